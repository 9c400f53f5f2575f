package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatches is how many batches the store asks go-redis's auto-pipeliner
// to allow on the wire at once. A batch whose connection stalls (a
// half-open connection, a retransmission back-off) holds its slot until the
// client's ReadTimeout; the other slots keep carrying the calls that arrive
// meanwhile, each batch on a connection of its own, so up to maxBatches-1
// stalled connections leave the store working
// (TestAutoPipeliningFlowsPastStalledConnections).
const maxBatches = 8

// autoPipelineOptions is the configuration the store asks for when it
// creates the client's deferred auto-pipeliner.
func autoPipelineOptions() *redis.AutoPipelineOptions {
	o := redis.DefaultAutoPipelineOptions()
	o.MaxConcurrentBatches = maxBatches
	o.Unordered = true
	return o
}

// newAutoPipeliner returns the client's deferred auto-pipeliner
// (AsyncAutoPipeline), creating it with autoPipelineOptions if the client
// has none yet, or nil when the one the client has keeps a single batch on
// the wire (go-redis's default, ordered): one stalled connection would then
// hold every call of the store until the ReadTimeout.
//
// The deferred face is used because its futures can be waited for under a
// context (AutoFuture.WaitContext): a batch runs on go-redis's own context,
// bounded by the client's ReadTimeout, never by one of its calls' deadlines,
// and each caller stops waiting at its own. Batches are unordered so that
// more than one can be on the wire: an owner never has two commands of one
// key in flight at once, so no order the store relies on is lost.
func newAutoPipeliner(client *redis.Client) (*redis.AutoPipeliner, error) {
	ap, err := client.AsyncAutoPipelineWithOptions(autoPipelineOptions())
	if err != nil {
		return nil, err
	}
	if cfg := ap.Config(); !cfg.Unordered || cfg.MaxConcurrentBatches < 2 {
		return nil, nil
	}
	return ap, nil
}

// autoPipelined runs one script call through the auto-pipeliner: EVALSHA,
// batched with the calls of other goroutines. A server that does not know
// the script answers NOSCRIPT; the script is then loaded once, by one
// SCRIPT LOAD that every call that met NOSCRIPT waits for, and the calls
// are sent again by hash, batched as before.
func (s *Store) autoPipelined(ctx context.Context, keys []string, script *redis.Script, args []any) *redis.Cmd {
	cmd := s.submit(ctx, keys, script, args)
	if !redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		return cmd
	}
	if err := s.scripts.load(ctx, s.client, script); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cmd = s.submit(ctx, keys, script, args)
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") { // flushed again meanwhile
		cmd = script.Eval(ctx, s.client, keys, args...)
	}
	return cmd
}

// submit hands one EVALSHA to the auto-pipeliner and waits for its reply
// until ctx ends. A call whose context has ended is not handed over. One
// that gives up waiting leaves its command to go-redis, which sends it with
// its batch; it may still run, as a command already written to a plain
// client's connection may.
func (s *Store) submit(ctx context.Context, keys []string, script *redis.Script, args []any) *redis.Cmd {
	if err := ctx.Err(); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if err := s.ap.Submit(ctx, cmd).WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The batch may still be writing cmd: answer with a command of our own.
		given := redis.NewCmd(ctx)
		given.SetErr(err)
		return given
	}
	return cmd
}

// scriptLoads loads each script once at a time: the calls that meet
// NOSCRIPT together wait for one SCRIPT LOAD instead of sending one each.
type scriptLoads struct {
	mu      sync.Mutex
	loading map[string]*scriptLoad // by script hash
}

// scriptLoad is one SCRIPT LOAD in flight; err is set before done closes.
type scriptLoad struct {
	done chan struct{}
	err  error
}

// load sends SCRIPT LOAD for script, or joins the one in flight, and waits
// for it until ctx ends. The load itself is not bounded by ctx, whose call
// may be the shortest of those waiting for it, but by the client's
// ReadTimeout.
func (l *scriptLoads) load(ctx context.Context, client redis.UniversalClient, script *redis.Script) error {
	l.mu.Lock()
	ld, ok := l.loading[script.Hash()]
	if !ok {
		if l.loading == nil {
			l.loading = map[string]*scriptLoad{}
		}
		ld = &scriptLoad{done: make(chan struct{})}
		l.loading[script.Hash()] = ld
		go func() {
			ld.err = script.Load(context.WithoutCancel(ctx), client).Err()
			l.mu.Lock()
			delete(l.loading, script.Hash())
			l.mu.Unlock()
			close(ld.done)
		}()
	}
	l.mu.Unlock()
	select {
	case <-ld.done:
		return ld.err
	case <-ctx.Done():
		return ctx.Err()
	}
}
