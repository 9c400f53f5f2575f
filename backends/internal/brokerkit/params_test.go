package brokerkit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TakeParams takes out the named parameters and leaves the rest of the URL,
// the library's options in their order, as written.
func TestTakeParams(t *testing.T) {
	rest, p, err := TakeParams("redis://u:p%40ss@h:6379/0?pool_size=4&max_idle_time=90s&dial_timeout=1s&maxlen=#frag",
		"max_idle_time", "maxlen", "claim_interval")
	require.NoError(t, err)
	assert.Equal(t, "redis://u:p%40ss@h:6379/0?pool_size=4&dial_timeout=1s#frag", rest)
	assert.Equal(t, 90*time.Second, p.Duration("max_idle_time", time.Minute))
	assert.Equal(t, 5*time.Second, p.Duration("claim_interval", 5*time.Second), "absent: the default")
	assert.Equal(t, int64(7), p.Int("maxlen", 7, 64), "empty: the default")
	require.NoError(t, p.Err())

	rest, p, err = TakeParams("amqp://h/?publish_groups=a%2Cb,%20c,,&prefetch=0", "publish_groups", "prefetch")
	require.NoError(t, err)
	assert.Equal(t, "amqp://h/", rest)
	assert.Equal(t, []string{"a", "b", "c"}, p.List("publish_groups"))
	assert.Equal(t, int64(1), p.Int("prefetch", 1, 32), "zero: the default")

	_, _, err = TakeParams("nats://h?ack_wait=1s&ack_wait=2s", "ack_wait")
	require.ErrorContains(t, err, "the parameter ack_wait twice")
	_, _, err = TakeParams("redis://u:s3cr3t?x@h/0", "maxlen")
	require.Error(t, err, "an '@' after the '?' is a password that holds one")
	assert.NotContains(t, err.Error(), "s3cr3t")
}

func TestRegisterTwicePanics(t *testing.T) {
	d := Driver{Broker: "test-broker"}
	Register(d)
	assert.PanicsWithValue(t, `backends: Register called twice for broker "test-broker"`, func() { Register(d) })
}
