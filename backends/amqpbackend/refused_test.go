package amqpbackend_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// A virtual host or user at its connection limit is ErrUnreachable: the
// same Config succeeds once connections close. amqp091 reports it as the
// 403 of a virtual host that does not exist, which stays ErrInvalidConfig;
// both were ErrInvalidConfig.
func TestAMQP_ConnectionLimitIsUnreachable(t *testing.T) {
	t.Parallel()
	node := testserver.StartRabbitMQ(t)
	ctl := func(args ...string) {
		t.Helper()
		_, err := node.Command("rabbitmqctl", args...)
		require.NoError(t, err)
	}
	base := strings.TrimSuffix(node.URL, "/")
	newBackend := func(url string) error {
		b, err := backends.New(backends.Config{URL: url, Group: "g", DialTimeout: 10 * time.Second}, nil)
		if err == nil {
			require.NoError(t, b.Close())
		}
		return err
	}
	ctl("add_vhost", "limited")
	ctl("set_permissions", "-p", "limited", "guest", ".*", ".*", ".*")
	require.NoError(t, newBackend(base+"/limited"))

	ctl("set_vhost_limits", "-p", "limited", `{"max-connections": 0}`)
	err := newBackend(base + "/limited")
	require.ErrorIs(t, err, backends.ErrUnreachable, "the virtual host's limit")
	assert.NotErrorIs(t, err, backends.ErrInvalidConfig)
	assert.Contains(t, err.Error(), "connection")
	assert.NotContains(t, err.Error(), "limited", "the URL's path")
	require.ErrorIs(t, newBackend(base+"/missing"), backends.ErrInvalidConfig, "a virtual host that does not exist")

	ctl("clear_vhost_limits", "-p", "limited")
	require.NoError(t, newBackend(base+"/limited"), "the same Config, once the limit allows it")

	ctl("set_user_limits", "guest", `{"max-connections": 0}`)
	err = newBackend(base + "/")
	require.ErrorIs(t, err, backends.ErrUnreachable, "the user's limit")
	assert.NotErrorIs(t, err, backends.ErrInvalidConfig)
}

// amqps:// to RabbitMQ's plain port: RabbitMQ answers, not in TLS, so the
// same Config never connects: ErrInvalidConfig, where it was ErrUnreachable
// ("tls: first record does not look like a TLS handshake").
func TestAMQP_TLSToAPlainPortIsRefused(t *testing.T) {
	t.Parallel()
	url := testserver.RabbitMQURL(t)
	_, err := backends.New(backends.Config{URL: "amqps://" + strings.TrimPrefix(url, "amqp://"), Group: "g"}, nil)
	require.ErrorIs(t, err, backends.ErrInvalidConfig)
	assert.NotErrorIs(t, err, backends.ErrUnreachable)
	assert.Contains(t, err.Error(), "TLS")
}
