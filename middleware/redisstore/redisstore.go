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
	// ErrNilClient is returned by New and NewExpiringKeyRepository for a
	// nil client.
	ErrNilClient = errors.New("redisstore: nil redis client")
	// ErrContextTimeoutDisabled is returned by New for a client that ignores
	// the deadlines of contexts: set redis.Options.ContextTimeoutEnabled (or
	// the field of the same name in redis.ClusterOptions, RingOptions,
	// FailoverOptions or UniversalOptions) to true, also on the options that
	// redis.ParseURL returns, and do not set ReadTimeout or WriteTimeout to
	// -2 (which disables socket deadlines altogether).
	ErrContextTimeoutDisabled = errors.New("redisstore: the redis client ignores context deadlines; set ContextTimeoutEnabled in its options, and no ReadTimeout or WriteTimeout of -2")
)

// Store is an [idempotency.Store] on Redis. It is safe for concurrent use.
// It does not own the client: closing the client is the caller's business.
type Store struct {
	client redis.UniversalClient
	ack    *replicaAck          // nil: no WAIT
	ap     *redis.AutoPipeliner // nil: every call on its own
	// scripts loads a script after NOSCRIPT, once for all the calls that met it.
	scripts scriptLoads
	// pending holds the claims given up while go-redis still had them;
	// Release waits for them.
	pending pendingClaims
	// scriptClaims and freshClaimArgs are set by tests alone, before the
	// store's first call: every claim runs claim.lua; extra arguments of
	// the fresh claim's SET.
	scriptClaims   bool
	freshClaimArgs []any
}

var _ idempotency.Store = (*Store)(nil)

// New returns a store on client: a *redis.Client (standalone or Sentinel),
// a *redis.ClusterClient or a *redis.Ring (which must not reshard while
// keys are live). A nil opts means the defaults of [Options]. New does not
// contact Redis.
//
// The client must honour context deadlines, or no call could be bounded by
// its owner's lease: New returns [ErrContextTimeoutDisabled] for a client
// of go-redis whose options leave ContextTimeoutEnabled false. Another
// [redis.UniversalClient] (a wrapper, say) is taken as it is.
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

// honoursDeadlines reports whether client's options let it bound socket I/O
// by the context's deadline; true for a client whose options it cannot read.
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

// boundsSocketIO reports whether c has a ReadTimeout and a WriteTimeout
// (-1 in its options means none). go-redis runs an auto-pipelined batch on
// its own context, bounded by those alone: without them a batch on a
// connection that stalls holds its slot for ever, and once every slot is
// held, no call of the store gets through again
// (TestAutoPipeliningNoReadTimeout). Such a client's calls go out on their
// own, each bounded by its context.
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

// Claim implements [idempotency.Store]. It first sends one plain SET NX
// PX GET of a new record, which settles an absent key (acquired) and a
// COMPLETED one (a duplicate, decoded here). Any other key takes
// claim.lua. A server older than Redis 7.0 refuses the SET: the claim's
// error says so.
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

// freshClaim sends the plain claim: SET key <N record> NX PX lease+ttl GET.
// done reports a claim it settled (an absent key, acquired; a COMPLETED
// one, refused); otherwise claim.lua must decide, and nothing was written.
func (s *Store) freshClaim(ctx context.Context, key string, req idempotency.ClaimRequest, lease, ttl int64) (_ idempotency.ClaimResult, done bool, _ error) {
	args := append(make([]any, 0, 8+len(s.freshClaimArgs)), "set", key, encodeNew(req, lease, ttl), "nx", "px", lease+ttl, "get")
	args = append(args, s.freshClaimArgs...)
	sent := time.Now()
	v, err := s.runPlain(ctx, "claim", key, req.Token, args).Text()
	switch {
	case err == redis.Nil: // the key was absent: this claim wrote it
		return acquiredFresh(sent, lease, req), true, nil
	case err != nil && isSyntaxError(err):
		// A server before Redis 7.0, whose SET cannot take NX and GET
		// together.
		return idempotency.ClaimResult{}, false, wrap("claim", key, fmt.Errorf("%w: %w", errBefore7, err))
	case err != nil && (isWrongType(err) || isFull(err)):
		// Not a string, or a full Redis, which refuses any SET, even one
		// that would write nothing: claim.lua reads the key, answers a
		// duplicate or a held key, and fails only where it must write.
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

// errBefore7 is the error of a claim on a server older than Redis 7.0.
var errBefore7 = errors.New("the server must be Redis 7.0 or newer (SET with NX and GET)")

// isSyntaxError reports the error reply of a server that does not know a
// command's options (SET NX GET before Redis 7.0).
func isSyntaxError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "ERR syntax error")
}

// isWrongType reports the error reply of a command on a key of another type.
func isWrongType(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE")
}

// isFull reports the error reply of a Redis whose used memory is above
// its maxmemory, which refuses every command that may write (OOM).
func isFull(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "OOM")
}

// Renew implements idempotency.Store with one EVALSHA (pipelined with WAIT
// under Options.Replicas).
func (s *Store) Renew(ctx context.Context, key, token string, lease time.Duration) error {
	if err := storekit.CheckOwner(key, token, lease); err != nil {
		return wrap("renew", key, err)
	}
	return s.owned(ctx, "renew", key, renewScript, token, millis(lease), ownerField(token))
}

// Complete implements idempotency.Store with one EVALSHA (pipelined with
// WAIT under Options.Replicas).
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
	// A claim of token given up while go-redis still had it would be sent
	// after this release: let it be answered first.
	if err := s.pending.wait(ctx, claimID(key, token)); err != nil {
		return scriptError(ctx, "release", key, err)
	}
	v, err := s.runScript(ctx, "release", key, releaseScript, token).Result()
	if err != nil {
		return scriptError(ctx, "release", key, err)
	}
	// 1: the claim was undone; 0: token held no live lease, so there was
	// nothing to undo (the claim never happened, or this is a resend).
	if v != int64(1) && v != int64(0) {
		return wrap("release", key, malformed(fmt.Sprintf("release reply %#v", v)))
	}
	return nil
}

// owned runs a script that answers 1 when the token owns the key (or its
// own transition was already applied) and 0 when it does not; renew.lua
// answers 2 for a key its token completed.
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

// Get implements idempotency.Store with one EVALSHA (a read that handles
// both encodings of a record atomically).
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

// Delete implements idempotency.Store with one UNLINK, which removes any
// value, a corrupt one included.
func (s *Store) Delete(ctx context.Context, key string) error {
	if key == "" {
		return wrap("delete", key, idempotency.ErrEmptyKey)
	}
	if err := s.client.Unlink(ctx, key).Err(); err != nil {
		return callError(ctx, "delete", key, err)
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

// millis rounds d up to whole milliseconds, the unit of PEXPIRE, after
// clamping it to idempotency.MaxTTL: the rounding must not overflow into a
// negative PEXPIRE (which deletes the key) or a SET PX error.
func millis(d time.Duration) int64 {
	d = storekit.ClampTTL(d)
	ms := d / time.Millisecond
	if d%time.Millisecond != 0 {
		ms++
	}
	return int64(ms)
}
