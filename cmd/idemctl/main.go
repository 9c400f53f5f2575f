package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"time"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `idemctl inspects and repairs the keys of watermill-idempotency stores.

Usage:
  idemctl COMMAND [flags] [KEY]

Commands:
  get KEY      show a key: state, attempts, lease left, TTL, fingerprint,
               size, and its stored output decoded (message UUIDs, metadata,
               payload sizes; an HTTP response's status, headers and body
               size; a gRPC response's type and size); --http or --grpc
               with --scope: KEY is the key an HTTP or gRPC client sent
  list         list the keys under --prefix, filtered by --state,
               --min-attempts and --age; stops after --limit matches; shows
               progress on stderr during long scans
  release KEY  free an IN_PROGRESS or FAILED key so that the next delivery
               runs its handler: the record is deleted, its attempts start
               again at 1; an owner still running it loses its lease (its
               context is cancelled at its next renewal, its result is not
               recorded). A COMPLETED key is refused (see purge). Asks for
               confirmation unless --yes.
  purge        delete the keys under --prefix and/or in --state; a dry run
               that only lists them unless --apply (then it asks for
               confirmation unless --yes)
  stats        count the keys under --prefix per state, with the mean bytes
               per record (Redis: MEMORY USAGE of each key; PostgreSQL:
               every row's stored size; MySQL: every row's values)

Flags of every command:
  --store URL     the store: redis://[user:pass@]host:port/db, rediss://… (TLS),
                  postgres://user@host:port/db?sslmode=…, or
                  mysql://user:pass@host:port/db (MySQL or MariaDB);
                  default $IDEMCTL_STORE
  --table NAME    the pgstore or mysqlstore table (default idempotency_keys)
  --json          machine-readable output on stdout (list: one JSON object
                  per line); errors as {"error": …, "code": …}
  --timeout D     give up after D (0, the default, means never; connecting
                  is always bounded by 5s)

Keys are stored as the middleware writes them: prefix:scope:key for the
Watermill middleware (prefix "idem" by default, scope the handler's name);
prefix:HASH:key for httpidem and grpcidem (prefix "httpidem", "grpcidem"),
HASH the hex of the first 16 bytes of SHA-256(scope), the scope empty under
SingleTenant: "idemctl get --http KEY [--scope S]" builds it from the key a
client sent. Times are the store's clock.

Exit codes:
  0  done
  1  failed (a corrupt record, an unexpected error)
  2  usage: bad flags or arguments
  3  not found: get or release of a key the store does not hold
  4  refused: not confirmed, or the key's state forbids it (release of a
     COMPLETED key)
  5  store down: the store could not be reached or did not answer

Run "idemctl COMMAND --help" for a command's flags.
`

// options are the flags every command has.
type options struct {
	store   string
	table   string
	json    bool
	timeout time.Duration
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.store, "store", os.Getenv("IDEMCTL_STORE"), "store URL: redis://, rediss://, postgres:// or mysql:// (default $IDEMCTL_STORE)")
	fs.StringVar(&o.table, "table", "", "pgstore or mysqlstore table (default idempotency_keys)")
	fs.BoolVar(&o.json, "json", false, "machine-readable output")
	fs.DurationVar(&o.timeout, "timeout", 0, "give up after this long (0: never)")
}

// cli is one invocation.
type cli struct {
	opts   options
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
	be     *backend
	// answered: the command wrote its JSON object already (a corrupt
	// record's, which carries its error), so a failure adds none.
	answered bool
}

// run runs one invocation and returns its exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	c := &cli{stdin: stdin, stdout: stdout, stderr: stderr}
	cmd, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "idemctl: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	fs := flag.NewFlagSet("idemctl "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.opts.register(fs)
	runCmd := cmd.flags(fs)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: idemctl %s\n\n%s\n\nFlags:\n", cmd.synopsis, cmd.help)
		fs.PrintDefaults()
	}
	pos, err := parseArgs(fs, args[1:])
	if err == flag.ErrHelp {
		return exitOK
	}
	if err != nil {
		return exitUsage // the flag package said why
	}
	if len(pos) != cmd.args {
		return c.fail(fmt.Errorf("%w: idemctl %s takes %d argument(s), got %d (run idemctl %s --help)", errUsage, args[0], cmd.args, len(pos), args[0]))
	}
	if c.opts.store == "" {
		return c.fail(fmt.Errorf("%w: no store: give --store URL or set IDEMCTL_STORE", errUsage))
	}
	if c.opts.timeout < 0 {
		return c.fail(fmt.Errorf("%w: --timeout %v is negative", errUsage, c.opts.timeout))
	}
	if c.opts.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.timeout)
		defer cancel()
	}
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	be, err := open(octx, c.opts.store, c.opts.table)
	cancel()
	if err != nil {
		return c.fail(err)
	}
	defer be.close()
	c.be = be
	return c.fail(runCmd(ctx, c, pos))
}

// fail reports err (if any) and returns its exit code.
func (c *cli) fail(err error) int {
	code := exitCode(err)
	if err == nil {
		return code
	}
	if c.opts.json && !c.answered {
		c.writeJSON(map[string]any{"error": err.Error(), "code": codeName(code), "exit": code})
	}
	fmt.Fprintf(c.stderr, "idemctl: %v\n", err)
	return code
}

// command is one subcommand: flags registers its own flags and returns the
// function that runs it with its positional arguments.
type command struct {
	synopsis string
	help     string
	args     int
	flags    func(fs *flag.FlagSet) func(ctx context.Context, c *cli, args []string) error
}

var commands = map[string]command{
	"get":     getCommand,
	"list":    listCommand,
	"release": releaseCommand,
	"purge":   purgeCommand,
	"stats":   statsCommand,
}

// parseArgs parses flags wherever they stand among the positional
// arguments (idemctl get KEY --json), until a "--" after which everything
// is positional (for a key that starts with "-").
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// confirm asks question on stderr and reads the answer from stdin: only
// "y" or "yes" agrees.
func (c *cli) confirm(question string) error {
	fmt.Fprintf(c.stderr, "%s [y/N] ", question)
	var line strings.Builder
	buf := make([]byte, 1)
	for {
		n, err := c.stdin.Read(buf)
		if n == 1 {
			if buf[0] == '\n' {
				break
			}
			line.WriteByte(buf[0])
		}
		if err != nil {
			break
		}
	}
	switch strings.ToLower(strings.TrimSpace(line.String())) {
	case "y", "yes":
		return nil
	}
	return refused(fmt.Errorf("not confirmed (answer y, or pass --yes)"))
}
