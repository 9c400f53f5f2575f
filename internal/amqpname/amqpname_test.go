package amqpname_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"

	"github.com/idempotency/watermill-idempotency/internal/amqpname"
)

func TestQueue(t *testing.T) {
	for _, tc := range []struct{ topic, group, want string }{
		{"orders", "billing", "orders_billing"},
		{"orders_poison", "billing", "orders_poison_billing"},
		{"X_eu", "billing", "X_eu_billing"},
		{"X", "eu_billing", "X_eu%5Fbilling"},
		{"X", "eu%5Fbilling", "X_eu%255Fbilling"},
		{"a.b", "c-d.e", "a.b_c-d.e"},
	} {
		assert.Equal(t, tc.want, amqpname.Queue(tc.topic, tc.group), "%q %q", tc.topic, tc.group)
	}
	assert.Equal(t, "orders_poison", amqpname.Exchange("orders_poison"))
}

// Every pair of a set of topics and groups built from the characters that
// the encoding treats specially, short and long, gets a queue of its own,
// of at most 255 bytes of valid UTF-8; every topic an exchange of its own.
func TestQueue_Distinct(t *testing.T) {
	parts := []string{"", "_", "%", "a", "a_", "_a", "a_b", "%5F", "%25", "a%5Fb", "_%", "%_", "__"}
	long := []string{strings.Repeat("t", 238), strings.Repeat("t", 250), strings.Repeat("t", 300),
		strings.Repeat("é", 130), strings.Repeat("€", 90)}
	var names []string
	for _, p := range parts {
		names = append(names, "x"+p, p+"x", p)
		for _, l := range long {
			names = append(names, l+p, p+l)
		}
	}
	queues := map[string][2]string{}
	exchanges := map[string]string{}
	for _, topic := range names {
		e := amqpname.Exchange(topic)
		assert.LessOrEqual(t, len(e), 255)
		if prev, dup := exchanges[e]; dup && prev != topic {
			t.Fatalf("topics %q and %q share the exchange %q", prev, topic, e)
		}
		exchanges[e] = topic
		for _, group := range names {
			q := amqpname.Queue(topic, group)
			assert.LessOrEqual(t, len(q), 255, "%q %q", topic, group)
			assert.True(t, utf8.ValidString(q), "%q %q", topic, group)
			if prev, dup := queues[q]; dup && prev != [2]string{topic, group} {
				t.Fatalf("%q and %q share the queue %q", prev, [2]string{topic, group}, q)
			}
			queues[q] = [2]string{topic, group}
		}
	}
}

// A cut name keeps the beginning of the whole one, for operators.
func TestQueue_Long(t *testing.T) {
	topic, group := strings.Repeat("t", 200), strings.Repeat("g", 60)
	q := amqpname.Queue(topic, group)
	assert.Len(t, q, 255)
	assert.True(t, strings.HasPrefix(q, topic+"_ggg"), q)
	assert.NotEqual(t, q, amqpname.Queue(topic, group[1:]+"h"), "same length, same beginning")
	whole := strings.Repeat("t", 200) + "_" + strings.Repeat("g", 37)
	assert.Equal(t, whole, amqpname.Queue(strings.Repeat("t", 200), strings.Repeat("g", 37)), "238 bytes: kept")
	assert.Len(t, amqpname.Queue(strings.Repeat("t", 200), strings.Repeat("g", 38)), 255, "239 bytes: cut")

	// A multi-byte character across the cut is left out whole.
	q = amqpname.Queue(strings.Repeat("t", 237)+"€", group)
	assert.True(t, utf8.ValidString(q))
	assert.Len(t, q, 237+17)
}

// A cut name is never the whole name of another pair or topic: the pair
// (its first 238 bytes, its hash) and the topic of its cut name read the
// same as a cut name where cut names were 255 bytes like whole ones.
func TestQueue_CutNamesAreNotWholeNames(t *testing.T) {
	topic, group := strings.Repeat("t", 250), "billing"
	q := amqpname.Queue(topic, group)
	cut := strings.LastIndexByte(q, '_')
	assert.NotEqual(t, q, amqpname.Queue(q[:cut], q[cut+1:]), "the pair (beginning, hash)")

	e := amqpname.Exchange(topic + strings.Repeat("x", 50))
	assert.NotEqual(t, e, amqpname.Exchange(e), "the topic named as the cut exchange")
	for _, n := range []int{238, 239, 255} {
		short, long := strings.Repeat("s", n), strings.Repeat("s", n+1)
		assert.NotEqual(t, amqpname.Exchange(short), amqpname.Exchange(long), "%d bytes", n)
	}
}
