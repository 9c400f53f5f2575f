package kafkabackend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill-kafka/v3/pkg/kafka"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

func init() {
	brokerkit.Register(brokerkit.Driver{Broker: brokerkit.Kafka, ParseURL: parseURL, Open: open})
}

// options are the URL parameters of a kafka:// URL.
type options struct {
	partitions  int32
	replication int16 // zero: min(defaultMaxReplicas, brokers)
	version     sarama.KafkaVersion
}

// Defaults of the URL parameters. Why 12 partitions: see the package
// documentation.
const (
	defaultPartitions = 12
	defaultVersion    = "2.1.0"
)

// defaultMaxReplicas caps the replication factor of a created topic when
// replication_factor is absent.
const defaultMaxReplicas = 3

// The consumer group's timeouts. A JoinGroup or SyncGroup request waits up
// to the rebalance timeout for the other members, so the read timeout must
// be longer: a member whose read gives up first rejoins, on kfake that
// starts the wait again, and the group never settles. The rebalance timeout
// is half the session timeout: kfake (not Kafka) drops, unanswered, a member
// that has waited in a rebalance longer than its session timeout, and starts
// the wait again at each member that joins meanwhile.
const (
	sessionTimeout    = 10 * time.Second // sarama's default: a dead member is noticed after it
	heartbeatInterval = 3 * time.Second  // sarama's default, under a third of the session
	rebalanceTimeout  = 5 * time.Second  // how long a rebalance waits for each member
	readTimeout       = 30 * time.Second // sarama's default
)

// parseURL reads kafka://host:9092[,host2:9092][?parameters]; credentials
// belong in Config.Tune (SASL), never in the URL.
func parseURL(raw string) (brokerkit.Endpoint, error) {
	rest, p, err := brokerkit.TakeParams(raw, "partitions", "replication_factor", "version")
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	urls, addrs, err := brokerkit.HostList(rest, "9092", false,
		"put Kafka credentials in Config.Tune (SASL), not in the URL")
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	o := options{
		partitions:  int32(p.Int("partitions", defaultPartitions, 32)),
		replication: int16(p.Int("replication_factor", 0, 16)),
	}
	v := p.String("version", defaultVersion)
	if o.version, err = sarama.ParseKafkaVersion(v); err != nil {
		p.Fail("version=%q is not a Kafka version such as 3.6.0", v)
	} else if !o.version.IsAtLeast(sarama.V0_10_2_0) {
		p.Fail("version=%q is below 0.10.2.0, the first with the consumer groups the backend joins", v)
	}
	return brokerkit.Endpoint{URL: urls, Addrs: addrs, Options: o}, p.Err()
}

// open builds a Kafka publisher and consumer-group subscriber.
//
// Choices over watermill-kafka's defaults:
//   - protocol version from the version parameter (2.1.0), where watermill pins 1.0.0,
//     which Kafka 4 no longer accepts;
//   - the subscriber joins Group and a new group starts at the oldest
//     offset, so nothing published before its first start is skipped
//     (sarama's default is the newest);
//   - producer acks from all in-sync replicas (sarama's default is the
//     leader alone, which loses acked messages on leader failover);
//   - topics are created, with partitions (12 by default, where the
//     broker's own default is 1) and replication_factor, before the
//     first publish or subscribe to them, so nothing depends on the broker's
//     auto.create.topics.enable, and one failing message holds back its
//     partition rather than the whole topic;
//   - NackResendSleep as configured (redelivered in-process: a nacked
//     message holds back its partition until it is acked);
//   - a rebalance timeout of 5 s, where sarama's 60 s outlasts its own read
//     timeout (30 s); a Config.Tune that leaves the read timeout no longer than
//     the rebalance timeout is refused.
func open(cfg brokerkit.Settings, ep brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	o := ep.Options.(options)
	base := func(c *sarama.Config) {
		c.Version = o.version
		c.ClientID = kafkaClientID(cfg.Consumer)
		c.Net.DialTimeout = cfg.DialTimeout
	}

	pubConf := kafka.DefaultSaramaSyncPublisherConfig()
	base(pubConf)
	pubConf.Producer.RequiredAcks = sarama.WaitForAll
	subConf := kafka.DefaultSaramaSubscriberConfig()
	base(subConf)
	subConf.Consumer.Offsets.Initial = sarama.OffsetOldest
	subConf.Consumer.Group.Session.Timeout = sessionTimeout
	subConf.Consumer.Group.Heartbeat.Interval = heartbeatInterval
	subConf.Consumer.Group.Rebalance.Timeout = rebalanceTimeout
	subConf.Net.ReadTimeout = readTimeout
	cfg.TuneClient(pubConf)
	cfg.TuneClient(subConf)
	if err := subConf.Validate(); err != nil {
		return brokerkit.Clients{}, fmt.Errorf("%w: Kafka: %v", brokerkit.ErrInvalidConfig, err)
	}
	if read, rebalance := subConf.Net.ReadTimeout, subConf.Consumer.Group.Rebalance.Timeout; read <= rebalance {
		return brokerkit.Clients{}, fmt.Errorf("%w: Kafka: Net.ReadTimeout (%v) must be longer than Consumer.Group.Rebalance.Timeout (%v): "+
			"a JoinGroup waits up to the rebalance timeout, and a member whose read gives up first rejoins, so the group may never settle",
			brokerkit.ErrInvalidConfig, read, rebalance)
	}

	topics := &kafkaTopics{
		brokers:     ep.Addrs,
		conf:        subConf,
		partitions:  o.partitions,
		replication: o.replication,
		created:     brokerkit.NewTopicSet[struct{}](),
	}
	pub, err := kafka.NewPublisher(kafka.PublisherConfig{
		Brokers:               ep.Addrs,
		Marshaler:             kafka.DefaultMarshaler{},
		OverwriteSaramaConfig: pubConf,
	}, logger)
	if _, bad := errors.AsType[sarama.ConfigurationError](err); bad {
		// Tune left pubConf unusable: sarama checks the producer's
		// settings only here, not in Validate.
		return brokerkit.Clients{}, fmt.Errorf("%w: Kafka: %v", brokerkit.ErrInvalidConfig, err)
	}
	if err != nil {
		return brokerkit.Clients{}, ep.Unreachable(cfg.DialTimeout, err)
	}
	newSubscriber := func(group string) (message.Subscriber, error) {
		// A copy of the config per subscriber: nothing is shared but the
		// values.
		conf := *subConf
		sub, err := kafka.NewSubscriber(kafka.SubscriberConfig{
			Brokers:               ep.Addrs,
			Unmarshaler:           kafka.DefaultMarshaler{},
			OverwriteSaramaConfig: &conf,
			ConsumerGroup:         group,
			NackResendSleep:       cfg.NackResendSleep,
		}, logger)
		if err != nil {
			return nil, fmt.Errorf("backends: kafka subscriber: %w", err)
		}
		return &kafkaSubscriber{sub: sub, topics: topics}, nil
	}
	sub, err := newSubscriber(cfg.Group)
	if err != nil {
		_ = pub.Close()
		return brokerkit.Clients{}, err
	}
	return brokerkit.Clients{
		Publisher:     brokerkit.EnsuringPublisher{Publisher: pub, Ensure: topics.ensure},
		Subscriber:    sub,
		NewSubscriber: newSubscriber,
	}, nil
}

var invalidClientIDChars = regexp.MustCompile(`[^A-Za-z0-9._-]`)

// kafkaClientID turns a consumer name into a client.id that every protocol
// version accepts.
func kafkaClientID(consumer string) string {
	return invalidClientIDChars.ReplaceAllString(consumer, "_")
}

// kafkaTopics creates topics once per process.
type kafkaTopics struct {
	brokers     []string
	conf        *sarama.Config
	partitions  int32
	replication int16
	created     *brokerkit.TopicSet[struct{}]
}

// ensure creates topic unless this process already did, or it exists.
func (k *kafkaTopics) ensure(topic string) error {
	_, err := k.created.Ensure(topic, k.create)
	return err
}

func (k *kafkaTopics) create(topic string) (struct{}, error) {
	admin, err := sarama.NewClusterAdmin(k.brokers, k.conf)
	if err != nil {
		return struct{}{}, fmt.Errorf("backends: kafka admin: %w", err)
	}
	defer func() { _ = admin.Close() }()

	replication := k.replication
	if replication == 0 {
		brokers, _, err := admin.DescribeCluster()
		if err != nil {
			return struct{}{}, fmt.Errorf("backends: kafka describe cluster: %w", err)
		}
		replication = int16(min(len(brokers), defaultMaxReplicas))
	}
	err = admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: k.partitions, ReplicationFactor: replication}, false)
	if err != nil && !errors.Is(err, sarama.ErrTopicAlreadyExists) {
		return struct{}{}, fmt.Errorf("backends: kafka create topic %q (%d partitions, replication %d): %w", topic, k.partitions, replication, err)
	}
	return struct{}{}, nil
}

// kafkaSubscriber creates a topic before its first subscribe.
type kafkaSubscriber struct {
	sub    *kafka.Subscriber
	topics *kafkaTopics
}

var (
	_ message.Subscriber           = (*kafkaSubscriber)(nil)
	_ message.SubscribeInitializer = (*kafkaSubscriber)(nil)
)

func (s *kafkaSubscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if err := s.topics.ensure(topic); err != nil {
		return nil, err
	}
	return s.sub.Subscribe(ctx, topic)
}

// SubscribeInitialize creates topic if it does not exist.
func (s *kafkaSubscriber) SubscribeInitialize(topic string) error { return s.topics.ensure(topic) }

func (s *kafkaSubscriber) Close() error { return s.sub.Close() }
