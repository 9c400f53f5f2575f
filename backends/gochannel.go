package backends

import (
	"errors"
	"strings"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// gochannel is built in: gochannel is part of Watermill, which this
// package depends on anyway, and it lets tests, examples and demos run with
// nothing but this package linked.
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

// newGoChannel builds one persistent in-process GoChannel and returns it as
// both Publisher and Subscriber: GoChannel has no state outside its instance,
// so a separate instance for each side would never deliver anything.
// Persistent makes a late subscriber receive what was published before it
// subscribed, as a broker would; it keeps every message in memory for the
// life of the instance.
func newGoChannel(s brokerkit.Settings, _ brokerkit.Endpoint, logger watermill.LoggerAdapter) (brokerkit.Clients, error) {
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	return brokerkit.Clients{
		Publisher:  gc,
		Subscriber: brokerkit.NewNackDelaySubscriber(gc, s.NackResendSleep),
		// Every subscriber of a GoChannel receives every message: a
		// "group" is one more subscriber of the same instance, whose Close
		// leaves the instance open for the others.
		NewSubscriber: func(string) (message.Subscriber, error) {
			sub := brokerkit.NewNackDelaySubscriber(gc, s.NackResendSleep)
			sub.KeepOpen = true
			return sub, nil
		},
	}, nil
}
