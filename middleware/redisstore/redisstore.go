package redisstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
)

var (
	// ErrNilClient is returned by New and NewExpiringKeyRepository for a nil client.
	ErrNilClient = errors.New("redisstore: nil redis client")
	// ErrContextTimeoutDisabled is New's error for a client that ignores context deadlines.
	ErrContextTimeoutDisabled = errors.New("redisstore: the redis client ignores context deadlines; set ContextTimeoutEnabled in its options, and no ReadTimeout or WriteTimeout of -2")
)

// Store is an [idempotency.Store] on Redis, safe for concurrent use; it does not own the client.
type Store struct {
	client         redis.UniversalClient
	ack            *replicaAck          // nil: no WAIT
	ap             *redis.AutoPipeliner // nil: every call on its own
	scripts        scriptLoads          // one SCRIPT LOAD for the calls that met NOSCRIPT
	pending        pendingClaims        // given-up claims Release waits for
	scriptClaims   bool                 // tests: every claim runs claim.lua
	freshClaimArgs []any                // tests: extra SET arguments
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store on client (a ring must not reshard while keys are
// live). A nil opts means the defaults. It does not contact Redis.
func New(client redis.UniversalClient, opts *Options) (*Store, error) {
	if isNil(client) {
		return nil, ErrNilClient
	}
	if !honoursDeadlines(client) {
		return nil, ErrContextTimeoutDisabled
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	ack, err := newReplicaAck(client, o)
	if err != nil {
		return nil, err
	}
	s := &Store{client: client, ack: ack}
	if c, primary := client.(*redis.Client); primary && !o.DisableAutoPipelining && boundsSocketIO(c) {
		if s.ap, err = newAutoPipeliner(c); err != nil {
			return nil, fmt.Errorf("redisstore: auto-pipelining: %w", err)
		}
	}
	return s, nil
}

func honoursDeadlines(client redis.UniversalClient) bool {
	honours := func(enabled bool, read, write time.Duration) bool { return enabled && read >= 0 && write >= 0 }
	switch c := client.(type) {
	case *redis.Client:
		o := c.Options()
		return honours(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case *redis.ClusterClient:
		o := c.Options()
		return honours(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	case *redis.Ring:
		o := c.Options()
		return honours(o.ContextTimeoutEnabled, o.ReadTimeout, o.WriteTimeout)
	}
	return true
}

// boundsSocketIO: only ReadTimeout and WriteTimeout bound a stalled batch.
func boundsSocketIO(c *redis.Client) bool {
	o := c.Options() // -1 is stored as 0, -2 as -1
	return o.ReadTimeout > 0 && o.WriteTimeout > 0
}

func isNil(c redis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// Claim implements [idempotency.Store] with SET NX PX GET, else claim.lua.
func (s *Store) Claim(ctx context.Context, key string, req idempotency.ClaimRequest) (idempotency.ClaimResult, error) {
	if err := storekit.CheckClaim(key, req.Token, req.Lease, req.TTL); err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	lease, ttl := millis(req.Lease), millis(req.TTL)
	if !s.scriptClaims {
		res, done, err := s.freshClaim(ctx, key, req, lease, ttl)
		if done || err != nil {
			return res, err
		}
	}
	v, err := s.runScript(ctx, "claim", key, claimScript, req.Token, lease, ttl, req.Fingerprint).Result()
	if err != nil {
		return idempotency.ClaimResult{}, scriptError(ctx, "claim", key, err)
	}
	r, ok := v.([]any)
	if !ok {
		return idempotency.ClaimResult{}, wrap("claim", key, malformed(fmt.Sprintf("claim reply %#v", v)))
	}
	res, err := parseClaim(r)
	if err != nil {
		return idempotency.ClaimResult{}, wrap("claim", key, err)
	}
	if res.Acquired && res.Record.Token != req.Token {
		return idempotency.ClaimResult{}, wrap("claim", key, malformed("acquired under another token"))
	}
	return res, nil
}

// freshClaim sends SET NX PX GET; done is false when it wrote nothing.
func (s *Store) freshClaim(ctx context.Context, key string, req idempotency.ClaimRequest, lease, ttl int64) (_ idempotency.ClaimResult, done bool, _ error) {
	args := append(make([]any, 0, 8+len(s.freshClaimArgs)), "set", key, encodeNew(req, lease, ttl), "nx", "px", lease+ttl, "get")
	args = append(args, s.freshClaimArgs...)
	sent := time.Now()
	v, err := s.runPlain(ctx, "claim", key, req.Token, args).Text()
	switch {
	case err == redis.Nil: // the key was absent: this claim wrote it
		return acquiredFresh(sent, lease, req), true, nil
	case err != nil && isSyntaxError(err):
		return idempotency.ClaimResult{}, false, wrap("claim", key, fmt.Errorf("%w: %w", errBefore7, err))
	case err != nil && (isWrongType(err) || isFull(err)):
		// A full Redis refuses even SETs that write nothing: ask claim.lua.
		return idempotency.ClaimResult{}, false, nil
	case err != nil:
		return idempotency.ClaimResult{}, false, callError(ctx, "claim", key, err)
	case len(v) == 0 || v[0] != completedTag: // not COMPLETED: claim.lua decides
		return idempotency.ClaimResult{}, false, nil
	}
	rec, err := decodeCompleted(v)
	if err != nil {
		return idempotency.ClaimResult{}, false, wrap("claim", key, err)
	}
	return idempotency.ClaimResult{Record: rec}, true, nil
}

var errBefore7 = errors.New("the server must be Redis 7.0 or newer (SET with NX and GET)")

func isSyntaxError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR syntax error")
}

func isWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

func isFull(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "OOM")
}

// Renew implements idempotency.Store with one EVALSHA.
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if err := storekit.CheckOwner(key, token, lease); err != nil {
		return wrap("renew", key, err)
	}
	return s.owned(ctx, "renew", key, renewScript, token, millis(lease), ownerField(token))
}

// Complete implements idempotency.Store with one EVALSHA.
func (s *Store) Complete(ctx context.Context, key, token string, result []byte, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap("complete", key, err)
	}
	return s.owned(ctx, "complete", key, completeScript, token, millis(ttl), result, ownerField(token))
}

// Fail implements idempotency.Store with one EVALSHA.
func (s *Store) Fail(ctx context.Context, key, token string, ttl time.Duration) error {
	if err := storekit.CheckOwner(key, token, ttl); err != nil {
		return wrap("fail", key, err)
	}
	return s.owned(ctx, "fail", key, failScript, token, millis(ttl))
}

// Release implements idempotency.Store with one EVALSHA.
func (s *Store) Release(ctx context.Context, key, token string) error {
	if err := storekit.CheckRelease(key, token); err != nil {
		return wrap("release", key, err)
	}
	// A given-up claim of token still with go-redis is answered first.
	if err := s.pending.wait(ctx, claimID(key, token)); err != nil {
		return scriptError(ctx, "release", key, err)
	}
	v, err := s.runScript(ctx, "release", key, releaseScript, token).Result()
	if err != nil {
		return scriptError(ctx, "release", key, err)
	}
	// 1: undone; 0: no live lease of token, nothing to undo.
	if v != int64(1) && v != int64(0) {
		return wrap("release", key, malformed(fmt.Sprintf("release reply %#v", v)))
	}
	return nil
}

// owned runs a script answering 1 (owned or applied), 0 (not) or 2 (renew.lua: completed).
func (s *Store) owned(ctx context.Context, op, key string, script *redis.Script, args ...any) error {
	v, err := s.runScript(ctx, op, key, script, args...).Result()
	if err != nil {
		return scriptError(ctx, op, key, err)
	}
	switch {
	case v == int64(1):
		return nil
	case v == int64(0):
		return wrap(op, key, idempotency.ErrLeaseLost)
	case v == int64(2) && op == "renew": // renew.lua: COMPLETED by this token
		return wrap(op, key, idempotency.ErrCompletedByOwner)
	}
	return wrap(op, key, malformed(fmt.Sprintf("owner reply %#v", v)))
}

// Get implements idempotency.Store with one EVALSHA.
func (s *Store) Get(ctx context.Context, key string) (idempotency.Record, error) {
	if key == "" {
		return idempotency.Record{}, wrap("get", key, idempotency.ErrEmptyKey)
	}
	v, err := s.runScript(ctx, "get", key, getScript).Slice()
	if err != nil {
		return idempotency.Record{}, scriptError(ctx, "get", key, err)
	}
	if len(v) == 0 {
		return idempotency.Record{State: idempotency.StateAbsent}, nil
	}
	rec, err := parseRecord(v)
	if err != nil {
		return idempotency.Record{}, wrap("get", key, err)
	}
	return rec, nil
}

// Delete implements idempotency.Store with one UNLINK; it removes a corrupt value too.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return wrap("delete", key, idempotency.ErrEmptyKey)
	}
	if err := s.client.Unlink(ctx, key).Err(); err != nil {
		return callError(ctx, "delete", key, err)
	}
	return nil
}

const maxKeyInError = 64

func wrap(op, key string, err error) error {
	if len(key) > maxKeyInError {
		key = key[:maxKeyInError] + "…"
	}
	return fmt.Errorf("redisstore: %s %q: %w", op, key, err)
}

// millis clamps d to idempotency.MaxTTL, then rounds it up to milliseconds.
func millis(d time.Duration) int64 {
	d = storekit.ClampTTL(d)
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++
	}
	return int64(ms)
}
