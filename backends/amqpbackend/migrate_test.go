package amqpbackend_test

import (
	"regexp"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// The commands of docs/OPERATIONS.md ("RabbitMQ: queues of the old
// names"), run as written on a private node: the old queue of group
// eu_billing on topic orders (orders_eu_billing, as releases before named
// it) is found, drained into the new one (orders_eu%5Fbilling) and
// deleted, and the group receives what the old queue held.
func TestAMQP_OldQueueNamesAreDrained(t *testing.T) {
	t.Parallel()
	node := testserver.StartRabbitMQ(t)
	ctl := func(tool string, args ...string) string {
		t.Helper()
		out, err := node.Command(tool, args...)
		require.NoError(t, err)
		return out
	}
	// What the old release left: its queue, bound, with a message that
	// the group has not handled.
	amqpAdmin(t, node.URL, func(ch *amqp091.Channel) {
		require.NoError(t, ch.ExchangeDeclare("orders", "fanout", true, false, false, false, nil))
		_, err := ch.QueueDeclare("orders_eu_billing", true, false, false, false, nil)
		require.NoError(t, err)
		require.NoError(t, ch.QueueBind("orders_eu_billing", "", "orders", false, nil))
	})
	b := backendtest.NewBackend(t, backends.Config{URL: node.URL, Group: "eu_billing"})
	backendtest.Publish(t, b.Publisher, "orders", "before") // no queue of the new name yet: the old one alone
	msgs := backendtest.Subscribe(t, b, "orders")
	backendtest.Publish(t, b.Publisher, "orders", "after") // both queues
	assert.Equal(t, "after", backendtest.Receive(t, msgs))

	assert.Regexp(t, `(?m)^orders_eu_billing\s+2\s+0$`, ctl("rabbitmqctl", "list_queues", "name", "messages", "consumers"))
	assert.Regexp(t, `(?m)^orders\s+orders_eu_billing$`, ctl("rabbitmqctl", "list_bindings", "source_name", "destination_name"))
	ctl("rabbitmq-plugins", "enable", "rabbitmq_shovel")
	ctl("rabbitmqctl", "set_parameter", "shovel", "drain-orders_eu_billing",
		`{"src-protocol": "amqp091", "src-uri": "amqp://", "src-queue": "orders_eu_billing", "src-delete-after": "queue-length", `+
			`"dest-protocol": "amqp091", "dest-uri": "amqp://", "dest-queue": "orders_eu%5Fbilling"}`)
	drained := regexp.MustCompile(`(?m)^orders_eu_billing\s+0$`)
	require.Eventually(t, func() bool { return drained.MatchString(ctl("rabbitmqctl", "list_queues", "name", "messages")) },
		time.Minute, 200*time.Millisecond, "the shovel empties the old queue")
	ctl("rabbitmqctl", "delete_queue", "orders_eu_billing")

	got := map[string]int{}
	for range 2 {
		got[backendtest.Receive(t, msgs)]++
	}
	assert.Equal(t, map[string]int{"before": 1, "after": 1}, got, "the old queue's messages, one a copy of one handled")
	assert.NotContains(t, ctl("rabbitmqctl", "list_queues", "name"), "orders_eu_billing\n")
}
