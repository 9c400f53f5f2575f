package grpcidem

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/idempotency/watermill-idempotency/middleware/grpcidem/internal/testpb"
)

// validKey is the rule every extracted key must satisfy: printable ASCII,
// not empty (a long key is stored hashed, never refused).
func validKey(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x20 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// FuzzKeyFromMetadata extracts the key from fuzzed metadata: one or two
// values under the configured name, and a value under a second configured
// name. It checks that extraction never panics, that a key it returns is
// valid and is one of the values sent, that a single valid value is taken
// as it is, and that two values, or two names that disagree, are refused.
func FuzzKeyFromMetadata(f *testing.F) {
	f.Add("k1", "", "", false)
	f.Add("k1", "k2", "", false)
	f.Add("k1", "k1", "", false)
	f.Add("k1", "", "k1", true)
	f.Add("k1", "", "k2", true)
	f.Add("", "", "", false)
	f.Add("k\x00", "", "", false)
	f.Add("clé", "", "", false)
	f.Add(strings.Repeat("k", 64), "", "", false)
	f.Add(strings.Repeat("k", 65), "", "", false)
	f.Add(" ~", "", " ~", true)
	f.Add("\x7f", "", "", false)
	f.Fuzz(func(t *testing.T, v1, v2, other string, withOther bool) {
		md := metadata.MD{}
		md.Append(defaultMetadata, v1)
		if v2 != "" {
			md.Append(defaultMetadata, v2)
		}
		if withOther {
			md.Append("x-request-key", other)
		}
		names := []string{defaultMetadata, "x-request-key"}
		key, source, err := extractKey(md, names, &testpb.ChargeRequest{}, defaultRequestField)
		again, _, err2 := extractKey(md, names, &testpb.ChargeRequest{}, defaultRequestField)
		if key != again || (err == nil) != (err2 == nil) {
			t.Fatalf("not deterministic: %q %v, then %q %v", key, err, again, err2)
		}
		if err != nil {
			if key != "" {
				t.Fatalf("key %q returned with error %v", key, err)
			}
			if !strings.HasPrefix(source, "metadata ") {
				t.Fatalf("error %v names no source: %q", err, source)
			}
			return
		}
		if !validKey(key) {
			t.Fatalf("invalid key %q accepted", key)
		}
		if key != v1 {
			t.Fatalf("key %q is not the value sent, %q", key, v1)
		}
		if v2 != "" {
			t.Fatalf("two values %q and %q accepted as %q", v1, v2, key)
		}
		if withOther && other != v1 {
			t.Fatalf("disagreeing names %q and %q accepted as %q", v1, other, key)
		}
	})
}

// FuzzKeyFromRequest extracts the key from a fuzzed request_id field of a
// real request message (read through protoreflect), alone or beside a
// metadata value. It checks that extraction never panics, that a returned
// key is valid and is the field's (or the metadata's, with an empty field),
// that the field and the metadata must agree, and that the request's
// fingerprint is stable and differs with the key field.
func FuzzKeyFromRequest(f *testing.F) {
	f.Add("rid-1", "", int64(1))
	f.Add("rid-1", "rid-1", int64(1))
	f.Add("rid-1", "rid-2", int64(1))
	f.Add("", "md-only", int64(2))
	f.Add("", "", int64(0))
	f.Add("k\x00", "", int64(1))
	f.Add("k\t", "", int64(1))
	f.Add("é", "", int64(1))
	f.Add(strings.Repeat("r", 256), "", int64(1))
	f.Add(strings.Repeat("r", 255), "", int64(-1))
	f.Fuzz(func(t *testing.T, field, mdValue string, amount int64) {
		if !utf8.ValidString(field) {
			// A proto3 string field holds UTF-8: grpc-go refuses to
			// decode anything else before any interceptor runs.
			return
		}
		req := &testpb.ChargeRequest{RequestId: field, Amount: amount}
		md := metadata.MD{}
		if mdValue != "" {
			md.Append(defaultMetadata, mdValue)
		}
		key, _, err := extractKey(md, []string{defaultMetadata}, req, defaultRequestField)
		switch {
		case err != nil:
			if key != "" {
				t.Fatalf("key %q returned with error %v", key, err)
			}
		case key == "":
			if field != "" || mdValue != "" {
				t.Fatalf("no key from field %q and metadata %q", field, mdValue)
			}
		case !validKey(key):
			t.Fatalf("invalid key %q accepted", key)
		case field != "" && key != field:
			t.Fatalf("key %q is not the field's %q", key, field)
		case field == "" && key != mdValue:
			t.Fatalf("key %q is not the metadata's %q", key, mdValue)
		case field != "" && mdValue != "" && field != mdValue:
			t.Fatalf("field %q and metadata %q disagree, yet %q accepted", field, mdValue, key)
		}

		fp1, err := fingerprint("/grpcidem.test.v1.Ledger/Charge", req)
		if err != nil {
			t.Fatal(err)
		}
		fp2, _ := fingerprint("/grpcidem.test.v1.Ledger/Charge", proto.Clone(req))
		if !bytes.Equal(fp1, fp2) {
			t.Fatalf("fingerprint of equal requests differs")
		}
		other, _ := fingerprint("/grpcidem.test.v1.Ledger/Charge", &testpb.ChargeRequest{RequestId: field + "x", Amount: amount})
		refund, _ := fingerprint("/grpcidem.test.v1.Ledger/Refund", req)
		if bytes.Equal(fp1, other) || bytes.Equal(fp1, refund) {
			t.Fatalf("fingerprint ignores the request or the method")
		}
	})
}

// FuzzDecodeAnswer decodes fuzzed stored answers: never a panic, and what
// decodes encodes to bytes that decode to the same answer.
func FuzzDecodeAnswer(f *testing.F) {
	msg, _, _ := encodeResponse(&testpb.ChargeReply{Run: 1, Key: "k"}, 1<<10)
	f.Add(msg)
	f.Add(storedAnswer{Kind: kindOmitted, Code: 5, Size: 1 << 21}.encode())
	f.Add([]byte{1, 2, 2, 8, 5})
	f.Add([]byte{1, 2, 0})
	f.Add([]byte{1, 9})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeAnswer(b)
		if err != nil {
			if !errors.Is(err, errBadRecord) {
				t.Fatalf("error %v is not errBadRecord", err)
			}
			return
		}
		if a.Kind == kindMessage {
			_, _ = a.message("")
		}
		back, err := decodeAnswer(a.encode())
		if err != nil {
			t.Fatalf("%x decodes to %+v, which does not decode again: %v", b, a, err)
		}
		if back.Kind != a.Kind || back.TypeName != a.TypeName || !bytes.Equal(back.Wire, a.Wire) ||
			back.Code != a.Code || back.Size != a.Size || !proto.Equal(back.Status, a.Status) {
			t.Fatalf("%x decodes to %+v, then to %+v", b, a, back)
		}
	})
}
