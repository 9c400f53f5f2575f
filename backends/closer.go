package backends

import "sync"

// closer is the closed state of the subscribers that relay messages
// themselves. Subscribe checks closed holding mu, so that no subscription
// starts once Close waits for them; closing tells the running ones to stop.
type closer struct {
	mu      sync.Mutex
	closed  bool
	closing chan struct{}
}

func newCloser() closer { return closer{closing: make(chan struct{})} }

// markClosed sets closed and closes closing; false when Close ran before.
func (c *closer) markClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.closed = true
	close(c.closing)
	return true
}
