package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"

	"github.com/idempotency/watermill-idempotency/internal/commalist"
	"github.com/idempotency/watermill-idempotency/middleware/idempotency"
	"github.com/idempotency/watermill-idempotency/middleware/redisstore"
)

type options struct {
	sections    []string
	brokers     []string
	concurrency []int
	n           int
	phaseLimit  time.Duration
	floorDur    time.Duration
	floorRounds int
	statsN      int
	redisAddr   string
	amqpURL     string
	natsURL     string
	pgURL       string
	jsonOut     bool
	verbose     bool
	prefix      string // of every key, stream, queue and group of the run
}

// allSections are the sections of a run, in the order they run.
var allSections = []string{"floor", "stats", "e2e"}

// report is what a run measured; -json prints it as it is.
type report struct {
	Started string   `json:"started"`
	Machine string   `json:"machine"`
	Floor   *Floor   `json:"floor,omitempty"`
	Stats   *Stats   `json:"stats,omitempty"`
	E2E     []Rate   `json:"e2e,omitempty"`
	Targets []Target `json:"targets"`
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("idembench: ")
	redis.SetLogger(quietRedis{})
	o, cpuProfile := parseFlags()
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			log.Fatalf("-cpuprofile: %v", err)
		}
		defer pprof.StopCPUProfile()
	}
	rep := &report{Started: time.Now().UTC().Format(time.RFC3339), Machine: machine()}
	for _, s := range o.sections {
		o.logf("%s ...", s)
		switch s {
		case "floor":
			fl, err := runFloor(context.Background(), o)
			if err != nil {
				log.Fatalf("floor: %v", err)
			}
			rep.Floor = &fl
		case "stats":
			st := runStats(o)
			rep.Stats = &st
		case "e2e":
			rep.E2E = runE2E(o)
		}
	}
	rep.Targets = rep.targets()
	if o.jsonOut {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			log.Fatal(err)
		}
		return
	}
	rep.print(os.Stdout)
}

// parseFlags parses the command line; a bad value ends the process.
func parseFlags() (o options, cpuProfile string) {
	sections := flag.String("sections", strings.Join(allSections, ","), "sections to run, comma-separated: "+strings.Join(allSections, ", "))
	brokers := flag.String("brokers", "gochannel,kafka,redis,amqp,nats", "e2e: brokers, comma-separated")
	conc := flag.String("c", "1,64", "stats and e2e: concurrency levels, comma-separated")
	flag.IntVar(&o.n, "n", 2000, "e2e: messages per cell")
	flag.DurationVar(&o.phaseLimit, "phase-timeout", time.Minute, "e2e: give up on a cell after this long and report what was handled")
	flag.DurationVar(&o.floorDur, "floor-d", time.Second, "floor: measuring time of each load and side in each round")
	flag.IntVar(&o.floorRounds, "floor-rounds", 5, "floor: rounds, each running the floor and ours side by side")
	flag.IntVar(&o.statsN, "stats-n", 1000, "stats: messages per cell")
	flag.StringVar(&o.redisAddr, "redis", envOr("REDIS_ADDR", "127.0.0.1:6379"), "e2e: the store's Redis, and the Redis Streams broker")
	flag.StringVar(&o.amqpURL, "amqp", envOr("AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"), "e2e: RabbitMQ URL")
	flag.StringVar(&o.natsURL, "nats", envOr("NATS_URL", "nats://127.0.0.1:4222"), "e2e: NATS JetStream URL")
	flag.StringVar(&o.pgURL, "pg", envOr("PG_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"),
		"stats: PostgreSQL for pgstore (empty: leave it out)")
	flag.BoolVar(&o.jsonOut, "json", false, "print the report as JSON instead of tables")
	flag.BoolVar(&o.verbose, "v", false, "log progress")
	flag.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	flag.Parse()

	for _, s := range commalist.Split(*sections) {
		if !slices.Contains(allSections, s) {
			log.Fatalf("-sections: unknown section %q (want %s)", s, strings.Join(allSections, ", "))
		}
	}
	o.sections = slices.DeleteFunc(slices.Clone(allSections), func(s string) bool { return !slices.Contains(commalist.Split(*sections), s) })
	o.brokers = commalist.Split(*brokers)
	for _, s := range commalist.Split(*conc) {
		c, err := strconv.Atoi(s)
		if err != nil || c < 1 {
			log.Fatalf("-c: %q is not a positive number", s)
		}
		o.concurrency = append(o.concurrency, c)
	}
	if o.floorRounds < 1 || o.n < 1 || o.statsN < 1 {
		log.Fatal("-floor-rounds, -n and -stats-n must be positive")
	}
	o.prefix = "idembench-" + watermill.NewShortUUID()
	return o, cpuProfile
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

// machine describes where the numbers come from.
func machine() string {
	m := fmt.Sprintf("%s/%s  %d CPUs (GOMAXPROCS %d)  %s", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				return m + "  " + strings.TrimSpace(v)
			}
		}
	}
	return m
}

type quietRedis struct{}

func (quietRedis) Printf(context.Context, string, ...any) {}

// newClient is a client of addr that the store accepts: it honours context
// deadlines.
func newClient(addr string, poolSize int) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, PoolSize: poolSize})
}

// newStore is a redisstore on c with the defaults.
func newStore(c *redis.Client) *redisstore.Store {
	s, err := redisstore.New(c, nil)
	if err != nil {
		log.Fatal(err)
	}
	return s
}

// newMiddleware is the middleware on oc and cfg, or the end of the process.
func newMiddleware(oc idempotency.OnceConfig, cfg idempotency.Config) *idempotency.Middleware {
	once, err := idempotency.NewOnce(oc)
	if err != nil {
		log.Fatal(err)
	}
	m, err := idempotency.New(once, &cfg)
	if err != nil {
		log.Fatal(err)
	}
	return m
}

// startRedis starts a private redis-server without persistence on a free
// loopback port: clean INFO counters, no other client, and a server the
// run may flush.
func startRedis() (c *redis.Client, stop func(), err error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, nil, fmt.Errorf("this section needs redis-server on PATH: %w", err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	_ = l.Close()
	dir, err := os.MkdirTemp("", "idembench-redis")
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(bin, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir)
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	c = newClient(net.JoinHostPort("127.0.0.1", port), 128)
	stop = func() { _ = c.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = os.RemoveAll(dir) }
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if c.Ping(context.Background()).Err() == nil {
			return c, stop, nil
		}
	}
	stop()
	return nil, nil, fmt.Errorf("redis-server on port %s did not start", port)
}

// infoFloat reads one numeric field of an INFO reply.
func infoFloat(info, field string) (float64, bool) {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			x, err := strconv.ParseFloat(v, 64)
			return x, err == nil
		}
	}
	return 0, false
}

// redisCPU is the CPU seconds Redis's main thread has used so far.
func redisCPU(ctx context.Context, c *redis.Client) (float64, bool) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	u, uok := infoFloat(info, "used_cpu_user_main_thread")
	s, sok := infoFloat(info, "used_cpu_sys_main_thread")
	return u + s, uok && sok
}

// forEach calls f once for each key, from conc goroutines.
func forEach(conc int, keys []string, f func(string)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(conc, len(keys)) {
		wg.Go(func() {
			for i := int(next.Add(1) - 1); i < len(keys); i = int(next.Add(1) - 1) {
				f(keys[i])
			}
		})
	}
	wg.Wait()
}

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

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
