package e2e

import (
	"io/fs"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// composeFile is the part of docker-compose.yml that the checks read.
type composeFile struct {
	Services map[string]struct {
		Image       string            `yaml:"image"`
		Command     []string          `yaml:"command"`
		Ports       []string          `yaml:"ports"`
		Environment map[string]string `yaml:"environment"`
	} `yaml:"services"`
}

// composeDefaults is, per service of docker-compose.yml, the image it must
// run and the port the tests, examples and docs default to.
var composeDefaults = []struct {
	service, image string
	port           int
	schemes        []string // URL schemes (and variables) that point at it
}{
	{"redis", "redis", 6379, []string{"redis", "rediss", "REDIS_ADDR"}},
	{"kafka", "apache/kafka", 9092, []string{"kafka", "KAFKA_BROKERS"}},
	{"rabbitmq", "rabbitmq", 5672, []string{"amqp", "amqps"}},
	{"nats", "nats", 4222, []string{"nats"}},
	{"postgres", "postgres", 5432, []string{"postgres", "postgresql"}},
	{"mariadb", "mariadb", 3306, []string{"mysql", "mariadb", "MYSQL_DSN"}},
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile("../docker-compose.yml")
	require.NoError(t, err)
	var c composeFile
	require.NoError(t, yaml.Unmarshal(raw, &c), "docker-compose.yml parses")
	return c
}

// published returns the host ports a service publishes on the same
// container port ("6379:6379", "127.0.0.1:6379:6379").
func published(ports []string) []int {
	var out []int
	for _, p := range ports {
		parts := strings.Split(strings.TrimSuffix(p, "/tcp"), ":")
		if len(parts) < 2 {
			continue
		}
		host, err1 := strconv.Atoi(parts[len(parts)-2])
		ctr, err2 := strconv.Atoi(parts[len(parts)-1])
		if err1 == nil && err2 == nil && host == ctr {
			out = append(out, host)
		}
	}
	return out
}

// docker-compose.yml must start, on the default ports, every server that the
// tests and examples use: Redis, Kafka in KRaft mode, RabbitMQ, NATS with
// JetStream, PostgreSQL and MariaDB.
func TestComposeServicesMatchDefaults(t *testing.T) {
	c := readCompose(t)
	for _, d := range composeDefaults {
		s, ok := c.Services[d.service]
		if !assert.True(t, ok, "service %s is missing", d.service) {
			continue
		}
		image, _, _ := strings.Cut(s.Image, ":")
		assert.Equal(t, d.image, image, "service %s runs image %s", d.service, s.Image)
		assert.Contains(t, published(s.Ports), d.port, "service %s publishes %d on the same host port", d.service, d.port)
	}

	nats := c.Services["nats"]
	assert.Contains(t, nats.Command, "-js", "NATS runs with JetStream, which the NATS backend requires")

	kafka := c.Services["kafka"].Environment
	roles := strings.Split(kafka["KAFKA_PROCESS_ROLES"], ",")
	assert.ElementsMatch(t, []string{"broker", "controller"}, roles, "Kafka is a single KRaft node (no ZooKeeper)")
	assert.Contains(t, kafka["KAFKA_ADVERTISED_LISTENERS"], "localhost:9092",
		"Kafka advertises the address clients on the host dial (KAFKA_BROKERS=localhost:9092)")
	assert.Equal(t, "1", kafka["KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR"], "a single node can hold one replica of __consumer_offsets")

	rabbit := c.Services["rabbitmq"].Environment
	assert.Equal(t, "guest", rabbit["RABBITMQ_DEFAULT_USER"], "the default AMQP URL logs in as guest")
	assert.Equal(t, "guest", rabbit["RABBITMQ_DEFAULT_PASS"])

	// PG_URL's default logs in as a user without a password, to a database
	// that must exist: the image creates it and trusts every login.
	pgURL, err := url.Parse(testserver.DefaultPostgresURL)
	require.NoError(t, err)
	_, hasPassword := pgURL.User.Password()
	assert.False(t, hasPassword, "PG_URL's default has no password")
	pg := c.Services["postgres"].Environment
	assert.Equal(t, "trust", pg["POSTGRES_HOST_AUTH_METHOD"], "PG_URL's default (%s) logs in without a password", testserver.DefaultPostgresURL)
	assert.Equal(t, strings.TrimPrefix(pgURL.Path, "/"), pg["POSTGRES_DB"], "the image creates PG_URL's database")
	if user := pg["POSTGRES_USER"]; user != "" {
		assert.Equal(t, pgURL.User.Username(), user, "PG_URL's user is the image's superuser")
	} else {
		assert.Equal(t, "postgres", pgURL.User.Username(), "PG_URL's user is the image's default superuser")
	}

	// MYSQL_DSN's default logs in as root without a password, to a database
	// that must exist: the image allows the empty root password and creates
	// the database.
	my, err := mysql.ParseDSN(testserver.DefaultMySQLDSN)
	require.NoError(t, err)
	assert.Equal(t, "root", my.User, "MYSQL_DSN's default logs in as the image's root")
	assert.Empty(t, my.Passwd, "MYSQL_DSN's default has no password")
	maria := c.Services["mariadb"].Environment
	assert.Equal(t, "1", maria["MARIADB_ALLOW_EMPTY_ROOT_PASSWORD"], "MYSQL_DSN's default (%s) logs in without a password", testserver.DefaultMySQLDSN)
	assert.Equal(t, my.DBName, maria["MARIADB_DATABASE"], "the image creates MYSQL_DSN's database")
	_, port, err := net.SplitHostPort(my.Addr)
	require.NoError(t, err)
	assert.Contains(t, published(c.Services["mariadb"].Ports), mustAtoi(t, port), "MYSQL_DSN's default port is published")
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	require.NoError(t, err)
	return n
}

// brokerAddr matches a loopback broker or database address in code and
// docs: scheme://[user[:pass]@]host:port, or VAR=host:port and "VAR",
// "host:port" for REDIS_ADDR and KAFKA_BROKERS.
var brokerAddr = regexp.MustCompile(`\b(kafka|rediss?|amqps?|nats|postgres(?:ql)?|mysql|mariadb)://(?:[^@/\s"]*@)?(?:localhost|127\.0\.0\.1):(\d+)` +
	`|\b(REDIS_ADDR|KAFKA_BROKERS)(?:=|", ")(?:localhost|127\.0\.0\.1):(\d+)` +
	`|@(tcp)\((?:localhost|127\.0\.0\.1):(\d+)\)`)

// Every loopback broker or PostgreSQL address written in the repository's
// code and docs
// (examples, README, package docs, test-server defaults; not tests) points
// at a port that docker-compose.yml publishes for that broker.
func TestComposePortsMatchDocsAndExamples(t *testing.T) {
	c := readCompose(t)
	portsOf := map[string][]int{}
	for _, d := range composeDefaults {
		for _, s := range d.schemes {
			portsOf[s] = published(c.Services[d.service].Ports)
		}
	}
	found := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") && path != ".." || d.Name() == "e2e" || d.Name() == "vendor") {
			return filepath.SkipDir
		}
		// Tests are left out: parser tests spell arbitrary ports on purpose.
		if d.IsDir() || strings.HasSuffix(path, "_test.go") || !(strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".md")) {
			return nil
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range brokerAddr.FindAllStringSubmatch(string(raw), -1) {
			scheme, port := m[1], m[2]
			switch {
			case m[3] != "":
				scheme, port = m[3], m[4]
			case m[5] != "":
				scheme, port = "MYSQL_DSN", m[6] // a go-sql-driver DSN
			}
			p, _ := strconv.Atoi(port)
			found[scheme+":"+port] = true
			assert.True(t, slices.Contains(portsOf[scheme], p), "%s: %s points at port %d, which docker-compose.yml does not publish for it",
				path, m[0], p)
		}
		return nil
	})
	require.NoError(t, err)
	// The walk must have seen the defaults, or it checked nothing.
	for _, want := range []string{"REDIS_ADDR:6379", "amqp:5672", "nats:4222", "kafka:9092", "postgres:5432", "mysql:3306", "MYSQL_DSN:3306"} {
		assert.True(t, found[want], "no file mentions %s; the scan is looking in the wrong place", want)
	}
}
