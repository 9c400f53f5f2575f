package backends

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// ParseURL returns a Config that selects the broker rawURL names, after
// checking the URL as Validate does. Group and the other fields are left
// zero. A URL of a broker whose package the program does not import is an
// ErrBrokerNotLinked: its Driver checks the URL.
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

// brokerOf returns the broker that raw's scheme selects, linked or not.
func brokerOf(raw string) (Broker, error) {
	raw = strings.TrimSpace(raw)
	if raw == "" {
		return "", fmt.Errorf("%w: empty (set %s to a URL of a broker this program links: %s; gochannel:// for one process)",
			ErrInvalidURL, EnvURL, brokerNames(Linked()))
	}
	scheme, _, ok := strings.Cut(raw, "://")
	if !ok {
		return "", fmt.Errorf("%w: no scheme:// (want the URL of a broker this program links: %s)", ErrInvalidURL, brokerNames(Linked()))
	}
	broker, ok := brokerByScheme[strings.ToLower(scheme)]
	if !ok {
		return "", fmt.Errorf("%w: scheme %s (want kafka, redis, rediss, amqp, amqps, nats or gochannel)",
			ErrUnknownBroker, safeScheme(scheme))
	}
	return broker, nil
}

// parseEndpoint checks raw with the Driver of the broker it selects.
func parseEndpoint(raw string) (Endpoint, error) {
	broker, err := brokerOf(raw)
	if err != nil {
		return Endpoint{}, err
	}
	d, err := driverFor(broker)
	if err != nil {
		return Endpoint{}, err
	}
	raw = strings.TrimSpace(raw)
	// For every broker alike, before its Driver: go-redis and amqp091 take
	// 0 and any port up to 99999. No port means the broker's default.
	for _, h := range hosts(raw) {
		if _, port := splitPort(h); port != "" {
			if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
				return Endpoint{}, invalidURL(raw, "a bad port (want 1 to 65535)")
			}
		}
	}
	ep, err := d.ParseURL(raw)
	if err != nil {
		return Endpoint{}, invalidURL(raw, err.Error())
	}
	ep.Broker = broker
	return ep, nil
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

// hosts returns the host[:port] items of raw's host part, trimmed: after
// the user information, which ends at the last '@', up to a path, query or
// fragment, split at ','.
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

// splitPort splits h at its last ':' outside an IPv6 address's brackets;
// port is empty when there is none.
func splitPort(h string) (host, port string) {
	if i := strings.LastIndex(h, ":"); i >= 0 && i > strings.LastIndex(h, "]") {
		return h[:i], h[i+1:]
	}
	return h, ""
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
