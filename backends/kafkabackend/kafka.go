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

type options struct {
	partitions  int32
	replication int16 // zero: min(defaultMaxReplicas, brokers)
	version     sarama.KafkaVersion
}

const (
	defaultPartitions  = 12
	defaultVersion     = "2.1.0"
	defaultMaxReplicas = 3 // replication cap when replication_factor is absent
)

// The group's timeouts: the read timeout outlasts a JoinGroup's wait (the
// rebalance timeout), which stays under the session timeout kfake enforces.
const (
	sessionTimeout    = 10 * time.Second // sarama's default: a dead member is noticed after it
	heartbeatInterval = 3 * time.Second  // sarama's default, under a third of the session
	rebalanceTimeout  = 5 * time.Second  // how long a rebalance waits for each member
	readTimeout       = 30 * time.Second // sarama's default
)

// parseURL reads kafka://host:9092[,host2:9092][?parameters], without credentials.
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

// open builds a Kafka publisher and group subscriber, as the package doc says.
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
		// sarama checks the producer's settings here, not in Validate.
		return brokerkit.Clients{}, fmt.Errorf("%w: Kafka: %v", brokerkit.ErrInvalidConfig, err)
	}
	if err != nil {
		return brokerkit.Clients{}, ep.Unreachable(cfg.DialTimeout, err)
	}
	newSubscriber := func(group string) (message.Subscriber, error) {
		conf := *subConf // a copy per subscriber
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

// kafkaClientID makes a consumer name a client.id every version accepts.
func kafkaClientID(consumer string) string {
	return invalidClientIDChars.ReplaceAllString(consumer, "_")
}

type kafkaTopics struct {
	brokers     []string
	conf        *sarama.Config
	partitions  int32
	replication int16
	created     *brokerkit.TopicSet[struct{}]
}

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
