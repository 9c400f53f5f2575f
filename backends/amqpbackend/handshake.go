package amqpbackend

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// handshakeTapLimit covers the handshake's frames, a few hundred bytes.
const handshakeTapLimit = 4096

// handshakeTap keeps a connection's first bytes: amqp091 turns the
// connection.close of a connection limit into a 403. TLS hides them.
type handshakeTap struct {
	dial func(network, addr string) (net.Conn, error)

	mu  sync.Mutex
	buf []byte
}

func (h *handshakeTap) Dial(network, addr string) (net.Conn, error) {
	c, err := h.dial(network, addr)
	if err != nil {
		return nil, err
	}
	return &tappedConn{Conn: c, tap: h}, nil
}

type tappedConn struct {
	net.Conn
	tap *handshakeTap
}

func (c *tappedConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.tap.mu.Lock()
	if room := handshakeTapLimit - len(c.tap.buf); room > 0 {
		c.tap.buf = append(c.tap.buf, p[:min(n, room)]...)
	}
	c.tap.mu.Unlock()
	return n, err
}

// atConnectionLimit reports RabbitMQ's 530 NOT_ALLOWED "connection limit
// (n) is reached" during the handshake.
func (h *handshakeTap) atConnectionLimit() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	b := h.buf
	// Frames: type (1), channel (2), size (4), payload, 0xCE.
	for len(b) >= 7 {
		size := int(binary.BigEndian.Uint32(b[3:7]))
		if len(b) < 7+size+1 {
			return false
		}
		p := b[7 : 7+size]
		// A method frame on channel 0: connection (10) close (50), reply
		// code, reply text (a short string).
		if b[0] == 1 && len(p) >= 7 && binary.BigEndian.Uint16(p[0:2]) == 10 && binary.BigEndian.Uint16(p[2:4]) == 50 {
			code, text := binary.BigEndian.Uint16(p[4:6]), p[7:min(7+int(p[6]), len(p))]
			return code == amqp091.NotAllowed && strings.Contains(string(text), "connection limit")
		}
		b = b[7+size+1:]
	}
	return false
}
