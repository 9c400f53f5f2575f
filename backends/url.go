package backends

import (
	"fmt"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// ParseURL returns a Config that selects the broker rawURL names, after
// checking the URL as Validate does. Group and the other fields are left
// zero.
//
// Its errors, like every error of this package, name the URL's scheme and
// host alone: never the URL itself, its user information (a user name, a
// password or a token), its path or query, or the text of a client library's
// parse error, which may quote any of them.
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
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return endpoint{}, fmt.Errorf("%w: no scheme:// (want e.g. kafka://localhost:9092)", ErrInvalidURL)
	}
	broker, ok := brokerByScheme[strings.ToLower(scheme)]
	if !ok {
		return endpoint{}, fmt.Errorf("%w: scheme %s (want kafka, redis, rediss, amqp, amqps, nats or gochannel)",
			ErrUnknownBroker, safeScheme(scheme))
	}
	switch broker {
	case Kafka:
		return parseHostList(Kafka, raw, "9092")
	case RedisStreams:
		if err := checkAuthority(raw, rest); err != nil {
			return endpoint{}, err
		}
		opts, err := redis.ParseURL(raw)
		if err != nil {
			// The parser's text may quote the password: never pass it on.
			return endpoint{}, invalidURL(raw, "go-redis cannot parse it: check the host, the port, the database number "+
				"(a number after the /) and the options (go-redis URL options only)")
		}
		return endpoint{broker: RedisStreams, url: raw, addrs: []string{opts.Addr}}, nil
	case AMQP:
		if err := checkAuthority(raw, rest); err != nil {
			return endpoint{}, err
		}
		uri, err := amqp091.ParseURI(raw)
		if err != nil {
			return endpoint{}, invalidURL(raw, "amqp091 cannot parse it: check the host, the port and the options")
		}
		return endpoint{broker: AMQP, url: raw, addrs: []string{net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port))}}, nil
	case NATS:
		return parseHostList(NATS, raw, "4222")
	default:
		if rest != "" && rest != "/" {
			return endpoint{}, invalidURL(raw, "gochannel takes nothing after gochannel://")
		}
		return endpoint{broker: GoChannel, url: raw}, nil
	}
}

// checkAuthority rejects a URL with an '@' after the end of its host part:
// a user name or password holding an unescaped '/', '?' or '#', which URL
// parsers then read as the start of the path, and part of the password as
// the host, the port or the path, where an error message or a dial would
// show it.
func checkAuthority(raw, rest string) error {
	if i := strings.IndexAny(rest, "/?#"); i >= 0 && strings.Contains(rest[i:], "@") {
		return invalidURL(raw, "an '@' after a '/', '?' or '#': percent-encode '/', '?', '#' and '@' "+
			"in user names and passwords (%2F, %3F, %23, %40)")
	}
	return nil
}

// parseHostList parses scheme://[user:pass@]host[:port][,host[:port]...], the
// form Kafka and NATS take, filling defPort where a host has none. It splits
// by hand: net/url rejects a host list whose last host has no port.
func parseHostList(b Broker, raw, defPort string) (endpoint, error) {
	scheme, rest, _ := strings.Cut(raw, "://")
	// The user information ends at the last '@' (a token or password
	// written with an unescaped '/', '#' or '?' is refused below, but never
	// shown); whatever precedes it is never shown.
	var userinfo string
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		userinfo, rest = rest[:i], rest[i+1:]
		if b == Kafka {
			return endpoint{}, invalidURL(raw, "put Kafka credentials in KafkaConfig.Tune (SASL), not in the URL")
		}
		if strings.Contains(userinfo, ",") {
			// nats.Connect splits its URL at every ',' and would read part
			// of the password as a server.
			return endpoint{}, invalidURL(raw, "a ',' in the user name or password: percent-encode it (%2C)")
		}
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if tail != "" && tail != "/" {
		return endpoint{}, invalidURL(raw, string(b)+" takes only host:port pairs, no path, query or fragment")
	}
	var addrs, urls []string
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return endpoint{}, invalidURL(raw, "an empty host")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port, or a bare IPv6 address in brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
		}
		if host == "" || strings.ContainsAny(host, " []@:") && !strings.Contains(h, "[") {
			return endpoint{}, invalidURL(raw, "a bad host")
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return endpoint{}, invalidURL(raw, "a bad port (want 1 to 65535)")
		}
		addr := net.JoinHostPort(host, port)
		addrs = append(addrs, addr)
		u := strings.ToLower(scheme) + "://"
		if userinfo != "" {
			u += userinfo + "@"
		}
		u += addr
		// nats.Connect parses each URL with net/url: user information it
		// reads otherwise (an unescaped '/', '?' or '#' ends it early, a
		// bad escape fails) would make it take part of a password for the
		// host or the port, and quote it in its error.
		if parsed, err := url.Parse(u); err != nil || parsed.Host != addr || parsed.User.String() == "" && userinfo != "" {
			return endpoint{}, invalidURL(raw, "the user name or password does not parse: percent-encode '/', '?', "+
				"'#', '@' and '%' in it (%2F, %3F, %23, %40, %25)")
		}
		urls = append(urls, u)
	}
	// nats.Connect takes a comma-separated list of full URLs.
	return endpoint{broker: b, url: strings.Join(urls, ","), addrs: addrs}, nil
}

// invalidURL is an ErrInvalidURL that names raw by its scheme and host only.
func invalidURL(raw, why string) error {
	return fmt.Errorf("%w: %s: %s", ErrInvalidURL, where(raw), why)
}

var (
	schemeChars = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,15}$`)
	hostChars   = regexp.MustCompile(`^([A-Za-z0-9._%-]*|\[[0-9A-Za-z:.%]*\])$`)
	portChars   = regexp.MustCompile(`^[0-9]{1,5}$`)
)

// safeScheme quotes a scheme that reads as one, and otherwise says there is
// none: text before "://" that is no scheme may be anything, a password
// included.
func safeScheme(s string) string {
	if schemeChars.MatchString(s) {
		return strconv.Quote(s)
	}
	return "(not a scheme)"
}

// where describes a broker URL for an error message: its scheme and the
// host:port pairs of its host part, nothing else. The user information,
// which ends at the last '@' since a password may hold '/', '#' or '?', is
// never shown, nor is the path or the query. A host or port that does not
// read as one (a password in a URL that lacks its '@' would be read as a
// host or a port) is shown as "…".
func where(raw string) string {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(raw), "://")
	if !ok || !schemeChars.MatchString(scheme) {
		return "the URL"
	}
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		rest = rest[i+1:]
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	var hosts []string
	for _, h := range strings.Split(rest, ",") {
		h = strings.TrimSpace(h)
		host, port := h, ""
		if i := strings.LastIndex(h, ":"); i >= 0 && i > strings.LastIndex(h, "]") {
			host, port = h[:i], h[i+1:]
		}
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
		hosts = append(hosts, host)
	}
	return strconv.Quote(strings.ToLower(scheme) + "://" + strings.Join(hosts, ","))
}

// scrubUserinfo replaces in text every occurrence of the user information
// of the URL (or URLs, comma-separated) raw, whole and split at ':', as
// written and percent-decoded, with "xxxxx".
func scrubUserinfo(text, raw string) string {
	var secrets []string
	for _, u := range strings.Split(raw, ",") {
		_, rest, ok := strings.Cut(u, "://")
		at := strings.LastIndex(rest, "@")
		if !ok || at < 0 {
			continue
		}
		userinfo := rest[:at]
		parts := append([]string{userinfo}, strings.Split(userinfo, ":")...)
		for _, p := range parts {
			secrets = append(secrets, p)
			if d, err := url.PathUnescape(p); err == nil {
				secrets = append(secrets, d)
			}
		}
	}
	// Longest first, so that a part does not break up its whole.
	slices.SortFunc(secrets, func(a, b string) int { return len(b) - len(a) })
	for _, s := range secrets {
		if s != "" {
			text = strings.ReplaceAll(text, s, "xxxxx")
		}
	}
	return text
}
