package demo

import "github.com/idempotency/watermill-idempotency/backends"

// BrokerFromEnv is backends.FromEnv with three defaults, so that a program
// runs without any setup: the in-process gochannel broker where BROKER_URL
// is unset, group where BROKER_GROUP is, and that group in
// AMQP.PublishGroups where BROKER_AMQP_PUBLISH_GROUPS is.
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
	if len(cfg.AMQP.PublishGroups) == 0 {
		// The examples publish to topics their own group consumes, at times
		// before that group ever subscribed (postgres-ledger's "publish"
		// runs alone): on RabbitMQ the group's queue must exist first.
		cfg.AMQP.PublishGroups = []string{cfg.Group}
	}
	return cfg, nil
}
