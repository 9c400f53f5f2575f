package httpidem

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idempotency/watermill-idempotency/middleware/internal/adapter"
)

// What is wrong with a key, besides adapter.CheckKey's rules.
var (
	errKeyQuote = errors.New("is not a valid quoted string")
	errKeyComma = errors.New("contains a comma outside a quoted string")
)

// parseKey returns the key of the header value v: as sent, or unquoted
// when it starts with a double quote (an RFC 8941 sf-string). An unquoted
// value holds no comma: proxies join repeated header lines with commas.
func parseKey(v string) (string, error) {
	if strings.HasPrefix(v, `"`) {
		k, ok := unquoteSFString(v)
		if !ok {
			return "", errKeyQuote
		}
		v = k
	} else if strings.IndexByte(v, ',') >= 0 {
		return "", errKeyComma
	}
	if err := adapter.CheckKey(v); err != nil {
		return "", err
	}
	return v, nil
}

// unquoteSFString decodes an RFC 8941 sf-string, without parameters.
func unquoteSFString(v string) (string, bool) {
	if len(v) < 2 || v[0] != '"' || v[len(v)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	for i := 1; i < len(v)-1; i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i >= len(v)-1 || (v[i] != '"' && v[i] != '\\') {
				return "", false
			}
			b.WriteByte(v[i])
		case c == '"':
			return "", false
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// fingerprintVersion changes whenever the fingerprint's input changes.
const fingerprintVersion = 1

// fingerprint hashes the method, the escaped path, the raw query and the
// SHA-256 of the body.
func fingerprint(r *http.Request, body []byte) []byte {
	bodySum := sha256.Sum256(body)
	return adapter.Fingerprint(fingerprintVersion, []byte(r.Method), []byte(r.URL.EscapedPath()), []byte(r.URL.RawQuery), bodySum[:])
}

// describeKeyError says what is wrong with a key, for a problem detail.
func describeKeyError(header string, err error) string {
	switch {
	case errors.Is(err, adapter.ErrKeyNotPrintable):
		return fmt.Sprintf("The %s header must hold printable ASCII characters only (0x20 to 0x7E).", header)
	case errors.Is(err, errKeyQuote):
		return fmt.Sprintf("The %s header starts with a double quote but is not a valid quoted string.", header)
	case errors.Is(err, errKeyComma):
		return fmt.Sprintf("The %s header holds a comma, which may join two header lines: send the key once, and quote it (\"a,b\") if the comma is part of it.", header)
	default:
		return fmt.Sprintf("The %s header is empty.", header)
	}
}
