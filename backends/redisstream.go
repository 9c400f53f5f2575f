package backends

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"
)

// newRedisStreams builds a Redis Streams publisher and consumer-group
// subscriber, each with its own client: watermill-redisstream closes the
// client it is given when the publisher or subscriber closes, and a router
// closes both.
//
// Choices over watermill-redisstream's defaults:
//   - Consumer is stable (the host name), where the library picks a random
//     name per process, leaving a dead consumer behind at every restart;
//   - NackResendSleep as configured, where the library resends a nacked
//     message at once, in a loop;
//   - MaxIdleTime and ClaimInterval as configured (see RedisConfig);
//   - the first read blocks for the block time rather than forever, so Close
//     never waits on a read that cannot be cancelled;
//   - a new group starts at the beginning of the stream ("0"), so nothing
//     published before its first start is skipped.
func newRedisStreams(cfg Config, ep endpoint, logger watermill.LoggerAdapter) (*Backend, error) {
	newClient := func() (*redis.Client, error) {
		opts, err := redis.ParseURL(ep.url)
		if err != nil {
			// parseEndpoint parsed it already; the parser's text may quote
			// the password.
			return nil, invalidURL(ep.url, "go-redis cannot parse it")
		}
		if opts.ClientName == "" {
			opts.ClientName = cfg.Consumer
		}
		c := redis.NewClient(opts)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			return nil, unreachable(RedisStreams, ep.addrs, cfg.DialTimeout, err)
		}
		return c, nil
	}

	pubClient, err := newClient()
	if err != nil {
		return nil, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        pubClient,
		DefaultMaxlen: cfg.Redis.MaxLen,
	}, logger)
	if err != nil {
		_ = pubClient.Close()
		return nil, fmt.Errorf("backends: redis streams publisher: %w", err)
	}

	newSubscriber := func(group string) (message.Subscriber, error) {
		subClient, err := newClient()
		if err != nil {
			return nil, err
		}
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:                        subClient,
			Consumer:                      cfg.Consumer,
			ConsumerGroup:                 group,
			NackResendSleep:               cfg.NackResendSleep,
			MaxIdleTime:                   cfg.Redis.MaxIdleTime,
			ClaimInterval:                 cfg.Redis.ClaimInterval,
			OldestId:                      "0",
			DisableIndefiniteInitialBlock: true,
		}, logger)
		if err != nil {
			_ = subClient.Close()
			return nil, fmt.Errorf("backends: redis streams subscriber: %w", err)
		}
		return sub, nil
	}
	sub, err := newSubscriber(cfg.Group)
	if err != nil {
		return nil, errors.Join(err, pub.Close())
	}
	return &Backend{Publisher: pub, Subscriber: sub, newSubscriber: newSubscriber}, nil
}
