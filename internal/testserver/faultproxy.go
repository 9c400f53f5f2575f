package testserver

import (
	"net"
	"sync"
	"testing"
	"time"
)

// FaultProxy is a loopback TCP proxy that knows nothing of the protocol it
// carries, for network faults between a client and a server: added latency,
// stalled connections, connections reset in the middle of a reply, and
// partitions. Bytes are forwarded unchanged and in order, each direction on
// its own.
//
// A stalled connection stays open but carries nothing, as when packets are
// lost and TCP keeps retransmitting: whatever was sent meanwhile is held,
// and delivered, late, when the stall ends (if the receiving side is still
// open). A partition stalls every connection, those opened during it too.
type FaultProxy struct {
	// Addr is the proxy's address (127.0.0.1 and a free port), for clients.
	Addr string

	acceptor    // its mu also guards the fields below
	latency     time.Duration
	partitioned bool
	heal        chan struct{} // closed when a partition ends
	resetNext   int           // replies still to cut in the middle
	resets      int
	conns       map[*faultConn]struct{}
}

// faultConn is one client connection and its server connection.
type faultConn struct {
	client, server *net.TCPConn
	stalled        bool
	resume         chan struct{} // closed when the stall ends
	done           chan struct{} // closed when the pair is closed
	once           sync.Once
	ended          int // directions that ended; p.mu guards it
}

// StartFaultProxy starts a fault proxy to the TCP server at target and
// closes it when the test ends.
func StartFaultProxy(t testing.TB, target string) *FaultProxy {
	t.Helper()
	p := &FaultProxy{conns: map[*faultConn]struct{}{}}
	p.Addr = p.listen(t, "fault proxy", target, p.pair)
	t.Cleanup(p.Close)
	return p
}

// SetLatency delays every chunk of bytes by d in each direction (a round
// trip then takes 2d more); 0 removes the delay. It applies to chunks read
// from now on.
func (p *FaultProxy) SetLatency(d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency = d
}

// StallAll stalls every open connection until ResumeAll: they stay open but
// carry nothing. Connections opened later are not stalled. It returns how
// many connections it stalled.
func (p *FaultProxy) StallAll() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if !c.stalled {
			c.stalled = true
			c.resume = make(chan struct{})
			n++
		}
	}
	return n
}

// ResumeAll ends the stall of every connection: what was held is delivered.
func (p *FaultProxy) ResumeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if c.stalled {
			c.stalled = false
			close(c.resume)
		}
	}
}

// Partition cuts the client side from the server side until Heal: every
// connection, open or opened meanwhile, carries nothing. A client that gives
// up on a connection and dials again gets a connection that carries nothing
// either.
func (p *FaultProxy) Partition() {
	p.mu.Lock()
	if !p.partitioned {
		p.partitioned = true
		p.heal = make(chan struct{})
	}
	p.mu.Unlock()
	p.StallAll()
}

// Heal ends a partition: held bytes are delivered, late, on connections
// whose ends are still open, and new connections carry traffic again.
func (p *FaultProxy) Heal() {
	p.mu.Lock()
	if p.partitioned {
		p.partitioned = false
		close(p.heal)
	}
	p.mu.Unlock()
	p.ResumeAll()
}

// ResetMidReply arms the proxy: the next chunk that the server sends on any
// connection is cut in two; its first half reaches the client, then both
// connections are reset (TCP RST), the rest dropped. Each call arms one.
func (p *FaultProxy) ResetMidReply() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.resetNext++
}

// Resets returns how many replies have been cut by ResetMidReply so far.
func (p *FaultProxy) Resets() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets
}

// ResetAll resets (TCP RST) every open connection, dropping what it held.
func (p *FaultProxy) ResetAll() {
	p.mu.Lock()
	conns := make([]*faultConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	for _, c := range conns {
		c.reset()
	}
}

// Conns returns how many connections are open through the proxy.
func (p *FaultProxy) Conns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.conns)
}

// Close stops the proxy and resets every connection through it. Closing a
// closed proxy does nothing.
func (p *FaultProxy) Close() {
	if !p.shut() {
		return
	}
	p.ResetAll()
	p.wg.Wait()
}

// pair starts forwarding a client and its server connection, stalled
// during a partition; false when the proxy is already closed.
func (p *FaultProxy) pair(client, server net.Conn) bool {
	c := &faultConn{client: client.(*net.TCPConn), server: server.(*net.TCPConn), done: make(chan struct{})}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.reset()
		return false
	}
	if p.partitioned {
		c.stalled = true
		c.resume = make(chan struct{})
	}
	p.conns[c] = struct{}{}
	p.mu.Unlock()
	p.wg.Add(2)
	go p.pipe(c, c.client, c.server, false)
	go p.pipe(c, c.server, c.client, true)
	return true
}

// chunk is bytes read at a time, forwarded latency after it.
type chunk struct {
	b  []byte
	at time.Time
}

// pipe forwards from src to dst: a reader goroutine timestamps chunks, and
// this goroutine delivers each one when its latency has passed and the
// connection is not stalled. When src ends, what was read is still
// delivered, then dst's write side is closed (a clean half close); a reset
// drops it all.
func (p *FaultProxy) pipe(c *faultConn, src, dst *net.TCPConn, fromServer bool) {
	defer p.wg.Done()
	chunks := make(chan chunk, 1024)
	go func() {
		defer close(chunks)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				select {
				case chunks <- chunk{b: buf[:n], at: time.Now()}:
				case <-c.done:
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer p.forget(c)
	for ch := range chunks {
		p.mu.Lock()
		deliver := ch.at.Add(p.latency)
		p.mu.Unlock()
		if wait := time.Until(deliver); wait > 0 {
			select {
			case <-time.After(wait):
			case <-c.done:
				return
			}
		}
		if !p.waitUnstalled(c) {
			return
		}
		if fromServer && p.takeReset() {
			_, _ = dst.Write(ch.b[:len(ch.b)/2])
			c.reset()
			return
		}
		if _, err := dst.Write(ch.b); err != nil {
			c.reset()
			return
		}
	}
	select {
	case <-c.done:
	default:
		_ = dst.CloseWrite()
	}
}

// waitUnstalled waits while c is stalled; false when c was closed meanwhile.
func (p *FaultProxy) waitUnstalled(c *faultConn) bool {
	for {
		p.mu.Lock()
		stalled, resume := c.stalled, c.resume
		p.mu.Unlock()
		if !stalled {
			return true
		}
		select {
		case <-resume:
		case <-c.done:
			return false
		}
	}
}

func (p *FaultProxy) takeReset() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.resetNext == 0 {
		return false
	}
	p.resetNext--
	p.resets++
	return true
}

// forget is called as each direction of c ends: once both have, c is
// closed and dropped from the open connections. A half-closed connection
// stays open while its other direction still delivers.
func (p *FaultProxy) forget(c *faultConn) {
	p.mu.Lock()
	c.ended++
	both := c.ended == 2
	if both {
		delete(p.conns, c)
	}
	p.mu.Unlock()
	if both {
		c.close(false)
	}
}

// reset closes both connections with a TCP RST, dropping unsent bytes.
func (c *faultConn) reset() { c.close(true) }

func (c *faultConn) close(rst bool) {
	c.once.Do(func() {
		close(c.done)
		for _, conn := range []*net.TCPConn{c.client, c.server} {
			if rst {
				_ = conn.SetLinger(0)
			}
			_ = conn.Close()
		}
	})
}
