package testserver

import (
	"net"
	"sync"
	"testing"
)

// acceptor is what the proxies share: the listener and its accept loop,
// the goroutines they start, and whether the proxy is closed. mu guards
// closed, and the proxy's own state beside it.
type acceptor struct {
	ln     net.Listener
	wg     sync.WaitGroup // the accept loop and every goroutine it starts
	mu     sync.Mutex
	closed bool
}

// listen starts the accept loop on a free loopback port and returns its
// address. For each client it dials target and hands both connections to
// pair, which returns false once the proxy is closed; a client whose server
// cannot be dialled is closed.
func (a *acceptor) listen(t testing.TB, what, target string, pair func(client, server net.Conn) bool) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("%s listen: %v", what, err)
	}
	a.ln = ln
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			client, err := ln.Accept()
			if err != nil {
				return // closed
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			if !pair(client, server) {
				return
			}
		}
	}()
	return ln.Addr().String()
}

// shut marks the proxy closed and closes the listener, which ends the
// accept loop; false when the proxy was closed already.
func (a *acceptor) shut() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	first := !a.closed
	a.closed = true
	_ = a.ln.Close() // a second close only fails
	return first
}
