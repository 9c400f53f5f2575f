package kafkabackend

import (
	"github.com/IBM/sarama"

	"github.com/idempotency/watermill-idempotency/backends"
)

// TuneFunc is a func(*sarama.Config) as a backends.KafkaTuner, for
// Config.Kafka.Tune: the backend calls it last on each sarama.Config it
// builds, one for the publisher and one for the subscriber and topic
// administration. It is the place for SASL, TLS and timeouts:
//
//	cfg.Kafka.Tune = kafkabackend.TuneFunc(func(c *sarama.Config) {
//		c.Net.SASL.Enable = true
//		c.Net.SASL.User, c.Net.SASL.Password = user, password
//	})
type TuneFunc func(*sarama.Config)

var _ backends.KafkaTuner = TuneFunc(nil)

// TuneKafka calls f with saramaConfig, which the Kafka backend passes as a
// *sarama.Config; anything else is ignored.
func (f TuneFunc) TuneKafka(saramaConfig any) {
	if c, ok := saramaConfig.(*sarama.Config); ok && f != nil {
		f(c)
	}
}
