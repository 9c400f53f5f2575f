package backends_test

import (
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/memstore"
)

// secretURL builds a broker URL with secret planted in one position of its
// user information: the password, a token alone, the user name, or the
// password of a URL with several hosts.
func secretURL(scheme string, form uint8, user, secret, host, port, tail string) string {
	hostPort := host
	if port != "" {
		hostPort += ":" + port
	}
	var userinfo string
	switch form % 4 {
	case 0:
		userinfo = user + ":" + secret
	case 1:
		userinfo = secret
	case 2:
		userinfo = secret + ":" + user
	case 3:
		userinfo = user + ":" + secret
		hostPort += ",second-" + hostPort
	}
	return scheme + "://" + userinfo + "@" + hostPort + tail
}

var fuzzSchemes = []string{"kafka", "redis", "rediss", "amqp", "amqps", "nats", "gochannel", "pulsar", "NATS", "http"}

// fuzzOnce is an owner protocol with the default lease.
var fuzzOnce = func() *idempotency.Once {
	once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: memstore.New(nil)})
	if err != nil {
		panic(err)
	}
	return once
}()

// urlErrors returns the text of every error that CheckLease and Validate
// give for raw, joined.
func urlErrors(raw string) string {
	var texts []string
	if err := (backends.Config{URL: raw}).CheckLease(fuzzOnce); err != nil {
		texts = append(texts, err.Error())
	}
	if err := (backends.Config{URL: raw, Group: "g"}).Validate(); err != nil {
		texts = append(texts, err.Error())
	}
	return strings.Join(texts, "\n")
}

// FuzzParseURL plants a secret in each position of a broker URL's user
// information, with any characters around it, and checks that no error of
// CheckLease or Validate shows it, raw or percent-decoded. The seeds run in
// every go test; go test -fuzz=FuzzParseURL ./backends/ searches further.
func FuzzParseURL(f *testing.F) {
	for _, s := range []struct {
		scheme             uint8
		form               uint8
		user, secret, host string
		port, tail         string
	}{
		{5, 1, "", "s3cr3t-token", "host", "badport", ""},     // NATS token, bad port
		{5, 1, "", "s3cr3t-token", "host", "4222", "/x"},      // NATS token, a path
		{5, 0, "u", "s3cr3t/pw", "host", "4222", ""},          // '/' in a NATS password
		{3, 0, "guest", "pa/ss#w0rd", "rabbit", "5672", "/"},  // '/' and '#' in an AMQP password
		{3, 0, "guest", `pa"ss#w0rd`, "rabbit", "5672", "/"},  // '"' in an AMQP password
		{3, 0, "guest", "pa#ss", "rabbit", "notaport", "/"},   // AMQP, bad port
		{3, 0, "guest", "pa#ss", "rabbit", "70000", "/"},      // AMQP, port out of range
		{1, 0, "user", "hunter2", "cache", "65536", "/0"},     // Redis, port out of range
		{1, 0, "user", `hunt\er2`, "cache", "6379", "/0"},     // '\' in a Redis password
		{1, 0, "user", "hunter2", "cache", "6379", "/notadb"}, // a bad Redis database
		{1, 0, "user", "hunt/er2", "cache", "6379", "/0"},     // '/' in a Redis password
		{1, 0, "user", "hunt%zzer2", "cache", "6379", "/0"},   // a bad escape
		{1, 0, "user", "hunt%65r2", "cache", "6379", "/0?x=@"},
		{2, 2, "pw", "s3cr3tuser", "cache", "6380", "/0?bad_option=1"},
		{6, 0, "user", "pw1234", "x", "", ""},                  // gochannel://user:pw@x
		{0, 0, "user", "hunter2", "k1", "9092", ""},            // Kafka takes no credentials
		{0, 3, "user", "hunter2", "k1", "9092", ""},            // Kafka, two hosts
		{5, 3, "user", "hunter2", "n1", "x", ""},               // NATS, two hosts, bad port
		{7, 0, "user", "hunter2", "pulsar", "6650", ""},        // unknown scheme
		{9, 0, "user", "hunter2@more", "h", "80", "/p"},        // '@' in the password
		{4, 0, "user", "p@ss:w/o?r#d", "rabbit", "5671", "/v"}, // every separator
	} {
		f.Add(s.scheme, s.form, s.user, s.secret, s.host, s.port, s.tail)
	}
	f.Fuzz(func(t *testing.T, schemeIdx, form uint8, user, secret, host, port, tail string) {
		if len(strings.TrimSpace(secret)) < 4 {
			return // too short to tell from the text around it
		}
		scheme := fuzzSchemes[int(schemeIdx)%len(fuzzSchemes)]
		raw := secretURL(scheme, form, user, secret, host, port, tail)
		// A secret that is also part of what may be shown (the scheme, the
		// host, the port), or of the fixed text of the messages, proves
		// nothing: the same URL with a plain placeholder for the secret
		// tells.
		placeholder := urlErrors(secretURL(scheme, form, user, "qzqzqzqzqz", host, port, tail))
		got := urlErrors(raw)
		// What an error may show: the scheme and the host part (after the
		// last '@', up to a path, query or fragment), quoted.
		hostPart := raw[strings.LastIndex(raw, "@")+1:]
		if i := strings.IndexAny(hostPart, "/?#"); i >= 0 {
			hostPart = hostPart[:i]
		}
		shown := strconv.Quote(strings.ToLower(scheme) + "://" + hostPart)
		for _, s := range []string{secret, unescaped(secret)} {
			if len(strings.TrimSpace(s)) < 4 || strings.Contains(placeholder, s) || strings.Contains(shown, s) {
				continue
			}
			if strings.Contains(got, s) {
				t.Fatalf("the error for %q shows the secret %q:\n%s", raw, s, got)
			}
		}
	})
}

// unescaped is s percent-decoded, as a URL parser would read it.
func unescaped(s string) string {
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// New's errors, which quote what the client libraries say, show no secret
// either: nats.go parses each server URL again and quotes the one it
// rejects, so a ',' in a password (which it splits at) is refused before.
func TestNew_ErrorHidesSecrets(t *testing.T) {
	t.Parallel()
	natsAddr := strings.TrimPrefix(testserver.NATSURL(t), "nats://")
	amqpURL := testserver.RabbitMQURL(t)
	amqpHost := amqpURL[strings.LastIndex(amqpURL, "@")+1:]
	for _, raw := range []string{
		"nats://user:s3cr3t,pw@" + natsAddr,
		"nats://s3cr3t-token,x@" + natsAddr,
		"amqp://guest:s3cr3t-pw@" + amqpHost,
		"nats://user:s3cr3t@127.0.0.1:1",
	} {
		_, err := backends.New(backends.Config{URL: raw, Group: "g", DialTimeout: 3 * time.Second}, nil)
		require.Error(t, err, raw)
		assert.NotContains(t, err.Error(), "s3cr3t", raw)
	}
}
