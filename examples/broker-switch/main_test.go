package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// TestSameBinaryOnEveryBroker builds the program once and runs it against
// each broker, changing nothing but BROKER_URL.
func TestSameBinaryOnEveryBroker(t *testing.T) {
	if testing.Short() {
		t.Skip("runs against every broker; left out by -short")
	}
	bin := filepath.Join(t.TempDir(), "broker-switch")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "%s", out)

	redisURL := "redis://" + testserver.RedisAddr(t) + "/0"
	brokers := []struct{ name, url string }{
		{"gochannel", "gochannel://"},
		{"kafka", "kafka://" + strings.Join(testserver.KafkaBrokers(t, testserver.KafkaOptions{}), ",")},
		{"redis", redisURL},
		{"amqp", testserver.RabbitMQURL(t)},
		{"nats", testserver.NATSURL(t)},
	}
	const orders = 20
	want := regexp.MustCompile(fmt.Sprintf(
		`^broker=(\w+) deliveries=%d processed=%d duplicates=%d effects=%d exactly-once=true$`, orders*copies, orders, orders*(copies-1), orders))
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) {
			cmd := exec.Command(bin)
			cmd.Env = append(os.Environ(), "BROKER_URL="+b.url, "BROKER_GROUP=switch-"+b.name,
				"REDIS_URL="+redisURL, fmt.Sprintf("ORDERS=%d", orders))
			var stderr strings.Builder
			cmd.Stderr = &stderr
			stdout, err := cmd.Output()
			require.NoError(t, err, "stderr:\n%s", tail(stderr.String(), 3000))
			line := strings.TrimSpace(string(stdout))
			m := want.FindStringSubmatch(line)
			require.NotNil(t, m, "output %q", line)
			require.Equal(t, b.name, m[1])
			t.Log(line)
		})
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
