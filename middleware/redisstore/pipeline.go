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

// newAutoPipeliner returns nil for an ordered pipeliner, which one stalled
// connection stops; an owner never has two commands of a key in flight.
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

// autoPipelined sends an EVALSHA; after NOSCRIPT, callers share one SCRIPT LOAD.
func (s *Store) autoPipelined(ctx context.Context, op, key string, script *redis.Script, args []any) *redis.Cmd {
	track := op == "claim"
	loads := s.scripts.loaded(script)
	cmd := s.submit(ctx, track, key, script, args)
	if !isNoScript(cmd.Err()) {
		return cmd
	}
	if err := s.scripts.load(ctx, s.client, script, loads); err != nil {
		return errCmd(ctx, err)
	}
	cmd = s.submit(ctx, track, key, script, args)
	if isNoScript(cmd.Err()) { // flushed again meanwhile
		cmd = script.Eval(ctx, s.client, []string{key}, args...)
	}
	return cmd
}

// submit hands one EVALSHA over; track a claim's, whose first argument is its token.
func (s *Store) submit(ctx context.Context, track bool, key string, script *redis.Script, args []any) *redis.Cmd {
	token := ""
	if track {
		token = args[0].(string)
	}
	cmdArgs := append(make([]any, 0, 4+len(args)), "evalsha", script.Hash(), 1, key)
	return s.submitArgs(ctx, key, token, append(cmdArgs, args...))
}

// submitArgs waits until ctx ends; a given-up claim stays in s.pending.
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

func (l *scriptLoads) loaded(script *redis.Script) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.done[script.Hash()]
}

type scriptLoad struct {
	done chan struct{}
	err  error
}

// load joins or sends a SCRIPT LOAD (not under ctx) unless one succeeded since.
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

func isNoScript(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "NOSCRIPT")
}

func claimID(key, token string) string { return token + "\x00" + key }

// pendingClaims are given-up claims still with go-redis, for Release to wait for.
type pendingClaims struct {
	mu sync.Mutex
	m  map[string]*pendingClaim
}

type pendingClaim struct {
	n    int
	done chan struct{}
}

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
