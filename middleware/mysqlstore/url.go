package mysqlstore

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// ErrInvalidURL is returned by ParseURL for a URL it cannot read.
var ErrInvalidURL = errors.New("mysqlstore: invalid mysql:// URL")

// ParseURL reads mysql:// or mariadb://user:password@host:port/database?param=value
// into the driver's configuration. The port defaults to 3306; parameters
// are as in a DSN.
func ParseURL(rawURL string) (*mysql.Config, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	if s := strings.ToLower(u.Scheme); s != "mysql" && s != "mariadb" {
		return nil, fmt.Errorf("%w: scheme %q, want mysql:// or mariadb://", ErrInvalidURL, u.Scheme)
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: %q names no host", ErrInvalidURL, rawURL)
	}
	// The driver parses the query; the rest is set as is: no DSN escaping.
	cfg, err := mysql.ParseDSN("/?" + u.RawQuery)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidURL, err)
	}
	if u.User != nil {
		cfg.User = u.User.Username()
		cfg.Passwd, _ = u.User.Password()
	}
	cfg.Net = "tcp"
	cfg.Addr = u.Host
	if u.Port() == "" {
		cfg.Addr = u.Host + ":3306"
	}
	cfg.DBName = strings.TrimPrefix(u.Path, "/")
	return cfg, nil
}
