package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
)

// The floor section measures whatever commands the store sends, not a copy
// of its scripts: it watches a real Store claim and complete a template key
// once, then sends the same commands again with only the key changed.

// cmdTemplate is one command a store sent for a template key, to be sent
// again for other keys: every argument equal to the template key is
// replaced, the others (token, TTLs, script hash) are sent as they were.
type cmdTemplate struct {
	args  []any
	keyAt []int // the positions in args of the template key
}

// newCmdTemplate returns the template of a command sent for key. An
// argument that holds key inside a larger value (a key spliced into a
// script or another key) cannot be substituted, and replaying it would hit
// the template key on every message: that is an error.
func newCmdTemplate(args []any, key string) (cmdTemplate, error) {
	if len(args) == 0 || key == "" {
		return cmdTemplate{}, errors.New("empty command or key")
	}
	t := cmdTemplate{args: slices.Clone(args)}
	for i, a := range args {
		s := argString(a)
		switch {
		case s == key:
			t.keyAt = append(t.keyAt, i)
		case strings.Contains(s, key):
			return cmdTemplate{}, fmt.Errorf("argument %d of %s holds the key %q inside a larger value (%s): it cannot be replayed on other keys",
				i, t.name(), key, shorten(s, 80))
		}
	}
	return t, nil
}

// argString is an argument as Redis receives it.
func argString(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case []byte:
		return string(v)
	default:
		return fmt.Sprint(v)
	}
}

// with returns the command's arguments for key.
func (t cmdTemplate) with(key string) []any {
	args := slices.Clone(t.args)
	for _, i := range t.keyAt {
		args[i] = key
	}
	return args
}

// name is the command's name, lower case, as INFO commandstats names it.
func (t cmdTemplate) name() string { return strings.ToLower(argString(t.args[0])) }

// String shows the command with the key as <key> and long arguments cut.
func (t cmdTemplate) String() string {
	parts := make([]string, len(t.args))
	for i, a := range t.args {
		s := argString(a)
		switch {
		case slices.Contains(t.keyAt, i):
			s = "<key>"
		case i == 0:
			s = strings.ToUpper(s)
		case s == "":
			s = `""`
		default:
			s = shorten(s, 40) // a script hash or a token in full, a stored result cut
		}
		parts[i] = s
	}
	return strings.Join(parts, " ")
}

// shorten cuts s to n bytes, marking the cut.
func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// templatesString shows a sequence of commands.
func templatesString(ts []cmdTemplate) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.String()
	}
	return out
}

// commandNames says what a message sends, e.g. "SET, SET" or "EVALSHA, EVALSHA".
func commandNames(steps ...[]cmdTemplate) string {
	var names []string
	for _, ts := range steps {
		for _, t := range ts {
			names = append(names, strings.ToUpper(t.name()))
		}
	}
	return strings.Join(names, ", ")
}

// storeCommands are the commands a store sent for one fresh message (its
// Claim, then its Complete) and for one duplicate (a Claim of a COMPLETED
// key).
type storeCommands struct {
	claim, complete, duplicate []cmdTemplate
}

// The TTLs of the floor section, the same for the store and the floor: a
// lease of a minute, a record kept a day.
const (
	floorLease = time.Minute
	floorTTL   = 24 * time.Hour
)

// cmdCapture is a go-redis hook that keeps every command its client sends
// (those that set up a new connection left out), to be read back with take.
type cmdCapture struct {
	mu   sync.Mutex
	cmds []redis.Cmder
}

func (c *cmdCapture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCapture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add(cmd)
		return next(ctx, cmd)
	}
}

func (c *cmdCapture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.add(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *cmdCapture) add(cmd redis.Cmder) {
	if connectionSetup[cmd.Name()] {
		return
	}
	c.mu.Lock()
	c.cmds = append(c.cmds, cmd)
	c.mu.Unlock()
}

// take returns the commands kept since the last take, and forgets them.
func (c *cmdCapture) take() []redis.Cmder {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmds := c.cmds
	c.cmds = nil
	return cmds
}

// captureStore watches a redisstore on addr, without auto-pipelining, claim
// and complete a fresh key under prefix with one token, then claim it again
// with another (a duplicate), and returns what it sent for each. A fresh
// message and a duplicate on a key of their own go first, so that every
// script they need is loaded and what is captured is what the store sends
// per message, not a NOSCRIPT and its fallback.
func captureStore(ctx context.Context, addr, prefix string) (storeCommands, error) {
	c := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: addr})
	defer c.Close()
	rec := &cmdCapture{}
	c.AddHook(rec)
	s := newRedisStore(c, true)
	token, dupToken := idempotency.NewToken(), idempotency.NewToken()

	message := func(key string) error {
		res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: floorLease, TTL: floorTTL})
		if err != nil {
			return err
		}
		if !res.Acquired {
			return fmt.Errorf("claim of fresh key %s not acquired: %+v", key, res.Record)
		}
		return s.Complete(ctx, key, token, nil, floorTTL)
	}
	duplicate := func(key string) error {
		res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: dupToken, Lease: floorLease, TTL: floorTTL})
		if err != nil {
			return err
		}
		if res.Acquired || res.Record.State != idempotency.StateCompleted {
			return fmt.Errorf("claim of COMPLETED key %s: acquired %v, state %v", key, res.Acquired, res.Record.State)
		}
		return nil
	}

	warm := prefix + "warm"
	if err := message(warm); err != nil {
		return storeCommands{}, fmt.Errorf("warm-up: %w", err)
	}
	if err := duplicate(warm); err != nil {
		return storeCommands{}, fmt.Errorf("warm-up: %w", err)
	}
	_ = s.Delete(ctx, warm)
	rec.take()

	key := prefix + "template"
	defer func() { _ = s.Delete(context.WithoutCancel(ctx), key) }()
	res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: token, Lease: floorLease, TTL: floorTTL})
	if err != nil || !res.Acquired {
		return storeCommands{}, fmt.Errorf("claim of the template key: acquired %v, %v", res.Acquired, err)
	}
	claim := rec.take()
	if err := s.Complete(ctx, key, token, nil, floorTTL); err != nil {
		return storeCommands{}, fmt.Errorf("complete of the template key: %w", err)
	}
	complete := rec.take()
	if err := duplicate(key); err != nil {
		return storeCommands{}, err
	}
	dup := rec.take()

	var out storeCommands
	for _, x := range []struct {
		what string
		cmds []redis.Cmder
		into *[]cmdTemplate
	}{{"claim", claim, &out.claim}, {"complete", complete, &out.complete}, {"duplicate claim", dup, &out.duplicate}} {
		if *x.into, err = templates(ctx, c, x.what, x.cmds, key); err != nil {
			return storeCommands{}, err
		}
	}
	return out, nil
}

// templates turns the commands a store sent for one call on key into
// templates. Each must have succeeded, touch no key but key (COMMAND
// GETKEYS, asked of the server), and at least one must name key: else a
// replay would not measure what the store does per message.
func templates(ctx context.Context, c *redis.Client, what string, cmds []redis.Cmder, key string) ([]cmdTemplate, error) {
	if len(cmds) == 0 {
		return nil, fmt.Errorf("the store's %s sent no command", what)
	}
	var out []cmdTemplate
	named := false
	for _, cmd := range cmds {
		if err := cmd.Err(); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("the store's %s sent %s, which failed: %w", what, cmd.Name(), err)
		}
		t, err := newCmdTemplate(cmd.Args(), key)
		if err != nil {
			return nil, fmt.Errorf("the store's %s: %w", what, err)
		}
		// A command without keys answers an error; one with keys must have
		// none but ours.
		if keys, err := c.CommandGetKeys(ctx, cmd.Args()...).Result(); err == nil {
			for _, k := range keys {
				if k != key {
					return nil, fmt.Errorf("the store's %s: %s touches key %q besides the template key %q", what, t.name(), k, key)
				}
			}
		}
		named = named || len(t.keyAt) > 0
		out = append(out, t)
	}
	if !named {
		return nil, fmt.Errorf("the store's %s: no command names the key %q: %v", what, key, templatesString(out))
	}
	return out, nil
}
