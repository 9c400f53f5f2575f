package main

import (
	"io"
	"net"
	"sync"
)

// flakyLink is a TCP link to the API that loses the API's first answer:
// the request goes through, the API runs it, and its answer is dropped
// and the connection reset, as when a network fails or a load balancer
// times out after the server did the work. Later connections carry
// everything.
type flakyLink struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	lost   bool // the first answer has been lost
	conns  map[net.Conn]bool
	closed bool
	wg     sync.WaitGroup
}

func startFlakyLink(target string) (*flakyLink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &flakyLink{ln: ln, target: target, conns: map[net.Conn]bool{}}
	l.wg.Go(l.accept)
	return l, nil
}

// Addr is the address to call the API at, through the link.
func (l *flakyLink) Addr() string { return l.ln.Addr().String() }

// Close stops the link and closes every connection through it.
func (l *flakyLink) Close() {
	_ = l.ln.Close()
	l.mu.Lock()
	l.closed = true
	for c := range l.conns {
		_ = c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
}

func (l *flakyLink) accept() {
	for {
		client, err := l.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", l.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		l.mu.Lock()
		if l.closed {
			l.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		lose := !l.lost
		l.lost = true
		l.conns[client], l.conns[server] = true, true
		l.mu.Unlock()
		l.wg.Go(func() { l.carry(client.(*net.TCPConn), server.(*net.TCPConn), lose) })
	}
}

// carry forwards the bytes both ways; when lose is set, it reads the
// answer's first bytes from the API, drops them and resets the client's
// connection.
func (l *flakyLink) carry(client, server *net.TCPConn, lose bool) {
	defer func() {
		_ = client.Close()
		_ = server.Close()
		l.mu.Lock()
		delete(l.conns, client)
		delete(l.conns, server)
		l.mu.Unlock()
	}()
	go func() {
		_, _ = io.Copy(server, client)
		_ = server.CloseWrite()
	}()
	if lose {
		_, _ = server.Read(make([]byte, 1)) // the API has answered
		_ = client.SetLinger(0)             // Close sends a reset
		return
	}
	_, _ = io.Copy(client, server)
}
