package redisstore

import (
	"errors"
	"fmt"
	"net/url"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrInvalidURL is returned by NewFromURL for a URL that redis.ParseURL
// refuses.
var ErrInvalidURL = errors.New("redisstore: invalid Redis URL")

// NewFromURL returns a store on a new *redis.Client for rawURL, in the
// form redis.ParseURL reads (redis://[user:password@]host:port/db, rediss://
// for TLS, unix:// for a socket, with go-redis's query parameters such as
// dial_timeout or pool_size), with ContextTimeoutEnabled set, which no URL
// can say and New requires, and maintenance notifications off (see
// Auto-pipelining in the package documentation): the same URL configures
// the store and, in package backends, the broker. It returns the client too: close it when
// the store is no longer used (the store has no Close), or use it for
// anything else.
//
// An invalid URL is an ErrInvalidURL that says what is wrong without
// repeating the URL, so that no password reaches a log. NewFromURL does not
// contact Redis. opts are NewWithOptions'.
func NewFromURL(rawURL string, opts Options) (*Store, *redis.Client, error) {
	ro, err := redis.ParseURL(rawURL)
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // url.Error repeats the whole URL, password included
		}
		return nil, nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	ro.ContextTimeoutEnabled = true
	if ro.MaintNotificationsConfig == nil {
		ro.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	}
	client := redis.NewClient(ro)
	s, err := NewWithOptions(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return s, client, nil
}
