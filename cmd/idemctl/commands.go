package main

import (
	"cmp"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idempotency/watermill-idempotency/internal/adapterinspect"
	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	// Linked in for adapterinspect: their keys and stored answers.
	_ "github.com/idempotency/watermill-idempotency/middleware/grpcidem"
	_ "github.com/idempotency/watermill-idempotency/middleware/httpidem"
)

// recordView is a record as idemctl shows it. Durations are milliseconds.
type recordView struct {
	Key            string      `json:"key"`
	State          string      `json:"state"`
	Attempts       int         `json:"attempts,omitempty"`
	CreatedAt      *time.Time  `json:"created_at,omitempty"`
	UpdatedAt      *time.Time  `json:"updated_at,omitempty"`
	AgeMS          int64       `json:"age_ms,omitempty"`
	LeaseExpiresAt *time.Time  `json:"lease_expires_at,omitempty"`
	LeaseLeftMS    *int64      `json:"lease_left_ms,omitempty"`
	TTLMS          int64       `json:"ttl_ms,omitempty"`
	Fingerprint    string      `json:"fingerprint,omitempty"`
	ResultBytes    *int        `json:"result_bytes,omitempty"`
	Bytes          int64       `json:"bytes,omitempty"`
	Output         *outputView `json:"output,omitempty"`
	Error          string      `json:"error,omitempty"`
}

// outputView is a COMPLETED record's stored result, decoded when the
// Watermill middleware, httpidem or grpcidem wrote it.
type outputView struct {
	// Format: "messages" (the handler's output), "none" (no output),
	// "not_stored" (larger than MaxOutputSize, or replay disabled), an
	// adapter's answer (see adapterinspect.Answer: "http_response",
	// "grpc_response", "grpc_status", "grpc_not_stored"), or "opaque"
	// (written by Once.Do or another tool).
	Format   string        `json:"format"`
	Messages []messageView `json:"messages,omitempty"`
	*adapterinspect.Answer
}

type messageView struct {
	UUID         string            `json:"uuid"`
	Metadata     map[string]string `json:"metadata"`
	PayloadBytes int               `json:"payload_bytes"`
}

const stateCorrupt = "corrupt"

// view is rec as idemctl shows it; with withOutput, its stored output
// decoded, the adapter named first tried first (see decodeOutput).
func view(key string, rec idempotency.Record, ttl time.Duration, bytes int64, now time.Time, withOutput bool, first string) recordView {
	v := recordView{Key: key, State: rec.State.String(), Attempts: rec.Attempts, TTLMS: ttl.Milliseconds(), Bytes: bytes}
	if !rec.CreatedAt.IsZero() {
		v.CreatedAt, v.UpdatedAt = &rec.CreatedAt, &rec.UpdatedAt
		v.AgeMS = now.Sub(rec.UpdatedAt).Milliseconds()
	}
	if !rec.LeaseExpiresAt.IsZero() {
		v.LeaseExpiresAt = &rec.LeaseExpiresAt
		if rec.State == idempotency.StateInProgress {
			left := max(rec.LeaseExpiresAt.Sub(now).Milliseconds(), 0)
			v.LeaseLeftMS = &left
		}
	}
	if len(rec.Fingerprint) > 0 {
		v.Fingerprint = hex.EncodeToString(rec.Fingerprint)
	}
	if rec.State == idempotency.StateCompleted {
		n := len(rec.Result)
		v.ResultBytes = &n
		if withOutput {
			v.Output = decodeOutput(key, rec.Result, first)
		}
	}
	return v
}

// decodeOutput decodes a stored result: as an answer of the adapter named
// first (--http, --grpc), or of the adapter whose default prefix key
// starts with, then as the Watermill middleware's output, then as any
// adapter's answer; what none of them wrote is opaque.
func decodeOutput(key string, result []byte, first string) *outputView {
	adapters := adapterinspect.All()
	slices.SortStableFunc(adapters, func(a, b adapterinspect.Adapter) int {
		return cmp.Compare(rank(b, key, first), rank(a, key, first))
	})
	for _, a := range adapters {
		if rank(a, key, first) == 0 {
			break
		}
		if ans, err := a.Describe(result); err == nil {
			return &outputView{Format: ans.Format, Answer: &ans}
		}
	}
	msgs, stored, err := storekit.DecodeOutput(result)
	switch {
	case err != nil:
		for _, a := range adapters {
			if ans, err := a.Describe(result); err == nil {
				return &outputView{Format: ans.Format, Answer: &ans}
			}
		}
		return &outputView{Format: "opaque"}
	case !stored:
		return &outputView{Format: "not_stored"}
	case len(msgs) == 0:
		return &outputView{Format: "none"}
	}
	out := &outputView{Format: "messages"}
	for _, m := range msgs {
		out.Messages = append(out.Messages, messageView{UUID: m.UUID, Metadata: m.Metadata, PayloadBytes: len(m.Payload)})
	}
	return out
}

// rank orders the adapters whose answer a result may be: 2 for the one the
// operator named, 1 for the one whose default prefix key starts with.
func rank(a adapterinspect.Adapter, key, first string) int {
	switch {
	case a.Name == first:
		return 2
	case strings.HasPrefix(key, a.DefaultPrefix+":"):
		return 1
	}
	return 0
}

func corruptView(key string, err error) recordView {
	return recordView{Key: key, State: stateCorrupt, Error: err.Error()}
}

func (c *cli) writeJSON(v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintf(c.stdout, "%s\n", b)
}

func ms(n int64) string { return (time.Duration(n) * time.Millisecond).String() }

// printRecord prints v for a person.
func (c *cli) printRecord(v recordView) {
	w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "key:\t%q\n", v.Key)
	fmt.Fprintf(w, "state:\t%s\n", v.State)
	if v.Error != "" {
		fmt.Fprintf(w, "error:\t%s\n", v.Error)
	}
	if v.Attempts > 0 {
		fmt.Fprintf(w, "attempts:\t%d\n", v.Attempts)
	}
	if v.CreatedAt != nil {
		fmt.Fprintf(w, "created:\t%s\n", v.CreatedAt.UTC().Format(time.RFC3339Nano))
		fmt.Fprintf(w, "updated:\t%s (%s ago)\n", v.UpdatedAt.UTC().Format(time.RFC3339Nano), ms(v.AgeMS))
	}
	if v.LeaseExpiresAt != nil {
		left := "lapsed"
		if v.LeaseLeftMS != nil {
			left = ms(*v.LeaseLeftMS) + " left"
		}
		fmt.Fprintf(w, "lease until:\t%s (%s)\n", v.LeaseExpiresAt.UTC().Format(time.RFC3339Nano), left)
	}
	if v.TTLMS > 0 {
		fmt.Fprintf(w, "ttl:\t%s\n", ms(v.TTLMS))
	}
	if v.Fingerprint != "" {
		fmt.Fprintf(w, "fingerprint:\t%s\n", v.Fingerprint)
	}
	if v.Bytes > 0 {
		fmt.Fprintf(w, "size:\t%d bytes\n", v.Bytes)
	}
	if v.ResultBytes != nil {
		fmt.Fprintf(w, "result:\t%d bytes\n", *v.ResultBytes)
	}
	if v.Output != nil {
		fmt.Fprintf(w, "output:\t%s\n", v.Output.Format)
		for i, m := range v.Output.Messages {
			keys := make([]string, 0, len(m.Metadata))
			for k := range m.Metadata {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			meta := make([]string, 0, len(keys))
			for _, k := range keys {
				meta = append(meta, fmt.Sprintf("%s=%q", k, m.Metadata[k]))
			}
			fmt.Fprintf(w, "  message %d:\tuuid %s, payload %d bytes, metadata {%s}\n", i, m.UUID, m.PayloadBytes, strings.Join(meta, ", "))
		}
		if a := v.Output.Answer; a != nil {
			printAnswer(w, a)
		}
	}
	_ = w.Flush()
}

// printAnswer prints the lines of an adapter's stored answer.
func printAnswer(w io.Writer, a *adapterinspect.Answer) {
	if a.Status != 0 {
		fmt.Fprintf(w, "  status:\t%d\n", a.Status)
	}
	names := make([]string, 0, len(a.Headers))
	for name := range a.Headers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, v := range a.Headers[name] {
			fmt.Fprintf(w, "  header:\t%s: %s\n", name, v)
		}
	}
	if a.BodyBytes != nil {
		note := ""
		if a.BodyStored != nil && !*a.BodyStored {
			note = " (not stored: over MaxResponseBody)"
		}
		fmt.Fprintf(w, "  body:\t%d bytes%s\n", *a.BodyBytes, note)
	}
	if a.Type != "" {
		fmt.Fprintf(w, "  type:\t%s\n", a.Type)
	}
	if a.Code != "" {
		fmt.Fprintf(w, "  code:\t%s\n", a.Code)
	}
	if a.Message != "" {
		fmt.Fprintf(w, "  message:\t%q\n", a.Message)
	}
	if a.Bytes != nil {
		fmt.Fprintf(w, "  size:\t%d bytes\n", *a.Bytes)
	}
}

// progress reports a long walk on stderr, at most every two seconds.
type progress struct {
	c     *cli
	every time.Duration
	start time.Time
	last  time.Time
	shown bool
}

// progressEvery is how often a long walk reports its progress.
const progressEvery = 2 * time.Second

func newProgress(c *cli) *progress {
	now := time.Now()
	return &progress{c: c, every: progressEvery, start: now, last: now}
}

func (p *progress) update(scanned, matched int) {
	if time.Since(p.last) < p.every {
		return
	}
	p.last = time.Now()
	p.shown = true
	fmt.Fprintf(p.c.stderr, "idemctl: %d keys scanned, %d matched (%s)\n", scanned, matched, time.Since(p.start).Round(time.Second))
}

func (p *progress) done(scanned, matched int) {
	if p.shown {
		fmt.Fprintf(p.c.stderr, "idemctl: done: %d keys scanned, %d matched (%s)\n", scanned, matched, time.Since(p.start).Round(time.Millisecond))
	}
}

var getCommand = command{
	synopsis: "get KEY [--http | --grpc] [--scope S] [--prefix P] [--json]",
	help: "Shows one key: state, attempts, lease left, TTL, fingerprint, size and the stored output\n" +
		"(the Watermill middleware's messages; httpidem's status, headers and body size; grpcidem's\n" +
		"response type and size, or its status).\n" +
		"With --http or --grpc, KEY is the key a client sent (Idempotency-Key, idempotency-key),\n" +
		"and the stored key is built as httpidem or grpcidem builds it: PREFIX:HASH:KEY, HASH the hex\n" +
		"of the first 16 bytes of SHA-256(scope) (under SingleTenant the scope is empty).\n" +
		"Exit 3 when the store does not hold the key.",
	args: 1,
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		adapters := map[string]*bool{}
		for _, a := range adapterinspect.All() {
			adapters[a.Name] = fs.Bool(a.Name, false, fmt.Sprintf("KEY is a client's key of %sidem: build its stored key (--scope, --prefix)", a.Name))
		}
		scope := fs.String("scope", "", "with --http or --grpc: the scope of the request (Config.Scope's answer; empty under SingleTenant)")
		prefix := fs.String("prefix", "", "with --http or --grpc: Config.KeyPrefix (default httpidem or grpcidem)")
		return func(ctx context.Context, c *cli, args []string) error {
			key, first := args[0], ""
			for _, a := range adapterinspect.All() {
				if !*adapters[a.Name] {
					continue
				}
				if first != "" {
					return fmt.Errorf("%w: --%s and --%s: a key is of one adapter", errUsage, first, a.Name)
				}
				first = a.Name
				p := strings.TrimSuffix(*prefix, ":") // a KeyPrefix holds no colon
				if p == "" {
					p = a.DefaultPrefix
				}
				k, err := a.ClientKey(key)
				if err != nil {
					return fmt.Errorf("%w: --%s: key %q %v", errUsage, a.Name, key, err)
				}
				key = a.StoreKey(p, *scope, k)
			}
			if first == "" && (*scope != "" || *prefix != "") {
				return fmt.Errorf("%w: --scope and --prefix build an adapter's key: give --http or --grpc", errUsage)
			}
			k, err := c.lookup(ctx, key)
			if errors.Is(err, idempotency.ErrCorruptRecord) {
				c.show(corruptView(key, err))
				return err
			}
			if err != nil {
				return err
			}
			if k.rec.State == idempotency.StateAbsent {
				return notFound(fmt.Errorf("no record under %q", key))
			}
			c.show(view(key, k.rec, k.ttl, k.bytes, k.now, true, first))
			return nil
		}
	},
}

// keyRead is one key as get and release read it.
type keyRead struct {
	now   time.Time // the store's clock, read first
	rec   idempotency.Record
	ttl   time.Duration
	bytes int64
}

// lookup reads the store's clock, then the record under key: its entry
// in a listing of key as a prefix (which has its TTL and size), or Get's
// answer when the listing has none (the key is absent).
func (c *cli) lookup(ctx context.Context, key string) (keyRead, error) {
	now, err := c.be.now(ctx)
	if err != nil {
		return keyRead{}, err
	}
	for e, err := range c.be.store.Records(ctx, key) {
		switch {
		case err != nil:
			return keyRead{}, err
		case e.Key != key:
		case e.Err != nil:
			return keyRead{now: now}, e.Err
		default:
			return keyRead{now: now, rec: e.Record, ttl: e.TTL, bytes: e.Bytes}, nil
		}
	}
	rec, err := c.be.store.Get(ctx, key)
	return keyRead{now: now, rec: rec}, err
}

func (c *cli) show(v recordView) {
	c.answered = true
	if c.opts.json {
		c.writeJSON(v)
	} else {
		c.printRecord(v)
	}
}

// filter is the record selection of list and purge.
type filter struct {
	prefix      string
	state       string
	minAttempts int
	age         time.Duration
	limit       int
}

// filtered registers the filter's flags on fs, --limit defaulting to
// limit, and returns a command's run that calls run with the filter once
// it is valid.
func filtered(fs *flag.FlagSet, limit int, run func(ctx context.Context, c *cli, f filter) error) func(context.Context, *cli, []string) error {
	var f filter
	fs.StringVar(&f.prefix, "prefix", "", "only keys that start with this (e.g. idem:orders:); empty: every key of the store")
	fs.StringVar(&f.state, "state", "", "only keys in this state: in_progress, failed (a lapsed lease is failed), completed or corrupt")
	fs.IntVar(&f.minAttempts, "min-attempts", 0, "only keys with at least this many attempts")
	fs.DurationVar(&f.age, "age", 0, "only keys whose last transition (for in_progress: the claim) is at least this old")
	fs.IntVar(&f.limit, "limit", limit, "stop after this many matching keys")
	return func(ctx context.Context, c *cli, _ []string) error {
		if err := f.validate(); err != nil {
			return err
		}
		return run(ctx, c, f)
	}
}

func (f *filter) validate() error {
	switch f.state {
	case "", "in_progress", "failed", "completed", stateCorrupt:
	default:
		return fmt.Errorf("%w: --state %q: use in_progress, failed, completed or corrupt", errUsage, f.state)
	}
	if f.minAttempts < 0 || f.age < 0 || f.limit < 1 {
		return fmt.Errorf("%w: --min-attempts and --age must not be negative, --limit must be positive", errUsage)
	}
	return nil
}

func (f *filter) match(e idempotency.Entry, now time.Time) bool {
	if e.Err != nil { // a corrupt record has no state, attempts or age
		return (f.state == "" || f.state == stateCorrupt) && f.minAttempts == 0 && f.age == 0
	}
	if e.Record.State == idempotency.StateAbsent || f.state == stateCorrupt {
		return false
	}
	if f.state != "" && e.Record.State.String() != f.state {
		return false
	}
	if e.Record.Attempts < f.minAttempts {
		return false
	}
	return f.age == 0 || now.Sub(e.Record.UpdatedAt) >= f.age
}

// walk yields the entries that match f, with progress on stderr. A read
// error other than a corrupt record ends the walk.
func (c *cli) walk(ctx context.Context, f filter, each func(e idempotency.Entry) error) (scanned, matched int, truncated bool, err error) {
	now, err := c.be.now(ctx)
	if err != nil {
		return 0, 0, false, err
	}
	p := newProgress(c)
	defer func() { p.done(scanned, matched) }()
	for e, err := range c.be.store.Records(ctx, f.prefix) {
		if err != nil {
			return scanned, matched, false, err
		}
		if e.Err != nil && !errors.Is(e.Err, idempotency.ErrCorruptRecord) {
			return scanned, matched, false, e.Err
		}
		scanned++
		p.update(scanned, matched)
		if !f.match(e, now) {
			continue
		}
		if matched == f.limit {
			return scanned, matched, true, nil
		}
		matched++
		if err := each(e); err != nil {
			return scanned, matched, false, err
		}
	}
	return scanned, matched, false, nil
}

var listCommand = command{
	synopsis: "list [--prefix P] [--state S] [--min-attempts N] [--age D] [--limit N] [--json]",
	help: "Lists the keys under --prefix that match every filter, as the store's walk finds them\n" +
		"(Redis: SCAN; PostgreSQL and MySQL: pages in key_hash order), until --limit matches.\n" +
		"With --json, one JSON object per line; a summary goes to stderr.",
	args: 0,
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		return filtered(fs, 1000, func(ctx context.Context, c *cli, f filter) error {
			now, err := c.be.now(ctx)
			if err != nil {
				return err
			}
			var tw *tabwriter.Writer
			if !c.opts.json {
				tw = tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "STATE\tATTEMPTS\tAGE\tLEASE LEFT\tTTL\tKEY")
			}
			scanned, matched, truncated, err := c.walk(ctx, f, func(e idempotency.Entry) error {
				var v recordView
				if e.Err != nil {
					v = corruptView(e.Key, e.Err)
				} else {
					v = view(e.Key, e.Record, e.TTL, e.Bytes, now, false, "")
				}
				if c.opts.json {
					c.writeJSON(v)
					return nil
				}
				left := "-"
				if v.LeaseLeftMS != nil {
					left = ms(*v.LeaseLeftMS)
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%q\n", v.State, v.Attempts, ms(v.AgeMS), left, ms(v.TTLMS), v.Key)
				return nil
			})
			if tw != nil {
				_ = tw.Flush()
			}
			if err != nil {
				return err
			}
			more := ""
			if truncated {
				more = fmt.Sprintf("; stopped at --limit %d, more keys match", f.limit)
			}
			fmt.Fprintf(c.stderr, "idemctl: %d of %d scanned keys listed%s\n", matched, scanned, more)
			return nil
		})
	},
}

var releaseCommand = command{
	synopsis: "release KEY [--yes] [--json]",
	help: "Frees an IN_PROGRESS or FAILED key so that the next delivery runs its handler.\n" +
		"The record is deleted in one atomic store operation that checks its state first:\n" +
		"its attempt count and fingerprint are forgotten, and the next delivery is attempt 1\n" +
		"(also past MaxAttempts). An owner still running the handler loses its lease: its\n" +
		"context is cancelled at its next renewal and its Complete reports lease_lost, so\n" +
		"release a live IN_PROGRESS key only when its handler is stuck. A COMPLETED key is\n" +
		"refused (exit 4): deleting it would run the effect again; use purge for that.\n" +
		"Exit 3 when the store does not hold the key.",
	args: 1,
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		yes := fs.Bool("yes", false, "do not ask for confirmation")
		return func(ctx context.Context, c *cli, args []string) error {
			key := args[0]
			k, err := c.lookup(ctx, key)
			rec := k.rec
			if errors.Is(err, idempotency.ErrCorruptRecord) {
				return fmt.Errorf("%w; release frees only records: delete it with idemctl purge --prefix %q --state corrupt --apply", err, key)
			}
			if err != nil {
				return err
			}
			if err := releasable(key, rec.State); err != nil {
				return err
			}
			if !*yes {
				what := fmt.Sprintf("%s, %d attempt(s)", rec.State, rec.Attempts)
				if rec.State == idempotency.StateInProgress {
					what += fmt.Sprintf(", lease held for %s more: its owner will be cancelled", rec.LeaseExpiresAt.Sub(k.now).Round(time.Millisecond))
				}
				if err := c.confirm(fmt.Sprintf("Release %q (%s)? The next delivery runs the handler as attempt 1.", key, what)); err != nil {
					return err
				}
			}
			found, deleted, err := c.be.store.DeleteIf(ctx, key, idempotency.StateInProgress, idempotency.StateFailed)
			if err != nil {
				return err
			}
			if !deleted {
				return releasable(key, found) // it changed since it was read
			}
			if c.opts.json {
				c.writeJSON(map[string]any{"key": key, "released": true, "state": found.String(), "attempts": rec.Attempts})
			} else {
				fmt.Fprintf(c.stdout, "released %q (was %s after %d attempt(s)); the next delivery runs it\n", key, found, rec.Attempts)
			}
			return nil
		}
	},
}

// releasable says why a key in state cannot be released, or nil.
func releasable(key string, state idempotency.State) error {
	switch state {
	case idempotency.StateAbsent:
		return notFound(fmt.Errorf("no record under %q: nothing to release, the next delivery runs it", key))
	case idempotency.StateCompleted:
		return refused(fmt.Errorf("%q is COMPLETED: release frees only IN_PROGRESS or FAILED keys; deleting a completed key runs its effect again (idemctl purge does it)", key))
	}
	return nil
}

var purgeCommand = command{
	synopsis: "purge [--prefix P] [--state S] [--min-attempts N] [--age D] [--limit N] [--apply [--yes]] [--json]",
	help: "Deletes the keys under --prefix and/or in --state (and matching the other filters).\n" +
		"Without --apply it is a dry run that only lists what it would delete. With --apply\n" +
		"it asks for confirmation unless --yes, then deletes each key; with --state, only if\n" +
		"the key is still in that state (checked atomically; corrupt: just before), so a key\n" +
		"that moved on is skipped. Deleting a COMPLETED key lets its next copy run the effect\n" +
		"again; deleting an IN_PROGRESS one cancels its owner (see release).",
	args: 0,
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		apply := fs.Bool("apply", false, "delete (without it: a dry run)")
		yes := fs.Bool("yes", false, "with --apply: do not ask for confirmation")
		return filtered(fs, 100000, func(ctx context.Context, c *cli, f filter) error {
			if f.prefix == "" && f.state == "" {
				return fmt.Errorf("%w: purge needs --prefix or --state (it never deletes every key of a store)", errUsage)
			}
			var keys []string
			if _, _, truncated, err := c.walk(ctx, f, func(e idempotency.Entry) error { keys = append(keys, e.Key); return nil }); err != nil {
				return err
			} else if truncated {
				fmt.Fprintf(c.stderr, "idemctl: stopped at --limit %d; run purge again for the rest\n", f.limit)
			}
			if !*apply {
				if c.opts.json {
					c.writeJSON(map[string]any{"dry_run": true, "matched": len(keys), "deleted": 0, "keys": nonNil(keys)})
				} else {
					for i, k := range keys {
						if i == maxListed {
							fmt.Fprintf(c.stdout, "… and %d more (--json lists them all)\n", len(keys)-maxListed)
							break
						}
						fmt.Fprintf(c.stdout, "would delete %q\n", k)
					}
					fmt.Fprintf(c.stdout, "dry run: %d key(s) match; run again with --apply to delete them\n", len(keys))
				}
				return nil
			}
			if len(keys) > 0 && !*yes {
				if err := c.confirm(fmt.Sprintf("Delete %d key(s) (prefix %q, state %q)?", len(keys), f.prefix, f.state)); err != nil {
					return err
				}
			}
			deleted, skipped := []string{}, []string{}
			for _, k := range keys {
				ok, err := c.purgeKey(ctx, k, f.state)
				if err != nil {
					return err
				}
				if ok {
					deleted = append(deleted, k)
				} else {
					skipped = append(skipped, k)
				}
			}
			if c.opts.json {
				c.writeJSON(map[string]any{"dry_run": false, "matched": len(keys), "deleted": len(deleted), "skipped": skipped, "keys": deleted})
			} else {
				fmt.Fprintf(c.stdout, "deleted %d key(s); %d skipped (their state changed)\n", len(deleted), len(skipped))
			}
			return nil
		})
	},
}

// purgeKey deletes key: only if still in state when one is given.
func (c *cli) purgeKey(ctx context.Context, key, state string) (bool, error) {
	var st idempotency.State
	switch state {
	case "":
		return true, c.be.store.Delete(ctx, key)
	case stateCorrupt:
		// No store deletes only a corrupt row: check just before the
		// delete that it is still one (a claim never rewrites it, only a
		// delete or the purge of its expiry removes it).
		if _, _, err := c.be.store.DeleteIf(ctx, key); !errors.Is(err, idempotency.ErrCorruptRecord) {
			return false, err
		}
		return true, c.be.store.Delete(ctx, key)
	case "in_progress":
		st = idempotency.StateInProgress
	case "failed":
		st = idempotency.StateFailed
	case "completed":
		st = idempotency.StateCompleted
	}
	_, deleted, err := c.be.store.DeleteIf(ctx, key, st)
	return deleted, err
}

// maxListed bounds the keys a dry run prints as text.
const maxListed = 20

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// stateCount is one state's line of stats.
type stateCount struct {
	Records   int64 `json:"records"`
	Sampled   int64 `json:"sampled"` // the records whose size the store reported
	MeanBytes int64 `json:"mean_bytes"`
}

// stats counts the records under prefix by state, from a listing of at
// most limit of them.
func (c *cli) stats(ctx context.Context, prefix string, limit int, progress func(scanned, matched int)) (counts map[string]stateCount, scanned int, truncated bool, err error) {
	counts = map[string]stateCount{}
	sums := map[string]int64{}
	for e, err := range c.be.store.Records(ctx, prefix) {
		if err != nil {
			return nil, scanned, false, err
		}
		if scanned == limit {
			truncated = true
			break
		}
		scanned++
		progress(scanned, scanned)
		state := e.Record.State.String()
		switch {
		case e.Err != nil && errors.Is(e.Err, idempotency.ErrCorruptRecord):
			state = stateCorrupt
		case e.Err != nil:
			return nil, scanned, false, e.Err
		case e.Record.State == idempotency.StateAbsent:
			continue // expired during the walk
		}
		n := counts[state]
		n.Records++
		if e.Bytes > 0 {
			n.Sampled++
			sums[state] += e.Bytes
		}
		counts[state] = n
	}
	for s, n := range counts {
		if n.Sampled > 0 {
			n.MeanBytes = sums[s] / n.Sampled
		}
		counts[s] = n
	}
	return counts, scanned, truncated, nil
}

var statsCommand = command{
	synopsis: "stats [--prefix P] [--limit N] [--json]",
	help: "Counts the keys under --prefix per state, with the mean bytes per record, from a walk\n" +
		"of at most --limit keys (Redis: SCAN, sizes by MEMORY USAGE; PostgreSQL: pg_column_size\n" +
		"of each row; MySQL: the sum of its columns' lengths, without InnoDB's overhead).\n" +
		"Sizing: keys per day x retention in days x bytes per record.",
	args: 0,
	flags: func(fs *flag.FlagSet) func(context.Context, *cli, []string) error {
		prefix := fs.String("prefix", "", "only keys that start with this; empty: every key of the store")
		limit := fs.Int("limit", 1000000, "count at most this many keys")
		return func(ctx context.Context, c *cli, _ []string) error {
			if *limit < 1 {
				return fmt.Errorf("%w: --limit must be positive", errUsage)
			}
			p := newProgress(c)
			counts, scanned, truncated, err := c.stats(ctx, *prefix, *limit, p.update)
			if err != nil {
				return err
			}
			p.done(scanned, scanned)
			var total, sampled, sum int64
			for _, s := range counts {
				total += s.Records
				sampled += s.Sampled
				sum += s.Sampled * s.MeanBytes
			}
			var mean int64
			if sampled > 0 {
				mean = sum / sampled
			}
			if c.opts.json {
				c.writeJSON(map[string]any{"store": c.be.kind, "prefix": *prefix, "records": total, "scanned": scanned,
					"exact": !truncated, "truncated": truncated, "mean_bytes": mean, "states": counts})
				return nil
			}
			w := tabwriter.NewWriter(c.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "STATE\tRECORDS\tSAMPLED\tMEAN BYTES")
			names := make([]string, 0, len(counts))
			for s := range counts {
				names = append(names, s)
			}
			sort.Strings(names)
			for _, s := range names {
				fmt.Fprintf(w, "%s\t%d\t%d\t%d\n", s, counts[s].Records, counts[s].Sampled, counts[s].MeanBytes)
			}
			fmt.Fprintf(w, "total\t%d\t%d\t%d\n", total, sampled, mean)
			_ = w.Flush()
			if truncated {
				fmt.Fprintf(c.stdout, "(stopped at --limit %d keys: counts are a lower bound)\n", *limit)
			}
			return nil
		}
	},
}
