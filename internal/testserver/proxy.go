package testserver

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
)

// Proxy is a loopback TCP proxy in front of a Redis server, for fault
// injection: it forwards every byte both ways, and can be armed to let one
// command through to Redis, then drop that command's reply and close the
// client's connection. That is a lost reply: the command ran, the client
// never learns it, and go-redis (MaxRetries, 3 by default) redials and
// resends the same command. Tests then check that the resend does what the
// first try's caller expected.
//
// The proxy speaks just enough RESP (2 and 3) to find where each command and
// each reply ends; it changes nothing it forwards.
type Proxy struct {
	// Addr is the proxy's address (127.0.0.1 and a free port), for clients.
	Addr string

	acceptor // its mu also guards the fields below
	armed    []func(cmd []string) bool
	dropped  int
	conns    map[net.Conn]struct{}
}

// StartProxy starts a proxy to the Redis server at target and closes it when
// the test ends.
func StartProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	p := &Proxy{conns: map[net.Conn]struct{}{}}
	p.Addr = p.listen(t, "proxy", target, p.pair)
	t.Cleanup(p.Close)
	return p
}

// DropReply arms the proxy: the next command for which match returns true
// (cmd is the command's name and arguments, as sent) goes through to Redis,
// its reply is read and dropped, and the client's connection is closed.
// Each call arms one drop; several calls queue several.
func (p *Proxy) DropReply(match func(cmd []string) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = append(p.armed, match)
}

// Dropped returns how many replies the proxy has dropped so far.
func (p *Proxy) Dropped() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dropped
}

// Command returns a matcher for DropReply: the command named name
// (case-insensitive) with every one of args among its arguments.
func Command(name string, args ...string) func(cmd []string) bool {
	return func(cmd []string) bool {
		if len(cmd) == 0 || !strings.EqualFold(cmd[0], name) {
			return false
		}
	next:
		for _, want := range args {
			for _, got := range cmd[1:] {
				if got == want {
					continue next
				}
			}
			return false
		}
		return true
	}
}

// Close stops the proxy and closes every connection through it. Closing a
// closed proxy does nothing.
func (p *Proxy) Close() {
	if !p.shut() {
		return
	}
	p.mu.Lock()
	for c := range p.conns { // track lets no new one in
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// track registers c for Close; false when the proxy is already closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.conns, c)
}

// pair starts relaying a client and its server connection; false when the
// proxy is already closed.
func (p *Proxy) pair(client, server net.Conn) bool {
	if !p.track(client) || !p.track(server) {
		_ = client.Close()
		_ = server.Close()
		return false
	}
	p.wg.Add(1)
	go p.serve(client, server)
	return true
}

// serve relays one client connection. Replies come back in the order of
// the commands, so the client-to-server side queues, per command, whether
// its reply is to be dropped, and the server-to-client side pops one flag
// per reply.
func (p *Proxy) serve(client, server net.Conn) {
	defer p.wg.Done()
	drops := make(chan bool, 1024)
	done, stop := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		defer close(drops)
		rd := bufio.NewReader(client)
		for {
			raw, cmd, err := readCommand(rd)
			if err != nil {
				return
			}
			select {
			case drops <- p.take(cmd):
			case <-stop:
				return
			}
			if _, err := server.Write(raw); err != nil {
				return
			}
		}
	}()

	rd := bufio.NewReader(server)
	for {
		raw, push, err := readReply(rd)
		if err != nil {
			break
		}
		if !push { // a RESP3 push is out of band: no command's reply
			if drop, ok := <-drops; !ok || drop {
				p.mu.Lock()
				p.dropped++
				p.mu.Unlock()
				break
			}
		}
		if _, err := client.Write(raw); err != nil {
			break
		}
	}
	// A half close first, so the client reads a clean EOF (which go-redis
	// retries) rather than a reset.
	if tc, ok := client.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
	_ = client.Close()
	_ = server.Close()
	close(stop)
	<-done
	p.untrack(client)
	p.untrack(server)
}

// take reports whether the reply to cmd is to be dropped, disarming the
// first matcher that matches it.
func (p *Proxy) take(cmd []string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, match := range p.armed {
		if match(cmd) {
			p.armed = append(p.armed[:i], p.armed[i+1:]...)
			return true
		}
	}
	return false
}

// readCommand reads one command: a RESP array of bulk strings, or an inline
// command line. It returns the raw bytes to forward and the parsed command.
func readCommand(rd *bufio.Reader) ([]byte, []string, error) {
	line, err := readLine(rd)
	if err != nil {
		return nil, nil, err
	}
	if line[0] != '*' {
		return line, strings.Fields(string(line)), nil
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil {
		return nil, nil, fmt.Errorf("proxy: bad command header %q", line)
	}
	raw := line
	cmd := make([]string, 0, max(n, 0))
	for range n {
		arg, err := readValue(rd, nil)
		if err != nil {
			return nil, nil, err
		}
		raw = append(raw, arg...)
		if arg[0] == '$' {
			_, body, _ := strings.Cut(string(arg), "\r\n")
			cmd = append(cmd, strings.TrimSuffix(body, "\r\n"))
		}
	}
	return raw, cmd, nil
}

// readReply reads one reply, an attribute before it included; push reports
// a RESP3 push message, which answers no command.
func readReply(rd *bufio.Reader) (raw []byte, push bool, err error) {
	for {
		start := len(raw)
		if raw, err = readValue(rd, raw); err != nil {
			return nil, false, err
		}
		if raw[start] != '|' { // an attribute annotates the value after it
			return raw, raw[start] == '>', nil
		}
	}
}

// readValue appends one RESP2 or RESP3 value, raw, to buf.
func readValue(rd *bufio.Reader, buf []byte) ([]byte, error) {
	line, err := readLine(rd)
	if err != nil {
		return nil, err
	}
	buf = append(buf, line...)
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return buf, nil
	case '$', '!', '=':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return nil, fmt.Errorf("proxy: bad length %q", line)
		}
		if n < 0 {
			return buf, nil
		}
		body := make([]byte, n+2)
		if _, err := io.ReadFull(rd, body); err != nil {
			return nil, err
		}
		return append(buf, body...), nil
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(string(line[1 : len(line)-2]))
		if err != nil {
			return nil, fmt.Errorf("proxy: bad count %q", line)
		}
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		for range n {
			if buf, err = readValue(rd, buf); err != nil {
				return nil, err
			}
		}
		return buf, nil
	}
	return nil, fmt.Errorf("proxy: unknown RESP type %q", line[0])
}

// readLine reads one line, its CRLF included.
func readLine(rd *bufio.Reader) ([]byte, error) {
	line, err := rd.ReadBytes('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return nil, errors.New("proxy: malformed RESP line")
	}
	return line, nil
}
