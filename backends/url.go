package backends

import (
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// ParseURL returns a Config that selects the broker rawURL names, after
// checking the URL as Validate does. Group and the other fields are left
// zero.
func ParseURL(rawURL string) (Config, error) {
	if _, err := parseEndpoint(rawURL); err != nil {
		return Config{}, err
	}
	return Config{URL: rawURL}, nil
}

// endpoint is a parsed Config.URL.
type endpoint struct {
	broker Broker
	// url is the URL handed to the broker's client library.
	url string
	// addrs are the host:port pairs the client dials, for reachability
	// checks and error messages.
	addrs []string
}

func parseEndpoint(raw string) (endpoint, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return endpoint{}, fmt.Errorf("%w: empty (set %s, e.g. kafka://localhost:9092)", ErrInvalidURL, EnvURL)
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("%w: %q has no scheme://", ErrInvalidURL, redact(raw))
	}
	broker, ok := brokerByScheme[strings.ToLower(scheme)]
	if !ok {
		return endpoint{}, fmt.Errorf("%w: scheme %q in %q (want kafka, redis, rediss, amqp, amqps, nats or gochannel)",
			ErrUnknownBroker, scheme, redact(raw))
	}
	switch broker {
	case Kafka:
		return parseHostList(Kafka, raw, "9092")
	case RedisStreams:
		opts, err := redis.ParseURL(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %s", ErrInvalidURL, redact(raw), scrub(raw, err))
		}
		return endpoint{broker: RedisStreams, url: raw, addrs: []string{opts.Addr}}, nil
	case AMQP:
		uri, err := amqp091.ParseURI(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %s", ErrInvalidURL, redact(raw), scrub(raw, err))
		}
		return endpoint{broker: AMQP, url: raw, addrs: []string{net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))}}, nil
	case NATS:
		return parseHostList(NATS, raw, "4222")
	default:
		u, err := url.Parse(raw)
		if err != nil {
			return endpoint{}, fmt.Errorf("%w: %q: %v", ErrInvalidURL, raw, err)
		}
		if u.Host != "" || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil {
			return endpoint{}, fmt.Errorf("%w: %q: gochannel takes nothing after gochannel://", ErrInvalidURL, raw)
		}
		return endpoint{broker: GoChannel, url: raw}, nil
	}
}

// parseHostList parses scheme://[user:pass@]host[:port][,host[:port]...], the
// form Kafka and NATS take, filling defPort where a host has none. It splits
// by hand: net/url rejects a host list whose last host has no port.
func parseHostList(b Broker, raw, defPort string) (endpoint, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if tail != "" && tail != "/" {
		return endpoint{}, fmt.Errorf("%w: %q: %s takes only host:port pairs, not %q", ErrInvalidURL, redact(raw), b, tail)
	}
	var userinfo string
	if i := strings.LastIndex(authority, "@"); i >= 0 {
		userinfo, authority = authority[:i], authority[i+1:]
		if b == Kafka {
			return endpoint{}, fmt.Errorf("%w: %q: put Kafka credentials in KafkaConfig.Tune (SASL), not in the URL", ErrInvalidURL, redact(raw))
		}
	}
	var addrs, urls []string
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return endpoint{}, fmt.Errorf("%w: %q: empty host", ErrInvalidURL, redact(raw))
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port, or a bare IPv6 address in brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
		}
		if host == "" || strings.ContainsAny(host, " []@:") && !strings.Contains(h, "[") {
			return endpoint{}, fmt.Errorf("%w: %q: bad host %q", ErrInvalidURL, redact(raw), h)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return endpoint{}, fmt.Errorf("%w: %q: bad port %q", ErrInvalidURL, redact(raw), port)
		}
		addr := net.JoinHostPort(host, port)
		addrs = append(addrs, addr)
		u := strings.ToLower(scheme) + "://"
		if userinfo != "" {
			u += userinfo + "@"
		}
		urls = append(urls, u+addr)
	}
	// nats.Connect takes a comma-separated list of full URLs.
	return endpoint{broker: b, url: strings.Join(urls, ","), addrs: addrs}, nil
}

// scrub returns err's text with the password of raw, which client libraries
// quote in their parse errors, hidden.
func scrub(raw string, err error) string {
	if r := redact(raw); r != raw {
		return strings.ReplaceAll(err.Error(), raw, r)
	}
	return err.Error()
}

// redact hides a password in a URL meant for an error message.
func redact(raw string) string {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return raw
	}
	end := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		end = i
	}
	at := strings.LastIndex(rest[:end], "@")
	if at < 0 {
		return raw
	}
	user, _, hasPass := strings.Cut(rest[:at], ":")
	if !hasPass {
		return raw
	}
	return scheme + "://" + user + ":xxxxx" + rest[at:]
}
