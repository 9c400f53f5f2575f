package redisstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware"
)

// ErrNilClient is returned by New and NewExpiringKeyRepository for a nil client.
var ErrNilClient = errors.New("redisstore: nil redis client")

// Store is a middleware.Store on Redis. It is safe for concurrent use and
// does not own the client: closing the client is the caller's business.
type Store struct {
	client redis.UniversalClient
}

var _ middleware.Store = (*Store)(nil)

// New returns a store on client, which may be a *redis.Client,
// *redis.ClusterClient, a Sentinel failover client or a *redis.Ring (a ring
// must not reshard while keys are live). New does not contact Redis.
func New(client redis.UniversalClient) (*Store, error) {
	if isNil(client) {
		return nil, ErrNilClient
	}
	return &Store{client: client}, nil
}

func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Claim implements middleware.Store with one EVALSHA.
func (s *Store) Claim(ctx context.Context, key string, lease time.Duration, fingerprint []byte) (middleware.ClaimResult, error) {
	if err := middleware.CheckClaim(key, lease); err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	token, err := newToken()
	if err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	v, err := claimScript.Run(ctx, s.client, []string{key}, token, millis(lease), fingerprint).Slice()
	if err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	if len(v) == 0 {
		return middleware.ClaimResult{}, wrap("claim", key, errors.New("empty script reply"))
	}
	if acquired, _ := v[0].(int64); acquired == 1 {
		if len(v) < 4 {
			return middleware.ClaimResult{}, wrap("claim", key, fmt.Errorf("short script reply %v", v))
		}
		rec := middleware.Record{
			State:     middleware.StateInProgress,
			Token:     token,
			Attempts:  int(asInt(v[1])),
			CreatedAt: time.UnixMilli(asInt(v[2])),
			UpdatedAt: time.UnixMilli(asInt(v[3])),
		}
		if len(v) > 4 {
			rec.Fingerprint = asBytes(v[4])
		}
		return middleware.ClaimResult{Acquired: true, Token: token, Record: rec}, nil
	}
	rec, err := parseRecord(v[1:])
	if err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	return middleware.ClaimResult{Record: rec}, nil
}

// parseRecord reads {state, attempts, created, updated, fingerprint, result}
// as returned by the scripts (missing trailing values are nil).
func parseRecord(v []any) (middleware.Record, error) {
	at := func(i int) any {
		if i < len(v) {
			return v[i]
		}
		return nil
	}
	st, _ := at(0).(string)
	var rec middleware.Record
	switch st {
	case "P":
		rec.State = middleware.StateInProgress
	case "C":
		rec.State = middleware.StateCompleted
		rec.Result = asBytes(at(5))
		if rec.Result == nil {
			rec.Result = []byte{}
		}
	case "F":
		rec.State = middleware.StateFailed
	default:
		return rec, fmt.Errorf("unknown state %q in record", st)
	}
	rec.Attempts = int(asInt(at(1)))
	rec.CreatedAt = time.UnixMilli(asInt(at(2)))
	rec.UpdatedAt = time.UnixMilli(asInt(at(3)))
	rec.Fingerprint = asBytes(at(4))
	return rec, nil
}

// Renew implements middleware.Store with one EVALSHA.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if err := middleware.CheckOwner(key, token, lease); err != nil {
		return wrap("renew", key, err)
	}
	return s.owned(ctx, "renew", key, renewScript, token, millis(lease))
}

// Complete implements middleware.Store with one EVALSHA.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	if err := middleware.CheckOwner(key, token, ttl); err != nil {
		return wrap("complete", key, err)
	}
	if result == nil {
		result = []byte{}
	}
	return s.owned(ctx, "complete", key, finishScript, token, millis(ttl), "C", result)
}

// Fail implements middleware.Store with one EVALSHA.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := middleware.CheckOwner(key, token, ttl); err != nil {
		return wrap("fail", key, err)
	}
	return s.owned(ctx, "fail", key, finishScript, token, millis(ttl), "F", "")
}

// owned runs a script that answers 1 when the token owns the key.
func (s *Store) owned(ctx context.Context, op, key string, script *redis.Script, args ...any) error {
	n, err := script.Run(ctx, s.client, []string{key}, args...).Int64()
	if err != nil {
		return wrap(op, key, err)
	}
	if n != 1 {
		return wrap(op, key, middleware.ErrLeaseLost)
	}
	return nil
}

// Get implements middleware.Store with one EVALSHA (a read that handles
// both encodings of a record atomically).
func (s *Store) Get(ctx context.Context, key string) (middleware.Record, error) {
	if key == "" {
		return middleware.Record{}, wrap("get", key, middleware.ErrEmptyKey)
	}
	v, err := getScript.Run(ctx, s.client, []string{key}).Slice()
	if errors.Is(err, redis.Nil) {
		return middleware.Record{State: middleware.StateAbsent}, nil
	}
	if err != nil {
		return middleware.Record{}, wrap("get", key, err)
	}
	rec, err := parseRecord(v)
	if err != nil {
		return middleware.Record{}, wrap("get", key, err)
	}
	if len(v) > 6 {
		if tok, ok := v[6].(string); ok {
			rec.Token = tok
		}
	}
	return rec, nil
}

// Delete implements middleware.Store with one UNLINK.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return wrap("delete", key, middleware.ErrEmptyKey)
	}
	if err := s.client.Unlink(ctx, key).Err(); err != nil {
		return wrap("delete", key, err)
	}
	return nil
}

// maxKeyInError bounds how much of a key an error message quotes.
const maxKeyInError = 64

func wrap(op, key string, err error) error {
	if len(key) > maxKeyInError {
		key = key[:maxKeyInError] + "…"
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// millis rounds d up to whole milliseconds, the unit of PEXPIRE.
func millis(d time.Duration) int64 {
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func asInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}

func asBytes(v any) []byte {
	if s, ok := v.(string); ok && s != "" {
		return []byte(s)
	}
	return nil
}

func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("owner token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}
