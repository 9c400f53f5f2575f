package demo

import "github.com/idempotency/watermill-idempotency/backends"

// BrokerFromEnv is backends.FromEnv with two defaults, so that a program
// runs without any setup: the in-process gochannel broker where BROKER_URL
// is unset, and group where BROKER_GROUP is.
func BrokerFromEnv(group string) (backends.Config, error) {
	cfg, err := backends.FromEnv()
	if err != nil {
		return cfg, err
	}
	if cfg.URL == "" {
		cfg.URL = "gochannel://"
	}
	if cfg.Group == "" {
		cfg.Group = group
	}
	return cfg, nil
}
