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
//
// A claim given up while its command is still with go-redis is recorded
// under its key and token until its batch is answered (see pendingClaims):
// Release waits for it, so that the release is not sent on another
// connection ahead of the claim it undoes.
func (s *Store) autoPipelined(ctx context.Context, op string, keys []string, script *redis.Script, args []any) *redis.Cmd {
	track := op == "claim"
	loads := s.scripts.loaded(script)
	cmd := s.submit(ctx, track, keys, script, args)
	if !isNoScript(cmd.Err()) {
		return cmd
	}
	if err := s.scripts.load(ctx, s.client, script, loads); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cmd = s.submit(ctx, track, keys, script, args)
	if isNoScript(cmd.Err()) { // flushed again meanwhile
		cmd = script.Eval(ctx, s.client, keys, args...)
	}
	return cmd
}

// submit hands one EVALSHA to the auto-pipeliner and waits for its reply
// as submitArgs does; with track set (a claim, whose first argument is its
// token) a command given up is tracked as that claim's.
func (s *Store) submit(ctx context.Context, track bool, keys []string, script *redis.Script, args []any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	token := ""
	if track {
		token = args[0].(string)
	}
	return s.submitArgs(ctx, keys[0], token, cmdArgs)
}

// submitArgs hands one command to the auto-pipeliner and waits for its
// reply until ctx ends. A call whose context has ended is not handed over.
// One that gives up waiting leaves its command to go-redis, which sends it
// with its batch; it may still run, as a command already written to a
// plain client's connection may. With a token (a claim of key by that
// token), such a command is recorded in s.pending under its claimID until
// its batch is answered.
func (s *Store) submitArgs(ctx context.Context, key, token string, cmdArgs []any) *redis.Cmd {
	if err := ctx.Err(); err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	cmd := redis.NewCmd(ctx, cmdArgs...)
	fut := s.ap.Submit(ctx, cmd)
	if err := fut.WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The batch may still be writing cmd: answer with a command of our own.
		if token != "" {
			s.pending.add(claimID(key, token), fut)
		}
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
	// done counts the loads of each script that succeeded, by hash: a call
	// that met NOSCRIPT after one of them finished since it sent its
	// EVALSHA sends it again without another load
	// (TestAutoPipeliningScriptFlushStorm).
	done map[string]uint64
}

// loaded returns how many loads of script have succeeded so far.
func (l *scriptLoads) loaded(script *redis.Script) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[script.Hash()]
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
//
// since is what loaded answered before the call's EVALSHA was sent: when a
// load has succeeded since, the script was loaded after that EVALSHA may
// have met NOSCRIPT, and load returns at once.
func (l *scriptLoads) load(ctx context.Context, client redis.UniversalClient, script *redis.Script, since uint64) error {
	l.mu.Lock()
	if l.done[script.Hash()] > since {
		l.mu.Unlock()
		return nil
	}
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
			if ld.err == nil {
				if l.done == nil {
					l.done = map[string]uint64{}
				}
				l.done[script.Hash()]++
			}
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

// isNoScript reports whether err is Redis's NOSCRIPT reply; nil, the common
// case, is checked first, without go-redis's allocation.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

// claimID names a claim of key by token in pendingClaims.
func claimID(key, token string) string { return token + "\x00" + key }

// pendingClaims are the claims whose callers gave up waiting while their
// commands were still with go-redis's auto-pipeliner, by claimID. Batches
// are unordered, so a Release sent after such a claim could otherwise reach
// Redis first, on another connection, find nothing to undo, and leave the
// claim to be applied afterwards: the key would then stay IN_PROGRESS under
// a token nobody holds until its lease lapsed, and count an attempt that
// never ran (TestAutoPipeliningReleaseAfterGivenUpClaim).
type pendingClaims struct {
	mu sync.Mutex
	m  map[string]*pendingClaim
}

// pendingClaim is one or more given-up claims of one key and token; done
// closes once every one of them is answered.
type pendingClaim struct {
	n    int
	done chan struct{}
}

// add records a given-up claim until fut's batch is answered.
func (p *pendingClaims) add(id string, fut redis.AutoFuture) {
	p.mu.Lock()
	if p.m == nil {
		p.m = map[string]*pendingClaim{}
	}
	c := p.m[id]
	if c == nil {
		c = &pendingClaim{done: make(chan struct{})}
		p.m[id] = c
	}
	c.n++
	p.mu.Unlock()
	go func() {
		_ = fut.Wait() // bounded by the client's ReadTimeout, or its Close
		p.mu.Lock()
		defer p.mu.Unlock()
		if c.n--; c.n == 0 {
			delete(p.m, id)
			close(c.done)
		}
	}()
}

// wait waits until no given-up claim of id is with go-redis any more, or
// ctx ends.
func (p *pendingClaims) wait(ctx context.Context, id string) error {
	p.mu.Lock()
	c := p.m[id]
	p.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
