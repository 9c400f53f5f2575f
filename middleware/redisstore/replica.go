package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
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
	// Complete that wrote before the store answers: each is sent to the
	// key's primary with WAIT Replicas on the same connection, in one
	// pipeline (one round trip) while that primary's replicas keep up, and
	// after it, only if it wrote, once a WAIT there fell short (see Replica
	// acknowledgement in the package documentation). A failover to a
	// replica that acknowledged then keeps the transition: a claimed key
	// stays claimed, a lease stays renewed, a completed key stays
	// COMPLETED. When fewer replicas acknowledge within ReplicaTimeout, the
	// transition still succeeds (it was applied on the primary, and the
	// effect of a completed run did happen), and the shortfall is counted
	// (ReplicaStats), logged and passed to OnReplicaShortfall. A call that
	// wrote nothing (a duplicate, a claim of a held key, a lease lost) is
	// neither. Fail and Release do not wait: losing one in a failover leaves
	// a lease that lapses, which counts as the same failed attempt. Zero
	// means no WAIT.
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
	// lagging holds, by primary's address, whether its replicas fell short
	// of the last WAIT sent there (*atomic.Bool).
	lagging sync.Map
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
// own (see waited), since WAIT counts only the writes of its own
// connection and go-redis's auto-pipeliner sends WAIT on another. Every
// other call goes through the auto-pipeliner unless it is off.
func (s *Store) runScript(ctx context.Context, op, key string, script *redis.Script, args ...any) *redis.Cmd {
	keys := []string{key}
	if s.ack == nil || (op != "claim" && op != "renew" && op != "complete") {
		if s.ap != nil && !s.ap.IsClosed() {
			return s.autoPipelined(ctx, op, keys, script, args)
		}
		return script.Run(ctx, s.client, keys, args...)
	}
	return s.waited(ctx, op, key, func(p redis.Pipeliner, byText bool) *redis.Cmd {
		if byText {
			return script.Eval(ctx, p, keys, args...)
		}
		return script.EvalSha(ctx, p, keys, args...)
	}, func(cmd *redis.Cmd) bool { return scriptWrote(op, cmd) })
}

// scriptWrote reports whether a script's reply is that of a transition it
// wrote: a claim acquired (claimfast.lua's server time, claim.lua's 1), a
// lease renewed, a record completed. A Complete resent after its own
// completion also answers 1 and waits: its reply cannot tell.
func scriptWrote(op string, cmd *redis.Cmd) bool {
	v, err := cmd.Result()
	switch r := v.(type) {
	case int64:
		return err == nil && (op == "claim" || r == 1)
	case []any:
		return err == nil && op == "claim" && len(r) > 0 && r[0] == int64(1)
	}
	return false
}

// runPlain runs one plain command on key (the fresh claim's SET) as
// runScript runs a claim: through the auto-pipeliner, tracked as the claim
// of key by token if given up; on its own without one; followed by WAIT
// under replica acknowledgement when it wrote the key (redis.Nil: the key
// was absent).
func (s *Store) runPlain(ctx context.Context, op, key, token string, args []any) *redis.Cmd {
	if s.ack == nil {
		if s.ap != nil && !s.ap.IsClosed() {
			return s.submitArgs(ctx, key, token, args)
		}
		cmd := redis.NewCmd(ctx, args...)
		_ = s.client.Process(ctx, cmd)
		return cmd
	}
	return s.waited(ctx, op, key, func(p redis.Pipeliner, _ bool) *redis.Cmd { return p.Do(ctx, args...) },
		func(cmd *redis.Cmd) bool { return cmd.Err() == redis.Nil })
}

// waited runs a claim's, renewal's or completion's command, which send
// adds to a pipeline (by its script's text if byText), on the primary of
// key's slot, and WAIT on the same connection: in the same pipeline, one
// round trip, while that primary's replicas keep up; once a WAIT there fell
// short, after the command and only if wrote says it wrote, until a WAIT
// there is acknowledged again. A command that wrote nothing is not
// counted. A server that does not know the script answers NOSCRIPT, and
// the call is sent once more with EVAL, which loads it. On a cluster
// client a MOVED or ASK answer is followed at once, as the client follows
// it for any other command: to the node it names (after ASKING for ASK),
// with the client's slot map reloaded, up to the client's MaxRedirects.
func (s *Store) waited(ctx context.Context, op, key string, send func(p redis.Pipeliner, byText bool) *redis.Cmd, wrote func(*redis.Cmd) bool) *redis.Cmd {
	primary := s.client
	cluster, _ := s.client.(*redis.ClusterClient)
	if cluster != nil {
		node, err := cluster.MasterForKey(ctx, key)
		if err != nil {
			cmd := redis.NewCmd(ctx)
			cmd.SetErr(err)
			return cmd
		}
		primary = node
	}
	asking := false
	for redirects := 0; ; redirects++ {
		cmd, wait := s.sendWaited(ctx, primary, asking, send, wrote)
		if cluster == nil || redirects >= cluster.Options().MaxRedirects {
			s.ack.count(op, key, cmd, wait, wrote)
			return cmd
		}
		addr, moved := redis.IsMovedError(cmd.Err())
		ask := false
		if !moved {
			addr, ask = redis.IsAskError(cmd.Err())
		}
		if !moved && !ask {
			s.ack.count(op, key, cmd, wait, wrote)
			return cmd
		}
		node, err := clusterNode(ctx, cluster, addr)
		if err != nil {
			return cmd // the redirect, as the owner's retry will meet it
		}
		primary, asking = node, ask
	}
}

// sendWaited sends one attempt of waited's command to primary, after
// ASKING if asking, with WAIT as waited says, and returns the command and
// WAIT's (nil when none was sent). A client whose connections the store
// cannot hold (neither a *redis.Client nor a cluster node) always has WAIT
// in the pipeline, and so does a call whose held connection broke.
func (s *Store) sendWaited(ctx context.Context, primary redis.UniversalClient, asking bool, send func(p redis.Pipeliner, byText bool) *redis.Cmd, wrote func(*redis.Cmd) bool) (cmd, wait *redis.Cmd) {
	behind := s.ack.behind(primary)
	exec := func(p func() redis.Pipeliner, withWait bool) {
		for _, byText := range []bool{false, true} {
			pipe := p()
			if asking {
				pipe.Do(ctx, "asking")
			}
			cmd = send(pipe, byText)
			if withWait {
				wait = pipe.Do(ctx, "wait", s.ack.replicas, s.ack.waitTimeout(ctx).Milliseconds())
			}
			_, _ = pipe.Exec(ctx) // each command carries its own error
			if !isNoScript(cmd.Err()) {
				return
			}
		}
	}
	held := false
	if c, ok := primary.(*redis.Client); ok && behind.Load() {
		conn := c.Conn()
		defer func() { _ = conn.Close() }()
		exec(conn.Pipeline, false)
		// A connection that broke (no reply from Redis) is not resent by
		// go-redis once held: the call is sent again below, as a pipeline
		// with WAIT that go-redis resends on another connection.
		var reply redis.Error
		if err := cmd.Err(); err == nil || errors.As(err, &reply) || ctx.Err() != nil {
			if !wrote(cmd) {
				return cmd, nil
			}
			wait = conn.Do(ctx, "wait", s.ack.replicas, s.ack.waitTimeout(ctx).Milliseconds())
			held = true
		}
	}
	if !held {
		exec(primary.Pipeline, true)
	}
	if acked, err := wait.Int64(); err == nil {
		behind.Store(acked < int64(s.ack.replicas))
	}
	return cmd, wait
}

// clusterNode returns cluster's node at addr, as a MOVED or ASK answer
// names it, after reloading the client's slot map: ForEachShard reloads it
// before it visits the nodes.
func clusterNode(ctx context.Context, cluster *redis.ClusterClient, addr string) (*redis.Client, error) {
	addr = nodeAddr(addr)
	var (
		mu   sync.Mutex
		node *redis.Client
	)
	err := cluster.ForEachShard(ctx, func(_ context.Context, c *redis.Client) error {
		if c.Options().Addr == addr {
			mu.Lock()
			node = c
			mu.Unlock()
		}
		return nil
	})
	if err == nil && node == nil {
		err = fmt.Errorf("redisstore: no node at %s in the cluster's slot map", addr)
	}
	return node, err
}

// nodeAddr is addr as go-redis names a cluster node: an IPv6 host
// bracketed, as a MOVED or ASK answer does not.
func nodeAddr(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 || strings.ContainsAny(addr, ".[") {
		return addr
	}
	return net.JoinHostPort(addr[:i], addr[i+1:])
}

// behind is primary's flag in lagging.
func (a *replicaAck) behind(primary redis.UniversalClient) *atomic.Bool {
	addr := ""
	if c, ok := primary.(*redis.Client); ok {
		addr = c.Options().Addr
	}
	if v, ok := a.lagging.Load(addr); ok {
		return v.(*atomic.Bool)
	}
	v, _ := a.lagging.LoadOrStore(addr, new(atomic.Bool))
	return v.(*atomic.Bool)
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

// count records the outcome of one WAIT after a command that wrote (wait
// is nil when none was sent, as when it wrote nothing).
func (a *replicaAck) count(op, key string, cmd, wait *redis.Cmd, wrote func(*redis.Cmd) bool) {
	if wait == nil || !wrote(cmd) {
		return
	}
	acked, waitErr := wait.Int64()
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
