package brokerkit

import (
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
)

// Closer is the closed state of the subscribers that relay messages
// themselves. Subscribe checks Closed holding Mu, so that no subscription
// starts once Close waits for them; Closing tells the running ones to stop.
// Build it with NewCloser.
type Closer struct {
	Mu      sync.Mutex
	Closed  bool
	Closing chan struct{}
}

// NewCloser returns an open Closer.
func NewCloser() Closer { return Closer{Closing: make(chan struct{})} }

// MarkClosed sets Closed and closes Closing; false when it ran before.
func (c *Closer) MarkClosed() bool {
	c.Mu.Lock()
	defer c.Mu.Unlock()
	if c.Closed {
		return false
	}
	c.Closed = true
	close(c.Closing)
	return true
}

// SettleOnStop settles a message when its subscription stops: as the handler
// did if it answered just before (select picks among ready cases at random,
// so an ack must not lose to the stop signal), else with abandon.
func SettleOnStop(msg *message.Message, ack, nack, abandon func()) {
	select {
	case <-msg.Acked():
		ack()
	case <-msg.Nacked():
		nack()
	default:
		abandon()
	}
}
