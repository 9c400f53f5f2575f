package backends

// Broker names a message broker that New can build a Publisher and Subscriber
// for. It is taken from the scheme of Config.URL.
type Broker string

// The supported brokers, each with the URL schemes that select it.
const (
	// Kafka is selected by kafka://host:9092[,host2:9092].
	Kafka Broker = "kafka"
	// RedisStreams is selected by redis://[user:pass@]host:6379/0, or
	// rediss:// for TLS.
	RedisStreams Broker = "redis"
	// AMQP (RabbitMQ) is selected by amqp://user:pass@host:5672/vhost, or
	// amqps:// for TLS.
	AMQP Broker = "amqp"
	// NATS (JetStream) is selected by nats://host:4222[,host2:4222].
	NATS Broker = "nats"
	// GoChannel (in-process, for tests and demos) is selected by gochannel://.
	GoChannel Broker = "gochannel"
)

var brokerByScheme = map[string]Broker{
	"kafka":     Kafka,
	"redis":     RedisStreams,
	"rediss":    RedisStreams,
	"amqp":      AMQP,
	"amqps":     AMQP,
	"nats":      NATS,
	"gochannel": GoChannel,
}

// Broker returns the broker that c.URL selects, after checking the URL as
// ParseURL does.
func (c Config) Broker() (Broker, error) {
	ep, err := parseEndpoint(c.URL)
	if err != nil {
		return "", err
	}
	return ep.Broker, nil
}
