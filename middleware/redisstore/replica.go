package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// DefaultReplicaTimeout is how long a transition waits for its replicas
// when Options.ReplicaTimeout is zero.
const DefaultReplicaTimeout = 500 * time.Millisecond

// ErrReplicaAckUnsupported is returned by NewWithOptions when Options.Replicas
// is set for a *redis.Ring: its shards have no replicas to wait for, and it
// could not send WAIT on the connection of the script.
var ErrReplicaAckUnsupported = errors.New("redisstore: replica acknowledgement needs a client of one primary (standalone, Sentinel) or a cluster client, not a ring")

// Options configure a Store beyond its client. A zero Options is the
// default: no replica acknowledgement, nothing logged.
type Options struct {
	// Replicas is how many replicas must acknowledge a Claim, a Renew or a
	// Complete before the store answers: each of them is sent as EVALSHA
	// followed by WAIT Replicas, in one pipeline, so it stays one round trip.
	// A failover to a replica that acknowledged then keeps the transition: a
	// claimed key stays claimed, a lease stays renewed, a completed key stays
	// COMPLETED. When fewer replicas acknowledge within ReplicaTimeout, the
	// transition still succeeds (it was applied on the primary, and the
	// effect of a completed run did happen), and the shortfall is counted
	// (ReplicaStats), logged and passed to OnReplicaShortfall. Fail and
	// Release do not wait: losing one in a failover leaves a lease that
	// lapses, which counts as the same failed attempt. Zero means no WAIT.
	Replicas int
	// ReplicaTimeout bounds each WAIT; a call's context deadline bounds it
	// too (to half of what is left, so that the reply still arrives in
	// time). Redis ends a WAIT that times out on its next server tick, up to
	// 100 ms late at its default hz (see Replica acknowledgement in the
	// package documentation). It must be shorter than the client's
	// ReadTimeout, which bounds a pipeline's reply. Zero means
	// DefaultReplicaTimeout (500 ms).
	ReplicaTimeout time.Duration
	// OnReplicaShortfall, when not nil, is called after each transition that
	// was applied but acknowledged by fewer than Replicas replicas in time.
	// It runs on the caller's goroutine and must not block.
	OnReplicaShortfall func(ReplicaShortfall)
	// Logger logs replica shortfalls (at Info level). Nil means none.
	Logger watermill.LoggerAdapter
	// DisableAutoPipelining sends every call on its own. By default the
	// store hands its calls to go-redis's automatic pipelining (the client's
	// AsyncAutoPipeline, created with 8 batches on the wire, unordered, if
	// the client has none yet) on a *redis.Client (standalone, Sentinel):
	// calls that arrive while others are on their way go out together, each
	// still its own EVALSHA, and each keeps its own deadline. Under load
	// that takes the round trips, not the commands, off Redis's and the
	// client's hands. Claims, renewals and completions under Replicas are
	// never auto-pipelined, nor is a cluster client or a ring (see the
	// package documentation).
	DisableAutoPipelining bool
}

// ReplicaShortfall describes a transition applied on the primary that fewer
// replicas than Options.Replicas acknowledged within the timeout: a
// failover before they catch up may lose it.
type ReplicaShortfall struct {
	// Op is the transition: "claim", "renew" or "complete".
	Op string
	// Key is the record's key.
	Key string
	// Acked is how many replicas acknowledged it; Wanted is Options.Replicas.
	Acked, Wanted int
}

// ReplicaStats counts the transitions that waited for replicas since the
// store was made.
type ReplicaStats struct {
	// Acknowledged counts transitions that enough replicas acknowledged.
	Acknowledged uint64
	// Shortfalls counts transitions applied on the primary that fewer
	// replicas acknowledged in time (see ReplicaShortfall).
	Shortfalls uint64
}

// replicaAck is the store's replica acknowledgement, nil when Replicas is 0.
type replicaAck struct {
	replicas    int
	timeout     time.Duration
	onShortfall func(ReplicaShortfall)
	logger      watermill.LoggerAdapter
	acked       atomic.Uint64
	shortfalls  atomic.Uint64
}

func newReplicaAck(client redis.UniversalClient, o Options) (*replicaAck, error) {
	switch {
	case o.Replicas < 0:
		return nil, fmt.Errorf("redisstore: Options.Replicas is %d, must be 0 (no WAIT) or more", o.Replicas)
	case o.ReplicaTimeout < 0:
		return nil, fmt.Errorf("redisstore: Options.ReplicaTimeout is %v, must be positive (zero: %v)", o.ReplicaTimeout, DefaultReplicaTimeout)
	case o.Replicas == 0:
		return nil, nil
	}
	if _, ring := client.(*redis.Ring); ring {
		return nil, ErrReplicaAckUnsupported
	}
	a := &replicaAck{replicas: o.Replicas, timeout: o.ReplicaTimeout, onShortfall: o.OnReplicaShortfall, logger: o.Logger}
	if a.timeout == 0 {
		a.timeout = DefaultReplicaTimeout
	}
	if rt := readTimeout(client); rt > 0 && a.timeout >= rt {
		return nil, fmt.Errorf("redisstore: Options.ReplicaTimeout %v must be shorter than the client's ReadTimeout %v, which bounds WAIT's reply", a.timeout, rt)
	}
	if a.logger == nil {
		a.logger = watermill.NopLogger{}
	}
	return a, nil
}

// readTimeout is the ReadTimeout of a client whose options New can read;
// 0 when it cannot, or the client has none.
func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// ReplicaStats returns the store's replica acknowledgement counts; both are
// zero when Options.Replicas is 0.
func (s *Store) ReplicaStats() ReplicaStats {
	if s.ack == nil {
		return ReplicaStats{}
	}
	return ReplicaStats{Acknowledged: s.ack.acked.Load(), Shortfalls: s.ack.shortfalls.Load()}
}

// runScript runs a transition's script on key. With replica
// acknowledgement a claim, renewal or completion waits for the replicas
// (Fail, Release and Get do not; see Options.Replicas): it goes out on its
// own, in a pipeline of EVALSHA and WAIT on one connection, since WAIT
// counts only the writes of its own connection and go-redis's
// auto-pipeliner sends WAIT on another. Every other call goes through the
// auto-pipeliner unless it is off.
func (s *Store) runScript(ctx context.Context, op, key string, script *redis.Script, args ...any) *redis.Cmd {
	wait := s.ack != nil && (op == "claim" || op == "renew" || op == "complete")
	if !wait && s.ap != nil && !s.ap.IsClosed() {
		return s.autoPipelined(ctx, op, []string{key}, script, args)
	}
	return s.runOne(ctx, op, []string{key}, script, wait, args)
}

// runPlain runs one plain command on key (the fresh claim's SET) as
// runScript runs a claim: through the auto-pipeliner, tracked as the claim
// of key by token if given up; on its own without one; pipelined with WAIT
// under replica acknowledgement. count records that WAIT's outcome (a no-op
// without one): the caller calls it when the command settled the
// transition, so that a claim that goes on to claim.lua is counted once.
func (s *Store) runPlain(ctx context.Context, op, key, token string, args []any) (_ *redis.Cmd, count func()) {
	none := func() {}
	if s.ack == nil {
		if s.ap != nil && !s.ap.IsClosed() {
			return s.submitArgs(ctx, key, token, args), none
		}
		cmd := redis.NewCmd(ctx, args...)
		_ = s.client.Process(ctx, cmd)
		return cmd, none
	}
	pipeliner, err := s.pipelinerFor(ctx, key)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd, none
	}
	cmd, acked, werr := s.pipelined(ctx, pipeliner, func(p redis.Pipeliner) *redis.Cmd { return p.Do(ctx, args...) })
	return cmd, func() { s.ack.count(op, key, acked, werr) }
}

// runOne runs one script call on its own. With wait it is pipelined with
// WAIT: one round trip. A server that does not know the script answers
// NOSCRIPT, and the call is sent once more with EVAL, which loads it: the
// first pipeline's WAIT had nothing new to wait for, but with fewer
// replicas than asked it still waited its timeout (once per script and
// server).
func (s *Store) runOne(ctx context.Context, op string, keys []string, script *redis.Script, wait bool, args []any) *redis.Cmd {
	if !wait {
		return script.Run(ctx, s.client, keys, args...)
	}
	key := keys[0]
	pipeliner, err := s.pipelinerFor(ctx, key)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cmd, acked, werr := s.pipelined(ctx, pipeliner, func(p redis.Pipeliner) *redis.Cmd {
		return script.EvalSha(ctx, p, keys, args...)
	})
	if isNoScript(cmd.Err()) {
		cmd, acked, werr = s.pipelined(ctx, pipeliner, func(p redis.Pipeliner) *redis.Cmd {
			return script.Eval(ctx, p, keys, args...)
		})
	}
	if cmd.Err() == nil {
		s.ack.count(op, key, acked, werr)
	}
	return cmd
}

// pipelined sends one script call and a WAIT in one pipeline and returns
// the script's command, the replicas WAIT counted and WAIT's error.
func (s *Store) pipelined(ctx context.Context, pipe redis.Pipeliner, call func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, int64, error) {
	cmd := call(pipe)
	wait := pipe.Do(ctx, "wait", s.ack.replicas, s.ack.waitTimeout(ctx).Milliseconds())
	_, _ = pipe.Exec(ctx) // each command carries its own error
	acked, err := wait.Int64()
	return cmd, acked, err
}

// pipelinerFor returns a pipeline whose commands all go to key's primary:
// WAIT has no key, and a cluster client would send it to any node.
func (s *Store) pipelinerFor(ctx context.Context, key string) (redis.Pipeliner, error) {
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Pipeline(), nil
	}
	return s.client.Pipeline(), nil
}

// waitTimeout is WAIT's timeout for a call under ctx: the configured one,
// at most half of what is left before ctx's deadline, and never 0 (which
// would make WAIT block for ever).
func (a *replicaAck) waitTimeout(ctx context.Context) time.Duration {
	d := a.timeout
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(d.Truncate(time.Millisecond), time.Millisecond)
}

// count records the outcome of one WAIT after a script that succeeded.
func (a *replicaAck) count(op, key string, acked int64, waitErr error) {
	if waitErr == nil && acked >= int64(a.replicas) {
		a.acked.Add(1)
		return
	}
	a.shortfalls.Add(1)
	fields := watermill.LogFields{"op": op, "idempotency_key": key, "replicas_acked": acked, "replicas_wanted": a.replicas}
	if waitErr != nil {
		fields["err"] = waitErr
	}
	a.logger.Info("Redis replicas did not acknowledge a transition in time; a failover now may lose it", fields)
	if a.onShortfall != nil {
		a.onShortfall(ReplicaShortfall{Op: op, Key: key, Acked: int(acked), Wanted: a.replicas})
	}
}
