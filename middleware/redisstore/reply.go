package redisstore

import (
	"bytes"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// corruptPrefix starts the error reply of a script that found a value which
// is not a record (prelude.lua). Redis passes it through EVALSHA as the
// error's code, and go-redis neither retries such a reply nor drops the
// connection over it.
const corruptPrefix = "IDEMPOTENCY_CORRUPT "

// scriptError translates an error of a script call: a corrupt record becomes
// idempotency.ErrCorruptRecord with the script's reason; anything else (a
// network error, a cancelled context) is wrapped as callError wraps it.
func scriptError(ctx context.Context, op, key string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if reason, ok := strings.CutPrefix(rerr.Error(), corruptPrefix); ok {
			return wrap(op, key, fmt.Errorf("%w: %s", idempotency.ErrCorruptRecord, reason))
		}
	}
	return callError(ctx, op, key, err)
}

// errFull is the error of a call that a full Redis refused: its used
// memory is above maxmemory, and under noeviction (see the package
// documentation) it writes nothing until memory is freed or added.
var errFull = errors.New("the Redis is full (used memory above maxmemory), nothing was written")

// callError wraps an error of a client call made under ctx. go-redis bounds
// a call's socket I/O by ctx's deadline (ContextTimeoutEnabled, which New
// requires) but reports that deadline as the socket's "i/o timeout", which
// errors.Is does not match with context.DeadlineExceeded; the context's
// error is added to it, so that the caller sees a call its own deadline cut
// short as such. A timeout of the client's ReadTimeout or WriteTimeout,
// before ctx's deadline, stays a plain network error. A full Redis's
// refusal (OOM) says so (errFull).
func callError(ctx context.Context, op, key string, err error) error {
	if isFull(err) {
		return wrap(op, key, fmt.Errorf("%w: %w", errFull, err))
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || !errors.Is(err, os.ErrDeadlineExceeded) {
		return wrap(op, key, err)
	}
	// The socket's deadline was ctx's; ctx's own timer may fire a moment
	// after the socket's, so the deadline is compared as well as Err read.
	if deadline, ok := ctx.Deadline(); ok && (ctx.Err() != nil || !time.Now().Before(deadline)) {
		return wrap(op, key, fmt.Errorf("%w: %w", context.DeadlineExceeded, err))
	}
	return wrap(op, key, err)
}

// malformed reports a script reply that does not have the documented
// layout: a bug or a version mismatch, never a state of the record.
func malformed(what string) error {
	return fmt.Errorf("malformed script reply: %s", what)
}

// parseClaim reads claim.lua's reply: {acquired} followed by a record.
func parseClaim(v []any) (idempotency.ClaimResult, error) {
	if len(v) == 0 {
		return idempotency.ClaimResult{}, malformed("empty claim reply")
	}
	acquired, ok := v[0].(int64)
	if !ok || (acquired != 0 && acquired != 1) {
		return idempotency.ClaimResult{}, malformed(fmt.Sprintf("acquired flag %#v", v[0]))
	}
	rec, err := parseRecord(v[1:])
	if err != nil {
		return idempotency.ClaimResult{}, err
	}
	if acquired == 1 && rec.State != idempotency.StateInProgress {
		return idempotency.ClaimResult{}, malformed("acquired a record that is not in progress")
	}
	return idempotency.ClaimResult{Acquired: acquired == 1, Record: rec}, nil
}

// parseRecord reads a record as prelude.lua's reply() lays it out:
// {state, attempts, created, updated, lease, fingerprint, result, token}.
// Every field must have its type and range; nothing defaults to zero.
func parseRecord(v []any) (idempotency.Record, error) {
	var rec idempotency.Record
	if len(v) != 8 {
		return rec, malformed(fmt.Sprintf("record of %d fields, want 8", len(v)))
	}
	state, err := replyString(v, 0)
	if err != nil {
		return rec, err
	}
	ints := make([]int64, 4) // attempts, created, updated, lease
	for i := range ints {
		if ints[i], err = replyInt(v, 1+i); err != nil {
			return rec, err
		}
	}
	attempts, created, updated, lease := ints[0], ints[1], ints[2], ints[3]
	fp, err := replyString(v, 5)
	if err != nil {
		return rec, err
	}
	result, err := replyString(v, 6)
	if err != nil {
		return rec, err
	}
	token, err := replyString(v, 7)
	if err != nil {
		return rec, err
	}
	switch {
	case attempts < 1:
		return rec, malformed(fmt.Sprintf("attempts %d", attempts))
	case created < 1 || updated < created:
		return rec, malformed(fmt.Sprintf("times created %d, updated %d", created, updated))
	case lease < 0:
		return rec, malformed(fmt.Sprintf("lease deadline %d", lease))
	}
	rec.Attempts = int(attempts)
	rec.CreatedAt = time.UnixMilli(created)
	rec.UpdatedAt = time.UnixMilli(updated)
	if lease > 0 {
		rec.LeaseExpiresAt = time.UnixMilli(lease)
	}
	if fp != "" {
		rec.Fingerprint = []byte(fp)
	}
	switch state {
	case "P":
		if lease == 0 || result != "" {
			return rec, malformed("in progress without a lease, or with a result")
		}
		rec.State = idempotency.StateInProgress
		rec.Token = token
	case "F":
		if token != "" || result != "" {
			return rec, malformed("failed with a token or a result")
		}
		rec.State = idempotency.StateFailed
	case "C":
		if token != "" || lease != 0 {
			return rec, malformed("completed with a token or a lease")
		}
		rec.State = idempotency.StateCompleted
		rec.Result = []byte(result) // non-nil even when empty
	default:
		return rec, malformed(fmt.Sprintf("state %q", state))
	}
	return rec, nil
}

func replyInt(v []any, i int) (int64, error) {
	n, ok := v[i].(int64)
	if !ok {
		return 0, malformed(fmt.Sprintf("field %d: %#v is not an integer", i, v[i]))
	}
	return n, nil
}

func replyString(v []any, i int) (string, error) {
	s, ok := v[i].(string)
	if !ok {
		return "", malformed(fmt.Sprintf("field %d: %#v is not a string", i, v[i]))
	}
	return s, nil
}

// acquiredFresh is the result of a claim that installed attempt 1 of a new
// record on an absent key at time at (ms precision): the server's clock
// for claimfast.lua, which reads it; the client's at the send for the plain
// claim, which cannot (see the package documentation, Claim).
func acquiredFresh(at time.Time, leaseMillis int64, req idempotency.ClaimRequest) idempotency.ClaimResult {
	at = at.Truncate(time.Millisecond)
	rec := idempotency.Record{State: idempotency.StateInProgress, Token: req.Token, Attempts: 1,
		CreatedAt: at, UpdatedAt: at, LeaseExpiresAt: at.Add(time.Duration(leaseMillis) * time.Millisecond)}
	if len(req.Fingerprint) > 0 {
		rec.Fingerprint = bytes.Clone(req.Fingerprint)
	}
	return idempotency.ClaimResult{Acquired: true, Record: rec}
}

// encodeNew is the N record of a fresh claim (see prelude.lua): the P
// string's layout, attempt 1, created and updated 0, the lease's length
// where P holds its deadline, the retention, the owner and the fingerprint.
func encodeNew(req idempotency.ClaimRequest, lease, retain int64) []byte {
	b := make([]byte, 0, pfHeader+len(req.Token)+len(req.Fingerprint))
	b = append(b, pfTag, 'N')
	b = binary.BigEndian.AppendUint32(b, 1)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0) // created, updated
	b = appendUint48(b, uint64(lease))
	b = appendUint48(b, uint64(retain))
	b = binary.BigEndian.AppendUint32(b, uint32(len(req.Token)))
	b = append(b, req.Token...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(req.Fingerprint)))
	return append(b, req.Fingerprint...)
}

// appendUint48 appends v's low 6 bytes, big-endian.
func appendUint48(b []byte, v uint64) []byte {
	return append(b, byte(v>>40), byte(v>>32), byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
}

// ownerField is the owner field of a COMPLETED string for token: the first
// 8 bytes of its SHA-1 (see prelude.lua).
func ownerField(token string) string {
	sum := sha1.Sum([]byte(token))
	return string(sum[:8])
}

// The strings of prelude.lua's layouts.
const (
	completedTag    = 0xC1
	completedHeader = 26
	pfTag           = 0xC0
	pfHeader        = 38
)

// decodeCompleted reads a COMPLETED string that claimfast.lua returned as
// it is, with the checks of prelude.lua's load_string: a value that fails
// one is idempotency.ErrCorruptRecord with the same reason.
func decodeCompleted(v string) (idempotency.Record, error) {
	corrupt := func(reason string) (idempotency.Record, error) {
		return idempotency.Record{}, fmt.Errorf("%w: string: %s", idempotency.ErrCorruptRecord, reason)
	}
	if len(v) < completedHeader {
		return corrupt("too short")
	}
	if v[0] != completedTag {
		return corrupt("unknown tag")
	}
	b := []byte(v[:completedHeader])
	attempts := uint64(binary.BigEndian.Uint32(b[1:5]))
	created := uint48(b[5:11])
	updated := uint48(b[11:17])
	n, pos := uint64(b[25]), uint64(completedHeader)
	if n == 255 {
		if len(v) < completedHeader+4 {
			return corrupt("too short")
		}
		n, pos = uint64(binary.BigEndian.Uint32([]byte(v[completedHeader:completedHeader+4]))), completedHeader+4
		if n < 255 {
			return corrupt("bad fingerprint length")
		}
	}
	if pos+n > uint64(len(v)) {
		return corrupt("fingerprint overruns the value")
	}
	switch {
	case attempts < 1:
		return corrupt("bad attempts")
	case created < 1:
		return corrupt("bad created time")
	case updated < created:
		return corrupt("bad updated time")
	}
	rec := idempotency.Record{State: idempotency.StateCompleted, Attempts: int(attempts),
		CreatedAt: time.UnixMilli(int64(created)), UpdatedAt: time.UnixMilli(int64(updated)),
		Result: []byte(v[pos+n:])}
	if n > 0 {
		rec.Fingerprint = []byte(v[pos : pos+n])
	}
	return rec, nil
}

// uint48 reads a 6-byte big-endian integer.
func uint48(b []byte) uint64 {
	return uint64(b[0])<<40 | uint64(b[1])<<32 | uint64(binary.BigEndian.Uint32(b[2:6]))
}
