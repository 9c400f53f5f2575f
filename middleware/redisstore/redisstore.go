package redisstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
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
func (s *Store) Claim(ctx context.Context, key string, req middleware.ClaimRequest) (middleware.ClaimResult, error) {
	if err := middleware.CheckClaim(key, req); err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	v, err := claimScript.Run(ctx, s.client, []string{key},
		req.Token, millis(req.Lease), millis(req.TTL), req.Fingerprint).Slice()
	if err != nil {
		return middleware.ClaimResult{}, scriptError("claim", key, err)
	}
	res, err := parseClaim(v)
	if err != nil {
		return middleware.ClaimResult{}, wrap("claim", key, err)
	}
	if res.Acquired && res.Record.Token != req.Token {
		return middleware.ClaimResult{}, wrap("claim", key, malformed("acquired under another token"))
	}
	return res, nil
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
	return s.owned(ctx, "complete", key, completeScript, token, millis(ttl), result)
}

// Fail implements middleware.Store with one EVALSHA.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := middleware.CheckOwner(key, token, ttl); err != nil {
		return wrap("fail", key, err)
	}
	return s.owned(ctx, "fail", key, failScript, token, millis(ttl))
}

// owned runs a script that answers 1 when the token owns the key (or its
// own transition was already applied) and 0 when it does not.
func (s *Store) owned(ctx context.Context, op, key string, script *redis.Script, args ...any) error {
	v, err := script.Run(ctx, s.client, []string{key}, args...).Result()
	if err != nil {
		return scriptError(op, key, err)
	}
	switch v {
	case int64(1):
		return nil
	case int64(0):
		return wrap(op, key, middleware.ErrLeaseLost)
	}
	return wrap(op, key, malformed(fmt.Sprintf("owner reply %#v", v)))
}

// Get implements middleware.Store with one EVALSHA (a read that handles
// both encodings of a record atomically).
func (s *Store) Get(ctx context.Context, key string) (middleware.Record, error) {
	if key == "" {
		return middleware.Record{}, wrap("get", key, middleware.ErrEmptyKey)
	}
	v, err := getScript.Run(ctx, s.client, []string{key}).Slice()
	if err != nil {
		return middleware.Record{}, scriptError("get", key, err)
	}
	if len(v) == 0 {
		return middleware.Record{State: middleware.StateAbsent}, nil
	}
	rec, err := parseRecord(v)
	if err != nil {
		return middleware.Record{}, wrap("get", key, err)
	}
	return rec, nil
}

// Delete implements middleware.Store with one UNLINK, which removes any
// value, a corrupt one included.
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
