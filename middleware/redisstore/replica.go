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

const defaultReplicaTimeout = 500 * time.Millisecond

var errReplicaAckUnsupported = errors.New("redisstore: replica acknowledgement needs a client of one primary (standalone, Sentinel) or a cluster client, not a ring")

// Options configure a [Store]. A nil *Options means the defaults.
type Options struct {
	// Replicas must acknowledge each write of Claim, Renew and Complete. The default is 0.
	Replicas int
	// ReplicaTimeout bounds each WAIT, below the client's ReadTimeout. The default is 500 ms.
	ReplicaTimeout time.Duration
	// OnReplicaShortfall is called, without blocking, when only acked
	// replicas acknowledged in time. The default logs with [slog.Warn].
	OnReplicaShortfall func(op, key string, acked int)
	// DisableAutoPipelining sends every call on its own. The default is false.
	DisableAutoPipelining bool
}

type replicaAck struct {
	replicas    int
	timeout     time.Duration
	onShortfall func(op, key string, acked int)
	acked       atomic.Uint64
	shortfalls  atomic.Uint64
	lagging     sync.Map // by primary's address: *atomic.Bool, last WAIT fell short
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

func readTimeout(client redis.UniversalClient) time.Duration {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ReadTimeout
	case *redis.ClusterClient:
		return c.Options().ReadTimeout
	}
	return 0
}

// runScript runs a script; under Replicas a write goes out alone with WAIT.
func (s *Store) runScript(ctx context.Context, op, key string, script *redis.Script, args ...any) *redis.Cmd {
	keys := []string{key}
	if s.ack == nil || (op != "claim" && op != "renew" && op != "complete") {
		if s.ap != nil && !s.ap.IsClosed() {
			return s.autoPipelined(ctx, op, key, script, args)
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

// scriptWrote reports a claim acquired, a lease renewed or a record completed.
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

// runPlain runs the fresh claim's SET as runScript runs a claim.
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

// waited sends the command to key's primary with WAIT on its connection (in
// one pipeline while replicas keep up); MOVED and ASK are followed at once.
func (s *Store) waited(ctx context.Context, op, key string, send func(p redis.Pipeliner, byText bool) *redis.Cmd, wrote func(*redis.Cmd) bool) *redis.Cmd {
	primary := s.client
	cluster, _ := s.client.(*redis.ClusterClient)
	if cluster != nil {
		node, err := cluster.MasterForKey(ctx, key)
		if err != nil {
			return errCmd(ctx, err)
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

// sendWaited sends one attempt to primary; wait is nil when none was sent.
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
		// go-redis does not resend on a held connection: the pipeline below is.
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

// clusterNode returns the node at addr; ForEachShard reloads the slot map first.
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

// nodeAddr brackets an IPv6 host, as go-redis names a node and MOVED does not.
func nodeAddr(addr string) string {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 || strings.ContainsAny(addr, ".[") {
		return addr
	}
	return net.JoinHostPort(addr[:i], addr[i+1:])
}

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

// waitTimeout is at most half of ctx's time left, and never 0 (for ever).
func (a *replicaAck) waitTimeout(ctx context.Context) time.Duration {
	d := a.timeout
	if deadline, ok := ctx.Deadline(); ok {
		d = min(d, time.Until(deadline)/2)
	}
	return max(d.Truncate(time.Millisecond), time.Millisecond)
}

// count records one WAIT's outcome after a command that wrote (wait nil: none sent).
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

func logShortfall(op, key string, acked int) {
	slog.Warn("redisstore: Redis replicas did not acknowledge a transition in time; a failover now may lose it",
		"op", op, "idempotency_key", key, "replicas_acked", acked)
}
