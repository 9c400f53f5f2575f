package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// corruptPrefix starts a script's error reply for a value that is no record.
const corruptPrefix = "IDEMPOTENCY_CORRUPT "

// scriptError makes a corrupt reply idempotency.ErrCorruptRecord.
func scriptError(ctx context.Context, op, key string, err error) error {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		if reason, ok := strings.CutPrefix(rerr.Error(), corruptPrefix); ok {
			return wrap(op, key, fmt.Errorf("%w: %s", idempotency.ErrCorruptRecord, reason))
		}
	}
	return callError(ctx, op, key, err)
}

var errFull = errors.New("the Redis is full (used memory above maxmemory), nothing was written")

// callError adds context.DeadlineExceeded to an "i/o timeout" at ctx's deadline.
func callError(ctx context.Context, op, key string, err error) error {
	if isFull(err) {
		return wrap(op, key, fmt.Errorf("%w: %w", errFull, err))
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || !errors.Is(err, os.ErrDeadlineExceeded) {
		return wrap(op, key, err)
	}
	// ctx's timer may fire a moment after the socket's: compare the deadline.
	if deadline, ok := ctx.Deadline(); ok && (ctx.Err() != nil || !time.Now().Before(deadline)) {
		return wrap(op, key, fmt.Errorf("%w: %w", context.DeadlineExceeded, err))
	}
	return wrap(op, key, err)
}

// malformed reports a reply off its layout: a bug, never a record's state.
func malformed(what string) error {
	return fmt.Errorf("malformed script reply: %s", what)
}

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

// parseRecord reads codec.lua's reply() strictly: nothing defaults.
func parseRecord(v []any) (idempotency.Record, error) {
	var rec idempotency.Record
	if len(v) != 8 {
		return rec, malformed(fmt.Sprintf("record of %d fields, want 8", len(v)))
	}
	state, err := replyField[string](v, 0, "a string")
	if err != nil {
		return rec, err
	}
	var ints [4]int64 // attempts, created, updated, lease
	for i := range ints {
		if ints[i], err = replyField[int64](v, 1+i, "an integer"); err != nil {
			return rec, err
		}
	}
	var strs [3]string // fingerprint, result, token
	for i := range strs {
		if strs[i], err = replyField[string](v, 5+i, "a string"); err != nil {
			return rec, err
		}
	}
	attempts, created, updated, lease := ints[0], ints[1], ints[2], ints[3]
	fp, result, token := strs[0], strs[1], strs[2]
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

func replyField[T any](v []any, i int, what string) (T, error) {
	x, ok := v[i].(T)
	if !ok {
		return x, malformed(fmt.Sprintf("field %d: %#v is not %s", i, v[i], what))
	}
	return x, nil
}

// acquiredFresh is a plain claim's attempt 1, timed by this host's clock.
func acquiredFresh(at time.Time, leaseMillis int64, req idempotency.ClaimRequest) idempotency.ClaimResult {
	at = at.Truncate(time.Millisecond)
	rec := idempotency.Record{State: idempotency.StateInProgress, Token: req.Token, Attempts: 1,
		CreatedAt: at, UpdatedAt: at, LeaseExpiresAt: at.Add(time.Duration(leaseMillis) * time.Millisecond)}
	if len(req.Fingerprint) > 0 {
		rec.Fingerprint = bytes.Clone(req.Fingerprint)
	}
	return idempotency.ClaimResult{Acquired: true, Record: rec}
}
