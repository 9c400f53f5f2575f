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

// NewFromURL returns a store on a new *redis.Client for rawURL, as
// [redis.ParseURL] reads it (redis://, rediss://, unix://, with go-redis's
// query parameters). The client has ContextTimeoutEnabled set and
// maintenance notifications off (see Auto-pipelining in the package doc).
// Close the client when the store is no longer used. opts are New's.
//
// An invalid URL, one whose values redis.NewClient would panic on included
// (a negative pool_size, say), is an [ErrInvalidURL] that does not repeat
// the URL, so no password reaches a log. NewFromURL does not contact Redis.
func NewFromURL(rawURL string, opts *Options) (*Store, *redis.Client, error) {
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
	client, err := newClient(ro)
	if err != nil {
		return nil, nil, err
	}
	s, err := New(client, opts)
	if err != nil {
		_ = client.Close()
		return nil, nil, err
	}
	return s, client, nil
}

// newClient is redis.NewClient(ro), which panics on some values that
// redis.ParseURL takes (a negative pool_size, a count beyond 32 bits): such
// a panic is an ErrInvalidURL.
func newClient(ro *redis.Options) (c *redis.Client, err error) {
	defer func() {
		if r := recover(); r != nil {
			c, err = nil, fmt.Errorf("%w: %v", ErrInvalidURL, r)
		}
	}()
	return redis.NewClient(ro), nil
}
