package brokerkit

import (
	"errors"
	"net"
	"net/url"
	"strings"
)

// The URL parsers below return errors whose text says what is wrong and
// quotes nothing of the URL: package backends wraps them as an
// ErrInvalidConfig that names the URL by its scheme and host alone.

// CheckAuthority rejects a URL with an '@' after the end of its host part:
// a user name or password holding an unescaped '/', '?' or '#', which URL
// parsers then read as the start of the path, and part of the password as
// the host, the port or the path, where an error message or a dial would
// show it.
func CheckAuthority(raw string) error {
	_, rest, _ := strings.Cut(raw, "://")
	if i := strings.IndexAny(rest, "/?#"); i >= 0 && strings.Contains(rest[i:], "@") {
		return errors.New("an '@' after a '/', '?' or '#': percent-encode '/', '?', '#' and '@' " +
			"in user names and passwords (%2F, %3F, %23, %40)")
	}
	return nil
}

// HostList parses scheme://[user:pass@]host[:port][,host[:port]...], the
// form Kafka and NATS take, filling defPort where a host has none, and
// returns the URL of each host (user information included) joined with
// ',', which nats.Connect takes, and the host:port pairs. A URL with user
// information is refused unless userinfo is set, with noUserinfo as the
// reason. It splits by hand: net/url rejects a host list whose last host
// has no port.
func HostList(raw, defPort string, userinfo bool, noUserinfo string) (urls string, addrs []string, err error) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(raw), "://")
	// The user information ends at the last '@' (a token or password
	// written with an unescaped '/', '#' or '?' is refused below, but never
	// shown); whatever precedes it is never shown.
	var info string
	if i := strings.LastIndex(rest, "@"); i >= 0 {
		info, rest = rest[:i], rest[i+1:]
		if !userinfo {
			return "", nil, errors.New(noUserinfo)
		}
		if strings.Contains(info, ",") {
			// nats.Connect splits its URL at every ',' and would read part
			// of the password as a server.
			return "", nil, errors.New("a ',' in the user name or password: percent-encode it (%2C)")
		}
	}
	authority, tail := rest, ""
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authority, tail = rest[:i], rest[i:]
	}
	if tail != "" && tail != "/" {
		return "", nil, errors.New(strings.ToLower(scheme) + " takes only host:port pairs and the parameters of its backend: no path, other query or fragment")
	}
	var list []string
	for _, h := range strings.Split(authority, ",") {
		h = strings.TrimSpace(h)
		if h == "" {
			return "", nil, errors.New("an empty host")
		}
		host, port, err := net.SplitHostPort(h)
		if err != nil {
			// No port, or a bare IPv6 address in brackets.
			host, port = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]"), defPort
		}
		if host == "" || strings.ContainsAny(host, " []@:") && !strings.Contains(h, "[") {
			return "", nil, errors.New("a bad host")
		}
		if port == "" {
			port = defPort // package backends checked the others
		}
		addr := net.JoinHostPort(host, port)
		addrs = append(addrs, addr)
		u := strings.ToLower(scheme) + "://"
		if info != "" {
			u += info + "@"
		}
		u += addr
		// nats.Connect parses each URL with net/url: user information it
		// reads otherwise (an unescaped '/', '?' or '#' ends it early, a
		// bad escape fails) would make it take part of a password for the
		// host or the port, and quote it in its error.
		if parsed, err := url.Parse(u); err != nil || parsed.Host != addr || parsed.User.String() == "" && info != "" {
			return "", nil, errors.New("the user name or password does not parse: percent-encode '/', '?', " +
				"'#', '@' and '%' in it (%2F, %3F, %23, %40, %25)")
		}
		list = append(list, u)
	}
	return strings.Join(list, ","), addrs, nil
}
