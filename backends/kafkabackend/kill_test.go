package kafkabackend_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/idempotency/watermill-idempotency/backends"
	"github.com/idempotency/watermill-idempotency/backends/internal/backendtest"
	"github.com/idempotency/watermill-idempotency/internal/testserver"
)

// killChildVar holds, in a consumer process of TestKafka_GroupsSurviveKills,
// its killChild as JSON.
const killChildVar = "KAFKABACKEND_KILL_CHILD"

// TestMain runs a consumer of TestKafka_GroupsSurviveKills instead of the
// tests when this binary was re-executed as one.
func TestMain(m *testing.M) {
	if v := os.Getenv(killChildVar); v != "" {
		os.Exit(runKillChild(v))
	}
	os.Exit(m.Run())
}

// killChild is what a consumer process is told: the cluster, the topic, and
// the groups it consumes the topic in, one subscriber each.
type killChild struct {
	URL    string
	Topic  string
	Groups []string
}

// killTune shortens the consumer-group timeouts that the backend set, all by
// the same factor, so that their relation is the backend's: 3/5, which
// brings a session timeout of 10 s to 6 s, the least a Kafka broker accepts
// by default (group.min.session.timeout.ms).
var killTune = tuneSarama(func(c *sarama.Config) {
	for _, d := range []*time.Duration{
		&c.Net.ReadTimeout,
		&c.Consumer.Group.Session.Timeout,
		&c.Consumer.Group.Heartbeat.Interval,
		&c.Consumer.Group.Rebalance.Timeout,
	} {
		*d = *d * 3 / 5
	}
})

// killConfig is the configuration of the kill test's publisher and of each
// consumer process: all are named alike, as the pods of one deployment are.
func killConfig(url, group string) backends.Config {
	return backends.Config{
		URL:             backendtest.WithParams(url, "partitions", "6"),
		Group:           group,
		Consumer:        "kill-consumer",
		NackResendSleep: backendtest.FastNack,
		Tune:            killTune,
	}
}

// runKillChild consumes the topic in every group until the process is
// killed, printing "group payload" for each message before it acks it.
func runKillChild(env string) int {
	var c killChild
	if err := json.Unmarshal([]byte(env), &c); err != nil {
		fmt.Fprintln(os.Stderr, "kill child:", err)
		return 2
	}
	logger := watermill.NewStdLoggerWithOut(os.Stderr, false, false)
	b, err := backends.New(killConfig(c.URL, c.Groups[0]), logger)
	if err != nil {
		fmt.Fprintln(os.Stderr, "kill child:", err)
		return 2
	}
	var stdout sync.Mutex
	for i, group := range c.Groups {
		sub := b.Subscriber
		if i > 0 {
			if sub, err = b.SubscriberForGroup(group); err != nil {
				fmt.Fprintln(os.Stderr, "kill child:", err)
				return 2
			}
		}
		msgs, err := sub.Subscribe(context.Background(), c.Topic)
		if err != nil {
			fmt.Fprintln(os.Stderr, "kill child:", err)
			return 2
		}
		go func() {
			for m := range msgs {
				stdout.Lock()
				fmt.Fprintln(os.Stdout, group, string(m.Payload)) // unbuffered: one write per line
				stdout.Unlock()
				m.Ack()
			}
		}()
	}
	select {}
}

// killSeen is what the consumer processes printed: the payloads each group
// received.
type killSeen struct {
	mu     sync.Mutex
	groups map[string]map[string]bool
}

func (s *killSeen) add(group, payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.groups[group] != nil {
		s.groups[group][payload] = true
	}
}

// missing is how many of the first n payloads each group has not received,
// and the total.
func (s *killSeen) missing(n int) (map[string]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out, total := map[string]int{}, 0
	for g, seen := range s.groups {
		for i := range n {
			if !seen[strconv.Itoa(i)] {
				out[g]++
				total++
			}
		}
	}
	return out, total
}

// killProc is one consumer process.
type killProc struct {
	cmd  *exec.Cmd
	done chan struct{} // closed when its stdout reached EOF
	log  string
}

// Consumer processes are SIGKILLed at random moments, one at a time and
// started again at once, while messages flow, in three consumer groups per
// process; once the kills stop, every group receives every message. A killed
// member stays in its group until its session times out, and a group that
// rebalances meanwhile waits for it up to the rebalance timeout: sarama's
// JoinGroup read must outlast that wait, or the live members time out and
// rejoin, which on kfake starts the wait again, and the group never settles.
// The timeouts are the backend's, shortened by killTune.
func TestKafka_GroupsSurviveKills(t *testing.T) {
	if testing.Short() {
		t.Skip("kills consumer processes for half a minute; left out by -short")
	}
	t.Parallel()
	const (
		procs = 3
		kills = 12
	)
	brokers := testserver.KafkaBrokers(t)
	url := "kafka://" + strings.Join(brokers, ",")
	topic := backendtest.UniqueTopic("kill")
	var groups []string
	seen := &killSeen{groups: map[string]map[string]bool{}}
	for _, name := range []string{"book", "mail", "bill"} {
		g := name + "-" + backendtest.RunID + "-" + watermill.NewShortUUID()
		groups = append(groups, g)
		seen.groups[g] = map[string]bool{}
	}
	env, err := json.Marshal(killChild{URL: url, Topic: topic, Groups: groups})
	require.NoError(t, err)

	pub := backendtest.NewBackend(t, killConfig(url, groups[0]))
	published := 0
	publish := func() {
		require.NoError(t, pub.Publisher.Publish(topic, backendtest.NewMessage(strconv.Itoa(published))))
		published++
	}
	publish() // creates the topic

	self, err := os.Executable()
	require.NoError(t, err)
	dir := t.TempDir()
	started := 0
	var procLogs []string
	start := func() *killProc {
		started++
		p := &killProc{done: make(chan struct{}), log: filepath.Join(dir, fmt.Sprintf("consumer-%d.log", started))}
		procLogs = append(procLogs, p.log)
		logFile, err := os.Create(p.log)
		require.NoError(t, err)
		defer logFile.Close() // the child holds its own descriptor
		p.cmd = exec.Command(self, "-test.run=^$")
		p.cmd.Env = append(os.Environ(), killChildVar+"="+string(env))
		p.cmd.Stderr = logFile
		stdout, err := p.cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, p.cmd.Start())
		go func() {
			defer close(p.done)
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if g, payload, ok := strings.Cut(sc.Text(), " "); ok {
					seen.add(g, payload)
				}
			}
		}()
		t.Cleanup(func() { p.kill() })
		return p
	}
	running := make([]*killProc, procs)
	for i := range running {
		running[i] = start()
	}

	// Kills at random moments, 0.3 to 1.5 s apart, with messages published
	// all along: rebalances overlap, and members restarted by the kills
	// join while their dead predecessors are still in the group.
	for range kills {
		deadline := time.Now().Add(time.Duration(300+rand.IntN(1200)) * time.Millisecond)
		for time.Now().Before(deadline) {
			publish()
			time.Sleep(20 * time.Millisecond)
		}
		i := rand.IntN(procs)
		running[i].kill()
		running[i] = start()
	}
	// Each wait fails after 40 s, with what the groups and the consumers'
	// logs say.
	waitFor := func(what string, done func() bool) {
		t.Helper()
		deadline := time.Now().Add(40 * time.Second)
		for !done() {
			for _, p := range running {
				select {
				case <-p.done:
					t.Fatalf("a consumer process exited on its own (%v); its log:\n%s", p.cmd.Wait(), p.logTail())
				default:
				}
			}
			if time.Now().After(deadline) {
				perGroup, _ := seen.missing(published)
				t.Fatalf("%s within 40 s of the last of %d kills; of %d messages the groups lack %v; %s; %s",
					what, kills, published, perGroup, describeGroups(brokers, groups), groupErrors(procLogs))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitFor("the groups did not all become stable", func() bool {
		desc, err := describe(brokers, groups)
		if err != nil {
			return false
		}
		for _, g := range desc {
			if g.State != "Stable" {
				return false
			}
		}
		return true
	})
	// Then one more consumer joins, as when a deployment scales up. kfake
	// (not Kafka) keeps a member killed before its first JoinGroup was
	// answered, with its partitions and no session timeout, until the
	// group's next rebalance: this one.
	running = append(running, start())
	for range 50 {
		publish()
	}
	waitFor("the groups did not receive every message", func() bool {
		_, total := seen.missing(published)
		return total == 0
	})
	t.Logf("%d processes, %d kills: each of %d groups received all %d messages", procs, kills, len(groups), published)
}

// kill SIGKILLs the process unless it already ended, and reaps it.
func (p *killProc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done // Wait closes stdout, so it comes after the reader's EOF
	_ = p.cmd.Wait()
}

// logTail is the end of the process's log.
func (p *killProc) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// groupErrors counts the consumer-group errors in the consumer processes'
// logs, and quotes the last.
func groupErrors(logs []string) string {
	n, last := 0, ""
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if _, after, ok := strings.Cut(line, `msg="Group consume error"`); ok {
				n++
				if _, err, ok := strings.Cut(after, " err="); ok {
					last, _, _ = strings.Cut(err, " kafka_consumer_uuid=")
				}
			}
		}
	}
	return fmt.Sprintf("the consumers logged %d group consume errors, the last err=%s", n, last)
}

// describe is what the cluster reports of the groups.
func describe(brokers, groups []string) ([]*sarama.GroupDescription, error) {
	conf := sarama.NewConfig()
	conf.Version = sarama.V2_1_0_0
	admin, err := sarama.NewClusterAdmin(brokers, conf)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	return admin.DescribeConsumerGroups(groups)
}

// describeGroups is each group's state and member count.
func describeGroups(brokers, groups []string) string {
	desc, err := describe(brokers, groups)
	if err != nil {
		return "groups: " + err.Error()
	}
	var out []string
	for _, g := range desc {
		out = append(out, fmt.Sprintf("%s %s with %d members", g.GroupId, g.State, len(g.Members)))
	}
	return "groups: " + strings.Join(out, ", ")
}
