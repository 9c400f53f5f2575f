package readmetest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/internal/storekit"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

// root is the repository, from this package's directory.
const root = "../../.."

// docCommand is one command a document tells a user to run: a line of one
// of its "```sh", "```console" (or unmarked "```") blocks whose program
// (after any VAR=value assignments) is go or idemctl.
type docCommand struct {
	doc  string // relative to root
	line int
	text string // the command, its trailing comment cut
}

func (c docCommand) String() string { return fmt.Sprintf("%s:%d: %s", c.doc, c.line, c.text) }

// documentedCommands reads the commands of README.md, BENCHMARKS.md and
// docs/*.md.
func documentedCommands(t *testing.T) []docCommand {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	docs = append([]string{filepath.Join(root, "README.md"), filepath.Join(root, "BENCHMARKS.md")}, docs...)
	var out []docCommand
	for _, path := range docs {
		rel, err := filepath.Rel(root, path)
		require.NoError(t, err)
		f, err := os.Open(path)
		require.NoError(t, err)
		sc := bufio.NewScanner(f)
		inShell, inBlock := false, false
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			if strings.HasPrefix(line, "```") {
				inShell, inBlock = !inBlock && slices.Contains([]string{"```", "```sh", "```bash", "```shell", "```console"}, line), !inBlock
				continue
			}
			if !inShell {
				continue
			}
			text := strings.TrimSpace(cutComment(strings.TrimPrefix(strings.TrimSpace(line), "$ ")))
			if p := program(text); p == "go" || p == "idemctl" {
				out = append(out, docCommand{doc: rel, line: n, text: text})
			}
		}
		require.NoError(t, sc.Err())
		f.Close()
	}
	return out
}

// cutComment cuts a shell comment off line: from a "#" that starts a word
// outside single quotes.
func cutComment(line string) string {
	quoted := false
	for i, r := range line {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == '#' && !quoted && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return line[:i]
		}
	}
	return line
}

// program is the first word of a command line after its VAR=value words.
func program(text string) string {
	for _, w := range strings.Fields(text) {
		if !strings.Contains(w, "=") {
			return w
		}
	}
	return ""
}

// Smoke runs of the documented commands. Each runs as written, except:
//   - idembench (go run ./cmd/idembench …) runs from a binary built once,
//     with smokeIdembench appended (later flags win): every section the
//     command names, at the least measuring time and count;
//   - a benchmark command (go test … -bench …) gets -benchtime 1x: each
//     benchmark once;
//   - KAFKA_BROKERS=localhost:9092 (docker compose's Kafka) points at an
//     in-process kfake cluster of the test's own instead, and the command
//     gets -run Kafka: the Kafka tests of its packages;
//   - go install ./cmd/idemctl installs into a temporary GOBIN, and the
//     idemctl commands run in the order of their document with that
//     binary first on PATH, in bash (pipes as written), against a private
//     redis-server (IDEMCTL_STORE), with "y" on stdin; one that finds no
//     record gets one under the key it names and runs again (see
//     runIdemctl); each must exit 0;
//   - the README's quickstart and test command are run by .ci/run, which
//     reads them from the README itself (readme_command);
//   - go get of this module @latest fetches the published module, which a
//     test of this clone cannot: the module path is checked instead.
//
// A go or idemctl command that none of these covers fails the test.
var smokeIdembench = []string{"-c", "1,8", "-n", "20", "-floor-d", "10ms", "-floor-rounds", "1", "-stats-n", "20"}

// TestDocumentedCommands runs every go and idemctl command that README.md,
// BENCHMARKS.md and docs/*.md tell a user to run (see smokeIdembench for
// how), or fails naming the one no test runs.
func TestDocumentedCommands(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the documented commands against the servers; left out by -short")
	}
	cmds := documentedCommands(t)
	require.NotEmpty(t, cmds)
	bin := t.TempDir()
	absRoot, err := filepath.Abs(root)
	require.NoError(t, err)
	goBuild := func(args ...string) {
		out, err := goCmd(t, absRoot, nil, args...).CombinedOutput()
		require.NoError(t, err, "go %s: %s", strings.Join(args, " "), out)
	}
	goBuild("build", "-o", filepath.Join(bin, "idembench"), "./cmd/idembench")

	ciRun, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	require.NoError(t, err)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	byCI := map[string]bool{}
	for _, marker := range []string{"quickstart", "test-command"} {
		_, after, ok := strings.Cut(string(readme), "<!-- "+marker+" -->\n```sh\n")
		if ok && strings.Contains(string(ciRun), "readme_command "+marker) {
			byCI[strings.SplitN(after, "\n", 2)[0]] = true
		}
	}
	modulePath := readModulePath(t)

	var idemctl []docCommand
	installed := false
	// idembench commands that print tables, and those of them whose -json
	// twin they also stand for (see runIdembench).
	idembenchTables, idembenchJSON := map[string]bool{}, map[string]bool{}
	for _, c := range cmds {
		words := shellSplit(t, c.text)
		switch {
		case c.doc == "README.md" && byCI[c.text]:
			t.Logf("%s: run by .ci/run", c)
		case len(words) == 3 && words[0] == "go" && words[1] == "get":
			mod, _, _ := strings.Cut(words[2], "@")
			assert.Equal(t, modulePath, mod, "%s: go get of another module", c)
		case c.text == "go install ./cmd/idemctl":
			cmd := goCmd(t, absRoot, []string{"GOBIN=" + bin}, words[1:]...)
			out, err := cmd.CombinedOutput()
			require.NoError(t, err, "%s: %s", c, out)
			installed = true
		case words[0] == "idemctl":
			idemctl = append(idemctl, c)
		case len(words) > 2 && words[0] == "go" && words[1] == "run" && words[2] == "./cmd/idembench":
			args := slices.Clone(words[3:])
			withoutJSON := strings.Join(slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "-json" }), " ")
			if slices.Contains(args, "-json") && idembenchTables[withoutJSON] {
				t.Logf("%s: run with the command without -json, which writes the same report as JSON to -o", c)
				idembenchJSON[withoutJSON] = true
				continue
			}
			if !slices.Contains(args, "-json") {
				idembenchTables[withoutJSON] = true
			}
			t.Run(subtestName(c), func(t *testing.T) {
				t.Parallel()
				// Read after the loop: a parallel subtest starts when its parent returns.
				runIdembench(t, c, filepath.Join(bin, "idembench"), slices.Concat(args, smokeIdembench), idembenchJSON[withoutJSON])
			})
		case words[0] == "go" && len(words) > 1 && words[1] == "test" && slices.Contains(words, "-bench"):
			args := insertBeforePackages(words[1:], "-benchtime", "1x")
			t.Run(subtestName(c), func(t *testing.T) {
				t.Parallel()
				defer builds.lock(args)()
				runGo(t, c, absRoot, nil, args)
			})
		case strings.HasPrefix(c.text, "KAFKA_BROKERS=localhost:9092 go test "):
			args := insertBeforePackages(words[2:], "-run", "Kafka")
			t.Run(subtestName(c), func(t *testing.T) {
				t.Parallel()
				defer builds.lock(args)()
				brokers := testserver.KafkaBrokers(t)
				runGo(t, c, absRoot, []string{"KAFKA_BROKERS=" + strings.Join(brokers, ",")}, args)
			})
		case words[0] == "go" && len(words) > 1 && words[1] == "test" && slices.Contains(words, "-run"):
			t.Run(subtestName(c), func(t *testing.T) {
				t.Parallel()
				defer builds.lock(words[1:])()
				runGo(t, c, absRoot, nil, words[1:])
			})
		default:
			t.Errorf("%s: no test runs this command; run it here (see smokeIdembench) or in .ci/run", c)
		}
	}
	if len(idemctl) > 0 {
		require.True(t, installed, "the docs run idemctl but never say to install it (go install ./cmd/idemctl)")
		t.Run("idemctl", func(t *testing.T) {
			t.Parallel()
			runIdemctl(t, bin, idemctl)
		})
	}
}

// TestMain lets every subtest of TestDocumentedCommands run at once, unless
// -parallel says how many may: go test's default, GOMAXPROCS, would run two
// at a time on two cores, while each waits on a command of its own.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", "64")
	}
	os.Exit(m.Run())
}

// builds runs one at a time the go test commands that build the same test
// binaries (the same packages, with or without -race): run at once, each
// would compile them again; one after another, the second finds them in
// the build cache.
var builds buildLocks

type buildLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.Mutex
}

// lock waits for the lock of the test binaries that go args (its
// subcommand first) builds, and returns its unlock.
func (b *buildLocks) lock(args []string) func() {
	key := strings.Join(slices.DeleteFunc(slices.Clone(args), func(a string) bool {
		return !strings.HasPrefix(a, "./") && a != "-race"
	}), " ")
	b.mu.Lock()
	if b.locks == nil {
		b.locks = map[string]*sync.Mutex{}
	}
	l := b.locks[key]
	if l == nil {
		l = &sync.Mutex{}
		b.locks[key] = l
	}
	b.mu.Unlock()
	l.Lock()
	return l.Unlock
}

// goCmd is the go command with args in dir, env added to the test's.
func goCmd(t *testing.T, dir string, env []string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	return cmd
}

// runGo runs go with args and fails the test, with the command's output,
// unless it passed and ran something.
func runGo(t *testing.T, c docCommand, dir string, env, args []string) {
	start := time.Now()
	out, err := goCmd(t, dir, env, args...).CombinedOutput()
	require.NoError(t, err, "%s (run as go %s): %s", c, strings.Join(args, " "), tail(out))
	ran := regexp.MustCompile(`(?m)^ok\s+\S+\s+(\S+s|\(cached\))$`)
	require.Regexp(t, ran, string(out), "%s: no package ran a test or benchmark (a -run pattern that matches nothing?): %s", c, tail(out))
	t.Logf("%s: passed in %v", c, time.Since(start).Round(time.Second))
}

// runIdembench runs the idembench binary with args and checks that it
// wrote its report: tables ending with the targets, or JSON with -json.
// With alsoJSON (a documented command that differs from this one only by
// -json, whose run is this one: the sections and the report are the
// same), it adds -o and checks the JSON file as well.
func runIdembench(t *testing.T, c docCommand, bin string, args []string, alsoJSON bool) {
	start := time.Now()
	dir := t.TempDir()
	jsonFile := filepath.Join(dir, "report.json")
	if alsoJSON {
		args = append(args, "-o", jsonFile)
	}
	cmd := exec.CommandContext(t.Context(), bin, args...)
	cmd.Dir = dir
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	require.NoError(t, err, "%s (run as idembench %s): %s", c, strings.Join(args, " "), tail(stderr.Bytes()))
	if slices.Contains(args, "-json") {
		var rep map[string]any
		require.NoError(t, json.Unmarshal(stdout.Bytes(), &rep), "%s: -json printed no JSON object", c)
		assert.Contains(t, rep, "targets")
	} else {
		assert.Contains(t, stdout.String(), "## Targets", "%s: no targets table", c)
	}
	if alsoJSON {
		b, err := os.ReadFile(jsonFile)
		require.NoError(t, err, "%s: -o", c)
		var rep map[string]any
		require.NoError(t, json.Unmarshal(b, &rep), "%s: -o wrote no JSON object", c)
		assert.Contains(t, rep, "targets")
	}
	t.Logf("%s: passed in %v", c, time.Since(start).Round(time.Second))
}

// runIdemctl runs the idemctl commands in order in bash, against a private
// redis-server. A command that finds no record (exit 3, "no record under
// KEY") gets one stored under the key it named and runs again, and must
// then pass: a key ending in "-poison" FAILED, in "-stuck" IN_PROGRESS,
// any other COMPLETED.
func runIdemctl(t *testing.T, bin string, cmds []docCommand) {
	srv := testserver.StartRedis(t)
	rc := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer rc.Close()
	s, err := redisstore.New(rc, nil)
	require.NoError(t, err)
	run := func(c docCommand) (int, string) {
		cmd := exec.CommandContext(t.Context(), "bash", "-c", "set -o pipefail; "+c.text)
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
			"IDEMCTL_STORE=redis://"+srv.Addr+"/0")
		cmd.Stdin = strings.NewReader("y\n")
		out, _ := cmd.CombinedOutput()
		return cmd.ProcessState.ExitCode(), string(out)
	}
	noRecord := regexp.MustCompile(`no record under ("(?:[^"\\]|\\.)*")`)
	for _, c := range cmds {
		code, out := run(c)
		if m := noRecord.FindStringSubmatch(out); code == 3 && m != nil {
			key, err := strconv.Unquote(m[1])
			require.NoError(t, err)
			seed(t, s, key)
			code, out = run(c)
		}
		require.Equal(t, 0, code, "%s: %s", c, out)
		t.Logf("%s: passed", c)
	}
}

// seed stores a record under key: FAILED for a key ending in "-poison",
// IN_PROGRESS for "-stuck", else COMPLETED.
func seed(t *testing.T, s *redisstore.Store, key string) {
	ctx := context.Background()
	tok := storekit.NewToken()
	res, err := s.Claim(ctx, key, idempotency.ClaimRequest{Token: tok, Lease: time.Hour, TTL: time.Hour})
	require.NoError(t, err)
	require.True(t, res.Acquired, "seeding %s", key)
	switch {
	case strings.HasSuffix(key, "-stuck"):
	case strings.HasSuffix(key, "-poison"):
		require.NoError(t, s.Fail(ctx, key, tok, time.Hour))
	default:
		require.NoError(t, s.Complete(ctx, key, tok, nil, time.Hour))
	}
}

// insertBeforePackages returns args (go's subcommand first) with extra
// inserted before the first package pattern ("./…").
func insertBeforePackages(args []string, extra ...string) []string {
	i := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "./") })
	if i < 0 {
		i = len(args)
	}
	return slices.Concat(args[:i], extra, args[i:])
}

func subtestName(c docCommand) string { return fmt.Sprintf("%s:%d", c.doc, c.line) }

func readModulePath(t *testing.T) string {
	t.Helper()
	mod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	require.NoError(t, err)
	first, _, _ := strings.Cut(string(mod), "\n")
	return strings.TrimPrefix(first, "module ")
}

// tail is the end of a command's output, enough to say why it failed.
func tail(out []byte) string {
	const n = 4000
	if len(out) > n {
		return "…" + string(out[len(out)-n:])
	}
	return string(out)
}
