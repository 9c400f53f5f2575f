package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/mysqlstore"
	"github.com/idempotency/watermill-idempotency/middleware/pgstore"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// env is one store under test, with a key prefix of its own.
type env struct {
	kind   string
	store  idempotency.Store
	flags  []string // --store (and --table)
	prefix string   // the middleware's KeyPrefix; keys start with prefix+":"
	// corrupt writes a value under key that is not a record.
	corrupt func(t *testing.T, key string)
}

// eachStore runs f against real Redis, real PostgreSQL and real MySQL (or
// MariaDB), in parallel.
func eachStore(t *testing.T, f func(t *testing.T, e env)) {
	t.Helper()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		client := testserver.RedisClient(t)
		store, err := redisstore.New(client, nil)
		require.NoError(t, err)
		e := env{kind: "redis", store: store, prefix: testserver.UniqueName("idemctltest"),
			flags: []string{"--store", "redis://" + testserver.RedisAddr(t) + "/0"}}
		e.corrupt = func(t *testing.T, key string) {
			require.NoError(t, client.Set(context.Background(), key, "not a record", time.Minute).Err())
		}
		t.Cleanup(func() {
			keys, _ := client.Keys(context.Background(), e.prefix+"*").Result()
			if len(keys) > 0 {
				client.Del(context.Background(), keys...)
			}
		})
		f(t, e)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool := testserver.PostgresPool(t)
		table := testserver.UniqueName("idemctl_test_")
		store, err := pgstore.New(pool, pgstore.Config{Table: table})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(context.Background()))
		t.Cleanup(func() {
			_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
		})
		e := env{kind: "postgres", store: store, prefix: testserver.UniqueName("idemctltest"),
			flags: []string{"--store", testserver.PostgresURL(), "--table", table}}
		e.corrupt = func(t *testing.T, key string) {
			sum := sha256sum(key)
			_, err := pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
				` (key_hash, key, state, attempts, created_at, updated_at, expires_at) VALUES ($1, $2, 'bogus', 1, now(), now(), now() + interval '1 minute')`,
				sum, []byte(key))
			if err != nil && strings.Contains(err.Error(), "idempotency_record_valid") {
				// The table's CHECK refuses it: drop the constraint, as an
				// older table without it would be.
				_, err = pool.Exec(context.Background(), "ALTER TABLE "+pgx.Identifier{table}.Sanitize()+" DROP CONSTRAINT idempotency_record_valid")
				require.NoError(t, err)
				_, err = pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{table}.Sanitize()+
					` (key_hash, key, state, attempts, created_at, updated_at, expires_at) VALUES ($1, $2, 'bogus', 1, now(), now(), now() + interval '1 minute')`,
					sum, []byte(key))
			}
			require.NoError(t, err)
		}
		f(t, e)
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		db := testserver.MySQLDB(t)
		table := testserver.UniqueName("idemctl_test_")
		store, err := mysqlstore.New(db, mysqlstore.Config{Table: table})
		require.NoError(t, err)
		require.NoError(t, store.Migrate(context.Background()))
		t.Cleanup(func() {
			_ = store.Close()
			_, _ = db.ExecContext(context.Background(), "DROP TABLE IF EXISTS `"+table+"`")
		})
		e := env{kind: "mysql", store: store, prefix: testserver.UniqueName("idemctltest"),
			flags: []string{"--store", mysqlTestURL(t), "--table", table}}
		e.corrupt = func(t *testing.T, key string) {
			// The table's CHECK would refuse the row: drop it, as a table
			// made by hand without it would be.
			_, err := db.ExecContext(context.Background(), "ALTER TABLE `"+table+"` DROP CONSTRAINT IF EXISTS `"+table+"_record_valid`")
			require.NoError(t, err)
			_, err = db.ExecContext(context.Background(), "INSERT INTO `"+table+"`"+
				" (key_hash, `key`, state, attempts, created_at, updated_at, expires_at) VALUES (?, ?, 'bogus', 1, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) + INTERVAL 1 MINUTE)",
				sha256sum(key), []byte(key))
			require.NoError(t, err)
		}
		f(t, e)
	})
}

// mysqlTestURL is the shared MySQL server (MYSQL_DSN) as the mysql:// URL
// an operator gives idemctl.
func mysqlTestURL(t *testing.T) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testserver.MySQLDSN())
	require.NoError(t, err)
	u := url.URL{Scheme: "mysql", Host: cfg.Addr, Path: "/" + cfg.DBName}
	switch {
	case cfg.Passwd != "":
		u.User = url.UserPassword(cfg.User, cfg.Passwd)
	case cfg.User != "":
		u.User = url.User(cfg.User)
	}
	return u.String()
}

// result is one run of idemctl.
type result struct {
	code           int
	stdout, stderr string
}

// idemctl runs the command in process with stdin as its input.
func idemctl(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errOut)
	return result{code: code, stdout: out.String(), stderr: errOut.String()}
}

// jsonRun runs a command of e with --json and decodes its one JSON line.
func (e env) jsonRun(t *testing.T, stdin string, wantCode int, args ...string) map[string]any {
	t.Helper()
	r := idemctl(t, stdin, append(append(args, "--json"), e.flags...)...)
	require.Equal(t, wantCode, r.code, "exit code of %v; stdout %s; stderr %s", args, r.stdout, r.stderr)
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.stdout), &v), "stdout of %v: %q", args, r.stdout)
	return v
}

// jsonLines runs list and decodes its JSON lines.
func (e env) jsonLines(t *testing.T, args ...string) []map[string]any {
	t.Helper()
	r := idemctl(t, "", append(append([]string{"list", "--json"}, args...), e.flags...)...)
	require.Equal(t, exitOK, r.code, "list %v: %s", args, r.stderr)
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(r.stdout))
	for sc.Scan() {
		var v map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &v), "line %q", sc.Text())
		lines = append(lines, v)
	}
	return lines
}

func keysOf(lines []map[string]any) []string {
	var keys []string
	for _, l := range lines {
		keys = append(keys, l["key"].(string))
	}
	return keys
}

// newIdem returns the Watermill middleware on e's store and prefix, scope
// "orders".
func (e env) newIdem(t *testing.T, adjust func(*idempotency.OnceConfig, *idempotency.Config)) *idempotency.Middleware {
	t.Helper()
	oc := idempotency.OnceConfig{Store: e.store, LeaseTTL: 2 * time.Second}
	cfg := idempotency.Config{KeyPrefix: e.prefix, Scope: func(*message.Message) string { return "orders" }, NackDelay: time.Millisecond}
	if adjust != nil {
		adjust(&oc, &cfg)
	}
	once, err := idempotency.NewOnce(oc)
	require.NoError(t, err)
	idem, err := idempotency.New(once, &cfg)
	require.NoError(t, err)
	return idem
}

func (e env) key(id string) string { return e.prefix + ":orders:" + id }

func newMsg(id, payload string) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(payload))
	msg.Metadata.Set("requestId", id)
	return msg
}

// claimStuck claims key for a long lease, as a handler that hangs would hold
// it.
func (e env) claimStuck(t *testing.T, key string) {
	t.Helper()
	res, err := e.store.Claim(context.Background(), key, idempotency.ClaimRequest{Token: storekit.NewToken(), Lease: time.Minute, TTL: time.Minute})
	require.NoError(t, err)
	require.True(t, res.Acquired)
}

// failTimes makes key FAILED with n attempts.
func (e env) failTimes(t *testing.T, key string, n int) {
	t.Helper()
	for range n {
		tok := storekit.NewToken()
		res, err := e.store.Claim(context.Background(), key, idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
		require.NoError(t, err)
		require.True(t, res.Acquired)
		require.NoError(t, e.store.Fail(context.Background(), key, tok, time.Minute))
	}
}

// get shows a completed key's decoded output, fingerprint and TTL, and a key
// the store does not hold is exit 3.
func TestGet(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		idem := e.newIdem(t, func(_ *idempotency.OnceConfig, c *idempotency.Config) { c.CheckPayload = true })
		h := idem.Middleware(func(msg *message.Message) ([]*message.Message, error) {
			out := message.NewMessage("out-uuid-1", []byte("twelve bytes"))
			out.Metadata.Set("topic", "shipments")
			return []*message.Message{out}, nil
		})
		_, err := h(newMsg("order-1", "payload"))
		require.NoError(t, err)

		v := e.jsonRun(t, "", exitOK, "get", e.key("order-1"))
		assert.Equal(t, e.key("order-1"), v["key"])
		assert.Equal(t, "completed", v["state"])
		assert.EqualValues(t, 1, v["attempts"])
		assert.Greater(t, v["ttl_ms"], float64(time.Hour.Milliseconds()), "24 h by default")
		assert.Len(t, v["fingerprint"], 64, "SHA-256 of the payload, hex")
		assert.Greater(t, v["bytes"], float64(0))
		out := v["output"].(map[string]any)
		assert.Equal(t, "messages", out["format"])
		msgs := out["messages"].([]any)
		require.Len(t, msgs, 1)
		m := msgs[0].(map[string]any)
		assert.Equal(t, "out-uuid-1", m["uuid"])
		assert.EqualValues(t, 12, m["payload_bytes"])
		assert.Equal(t, map[string]any{"topic": "shipments"}, m["metadata"])

		// A value stored by Once.Do is no Watermill output: shown as opaque.
		once, err := idempotency.NewOnce(idempotency.OnceConfig{Store: e.store})
		require.NoError(t, err)
		_, err = once.Do(context.Background(), e.key("once"), func(context.Context) ([]byte, error) { return []byte("value"), nil })
		require.NoError(t, err)
		v = e.jsonRun(t, "", exitOK, "get", e.key("once"))
		assert.EqualValues(t, 5, v["result_bytes"])
		assert.Equal(t, map[string]any{"format": "opaque"}, v["output"])

		e.claimStuck(t, e.key("stuck"))
		v = e.jsonRun(t, "", exitOK, "get", e.key("stuck"))
		assert.Equal(t, "in_progress", v["state"])
		assert.Greater(t, v["lease_left_ms"], float64(30*time.Second.Milliseconds()))
		assert.LessOrEqual(t, v["lease_left_ms"], float64(time.Minute.Milliseconds()))
		assert.NotContains(t, v, "output")

		v = e.jsonRun(t, "", exitNotFound, "get", e.key("nobody"))
		assert.Equal(t, "not_found", v["code"])

		e.corrupt(t, e.key("bad"))
		v = e.jsonRun(t, "", exitError, "get", e.key("bad"))
		assert.Equal(t, "corrupt", v["state"])
		assert.Contains(t, v["error"], "corrupt")

		text := idemctl(t, "", append([]string{"get", e.key("order-1")}, e.flags...)...)
		require.Equal(t, exitOK, text.code, text.stderr)
		assert.Contains(t, text.stdout, "uuid out-uuid-1, payload 12 bytes")
	})
}

// list filters by state, attempts and age, and stops at --limit.
func TestList(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		h := e.newIdem(t, nil).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		for _, id := range []string{"a", "b", "c"} {
			_, err := h(newMsg(id, ""))
			require.NoError(t, err)
		}
		e.claimStuck(t, e.key("stuck"))
		e.failTimes(t, e.key("poison"), 5)
		e.failTimes(t, e.key("flaky"), 1)
		e.corrupt(t, e.key("bad"))

		all := e.jsonLines(t, "--prefix", e.prefix+":")
		assert.ElementsMatch(t, []string{e.key("a"), e.key("b"), e.key("c"), e.key("stuck"), e.key("poison"), e.key("flaky"), e.key("bad")}, keysOf(all))

		stuck := e.jsonLines(t, "--prefix", e.prefix+":", "--state", "in_progress")
		require.Equal(t, []string{e.key("stuck")}, keysOf(stuck))
		assert.Greater(t, stuck[0]["lease_left_ms"], float64(0))

		assert.Equal(t, []string{e.key("poison")}, keysOf(e.jsonLines(t, "--prefix", e.prefix+":", "--min-attempts", "5")))
		assert.ElementsMatch(t, []string{e.key("poison"), e.key("flaky")}, keysOf(e.jsonLines(t, "--prefix", e.prefix+":", "--state", "failed")))
		assert.Len(t, e.jsonLines(t, "--prefix", e.prefix+":", "--state", "completed"), 3)
		assert.Equal(t, []string{e.key("bad")}, keysOf(e.jsonLines(t, "--prefix", e.prefix+":", "--state", "corrupt")))
		assert.Len(t, e.jsonLines(t, "--prefix", e.prefix+":", "--limit", "2"), 2)
		assert.Empty(t, e.jsonLines(t, "--prefix", e.prefix+":", "--age", "1h"), "nothing is an hour old")
		time.Sleep(150 * time.Millisecond)
		e.failTimes(t, e.key("fresh"), 1)
		old := keysOf(e.jsonLines(t, "--prefix", e.prefix+":", "--state", "failed", "--age", "100ms"))
		assert.ElementsMatch(t, []string{e.key("poison"), e.key("flaky")}, old, "the fresh failure is younger")
		assert.Empty(t, e.jsonLines(t, "--prefix", e.prefix+":nothing-here"))

		r := idemctl(t, "", append([]string{"list", "--state", "stuck"}, e.flags...)...)
		assert.Equal(t, exitUsage, r.code)
	})
}

// release frees a stuck IN_PROGRESS key and a FAILED key past MaxAttempts,
// after which the next message runs through the Watermill middleware; it
// asks first, refuses a COMPLETED key and reports an absent one.
func TestReleaseThenTheNextMessageRuns(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		runs := 0
		idem := e.newIdem(t, func(c *idempotency.OnceConfig, _ *idempotency.Config) { c.MaxAttempts = 2 })
		h := idem.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })

		// A handler hung holding the key: every copy is nacked in progress.
		e.claimStuck(t, e.key("stuck"))
		_, err := h(newMsg("stuck", ""))
		require.ErrorIs(t, err, idempotency.ErrInProgress)

		v := e.jsonRun(t, "no\n", exitRefused, "release", e.key("stuck"))
		assert.Equal(t, "refused", v["code"])
		rec, err := e.store.Get(context.Background(), e.key("stuck"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateInProgress, rec.State, "not confirmed: nothing changed")

		v = e.jsonRun(t, "y\n", exitOK, "release", e.key("stuck"))
		assert.Equal(t, true, v["released"])
		assert.Equal(t, "in_progress", v["state"])
		_, err = h(newMsg("stuck", ""))
		require.NoError(t, err)
		assert.Equal(t, 1, runs, "the next message ran")
		rec, err = e.store.Get(context.Background(), e.key("stuck"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State)
		assert.Equal(t, 1, rec.Attempts, "attempts start again at 1")

		// A poison key at MaxAttempts: refused until released.
		e.failTimes(t, e.key("poison"), 2)
		_, err = h(newMsg("poison", ""))
		require.ErrorIs(t, err, idempotency.ErrTooManyAttempts)
		v = e.jsonRun(t, "", exitOK, "release", e.key("poison"), "--yes")
		assert.Equal(t, "failed", v["state"])
		assert.EqualValues(t, 3, v["attempts"], "the refused claim counted one")
		_, err = h(newMsg("poison", ""))
		require.NoError(t, err)
		assert.Equal(t, 2, runs)

		// COMPLETED is refused, absent is not found.
		v = e.jsonRun(t, "", exitRefused, "release", e.key("stuck"), "--yes")
		assert.Contains(t, v["error"], "COMPLETED")
		rec, err = e.store.Get(context.Background(), e.key("stuck"))
		require.NoError(t, err)
		assert.Equal(t, idempotency.StateCompleted, rec.State, "a completed key is never released")
		v = e.jsonRun(t, "", exitNotFound, "release", e.key("nobody"), "--yes")
		assert.Equal(t, "not_found", v["code"])

		// A corrupt value is not released; purge --state corrupt deletes it.
		e.corrupt(t, e.key("bad"))
		v = e.jsonRun(t, "", exitError, "release", e.key("bad"), "--yes")
		assert.Contains(t, v["error"], "--state corrupt")
		v = e.jsonRun(t, "", exitOK, "purge", "--prefix", e.key("bad"), "--state", "corrupt", "--apply", "--yes")
		assert.EqualValues(t, 1, v["deleted"])
		e.jsonRun(t, "", exitNotFound, "get", e.key("bad"))
	})
}

// A released owner is fenced: its Complete is ErrLeaseLost, and the key's
// new run is not overwritten.
func TestReleasedOwnerIsFenced(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		key := e.key("fenced")
		tok := storekit.NewToken()
		_, err := e.store.Claim(context.Background(), key, idempotency.ClaimRequest{Token: tok, Lease: time.Minute, TTL: time.Minute})
		require.NoError(t, err)
		e.jsonRun(t, "", exitOK, "release", key, "--yes")
		require.ErrorIs(t, e.store.Renew(context.Background(), key, tok, time.Minute), idempotency.ErrLeaseLost)
		require.ErrorIs(t, e.store.Complete(context.Background(), key, tok, []byte("late"), time.Minute), idempotency.ErrLeaseLost)
	})
}

// purge is a dry run unless --apply; with --state it deletes only keys still
// in that state; it needs a prefix or a state.
func TestPurge(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		h := e.newIdem(t, nil).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		for _, id := range []string{"a", "b"} {
			_, err := h(newMsg(id, ""))
			require.NoError(t, err)
		}
		e.failTimes(t, e.key("f1"), 1)
		e.failTimes(t, e.key("f2"), 3)
		e.claimStuck(t, e.key("stuck"))

		v := e.jsonRun(t, "", exitOK, "purge", "--prefix", e.prefix+":", "--state", "failed")
		assert.Equal(t, true, v["dry_run"])
		assert.EqualValues(t, 2, v["matched"])
		assert.ElementsMatch(t, []any{e.key("f1"), e.key("f2")}, v["keys"])
		assert.Len(t, e.jsonLines(t, "--prefix", e.prefix+":"), 5, "a dry run deletes nothing")

		e.jsonRun(t, "n\n", exitRefused, "purge", "--prefix", e.prefix+":", "--state", "failed", "--apply")
		assert.Len(t, e.jsonLines(t, "--prefix", e.prefix+":"), 5, "not confirmed: nothing deleted")

		v = e.jsonRun(t, "", exitOK, "purge", "--prefix", e.prefix+":", "--state", "failed", "--apply", "--yes")
		assert.Equal(t, false, v["dry_run"])
		assert.EqualValues(t, 2, v["deleted"])
		assert.ElementsMatch(t, []string{e.key("a"), e.key("b"), e.key("stuck")}, keysOf(e.jsonLines(t, "--prefix", e.prefix+":")))

		v = e.jsonRun(t, "y\n", exitOK, "purge", "--prefix", e.prefix+":", "--apply")
		assert.EqualValues(t, 3, v["deleted"])
		assert.Empty(t, e.jsonLines(t, "--prefix", e.prefix+":"))

		v = e.jsonRun(t, "", exitUsage, "purge", "--apply", "--yes")
		assert.Equal(t, "usage", v["code"])
	})
}

// stats counts keys per state with their mean size.
func TestStats(t *testing.T) {
	eachStore(t, func(t *testing.T, e env) {
		h := e.newIdem(t, nil).Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		for i := range 4 {
			_, err := h(newMsg("ok-"+strconv.Itoa(i), ""))
			require.NoError(t, err)
		}
		e.failTimes(t, e.key("f"), 2)
		e.claimStuck(t, e.key("stuck"))

		v := e.jsonRun(t, "", exitOK, "stats", "--prefix", e.prefix+":")
		assert.Equal(t, e.kind, v["store"])
		assert.EqualValues(t, 6, v["records"])
		assert.Equal(t, false, v["truncated"])
		states := v["states"].(map[string]any)
		for state, n := range map[string]float64{"completed": 4, "failed": 1, "in_progress": 1} {
			s := states[state].(map[string]any)
			assert.Equal(t, n, s["records"], state)
			assert.Greater(t, s["mean_bytes"], float64(0), state)
			assert.Equal(t, n, s["sampled"], state)
		}
		assert.Greater(t, v["mean_bytes"], float64(0))

		v = e.jsonRun(t, "", exitOK, "stats", "--prefix", e.prefix+":nothing")
		assert.EqualValues(t, 0, v["records"])
	})
}

// A store that does not answer is exit 5, for every command.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	port := strconv.Itoa(testserver.FreePort(t))
	for _, url := range []string{"redis://127.0.0.1:" + port + "/0", "postgres://postgres@127.0.0.1:" + port + "/test?sslmode=disable&connect_timeout=2",
		"mysql://root@127.0.0.1:" + port + "/test?timeout=2s"} {
		for _, args := range [][]string{{"get", "k"}, {"list"}, {"release", "k", "--yes"}, {"purge", "--prefix", "x"}, {"stats"}} {
			r := idemctl(t, "", append(args, "--json", "--store", url)...)
			assert.Equal(t, exitStoreDown, r.code, "%s %v: %s", url, args, r.stderr)
			var v map[string]any
			require.NoError(t, json.Unmarshal([]byte(r.stdout), &v))
			assert.Equal(t, "store_down", v["code"])
		}
	}
}

// Bad command lines are exit 2 and say why; --help explains itself.
func TestUsage(t *testing.T) {
	t.Setenv("IDEMCTL_STORE", "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--help"}, exitOK, "Exit codes"},
		{nil, exitUsage, "Commands:"},
		{[]string{"frobnicate"}, exitUsage, "unknown command"},
		{[]string{"get"}, exitUsage, "takes 1 argument"},
		{[]string{"get", "k"}, exitUsage, "no store"},
		{[]string{"get", "k", "--store", "memcached://x"}, exitUsage, "mysql://"},
		{[]string{"list", "--store", "mysql://x/y", "--table", "Bad-Name"}, exitUsage, "table"},
		{[]string{"list", "--store", "postgres://x/y", "--table", "Bad-Name"}, exitUsage, "table"},
		{[]string{"release", "--help"}, exitOK, "attempt 1"},
	} {
		r := idemctl(t, "", tc.args...)
		assert.Equal(t, tc.code, r.code, "%v: %s %s", tc.args, r.stdout, r.stderr)
		assert.Contains(t, r.stdout+r.stderr, tc.want, "%v", tc.args)
	}
}

// A key that starts with "-" is given after "--".
func TestParseArgs(t *testing.T) {
	var o options
	fs := newFlagSet(&o)
	pos, err := parseArgs(fs, []string{"a", "--json", "--", "-b", "--json"})
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "-b", "--json"}, pos)
	assert.True(t, o.json)
	assert.True(t, errors.Is(errUsage, errUsage))
}

func sha256sum(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

func newFlagSet(o *options) *flag.FlagSet {
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	o.register(fs)
	return fs
}

// A long walk reports its progress on stderr, and its end once it did.
func TestProgressOnStderr(t *testing.T) {
	var errOut bytes.Buffer
	p := newProgress(&cli{stderr: &errOut})
	p.update(5, 1)
	p.done(5, 1)
	assert.Empty(t, errOut.String(), "a short walk says nothing")
	p.every = 0
	p.update(10, 2)
	p.done(20, 3)
	assert.Contains(t, errOut.String(), "idemctl: 10 keys scanned, 2 matched")
	assert.Contains(t, errOut.String(), "idemctl: done: 20 keys scanned, 3 matched")
}
