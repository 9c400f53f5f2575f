package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-redisstream/pkg/redisstream"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

func init() {
	brokerkit.Register(brokerkit.Driver{Broker: brokerkit.RedisStreams, ParseURL: parseURL, Open: open})
}

// options are the backend's URL parameters of a redis:// URL.
type options struct {
	maxIdleTime   time.Duration
	claimInterval time.Duration
	maxLen        int64
}

// Defaults of the URL parameters. max_idle_time stays above the
// idempotency lease (40 s): see the package documentation.
const (
	defaultMaxIdleTime   = 60 * time.Second
	defaultClaimInterval = 5 * time.Second
)

// parseURL reads redis:// and rediss:// URLs as go-redis does, after
// taking out the backend's parameters.
func parseURL(raw string) (brokerkit.Endpoint, error) {
	rest, p, err := brokerkit.TakeParams(raw, "max_idle_time", "claim_interval", "maxlen")
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	opts, err := redis.ParseURL(rest)
	if err != nil {
		// The parser's text may quote the password: never pass it on.
		return brokerkit.Endpoint{}, errors.New("go-redis cannot parse it: check the host, the port, the database number " +
			"(a number after the /) and the options (go-redis URL options and max_idle_time, claim_interval, maxlen)")
	}
	o := options{
		maxIdleTime:   p.Duration("max_idle_time", defaultMaxIdleTime),
		claimInterval: p.Duration("claim_interval", defaultClaimInterval),
		maxLen:        p.Int("maxlen", 0, 64),
	}
	return brokerkit.Endpoint{URL: rest, Addrs: []string{opts.Addr}, Options: o,
		Redelivery: o.maxIdleTime, RedeliveryParam: "max_idle_time"}, p.Err()
}

// open builds a Redis Streams publisher and consumer-group
// subscriber, each with its own client: watermill-redisstream closes the
// client it is given when the publisher or subscriber closes, and a router
// closes both.
//
// Choices over watermill-redisstream's defaults:
//   - Consumer is stable (the host name), where the library picks a random
//     name per process, leaving a dead consumer behind at every restart;
//   - NackResendSleep as configured, where the library resends a nacked
//     message at once, in a loop;
//   - a nack refreshes the entry's idle time in Redis (redisNackRefresh),
//     every third of MaxIdleTime while the nack waits out NackResendSleep
//     and once more before the resend, so a message that keeps failing
//     stays with the consumer that holds it instead of being claimed after
//     MaxIdleTime by another consumer, which would loop on it too;
//   - max_idle_time and claim_interval as configured;
//   - the first read blocks for the block time rather than forever, so Close
//     never waits on a read that cannot be cancelled;
//   - a new group starts at the beginning of the stream ("0"), so nothing
//     published before its first start is skipped;
//   - a read refused with NOGROUP (the stream was deleted, and the group
//     with it, or the group alone) creates the group again, at "0" too
//     (redisGroups), where the library retried the read for ever.
func open(cfg brokerkit.Settings, ep brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	o := ep.Options.(options)
	newClient := func() (*redis.Client, error) {
		opts, err := redis.ParseURL(ep.URL)
		if err != nil {
			// parseURL parsed it already; the parser's text may quote the
			// password.
			return nil, fmt.Errorf("%w: go-redis cannot parse it", brokerkit.ErrInvalidConfig)
		}
		if opts.ClientName == "" {
			opts.ClientName = redisClientName(cfg.Consumer)
		}
		cfg.TuneClient(opts)
		c := redis.NewClient(opts)
		ctx, cancel := context.WithTimeout(context.Background(), cfg.DialTimeout)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			_ = c.Close()
			if refused(err) {
				return nil, ep.Refused(err)
			}
			return nil, ep.Unreachable(cfg.DialTimeout, err)
		}
		return c, nil
	}

	pubClient, err := newClient()
	if err != nil {
		return brokerkit.Clients{}, err
	}
	pub, err := redisstream.NewPublisher(redisstream.PublisherConfig{
		Client:        pubClient,
		DefaultMaxlen: o.maxLen,
	}, logger)
	if err != nil {
		_ = pubClient.Close()
		return brokerkit.Clients{}, fmt.Errorf("backends: redis streams publisher: %w", err)
	}

	newSubscriber := func(group string) (message.Subscriber, error) {
		subClient, err := newClient()
		if err != nil {
			return nil, err
		}
		groups := &redisGroups{client: subClient, group: group, logger: logger, streams: map[string]int{}}
		sub, err := redisstream.NewSubscriber(redisstream.SubscriberConfig{
			Client:                        subClient,
			Consumer:                      cfg.Consumer,
			ConsumerGroup:                 group,
			NackResendSleep:               redisstream.NoSleep, // the wrapper waits, refreshing
			MaxIdleTime:                   o.maxIdleTime,
			ClaimInterval:                 o.claimInterval,
			Unmarshaller:                  redisUnmarshaller{},
			OldestId:                      redisGroupStart,
			DisableIndefiniteInitialBlock: true,
			ShouldStopOnReadErrors:        groups.onReadError,
		}, logger)
		if err != nil {
			_ = subClient.Close()
			return nil, fmt.Errorf("backends: redis streams subscriber: %w", err)
		}
		groups.Subscriber = sub
		// The wrapper, not the library, waits NackResendSleep before the
		// resend, and refreshes the nacked entry's idle time meanwhile
		// (every third of MaxIdleTime) and at its end: a NackResendSleep
		// longer than MaxIdleTime left the entry idle long enough for
		// another consumer to claim it.
		wrapped := brokerkit.NewNackDelaySubscriber(groups, cfg.NackResendSleep)
		wrapped.BeforeNack = (&redisNackRefresh{client: subClient, group: group, consumer: cfg.Consumer, logger: logger}).refresh
		wrapped.RefreshEvery = max(o.maxIdleTime/3, 10*time.Millisecond)
		return wrapped, nil
	}
	sub, err := newSubscriber(cfg.Group)
	if err != nil {
		return brokerkit.Clients{}, errors.Join(err, pub.Close())
	}
	return brokerkit.Clients{Publisher: pub, Subscriber: sub, NewSubscriber: newSubscriber}, nil
}

var invalidClientNameChars = regexp.MustCompile(`[^!-~]`)

// redisClientName turns a consumer name into a client name: Redis refuses
// one with a space or a byte outside printable ASCII, and with it every
// connection. The consumer name in the group stays as it is.
func redisClientName(consumer string) string {
	return invalidClientNameChars.ReplaceAllString(consumer, "_")
}

// redisNackRefresh keeps a nacked message with the consumer that holds it.
//
// watermill-redisstream resends a nacked message in process: Redis never
// hears of it, so the entry's idle time grows with every failed attempt, and
// after MaxIdleTime another consumer of the group claims it (XCLAIM) and
// loops on it as well, while the messages each consumer has read ahead wait
// behind the loop. One failing message stalled the whole group, forever
// with the idempotency middleware's MaxAttempts unset.
//
// refresh claims the nacked entry for its own consumer again with JUSTID
// (XCLAIM resets the idle time; JUSTID leaves the delivery count alone), so
// it is never idle for long while the consumer lives. It claims only
// entries this consumer holds, and each only if it is still idle at least
// as long as XPENDING said (a claim by another consumer meanwhile resets
// its idle time, and the entry is left to that one). The message behind it
// that this consumer has read ahead is not refreshed: after MaxIdleTime
// another consumer claims and handles it.
type redisNackRefresh struct {
	client   redis.UniversalClient
	group    string
	consumer string
	logger   watermill.LoggerAdapter
}

// redisRefreshScan bounds the pending entries of one consumer searched for
// the nacked message.
const redisRefreshScan = 100

func (r *redisNackRefresh) refresh(stream string, msg *message.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := func() error {
		pending, err := r.client.XPendingExt(ctx, &redis.XPendingExtArgs{
			Stream: stream, Group: r.group, Start: "-", End: "+", Count: redisRefreshScan, Consumer: r.consumer,
		}).Result()
		if err != nil || len(pending) == 0 {
			return err
		}
		pipe := r.client.Pipeline()
		ranges := make([]*redis.XMessageSliceCmd, len(pending))
		for i, p := range pending {
			ranges[i] = pipe.XRangeN(ctx, stream, p.ID, p.ID, 1)
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		for i, p := range pending {
			entries, _ := ranges[i].Result()
			if len(entries) == 0 || entries[0].Values[redisstream.UUIDHeaderKey] != msg.UUID {
				continue
			}
			if err := r.client.XClaimJustID(ctx, &redis.XClaimArgs{
				Stream: stream, Group: r.group, Consumer: r.consumer, MinIdle: p.Idle, Messages: []string{p.ID},
			}).Err(); err != nil && !errors.Is(err, redis.Nil) {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		r.logger.Error("Cannot refresh the idle time of a nacked message", err,
			watermill.LogFields{"stream": stream, "message_uuid": msg.UUID})
	}
}

// redisGroupStart is where a group starts that the subscriber creates: the
// beginning of the stream, so that nothing written before is skipped.
const redisGroupStart = "0"

// redisGroups creates the consumer group again on the streams its
// subscriber reads, when a read is refused with NOGROUP.
//
// A stream deleted (DEL, or lost in a restart without persistence) takes
// its groups with it, and the next XADD creates it without them. The
// library then retries XREADGROUP for ever, and the messages wait. Its read
// error hook (ShouldStopOnReadErrors) names no stream, so on NOGROUP every
// stream this subscriber reads gets XGROUP CREATE ... MKSTREAM at
// redisGroupStart; where the group exists, Redis answers BUSYGROUP and
// nothing changes. Starting at "0" delivers everything written to the new
// stream, also before the group was back.
type redisGroups struct {
	message.Subscriber // the library's, set once it is built

	client redis.UniversalClient
	group  string
	logger watermill.LoggerAdapter

	mu      sync.Mutex
	streams map[string]int // subscriptions running per stream
}

// Subscribe subscribes to topic and counts the stream as read until ctx
// ends.
func (g *redisGroups) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	g.track(topic, 1)
	msgs, err := g.Subscriber.Subscribe(ctx, topic)
	if err != nil {
		g.track(topic, -1)
		return nil, err
	}
	context.AfterFunc(ctx, func() { g.track(topic, -1) })
	return msgs, nil
}

func (g *redisGroups) track(stream string, n int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.streams[stream] += n; g.streams[stream] <= 0 {
		delete(g.streams, stream)
	}
}

// onReadError creates the group again on NOGROUP. It never stops the read:
// the library retries it after 500 ms.
func (g *redisGroups) onReadError(err error) bool {
	if !redis.HasErrorPrefix(err, "NOGROUP") {
		return false
	}
	g.mu.Lock()
	streams := make([]string, 0, len(g.streams))
	for s := range g.streams {
		streams = append(streams, s)
	}
	g.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	pipe := g.client.Pipeline()
	cmds := make([]*redis.StatusCmd, len(streams))
	for i, s := range streams {
		cmds[i] = pipe.XGroupCreateMkStream(ctx, s, g.group, redisGroupStart)
	}
	_, _ = pipe.Exec(ctx)
	for i, cmd := range cmds {
		fields := watermill.LogFields{"stream": streams[i], "consumer_group": g.group}
		switch err := cmd.Err(); {
		case err == nil:
			g.logger.Info("Consumer group was missing (its stream deleted?); created it again", fields)
		case !redis.HasErrorPrefix(err, "BUSYGROUP"):
			g.logger.Error("Cannot create the consumer group again; retrying at the next read", err, fields)
		}
	}
	return false
}

// refused reports whether err is Redis refusing the URL for good: its
// credentials (NOAUTH, WRONGPASS, NOPERM) or its database number. Any other
// answer may change (LOADING, BUSY, the client limit, a proxy's ERR while
// its server is down).
func refused(err error) bool {
	if redis.IsAuthError(err) || redis.IsPermissionError(err) {
		return true
	}
	// HasErrorPrefix reads past a leading "ERR ". Then the client_name URL
	// option. The last two are Redis 5's (no HELLO, so go-redis sends AUTH).
	for _, prefix := range []string{"DB index is out of range", "SELECT is not allowed in cluster mode",
		"Client names cannot contain", "invalid password", "Client sent AUTH, but no password is set"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}
