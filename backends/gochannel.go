package backends

import (
	"errors"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// gochannel is built in: Watermill has it, and tests and demos need nothing else.
func init() {
	brokerkit.Register(brokerkit.Driver{
		Broker: brokerkit.GoChannel,
		ParseURL: func(raw string) (brokerkit.Endpoint, error) {
			if _, rest, _ := strings.Cut(raw, "://"); rest != "" && rest != "/" {
				return brokerkit.Endpoint{}, errors.New("gochannel takes nothing after gochannel://")
			}
			return brokerkit.Endpoint{URL: raw}, nil
		},
		Open: newGoChannel,
	})
}

// newGoChannel builds one persistent GoChannel as both Publisher and
// Subscriber: two instances would share nothing. Persistent keeps every
// message, for late subscribers, in memory.
func newGoChannel(s brokerkit.Settings, _ brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	return brokerkit.Clients{
		Publisher:  gc,
		Subscriber: brokerkit.NewNackDelaySubscriber(gc, s.NackResendSleep),
		// A "group" is one more subscriber, whose Close leaves gc open.
		NewSubscriber: func(string) (message.Subscriber, error) {
			sub := brokerkit.NewNackDelaySubscriber(gc, s.NackResendSleep)
			sub.KeepOpen = true
			return sub, nil
		},
	}, nil
}
