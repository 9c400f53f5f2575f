package backends

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/idempotency/watermill-idempotency/backends/internal/brokerkit"
)

// brokerOf returns the broker that raw's scheme selects, linked or not.
func brokerOf(raw string) (brokerkit.Broker, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", fmt.Errorf("%w: empty broker URL (set %s to a URL of a broker this program links: %s; gochannel:// for one process)",
			ErrInvalidConfig, envURL, strings.Join(brokerkit.Linked(), ", "))
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return "", fmt.Errorf("%w: broker URL without scheme:// (want the URL of a broker this program links: %s)", ErrInvalidConfig, strings.Join(brokerkit.Linked(), ", "))
	}
	broker, ok := brokerByScheme[strings.ToLower(scheme)]
	if !ok {
		return "", fmt.Errorf("%w: unknown broker scheme %s (want kafka, redis, rediss, amqp, amqps, nats or gochannel)",
			ErrInvalidConfig, safeScheme(scheme))
	}
	return broker, nil
}

// parseEndpoint checks raw with the Driver of the broker it selects.
func parseEndpoint(raw string) (brokerkit.Endpoint, error) {
	broker, err := brokerOf(raw)
	if err != nil {
		return brokerkit.Endpoint{}, err
	}
	d, ok := brokerkit.Lookup(broker)
	if !ok {
		return brokerkit.Endpoint{}, notLinkedError{broker}
	}
	raw = strings.TrimSpace(raw)
	// go-redis and amqp091 take port 0 and up to 99999: check it for all.
	for _, h := range hosts(raw) {
		if _, port := splitPort(h); port != "" {
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
				return brokerkit.Endpoint{}, invalidURL(raw, "a bad port (want 1 to 65535)")
			}
		}
	}
	ep, err := d.ParseURL(raw)
	if err != nil {
		return brokerkit.Endpoint{}, invalidURL(raw, err.Error())
	}
	ep.Broker = broker
	return ep, nil
}

// invalidURL is an ErrInvalidConfig naming raw by its scheme and host only.
func invalidURL(raw, why string) error {
	return fmt.Errorf("%w: broker URL %s: %s", ErrInvalidConfig, where(raw), why)
}

var brokerByScheme = map[string]brokerkit.Broker{
	"kafka":     brokerkit.Kafka,
	"redis":     brokerkit.RedisStreams,
	"rediss":    brokerkit.RedisStreams,
	"amqp":      brokerkit.AMQP,
	"amqps":     brokerkit.AMQP,
	"nats":      brokerkit.NATS,
	"gochannel": brokerkit.GoChannel,
}

var importPath = map[brokerkit.Broker]string{
	brokerkit.Kafka:        "github.com/idempotency/watermill-idempotency/backends/kafkabackend",
	brokerkit.RedisStreams: "github.com/idempotency/watermill-idempotency/backends/redisbackend",
	brokerkit.AMQP:         "github.com/idempotency/watermill-idempotency/backends/amqpbackend",
	brokerkit.NATS:         "github.com/idempotency/watermill-idempotency/backends/natsbackend",
}

// notLinkedError is an ErrInvalidConfig naming the import to add.
type notLinkedError struct{ broker brokerkit.Broker }

func (e notLinkedError) Error() string {
	return fmt.Sprintf("backends: broker %q is not linked: import _ %q (this program links %s)",
		e.broker, importPath[e.broker], strings.Join(brokerkit.Linked(), ", "))
}

func (e notLinkedError) Unwrap() error { return ErrInvalidConfig }

var (
	schemeChars = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}$`)
	hostChars   = regexp.MustCompile(`^([A-Za-z0-9._%-]*|\[[0-9A-Za-z:.%]*\])$`)
	portChars   = regexp.MustCompile(`^[0-9]{1,5}$`)
)

// safeScheme quotes a scheme that reads as one, not a password, say.
func safeScheme(s string) string {
	if schemeChars.MatchString(s) {
		return strconv.Quote(s)
	}
	return "(not a scheme)"
}

// where shows a URL's scheme and host:port pairs only; a host or port that
// does not read as one (a password, maybe) is "…".
func where(raw string) string {
	scheme, _, ok := strings.Cut(strings.TrimSpace(raw), "://")
	if !ok || !schemeChars.MatchString(scheme) {
		return "the URL"
	}
	var shown []string
	for _, h := range hosts(raw) {
		host, port := splitPort(h)
		if !hostChars.MatchString(host) {
			host = "…"
		}
		switch {
		case port == "" && !strings.Contains(h, ":"):
		case portChars.MatchString(port):
			host += ":" + port
		default:
			host += ":…"
		}
		shown = append(shown, host)
	}
	return strconv.Quote(strings.ToLower(scheme) + "://" + strings.Join(shown, ","))
}

// hosts returns the host[:port] items after the last '@', before any '/?#'.
func hosts(raw string) []string {
	_, rest, _ := strings.Cut(strings.TrimSpace(raw), "://")
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	var list []string
	for _, h := range strings.Split(rest, ",") {
		list = append(list, strings.TrimSpace(h))
	}
	return list
}

// splitPort splits h at its last ':' outside IPv6 brackets.
func splitPort(h string) (host, port string) {
	if i := strings.LastIndex(h, ":"); i >= 0 && i > strings.LastIndex(h, "]") {
		return h[:i], h[i+1:]
	}
	return h, ""
}
