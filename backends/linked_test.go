package backends_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The client libraries of each broker, by module path.
var (
	kafkaModules = []string{"github.com/ThreeDotsLabs/watermill-kafka/v3", "github.com/IBM/sarama", "github.com/jcmturner/gokrb5/v8"}
	redisModules = []string{"github.com/ThreeDotsLabs/watermill-redisstream", "github.com/redis/go-redis/v9"}
	amqpModules  = []string{"github.com/ThreeDotsLabs/watermill-amqp/v3", "github.com/rabbitmq/amqp091-go"}
	natsModules  = []string{"github.com/ThreeDotsLabs/watermill-nats/v2", "github.com/nats-io/nats.go"}
)

// TestLinkedModules lists the modules that testdata/linked/consumer links
// (go list -deps) under each of its build tags, each of which adds the
// blank import of one broker package (or of backends/all; no tag, none),
// and checks that the program links the client libraries of the brokers it
// imports and of no other: a program that imports backends and
// backends/redisbackend links neither sarama and gokrb5 (Kafka), nor
// amqp091-go (AMQP), nor nats.go (NATS). The build that imports
// backends/all links them all, which shows that the listing sees them. It
// builds each one too, and logs its size.
func TestLinkedModules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		program       string
		links, misses [][]string
	}{
		{"redisbackend", [][]string{redisModules}, [][]string{kafkaModules, amqpModules, natsModules}},
		{"natsbackend", [][]string{natsModules}, [][]string{kafkaModules, redisModules, amqpModules}},
		{"kafkabackend", [][]string{kafkaModules}, [][]string{redisModules, amqpModules, natsModules}},
		{"amqpbackend", [][]string{amqpModules}, [][]string{kafkaModules, redisModules, natsModules}},
		{"none", nil, [][]string{kafkaModules, redisModules, amqpModules, natsModules}},
		{"all", [][]string{kafkaModules, redisModules, amqpModules, natsModules}, nil},
	} {
		t.Run(tc.program, func(t *testing.T) {
			t.Parallel()
			const pkg = "./testdata/linked/consumer"
			tags := "-tags=" + tc.program
			if tc.program == "none" {
				tags = "-tags="
			}
			out := goCommand(t, "list", tags, "-deps", "-f", "{{with .Module}}{{.Path}}{{end}}", pkg)
			modules := slices.Compact(slices.Sorted(slices.Values(strings.Fields(out))))
			require.Contains(t, modules, "github.com/ThreeDotsLabs/watermill", "the listing names modules")
			for _, m := range slices.Concat(tc.links...) {
				assert.True(t, slices.Contains(modules, m), "%s does not link %s, its broker's client", tc.program, m)
			}
			for _, m := range slices.Concat(tc.misses...) {
				assert.False(t, slices.Contains(modules, m), "%s links %s, of a broker it does not import", tc.program, m)
			}
			t.Logf("%s links %d modules: %s", tc.program, len(modules), strings.Join(modules, " "))

			bin := filepath.Join(t.TempDir(), tc.program)
			goCommand(t, "build", tags, "-o", bin, pkg)
			info, err := os.Stat(bin)
			require.NoError(t, err)
			t.Logf("%s: %.1f MB", tc.program, float64(info.Size())/1e6)
		})
	}
}

// goCommand runs the go command in this package's directory, offline
// (every module is in the cache: this test's binary needed them).
func goCommand(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOPROXY=off", "GOWORK=off", "GOFLAGS=-mod=readonly -buildvcs=false")
	out, err := cmd.Output()
	var stderr string
	if ee, ok := err.(*exec.ExitError); ok {
		stderr = string(ee.Stderr)
	}
	require.NoError(t, err, "go %s: %s", strings.Join(args, " "), stderr)
	return string(out)
}

// TestREADMEQuotesTheNotLinkedError runs the consumer of testdata/linked
// linked with NATS and Redis Streams, as the README's import snippet is,
// on a kafka:// URL, and checks that it stops with the very message the
// README quotes.
func TestREADMEQuotesTheNotLinkedError(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	require.NoError(t, err)
	var quoted string
	for line := range strings.Lines(string(readme)) {
		if strings.Contains(line, "is not linked: import _") {
			quoted = strings.TrimSuffix(strings.TrimSpace(line), ".")
			quoted = strings.Trim(quoted, "`")
		}
	}
	require.NotEmpty(t, quoted, "the README quotes the error of a broker that is not linked")

	bin := filepath.Join(t.TempDir(), "consumer")
	goCommand(t, "build", "-tags=natsbackend,redisbackend", "-o", bin, "./testdata/linked/consumer")
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "BROKER_URL=kafka://localhost:9092", "BROKER_GROUP=g")
	out, err := cmd.CombinedOutput()
	require.Error(t, err, "the consumer stops at start-up")
	first, _, _ := strings.Cut(string(out), "\n")
	assert.Equal(t, "panic: "+quoted, first)
}
