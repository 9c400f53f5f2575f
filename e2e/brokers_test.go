package e2e

import (
	"context"
	neturl "net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/backends"
	// The scenarios run on every broker.
	_ "github.com/idempotency/watermill-idempotency/backends/all"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// Timers of the runs. They are production's, scaled down so that a crash or
// a slow handler plays out in seconds; their order is production's too:
// NackDelay < NackResendSleep << lease < the brokers' redelivery timers.
const (
	// lease is the idempotency lease (production: 40 s).
	lease = 2 * time.Second
	// nackDelay is the middleware's wait before nacking a key in progress
	// elsewhere or a store outage (production: 1 s).
	nackDelay = 50 * time.Millisecond
	// nackResend is the backends' NackResendSleep (production: 1 s).
	nackResend = 100 * time.Millisecond
	// redeliverAfter is Redis Streams' MaxIdleTime and NATS's AckWait
	// (production: 60 s): above the lease, as the backends package asks.
	redeliverAfter = 3 * time.Second
	// kafkaPartitions is the partition count of every Kafka topic.
	kafkaPartitions = 8
)

// broker is one column of the scenario table: how to reach a broker and
// what it does differently.
type broker struct {
	name string
	// start finds (or starts) the server and returns the backends URL.
	start func(t *testing.T) string
	// inProcess: one in-process instance carries every message (gochannel);
	// consumers must share it, and it has no consumer groups: each consumer
	// receives every message.
	inProcess bool
	// timerRedelivery: the broker redelivers a message that a live consumer
	// holds too long (Redis Streams MaxIdleTime). NATS, whose subscriber
	// sends progress acks while a handler runs, Kafka and RabbitMQ
	// redeliver only what a consumer that left held; gochannel never.
	timerRedelivery bool
	// cleanup deletes what one scenario created on a shared server.
	cleanup func(t *testing.T, url string, topics []string, group string)
	// pg: the column keeps the idempotency records in PostgreSQL (pgstore)
	// instead of Redis; mysql: in MySQL or MariaDB (mysqlstore). base is
	// then the name of the broker it runs on.
	pg, mysql bool
	base      string
}

// sqlStore reports whether the column keeps its records in a database
// table (pgstore or mysqlstore) rather than in Redis.
func (b *broker) sqlStore() bool { return b.pg || b.mysql }

// kind is the broker the column runs on, whatever its store: the name a
// scenario's na is keyed by.
func (b *broker) kind() string {
	if b.base != "" {
		return b.base
	}
	return b.name
}

// pgColumns are the brokers the scenario table runs on a second time with
// pgstore as the store, as pg-<broker>: gochannel, and NATS, the network
// broker whose column runs fastest. One network broker is enough: what the
// table checks there is the store's state machine under a broker's
// redeliveries, which the Redis store's columns already check on every
// broker.
var pgColumns = []*broker{sqlColumn("pg", "gochannel"), sqlColumn("pg", "nats")}

// mysqlColumns are the brokers the scenario table runs on with mysqlstore
// as the store, as mysql-<broker>: NATS, the one network broker, for the
// same reason.
var mysqlColumns = []*broker{sqlColumn("mysql", "nats")}

// sqlColumn is the broker named name, with pgstore (db "pg") or mysqlstore
// (db "mysql") as its store.
func sqlColumn(db, name string) *broker {
	for _, b := range brokers {
		if b.name == name {
			c := *b
			c.name, c.base = db+"-"+name, name
			c.pg, c.mysql = db == "pg", db == "mysql"
			return &c
		}
	}
	panic("e2e: no broker " + name)
}

// config is the backends configuration of one member of group.
func (b *broker) config(url, group, consumer string) backends.Config {
	cfg := backends.Config{
		URL:             url,
		Group:           group,
		Consumer:        consumer,
		NackResendSleep: nackResend,
		Tune:            kafkaTune,
	}
	setParam(&cfg, "kafka", "partitions", strconv.Itoa(kafkaPartitions))
	setParam(&cfg, "redis", "max_idle_time", redeliverAfter.String())
	setParam(&cfg, "redis", "claim_interval", "500ms")
	setParam(&cfg, "nats", "ack_wait", redeliverAfter.String())
	// The scenarios publish before the group's consumers (children among
	// them) first subscribe: on RabbitMQ the group's queue must exist
	// first, or the publish is ErrUnroutable.
	setParam(&cfg, "amqp", "publish_groups", group)
	return cfg
}

// setParam sets the URL parameter name of cfg.URL to value (removes it,
// for ""), where the URL's scheme is scheme.
func setParam(cfg *backends.Config, scheme, name, value string) {
	if !strings.HasPrefix(cfg.URL, scheme+"://") {
		return
	}
	base, query, _ := strings.Cut(cfg.URL, "?")
	var kept []string
	for kv := range strings.SplitSeq(query, "&") {
		if kv != "" && !strings.HasPrefix(kv, name+"=") {
			kept = append(kept, kv)
		}
	}
	if value != "" {
		kept = append(kept, name+"="+neturl.QueryEscape(value))
	}
	cfg.URL = base
	if len(kept) > 0 {
		cfg.URL += "?" + strings.Join(kept, "&")
	}
}

// childEnv is config as the environment variables backends.FromEnv reads, for
// the child processes of the crash and crash-loop scenarios. Tune has no
// variable; the children set it to kafkaTune themselves.
func childEnv(cfg backends.Config) []string {
	return []string{
		"BROKER_URL=" + cfg.URL,
		"BROKER_GROUP=" + cfg.Group,
		"BROKER_CONSUMER=" + cfg.Consumer,
		"BROKER_NACK_RESEND_SLEEP=" + cfg.NackResendSleep.String(),
	}
}

// kafkaTune makes consumer-group rebalances take seconds: every scenario
// starts a new group whose members join one by one, and the crash scenario
// waits for the killed member's session to time out.
func kafkaTune(client any) {
	if c, ok := client.(*sarama.Config); ok {
		c.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
		c.Consumer.Group.Session.Timeout = 6 * time.Second
		c.Consumer.Group.Rebalance.Timeout = 3 * time.Second
	}
}

var brokers = []*broker{
	{
		name: "kafka",
		start: func(t *testing.T) string {
			addrs := testserver.KafkaBrokers(t, testserver.KafkaOptions{Brokers: 3, Partitions: kafkaPartitions})
			return "kafka://" + strings.Join(addrs, ",")
		},
		cleanup: cleanupKafka,
	},
	{
		name:            "redis",
		start:           func(t *testing.T) string { return "redis://" + testserver.RedisAddr(t) + "/0" },
		timerRedelivery: true,
		cleanup:         cleanupRedisStreams,
	},
	{
		name:    "amqp",
		start:   func(t *testing.T) string { return testserver.RabbitMQURL(t) },
		cleanup: cleanupAMQP,
	},
	{
		name:    "nats",
		start:   func(t *testing.T) string { return testserver.NATSURL(t) },
		cleanup: cleanupNATS,
	},
	{
		name:      "gochannel",
		start:     func(*testing.T) string { return "gochannel://" },
		inProcess: true,
	},
}

// cleanupKafka deletes the topics and the group from a shared cluster
// (KAFKA_BROKERS); an in-process kfake cluster goes away by itself.
func cleanupKafka(t *testing.T, url string, topics []string, group string) {
	if testserver.Env("KAFKA_BROKERS", "") == "" {
		return
	}
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(strings.Split(strings.TrimPrefix(url, "kafka://"), ","), conf)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	defer func() { _ = admin.Close() }()
	_ = admin.DeleteConsumerGroup(group)
	for _, topic := range topics {
		_ = admin.DeleteTopic(topic)
	}
}

// cleanupRedisStreams deletes the streams (one key per topic).
func cleanupRedisStreams(t *testing.T, url string, topics []string, _ string) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		t.Logf("cleanup: %v", err)
		return
	}
	c := redis.NewClient(opts)
	defer c.Close()
	if err := c.Del(context.Background(), topics...).Err(); err != nil {
		t.Logf("cleanup: %v", err)
	}
}

// cleanupAMQP deletes each topic's exchange and the group's queue on it
// (topic_group). Deleting what does not exist is no error in RabbitMQ.
func cleanupAMQP(t *testing.T, url string, topics []string, group string) {
	testserver.DeleteAMQP(t, url, topics, []string{group})
}

// cleanupNATS deletes the stream of each topic, and with it the durables.
func cleanupNATS(t *testing.T, url string, topics []string, _ string) {
	testserver.DeleteNATSStreams(t, url, topics...)
}
