package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/commalist"
)

type options struct {
	sections    map[string]bool
	sectionList []string // -sections, split and trimmed, in the order given, for the report's config
	brokers     []string
	concurrency []int
	n           int
	phaseLimit  time.Duration
	chainDur    time.Duration
	ceilingDur  time.Duration
	floorDur    time.Duration
	floorRounds int
	redisAddr   string
	amqpURL     string
	natsURL     string
	pgURL       string
	mysqlURL    string
	statsKeys   int
	rounds      int
	jsonOut     bool
	jsonFile    string
	cpuProfile  string
	verbose     bool
	prefix      string
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("idembench: ")
	o := parseFlags()
	if o.cpuProfile != "" {
		stop := startCPUProfile(o.cpuProfile)
		defer stop()
	}
	o.prefix = "idembench-" + watermill.NewShortUUID()
	redis.SetLogger(quietRedis{})

	rep := newReport(o)
	rc := redis.NewClient(&redis.Options{ContextTimeoutEnabled: true, Addr: o.redisAddr, PoolSize: 256})
	defer rc.Close()
	defer cleanup(rc, o.prefix)

	var pg *pgBench
	if o.pgURL != "" && (o.sections["chain"] || o.sections["stats"]) {
		// As many connections as goroutines at the highest concurrency, as
		// the Redis pool has more than enough.
		pg = openPG(o.pgURL, maxInt(o.concurrency))
		defer pg.close()
	}
	var my *mysqlBench
	if o.mysqlURL != "" && (o.sections["chain"] || o.sections["stats"]) {
		my = openMySQL(o.mysqlURL, maxInt(o.concurrency))
		defer my.close()
	}
	runSections(o, rc, pg, my, rep)
	rep.summarise()
	if err := writeReport(rep, o); err != nil {
		log.Fatal(err)
	}
}

// startCPUProfile writes a CPU profile of the run to path until stop is
// called; a file it cannot write ends the process.
func startCPUProfile(path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		log.Fatalf("-cpuprofile: %v", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		log.Fatalf("-cpuprofile: %v", err)
	}
	return func() {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			log.Printf("-cpuprofile: %v", err)
		}
	}
}

// parseFlags defines the flags, parses the command line and checks the
// lists; a bad value ends the process.
func parseFlags() options {
	var o options
	sections := flag.String("sections", strings.Join(allSections, ","), "sections to run, comma-separated: "+strings.Join(allSections, ", "))
	brokers := flag.String("brokers", "gochannel,kafka,redis,amqp,nats", "brokers of the e2e section, comma-separated")
	conc := flag.String("c", "1,64", "concurrency levels, comma-separated")
	flag.IntVar(&o.n, "n", 2000, "e2e: messages per phase (fresh, then the same keys again as duplicates)")
	flag.DurationVar(&o.phaseLimit, "phase-timeout", 60*time.Second, "e2e: give up on a phase after this long and report what was handled")
	flag.DurationVar(&o.chainDur, "d", 2*time.Second, "chain: measuring time of each case")
	flag.DurationVar(&o.ceilingDur, "ceiling-d", 3*time.Second, "ceiling: measuring time of each load generator")
	flag.StringVar(&o.redisAddr, "redis", envOr("REDIS_ADDR", "127.0.0.1:6379"), "Redis: store, Redis Streams broker and ceiling")
	flag.StringVar(&o.amqpURL, "amqp", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "RabbitMQ URL")
	flag.StringVar(&o.natsURL, "nats", envOr("NATS_URL", "nats://127.0.0.1:4222"), "NATS JetStream URL")
	flag.StringVar(&o.pgURL, "pg", envOr("PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"PostgreSQL: pgstore in the chain and stats sections (empty: leave it out)")
	flag.StringVar(&o.mysqlURL, "mysql", envOr("MYSQL_URL", "mysql://root@127.0.0.1:3306/test"),
		"MySQL or MariaDB: mysqlstore in the chain and stats sections (empty: leave it out)")
	flag.DurationVar(&o.floorDur, "floor-d", time.Second, "floor: measuring time of each load and side in each round")
	flag.IntVar(&o.floorRounds, "floor-rounds", 5, "floor: rounds, each running the floor and ours side by side")
	flag.IntVar(&o.statsKeys, "stats-n", 1000, "stats: messages per measurement")
	flag.IntVar(&o.rounds, "rounds", 5, "latency: rounds of each setting (auto-pipelining off, on), alternating, -d each")
	flag.BoolVar(&o.jsonOut, "json", false, "print the report as JSON instead of tables")
	flag.StringVar(&o.jsonFile, "o", "", "also write the report as JSON to this file")
	flag.BoolVar(&o.verbose, "v", false, "log progress")
	flag.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	flag.Parse()

	o.sectionList = commalist.Split(*sections)
	o.sections = map[string]bool{}
	for _, s := range o.sectionList {
		if !slices.Contains(allSections, s) {
			log.Fatalf("-sections: unknown section %q (want %s)", s, strings.Join(allSections, ", "))
		}
		o.sections[s] = true
	}
	if o.rounds < 1 {
		log.Fatalf("-rounds: %d is not a positive number", o.rounds)
	}
	if o.floorRounds < 1 {
		log.Fatalf("-floor-rounds: %d is not a positive number", o.floorRounds)
	}
	o.brokers = commalist.Split(*brokers)
	for _, s := range commalist.Split(*conc) {
		c, err := strconv.Atoi(s)
		if err != nil || c < 1 {
			log.Fatalf("-c: %q is not a positive number", s)
		}
		o.concurrency = append(o.concurrency, c)
	}
	return o
}

// newReport starts the report of a run: where it runs and with what
// settings.
func newReport(o options) *report {
	rep := &report{SchemaVersion: schemaVersion, Machine: machine(), Started: time.Now().UTC().Format(time.RFC3339), Prefix: o.prefix}
	rep.Config = reportConfig{Sections: o.sectionList, N: o.n, ChainSeconds: o.chainDur.Seconds(), CeilingSeconds: o.ceilingDur.Seconds(),
		FloorSeconds: o.floorDur.Seconds(), FloorRounds: o.floorRounds, Rounds: o.rounds, StatsMessages: o.statsKeys, Concurrency: o.concurrency, Brokers: o.brokers}
	return rep
}

// runSections runs the chosen sections in the order of allSections and
// puts their results into rep; pg is nil without PostgreSQL, my without
// MySQL.
func runSections(o options, rc *redis.Client, pg *pgBench, my *mysqlBench, rep *report) {
	if o.sections["chain"] {
		o.logf("chain ...")
		rep.Chain = runChain(o, rc, pg, my)
	}
	if o.sections["latency"] {
		o.logf("latency ...")
		lat := runLatency(o, rc)
		rep.Latency = &lat
	}
	if o.sections["ceiling"] {
		o.logf("ceiling ...")
		ce := runCeiling(o, rc)
		rep.Ceiling = &ce
	}
	if o.sections["floor"] {
		o.logf("floor ...")
		fl := runFloor(o)
		rep.Floor = &fl
	}
	if o.sections["stats"] {
		o.logf("stats ...")
		st := runStats(o)
		rep.Stats = &st
		if pg != nil {
			o.logf("pgstats ...")
			ps := runPGStats(pg, o.statsKeys)
			rep.PGStats = &ps
		}
		if my != nil {
			o.logf("mysqlstats ...")
			ms := runMySQLStats(my, o.statsKeys)
			rep.MySQLStats = &ms
		}
	}
	if o.sections["e2e"] {
		rep.E2E = runE2E(o, rc)
	}
}

// writeReport writes rep as JSON to -o if set, then to stdout as JSON with
// -json or as tables without.
func writeReport(rep *report, o options) error {
	if o.jsonFile != "" {
		b, err := json.MarshalIndent(rep, "", "  ")
		if err == nil {
			err = os.WriteFile(o.jsonFile, append(b, '\n'), 0o644)
		}
		if err != nil {
			return err
		}
	}
	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	rep.print(os.Stdout)
	return nil
}

func (o options) logf(format string, args ...any) {
	if o.verbose {
		log.Printf(format, args...)
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// allSections are the sections of a run, in the order they run.
var allSections = []string{"chain", "latency", "ceiling", "floor", "stats", "e2e"}

// Machine describes where the numbers come from.
type Machine struct {
	GOOS       string `json:"goos"`
	GOARCH     string `json:"goarch"`
	CPUs       int    `json:"cpus"`
	GOMAXPROCS int    `json:"gomaxprocs"`
	GoVersion  string `json:"go_version"`
	CPUModel   string `json:"cpu_model,omitempty"`
}

func machine() Machine {
	m := Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPUModel = strings.TrimSpace(v)
				break
			}
		}
	}
	return m
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// rate formats messages per second.
func rate(r float64) string {
	switch {
	case r == 0:
		return "-"
	case r >= 100_000:
		return fmt.Sprintf("%.0fk", r/1000)
	case r >= 10_000:
		return fmt.Sprintf("%.1fk", r/1000)
	default:
		return fmt.Sprintf("%.0f", r)
	}
}

func ratio(a, b float64) string {
	if a == 0 || b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", a/b)
}
