package backends

import (
	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
)

// newGoChannel builds one persistent in-process GoChannel and returns it as
// both Publisher and Subscriber: GoChannel has no state outside its instance,
// so a separate instance for each side would never deliver anything.
// Persistent makes a late subscriber receive what was published before it
// subscribed, as a broker would; it keeps every message in memory for the
// life of the instance.
func newGoChannel(cfg Config, logger watermill.LoggerAdapter) (*Backend, error) {
	gc := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, logger)
	return &Backend{
		Publisher:  gc,
		Subscriber: newNackDelaySubscriber(gc, cfg.NackResendSleep),
		// Every subscriber of a GoChannel receives every message: a
		// "group" is one more subscriber of the same instance, whose Close
		// leaves the instance open for the others.
		newSubscriber: func(string) (message.Subscriber, error) {
			sub := newNackDelaySubscriber(gc, cfg.NackResendSleep)
			sub.keepOpen = true
			return sub, nil
		},
	}, nil
}
