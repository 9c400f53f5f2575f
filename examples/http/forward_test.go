package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// lostConfirm publishes every message, but reports the first publish as
// failed: a broker confirm lost after the message was delivered.
type lostConfirm struct {
	message.Publisher
	mu   sync.Mutex
	lost bool
}

func (p *lostConfirm) Publish(topic string, msgs ...*message.Message) error {
	if err := p.Publisher.Publish(topic, msgs...); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.lost {
		p.lost = true
		return errors.New("publish confirm lost")
	}
	return nil
}

// forwardingPath runs the program's API and receipts consumer on one
// in-memory store and broker, and returns a function that POSTs a payment
// and the receipts.
func forwardingPath(t *testing.T, publish func(message.Publisher) message.Publisher) (post func(apiKey, idemKey string) (status int, paymentID string), sent *receipts) {
	t.Helper()
	store := memstore.New(nil)
	pubSub := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	sent = newReceipts()
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: store})
	require.NoError(t, err)
	router, err := newConsumer(once, pubSub, sent, watermill.NopLogger{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- router.Run(ctx) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done); _ = pubSub.Close() })
	<-router.Running()
	api, err := newAPI(once, publish(pubSub))
	require.NoError(t, err)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	post = func(apiKey, idemKey string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/payments", strings.NewReader(`{"amount":1000,"currency":"eur"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+apiKey)
		req.Header.Set("Idempotency-Key", idemKey)
		resp, err := srv.Client().Do(req)
		require.NoError(t, err)
		_ = resp.Body.Close()
		return resp.StatusCode, strings.TrimPrefix(resp.Header.Get("Location"), "/payments/")
	}
	return post, sent
}

// TestForwardQuotedAndBareOnce: a client sends a key quoted, the event is
// published but its confirm is lost (503), and the client retries with the
// key bare. httpidem takes both forms for one key, so the retry runs the
// handler again (the key is FAILED) and publishes again: the consumer must
// see one requestId and send one receipt.
func TestForwardQuotedAndBareOnce(t *testing.T) {
	post, sent := forwardingPath(t, func(p message.Publisher) message.Publisher { return &lostConfirm{Publisher: p} })

	status, _ := post("sk_test_alice", `"order-42"`)
	assert.Equal(t, http.StatusServiceUnavailable, status)
	status, id42 := post("sk_test_alice", `order-42`)
	assert.Equal(t, http.StatusCreated, status)
	// A third payment: gochannel hands a subscriber one message at a
	// time, in order, so once its receipt is sent the two events of
	// order-42 have been consumed.
	status, id43 := post("sk_test_alice", `order-43`)
	assert.Equal(t, http.StatusCreated, status)
	require.Eventually(t, func() bool { return slices.Contains(sent.Sent(), id43) }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, []string{id42, id43}, sent.Sent(), "one receipt for order-42 (sent quoted, then bare), one for order-43")
}

// TestForwardTwoTenants: two tenants with the same Idempotency-Key make
// two payments, and the consumer sends two receipts.
func TestForwardTwoTenants(t *testing.T) {
	post, sent := forwardingPath(t, func(p message.Publisher) message.Publisher { return p })

	status, alice := post("sk_test_alice", "order-42")
	assert.Equal(t, http.StatusCreated, status)
	status, bob := post("sk_test_bob", "order-42")
	assert.Equal(t, http.StatusCreated, status)
	assert.NotEqual(t, alice, bob, "two tenants, two payments")
	// gochannel hands each published message to its subscriber in a
	// goroutine of its own, so the two may arrive in either order.
	require.Eventually(t, func() bool { return len(sent.Sent()) >= 2 }, 10*time.Second, 5*time.Millisecond)
	assert.ElementsMatch(t, []string{alice, bob}, sent.Sent(), "one receipt per tenant")
}
