package redisstore

import (
	"context"
	"errors"
	"sync"

	"github.com/redis/go-redis/v9"
)

// maxBatches on the wire: maxBatches-1 stalled connections leave the store working.
const maxBatches = 8

func autoPipelineOptions() *redis.AutoPipelineOptions {
	o := redis.DefaultAutoPipelineOptions()
	o.MaxConcurrentBatches = maxBatches
	o.Unordered = true
	return o
}

// newAutoPipeliner returns the client's deferred auto-pipeliner, or nil for
// an ordered one, where one stalled connection would hold every call.
// Unordered is safe: an owner never has two commands of a key in flight.
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

// autoPipelined sends one EVALSHA through the auto-pipeliner; after
// NOSCRIPT the callers share one SCRIPT LOAD and send again.
func (s *Store) autoPipelined(ctx context.Context, op string, keys []string, script *redis.Script, args []any) *redis.Cmd {
	track := op == "claim"
	loads := s.scripts.loaded(script)
	cmd := s.submit(ctx, track, keys, script, args)
	if !isNoScript(cmd.Err()) {
		return cmd
	}
	if err := s.scripts.load(ctx, s.client, script, loads); err != nil {
		return errCmd(ctx, err)
	}
	cmd = s.submit(ctx, track, keys, script, args)
	if isNoScript(cmd.Err()) { // flushed again meanwhile
		cmd = script.Eval(ctx, s.client, keys, args...)
	}
	return cmd
}

// submit hands one EVALSHA over; track a claim's, whose first argument is its token.
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

// submitArgs hands one command over and waits until ctx ends. One given
// up may still run; with a token it stays in s.pending until answered.
func (s *Store) submitArgs(ctx context.Context, key, token string, cmdArgs []any) *redis.Cmd {
	if err := ctx.Err(); err != nil {
		return errCmd(ctx, err)
	}
	cmd := redis.NewCmd(ctx, cmdArgs...)
	fut := s.ap.Submit(ctx, cmd)
	if err := fut.WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		// The batch may still be writing cmd: answer with another.
		if token != "" {
			s.pending.add(claimID(key, token), fut)
		}
		return errCmd(ctx, err)
	}
	return cmd
}

// errCmd is a command that was never sent, answering err.
func errCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}

// scriptLoads lets the calls that meet NOSCRIPT together share one SCRIPT LOAD.
type scriptLoads struct {
	mu      sync.Mutex
	loading map[string]*scriptLoad // by script hash
	// done counts successful loads by hash (TestAutoPipeliningScriptFlushStorm).
	done map[string]uint64
}

// loaded returns how many loads of script have succeeded.
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

// load sends SCRIPT LOAD (under ReadTimeout, not ctx) or joins the one in
// flight. since is loaded's answer before the EVALSHA: a load since is enough.
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

// isNoScript reports whether err is NOSCRIPT; nil is checked first, without allocating.
func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

func claimID(key, token string) string { return token + "\x00" + key }

// pendingClaims are given-up claims still with go-redis, by claimID: an
// unordered Release could overtake one and leave it IN_PROGRESS.
type pendingClaims struct {
	mu sync.Mutex
	m  map[string]*pendingClaim
}

// pendingClaim counts given-up claims of one key and token.
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

// wait waits until no given-up claim of id is with go-redis, or ctx ends.
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
