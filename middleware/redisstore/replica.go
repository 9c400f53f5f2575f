package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultReplicaTimeout is Options.ReplicaTimeout's default.
const defaultReplicaTimeout = 500 * time.Millisecond

// errReplicaAckUnsupported is New's error for Options.Replicas on a
// *redis.Ring: its shards have no replicas to wait for.
var errReplicaAckUnsupported = errors.New("redisstore: replica acknowledgement needs a client of one primary (standalone, Sentinel) or a cluster client, not a ring")

// Options configure a [Store] beyond its client. A nil *Options is the
// default for every field.
type Options struct {
	// Replicas is how many replicas must acknowledge each Claim, Renew
	// and Complete that wrote, by WAIT on the same connection. The default
	// is 0: no WAIT. See Replica acknowledgement in the package doc.
	Replicas int
	// ReplicaTimeout bounds each WAIT, and so does half of what is left of
	// the call's context. It must be shorter than the client's ReadTimeout.
	// The default is 500 ms.
	ReplicaTimeout time.Duration
	// OnReplicaShortfall is called, on the caller's goroutine, after a
	// transition applied on the primary that only acked of Replicas
	// replicas acknowledged in time; op is "claim", "renew" or "complete".
	// It must not block. The default logs it with [slog.Warn].
	OnReplicaShortfall func(op, key string, acked int)
	// DisableAutoPipelining sends every call on its own. The default is
	// false: a *redis.Client's calls go through go-redis's deferred
	// auto-pipeliner (see Auto-pipelining in the package doc).
	DisableAutoPipelining bool
}

// replicaAck is the store's replica acknowledgement, nil when Replicas is 0.
type replicaAck struct {
	replicas    int
	timeout     time.Duration
	onShortfall func(op, key string, acked int)
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
		return nil, fmt.Errorf("redisstore: Options.ReplicaTimeout is %v, must be positive (zero: %v)", o.ReplicaTimeout, defaultReplicaTimeout)
	case o.Replicas == 0:
		return nil, nil
	}
	if _, ring := client.(*redis.Ring); ring {
		return nil, errReplicaAckUnsupported
	}
	a := &replicaAck{replicas: o.Replicas, timeout: o.ReplicaTimeout, onShortfall: o.OnReplicaShortfall}
	if a.timeout == 0 {
		a.timeout = defaultReplicaTimeout
	}
	if a.onShortfall == nil {
		a.onShortfall = logShortfall
	}
	if rt := readTimeout(client); rt > 0 && a.timeout >= rt {
		return nil, fmt.Errorf("redisstore: Options.ReplicaTimeout %v must be shorter than the client's ReadTimeout %v, which bounds WAIT's reply", a.timeout, rt)
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
// wrote: a claim acquired, a lease renewed, a record completed. A Complete
// resent after its own completion also answers 1 and waits: its reply
// cannot tell.
func scriptWrote(op string, cmd *redis.Cmd) bool {
	v, err := cmd.Result()
	switch r := v.(type) {
	case int64:
		return err == nil && op != "claim" && r == 1
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
	a.onShortfall(op, key, int(acked))
}

// logShortfall is Options.OnReplicaShortfall's default.
func logShortfall(op, key string, acked int) {
	slog.Warn("redisstore: Redis replicas did not acknowledge a transition in time; a failover now may lose it",
		"op", op, "idempotency_key", key, "replicas_acked", acked)
}
