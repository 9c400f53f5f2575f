package httpidem

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseKey(t *testing.T) {
	cases := []struct {
		in      string
		want    string
		wantErr error
	}{
		{in: "k1", want: "k1"},
		{in: "8e03978e-40d5-43e8-bc93-6894a57f9324", want: "8e03978e-40d5-43e8-bc93-6894a57f9324"},
		{in: `"8e03978e"`, want: "8e03978e"},
		{in: `"a\"b\\c"`, want: `a"b\c`},
		{in: `a"b`, want: `a"b`},
		{in: " spaced key ", want: " spaced key "},
		{in: strings.Repeat("x", 255), want: strings.Repeat("x", 255)},
		{in: `"` + strings.Repeat("x", 255) + `"`, want: strings.Repeat("x", 255)},
		{in: "", wantErr: errKeyEmpty},
		{in: `""`, wantErr: errKeyEmpty},
		{in: strings.Repeat("x", 1000), want: strings.Repeat("x", 1000)}, // stored hashed
		{in: `"` + strings.Repeat("x", 1000) + `"`, want: strings.Repeat("x", 1000)},
		{in: "tab\there", wantErr: errKeyNotPrint},
		{in: "nul\x00", wantErr: errKeyNotPrint},
		{in: "del\x7f", wantErr: errKeyNotPrint},
		{in: "é", wantErr: errKeyNotPrint},
		{in: `"open`, wantErr: errKeyQuote},
		{in: `"`, wantErr: errKeyQuote},
		{in: `"a"b"`, wantErr: errKeyQuote},
		{in: `"a\b"`, wantErr: errKeyQuote},
		{in: `"a\"`, wantErr: errKeyQuote},
		{in: `"a";p=1`, wantErr: errKeyQuote},
		{in: "\"\x01\"", wantErr: errKeyQuote},
		{in: "k1,k2", wantErr: errKeyComma},
		{in: "k1, k2", wantErr: errKeyComma},
		{in: ",", wantErr: errKeyComma},
		{in: `a"b,c`, wantErr: errKeyComma},
		{in: `"k1,k2"`, want: "k1,k2"},
		{in: `","`, want: ","},
		{in: `"k1", "k2"`, wantErr: errKeyQuote},
	}
	for _, tc := range cases {
		got, err := parseKey(tc.in)
		if tc.wantErr != nil {
			assert.ErrorIs(t, err, tc.wantErr, "%q", tc.in)
			continue
		}
		require.NoError(t, err, "%q", tc.in)
		assert.Equal(t, tc.want, got, "%q", tc.in)
	}
}

func TestStoreKeyUnambiguous(t *testing.T) {
	pairs := [][2]string{
		{"a:b", "c"}, {"a", "b:c"}, {"", "a:b:c"}, {"a:b:c", ""}, {"1:a", "b"}, {"1", "a:b"},
		{"", "1:a:b"}, {"10", ""}, {"1", "0:"}, {"\x00", "x"}, {"", "\x00x"},
	}
	seen := map[string][2]string{}
	for _, p := range pairs {
		k := storeKey("p", p[0], p[1])
		if prev, dup := seen[k]; dup {
			t.Errorf("scope %q key %q and scope %q key %q share stored key %q", prev[0], prev[1], p[0], p[1], k)
		}
		seen[k] = p
	}
	// The documented form: prefix, a colon, 32 hex digits of SHA-256(scope),
	// a colon, the key.
	assert.Equal(t, "httpidem:2bd806c97f0e00af1a1fc3328fa763a9:k1", storeKey(defaultKeyPrefix, "alice", "k1"))
	assert.Equal(t, "p:e3b0c44298fc1c149afbf4c8996fb924:k1", storeKey("p", "", "k1"))
}

// TestStoreKeyHidesScope: a scope that is a secret (an API key) never
// appears in a stored key.
func TestStoreKeyHidesScope(t *testing.T) {
	const secret = "sk_live_4eC39HqLyjWDarjtT1zdp7dc"
	k := storeKey(defaultKeyPrefix, secret, "order-42")
	assert.NotContains(t, k, secret)
	assert.NotContains(t, k, secret[:8])
	assert.True(t, strings.HasSuffix(k, ":order-42"), k)
	assert.Len(t, k, len(defaultKeyPrefix)+1+32+1+len("order-42"))
}

func TestFingerprint(t *testing.T) {
	req := func(method, target, body string) []byte {
		return fingerprint(httptest.NewRequest(method, target, nil), []byte(body))
	}
	base := req("POST", "/pay", "{}")
	assert.Len(t, base, 32)
	assert.Equal(t, base, req("POST", "/pay", "{}"))
	for name, other := range map[string][]byte{
		"method": req("PATCH", "/pay", "{}"),
		"path":   req("POST", "/pay/", "{}"),
		"query":  req("POST", "/pay?a=1", "{}"),
		"body":   req("POST", "/pay", "{ }"),
		"shift":  req("POST", "/pa", "y{}"),
	} {
		assert.NotEqual(t, base, other, name)
	}
}

func TestResponseRoundTrip(t *testing.T) {
	cases := []storedResponse{
		{Status: 201, Header: http.Header{"Content-Type": {"application/json"}, "X-Multi": {"a", "b"}, "X-Empty": {""}},
			Body: []byte(`{"id":"pay_1"}`)},
		{Status: 204, Header: http.Header{}, Body: []byte{}},
		{Status: 200, Header: http.Header{"Content-Type": {}}, Body: bytes.Repeat([]byte{0, 1, 0xff}, 1000)},
		{Status: 201, Header: http.Header{"Location": {"/x"}}, BodyOmitted: true, BodySize: 5 << 20},
	}
	for _, c := range cases {
		if !c.BodyOmitted {
			c.BodySize = int64(len(c.Body))
		}
		enc := c.encode()
		got, err := decodeResponse(enc)
		require.NoError(t, err)
		assert.Equal(t, c, got)
		assert.Equal(t, enc, got.encode(), "encoding is deterministic")
	}
}

func TestDecodeRejects(t *testing.T) {
	good := storedResponse{Status: 201, Header: http.Header{"A": {"b"}}, Body: []byte("body")}.encode()
	for i := range len(good) {
		_, err := decodeResponse(good[:i])
		assert.ErrorIs(t, err, errBadRecord, "truncated to %d bytes", i)
	}
	_, err := decodeResponse(append(bytes.Clone(good), 0))
	assert.ErrorIs(t, err, errBadRecord, "trailing byte")
	bad := bytes.Clone(good)
	bad[0] = 2
	_, err = decodeResponse(bad)
	assert.ErrorIs(t, err, errBadRecord, "unknown version")
	bad = bytes.Clone(good)
	bad[1] = 0x80
	_, err = decodeResponse(bad)
	assert.ErrorIs(t, err, errBadRecord, "unknown flag")
	_, err = decodeResponse(storedResponse{Status: 42, Header: http.Header{}}.encode())
	assert.ErrorIs(t, err, errBadRecord, "status below 100")
}

func FuzzDecodeResponse(f *testing.F) {
	f.Add(storedResponse{Status: 201, Header: http.Header{"A": {"b", "c"}}, Body: []byte("body")}.encode())
	f.Add(storedResponse{Status: 201, BodyOmitted: true, BodySize: 1 << 40}.encode())
	f.Add([]byte{1, 0, 0xc9, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := decodeResponse(b)
		if err != nil {
			return
		}
		again, err := decodeResponse(s.encode())
		require.NoError(t, err)
		require.Equal(t, s, again)
	})
}
