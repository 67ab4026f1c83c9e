package tests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	gomysql "github.com/go-sql-driver/mysql"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Tests with child processes: the test binary runs itself again
// (os.Args[0] -test.run=^TestName$) with LASTSEEN_TEST_CHILD set to a JSON
// childSpec; the same test function sees the variable and plays the child
// (a flusher to kill, an app instance) instead of the parent.

const envChild = "LASTSEEN_TEST_CHILD"

// childSpec tells a child what to connect to and what to do.
type childSpec struct {
	Role    string `json:"role"` // "crash" or "instance"
	Dialect string `json:"dialect"`
	DSN     string `json:"dsn"`
	Redis   string `json:"redis"` // address, or the cluster's addresses separated by ","
	Cluster bool   `json:"cluster"`
	Prefix  string `json:"prefix"`
	Now     string `json:"now"`   // crash: the plugin's clock; instance: the touches' reference time
	Point   string `json:"point"` // crash: where to stop
	Seed    uint64 `json:"seed"`  // instance: the random sequence
	Ops     int    `json:"ops"`   // instance: operations to run
	Log     string `json:"log"`   // instance: file of what it recorded
}

// childSpecFromEnv returns the spec when this process is a child, else nil.
func childSpecFromEnv(t *testing.T) *childSpec {
	v := os.Getenv(envChild)
	if v == "" {
		return nil
	}
	var s childSpec
	if err := json.Unmarshal([]byte(v), &s); err != nil {
		t.Fatalf("child spec: %v", err)
	}
	return &s
}

// child is a running child process. Its stdout is read to the end
// whatever the parent does, so that a child never blocks on a full pipe.
type child struct {
	t      *testing.T
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stderr bytes.Buffer
	mu     sync.Mutex
	out    []string      // every stdout line so far
	more   chan struct{} // signalled (non-blocking) after each line
	done   chan struct{} // closed once the child ended and out is complete
	err    error         // cmd.Wait's, once done is closed
}

// startChild runs the test binary again for test with spec.
func startChild(t *testing.T, test string, spec childSpec) *child {
	t.Helper()
	js, err := json.Marshal(spec)
	must(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^"+test+"$", "-test.count=1", "-test.timeout=3m")
	cmd.Env = append(os.Environ(), envChild+"="+string(js))
	c := &child{t: t, cmd: cmd, more: make(chan struct{}, 1), done: make(chan struct{})}
	cmd.Stderr = &c.stderr
	c.stdin, err = cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.mu.Lock()
			c.out = append(c.out, sc.Text())
			c.mu.Unlock()
			select {
			case c.more <- struct{}{}:
			default:
			}
		}
		c.err = cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.done
	})
	return c
}

// output is everything the child printed, for failure messages.
func (c *child) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.out, "\n") + "\n" + c.stderr.String()
}

// waitLine returns the first line starting with prefix, failing if the
// child ends first or does not print it within a minute.
func (c *child) waitLine(prefix string) string {
	c.t.Helper()
	timeout := time.After(time.Minute)
	for {
		if line := c.printed(prefix); line != "" {
			return line
		}
		select {
		case <-c.more:
		case <-c.done:
			if line := c.printed(prefix); line != "" {
				return line
			}
			c.t.Fatalf("child ended (%v) before printing %q:\n%s", c.err, prefix, c.output())
		case <-timeout:
			c.t.Fatalf("child did not print %q within a minute:\n%s", prefix, c.output())
		}
	}
}

// kill sends SIGKILL and checks that the signal ended the child.
func (c *child) kill() {
	c.t.Helper()
	must(c.t, c.cmd.Process.Signal(syscall.SIGKILL))
	<-c.done
	var ee *exec.ExitError
	if !errors.As(c.err, &ee) || !ee.Sys().(syscall.WaitStatus).Signaled() || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		c.t.Fatalf("child ended with %v, want SIGKILL:\n%s", c.err, c.output())
	}
}

// wait waits for the child to exit and fails unless it succeeded.
func (c *child) wait() {
	c.t.Helper()
	select {
	case <-c.done:
	case <-time.After(3 * time.Minute):
		c.t.Fatalf("child still running after 3 minutes:\n%s", c.output())
	}
	if c.err != nil {
		c.t.Fatalf("child failed: %v\n%s", c.err, c.output())
	}
}

// childTarget returns the DSN and Redis address a child uses to reach the
// harness's own database and Redis.
func childTarget(t *testing.T, h *harness) (spec childSpec) {
	t.Helper()
	spec.Dialect, spec.Prefix = h.dialect, h.prefix
	switch h.dialect {
	case "sqlite":
		var rows []struct{ Name, File string }
		must(t, h.db.Raw("PRAGMA database_list").Scan(&rows).Error)
		for _, r := range rows {
			if r.Name == "main" {
				spec.DSN = r.File + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)"
			}
		}
	case "postgres":
		var schema string
		must(t, h.db.Raw("SELECT current_schema()").Scan(&schema).Error)
		spec.DSN = os.Getenv(testenv.EnvPostgres) + " search_path=" + schema
	case "mysql":
		mc, err := gomysql.ParseDSN(os.Getenv(testenv.EnvMySQL))
		must(t, err)
		must(t, h.db.Raw("SELECT DATABASE()").Scan(&mc.DBName).Error)
		spec.DSN = mc.FormatDSN()
	}
	switch h.redis {
	case "miniredis":
		spec.Redis = h.r.Mini.Addr()
	case "redis":
		spec.Redis = os.Getenv(testenv.EnvRedis)
	case "cluster":
		spec.Redis, spec.Cluster = os.Getenv(testenv.EnvRedisCluster), true
	}
	return spec
}

// childPlugin opens the child's database and Redis and registers a plugin
// with cfg (Redis and Prefix filled in).
func childPlugin(t *testing.T, spec *childSpec, cfg lastseen.Config) *lastseen.Plugin {
	t.Helper()
	var d gorm.Dialector
	switch spec.Dialect {
	case "sqlite":
		d = sqlite.Open(spec.DSN)
	case "postgres":
		d = postgres.Open(spec.DSN)
	case "mysql":
		d = mysql.Open(spec.DSN)
	}
	db, err := gorm.Open(d, quietGorm())
	must(t, err)
	if spec.Cluster {
		cfg.Redis = redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(spec.Redis, ",")})
	} else {
		cfg.Redis = redis.NewClient(&redis.Options{Addr: spec.Redis})
	}
	cfg.Buffer.Prefix = spec.Prefix
	cfg.Flush.Schedule, cfg.Sessions.Schedule = "off", "off"
	cfg.Logger = testenv.Discard
	p := lastseen.New(cfg)
	must(t, db.Use(p))
	return p
}

// ----------------------------------------------------- 4. crash mid-flush --

// Crash-test layout: two shards, batches of 3, 20 users.
const (
	crashShards = 2
	crashBatch  = 3
	crashUsers  = 20
)

// crashPoints are where the child flusher stops to be killed:
//   - after-swap: the pending hash was renamed to in-flight;
//   - after-commit: batch 1 committed, its acknowledgement not started;
//   - ack-in-flight: batch 1's acknowledgement was started and is held
//     before it reaches Redis, while batch 2 committed meanwhile;
//   - between-batches: the flush saw batch 1's acknowledgement, after
//     batch 2's statement committed, before batch 2's acknowledgement;
//   - before-unlink: every batch committed and acknowledged.
var crashPoints = []string{"after-swap", "after-commit", "ack-in-flight", "between-batches", "before-unlink"}

// runCrashChild flushes and, at the spec's point in the first shard that
// reaches any hook, prints "CRASHPOINT <point> <shard>" and blocks until
// killed. A shard flushed concurrently with that one (FlushConcurrency > 1)
// is frozen at its first hook, so nothing of it is committed.
func runCrashChild(t *testing.T, spec *childSpec) {
	now := mustTime(spec.Now)
	var mu sync.Mutex
	crashShard := -1
	stop := func(point string, shard int) {
		mu.Lock()
		if crashShard < 0 {
			crashShard = shard
		}
		mine := crashShard == shard
		mu.Unlock()
		if !mine {
			select {} // until SIGKILL
		}
		if point != spec.Point {
			return
		}
		fmt.Printf("CRASHPOINT %s %d\n", point, shard)
		os.Stdin.Read(make([]byte, 1)) // the parent never writes: SIGKILL comes first
		t.Fatal("stdin closed: the parent did not kill the child")
	}
	hooks := flushHooks{
		AfterSwap: func(shard int) { stop("after-swap", shard) },
		AfterCommit: func(shard, batch int) {
			switch batch {
			case 1:
				stop("after-commit", shard)
			case 2:
				stop("ack-in-flight", shard)
			}
		},
		BeforeAck: func(shard, batch int) {
			stop("before-ack", shard) // no such point: returns in the crashing shard
			if batch == 1 && spec.Point == "ack-in-flight" {
				select {} // the acknowledgement never reaches Redis; SIGKILL comes at batch 2's commit
			}
		},
		AfterAck: func(shard, batch int) {
			if batch == 1 {
				stop("between-batches", shard)
			}
		},
		BeforeUnlink: func(shard int) { stop("before-unlink", shard) },
	}
	p := childPlugin(t, spec, lastseen.Config{
		Throttle: time.Minute,
		Buffer:   lastseen.BufferConfig{Shards: crashShards},
		Flush:    lastseen.FlushConfig{BatchSize: crashBatch},
		Test:     lastseen.TestConfig{Now: func() time.Time { return now }, Seam: &testseam.Seam{Flush: hooks}},
	})
	_, err := p.Flush(context.Background())
	t.Fatalf("flush ended (%v) without reaching %s", err, spec.Point)
}

// TestCrashMidFlush: a flusher in a child process is
// killed with SIGKILL at each point of a flush; requests go on meanwhile
// (newer and older touches, and the app writing a newer value itself).
// Redis and the database are checked at the crash: exactly what the point
// implies is committed and in flight, and, whatever the point, no entry
// left the in-flight hash before the statement that wrote it committed
// (entries committed but not yet acknowledged, as with an acknowledgement
// in flight, stay in flight and are written again, forward-only, by the
// next flusher). A new flusher skips the
// shards whose lock the dead flusher held while the locks live, and once
// they expire writes everything: every timestamp reaches the database and
// none goes backwards.
func TestCrashMidFlush(t *testing.T) {
	if spec := childSpecFromEnv(t); spec != nil {
		runCrashChild(t, spec)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes; runs without -short")
	}
	for _, env := range []struct {
		d testenv.Dialect
		r testenv.RedisKind
	}{{testenv.SQLite(), testenv.Miniredis()}, {testenv.SQLite(), testenv.RedisServer()}, {servers.Postgres(), testenv.RedisServer()}} {
		for _, point := range crashPoints {
			t.Run(env.d.Name+"/"+env.r.Name+"/"+point, func(t *testing.T) {
				crashAt(t, newHarness(t, env.d, env.r), point)
			})
		}
	}
}

func crashAt(t *testing.T, h *harness, point string) {
	ctx := context.Background()
	h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
	cfg := h.config()
	cfg.Buffer.Shards, cfg.Flush.BatchSize, cfg.Throttle = crashShards, crashBatch, time.Minute
	p, db := h.plugin(cfg)
	must(t, db.AutoMigrate(&lastseen.User{}))
	want := seedFaultUsers(t, db, crashUsers)
	initial := map[int]string{}
	for id, v := range want {
		initial[id] = v
	}
	touchFaultUsers(t, p, crashUsers, "2026-03-01T10:00:00Z", want)
	shardOf := func(id int) int { return keys.ShardOf(strconv.Itoa(id), cfg.Buffer.Shards) }

	spec := childTarget(t, h)
	spec.Role, spec.Point, spec.Now = "crash", point, h.clock.Now().Format(time.RFC3339Nano)
	c := startChild(t, "TestCrashMidFlush", spec)
	var got string
	var s int
	if _, err := fmt.Sscanf(c.waitLine("CRASHPOINT "), "CRASHPOINT %s %d", &got, &s); err != nil || got != point {
		t.Fatalf("child stopped at %q (%v), want %s", got, err, point)
	}

	// The child is stopped inside its flush of shard s. Check what the
	// point implies, then let requests go on.
	var inShard, changed []int
	for id := 1; id <= crashUsers; id++ {
		if shardOf(id) != s {
			equal(t, fmt.Sprintf("user %d of the other shard", id), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), initial[id])
			continue
		}
		inShard = append(inShard, id)
		switch col := lastSeenColumn(t, db, "users", "id", "last_seen_at", id); col {
		case want[id]:
			changed = append(changed, id)
		case initial[id]:
		default:
			t.Errorf("user %d: column %q, want %q or %q", id, col, initial[id], want[id])
		}
	}
	if len(inShard) <= crashBatch {
		t.Fatalf("shard %d has %d users, want more than one batch", s, len(inShard))
	}
	shard := shardKeys(p, s)
	var inflight int64
	for _, key := range shard.AllInFlight() {
		n, err := h.r.Client.HLen(ctx, key).Result()
		must(t, err)
		inflight += n
	}
	two := min(2*crashBatch, len(inShard))                  // batches 1 and 2
	expect := map[string]struct{ committed, inflight int }{ // at each point, in shard s
		"after-swap":      {0, len(inShard)},
		"after-commit":    {crashBatch, len(inShard)},
		"ack-in-flight":   {two, len(inShard)},
		"between-batches": {two, len(inShard) - crashBatch},
		"before-unlink":   {len(inShard), 0},
	}[point]
	equal(t, "users committed at the crash", len(changed), expect.committed)
	equal(t, "in-flight entries at the crash", int(inflight), expect.inflight)
	// The invariant, whatever the point: an entry leaves the in-flight
	// hash only once the statement that wrote it committed.
	for _, id := range inShard {
		in, err := h.r.Client.HExists(ctx, inflightKey(p, strconv.Itoa(id)), strconv.Itoa(id)).Result()
		must(t, err)
		if !in && !slices.Contains(changed, id) {
			t.Errorf("user %d: acknowledged (not in flight) but its column %q is not committed", id, lastSeenColumn(t, db, "users", "id", "last_seen_at", id))
		}
	}
	equal(t, "pending hashes of the crashed shard", h.r.Client.Exists(ctx, shard.AllPending()...).Val(), int64(0))

	// Requests during the crash: users 5-8 newer, 9-12 older (a delayed
	// request), and the app itself writes a newer value for users 1 and 2.
	// The throttle window passes (the clock enters the next window;
	// miniredis is not fast-forwarded, which would expire the lock too).
	h.clock.Add(time.Minute)
	for id := 5; id <= 12; id++ {
		at := mustTime("2026-03-01T10:05:00Z")
		if id > 8 {
			at = mustTime("2026-03-01T09:59:00Z")
		} else {
			want[id] = at.Format(time.RFC3339)
		}
		ok, err := p.TouchAt(ctx, id, at)
		must(t, err)
		equal(t, fmt.Sprintf("touch %d recorded", id), ok, true)
	}
	for _, id := range []int{1, 2} {
		must(t, db.Model(&lastseen.User{}).Where("id = ?", id).Update("last_seen_at", mustTime("2026-03-01T11:00:00Z")).Error)
		want[id] = "2026-03-01T11:00:00Z"
	}

	c.kill()
	seen := map[int]time.Time{}
	noneBackwards := func(when string) {
		t.Helper()
		for id := 1; id <= crashUsers; id++ {
			var col time.Time // zero for NULL
			if v := lastSeenColumn(t, db, "users", "id", "last_seen_at", id); v != "" {
				col = mustTime(v)
			}
			if col.Before(seen[id]) {
				t.Errorf("%s: user %d went backwards from %v to %v", when, id, seen[id], col)
			}
			seen[id] = col
		}
	}
	noneBackwards("after the kill")

	// A new flusher: the dead one's locks (shard s, and the other shard if
	// it was being flushed concurrently) keep their shards until they expire.
	p2, _ := h.plugin(cfg)
	ttl, err := h.r.Client.PTTL(ctx, shard.Lock).Result()
	must(t, err)
	if ttl <= 0 || ttl > 30*time.Second {
		t.Fatalf("the dead flusher's lock has PTTL %v, want 0 < PTTL <= %v", ttl, 30*time.Second)
	}
	var locks []string
	for _, k := range allShardKeys(p) {
		locks = append(locks, k.Lock)
	}
	held, err := h.r.Client.Exists(ctx, locks...).Result()
	must(t, err)
	res, err := p2.Flush(ctx)
	must(t, err)
	equal(t, "shards skipped while the dead flusher's locks live", res.Skipped, int(held))
	noneBackwards("after the first flush")
	must(t, h.r.Client.Del(ctx, locks...).Err()) // what their TTL does
	res, err = p2.Flush(ctx)
	must(t, err)
	equal(t, "skipped once the lock expired", res.Skipped, 0)
	noneBackwards("after the second flush")
	checkFaultColumns(t, db, "after recovery", want)
	equal(t, "redis buffers left", len(h.pendingKeys()), 0)
}

// ------------------------------------------------------ 6. many instances --

// Many-instances layout: 3 processes, 300 operations each over 200 users.
const (
	instanceCount = 3
	instanceOps   = 300
	instanceUsers = 200
)

// runInstanceChild is one app instance: with the real clock and randomized
// timing it touches users at random past times (logging "T id micros" for
// each recorded touch), flushes, purges, and inserts sessions (logging
// "S id live|expired"); at the end it flushes until no shard was skipped
// and purges until it got the lock, and prints "DONE" with its counters.
// Any error other than ErrLocked fails it.
func runInstanceChild(t *testing.T, spec *childSpec) {
	ctx := context.Background()
	p := childPlugin(t, spec, lastseen.Config{
		Throttle: 20 * time.Millisecond,
		Buffer:   lastseen.BufferConfig{TouchTimeout: harnessTouchTimeout},
		Flush:    lastseen.FlushConfig{BatchSize: 50},
		Sessions: lastseen.SessionConfig{BatchSize: 100},
		Test:     lastseen.TestConfig{Seam: &testseam.Seam{PurgePause: -1}},
	})
	f, err := os.Create(spec.Log)
	must(t, err)
	w := bufio.NewWriter(f)
	rng := rand.New(rand.NewPCG(spec.Seed, 42))
	ref := mustTime(spec.Now)
	sessions := 0
	insertSessions := func() {
		now := time.Now().UTC()
		rows := []lastseen.Session{
			{ID: fmt.Sprintf("c%d-%d-x", spec.Seed, sessions), UserID: 1, ExpiresAt: now.Add(-time.Duration(1+rng.IntN(600)) * time.Second)},
			{ID: fmt.Sprintf("c%d-%d-y", spec.Seed, sessions), UserID: 2, ExpiresAt: now.Add(-time.Millisecond)},
			{ID: fmt.Sprintf("c%d-%d-l", spec.Seed, sessions), UserID: 3, ExpiresAt: now.Add(2 * time.Hour)},
		}
		var err error
		for range 5 { // the test's own insert; MySQL may pick it as a deadlock victim of a purge
			if err = pluginDB(t, p).Create(&rows).Error; err == nil {
				break
			}
		}
		must(t, err)
		fmt.Fprintf(w, "S %s expired\nS %s expired\nS %s live\n", rows[0].ID, rows[1].ID, rows[2].ID)
		sessions++
	}
	var touches, recorded, flushes, purges, locked int
	for range spec.Ops {
		switch r := rng.IntN(100); {
		case r < 80:
			id := 1 + rng.IntN(instanceUsers)
			at := ref.Add(-time.Duration(1 + rng.Int64N(int64(30*time.Minute)))).Truncate(time.Millisecond)
			ok, err := p.TouchAt(ctx, id, at)
			touches++
			if err != nil && !strings.HasPrefix(err.Error(), "lastseen: touch user ") {
				t.Fatalf("touch: %v", err)
			}
			if ok || err != nil { // recorded in Redis, or kept in the backlog
				recorded++
				fmt.Fprintf(w, "T %d %d\n", id, at.UnixMicro())
			}
		case r < 88:
			if _, err := p.Flush(ctx); err != nil {
				t.Fatalf("flush: %v", err)
			}
			flushes++
		case r < 92:
			_, err := p.PurgeExpiredSessions(ctx)
			if errors.Is(err, lastseen.ErrLocked) {
				locked++
			} else if err != nil {
				t.Fatalf("purge: %v", err)
			}
			purges++
		default:
			insertSessions()
		}
		time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
	}
	must(t, w.Flush())
	must(t, f.Close())
	for attempt := 0; ; attempt++ { // every shard, after this instance's last touch
		res, err := p.Flush(ctx)
		if err != nil {
			t.Fatalf("final flush: %v", err)
		}
		if res.Skipped == 0 {
			break
		}
		if attempt == 1000 {
			t.Fatal("final flush: shards still locked after 1000 attempts")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for attempt := 0; ; attempt++ { // a purge that starts after this instance's last insert
		_, err := p.PurgeExpiredSessions(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, lastseen.ErrLocked) || attempt == 1000 {
			t.Fatalf("final purge: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	s := p.Stats()
	if s.BacklogDropped != 0 || s.Backlog != 0 {
		t.Fatalf("backlog: %d dropped, %d left", s.BacklogDropped, s.Backlog)
	}
	fmt.Printf("DONE touches=%d recorded=%d flushes=%d purges=%d purges-locked=%d sessions=%d rows-written=%d deleted=%d skipped-shards=%d\n",
		touches, recorded, flushes, purges, locked, 3*sessions, s.RowsWritten, s.SessionsDeleted, s.FlushSkipped)
	p.Close(ctx)
}

// TestManyInstances: three processes touch, flush
// and purge against the same Redis and database with randomized timing.
// Afterwards the database holds the newest recorded timestamp of every user
// (or the newer value it had), Redis holds nothing, every expired session
// is gone and every live one remains, and no instance saw an error.
func TestManyInstances(t *testing.T) {
	if spec := childSpecFromEnv(t); spec != nil {
		runInstanceChild(t, spec)
		return
	}
	if testing.Short() {
		t.Skip("starts child processes; runs without -short")
	}
	for _, env := range []struct {
		d testenv.Dialect
		r testenv.RedisKind
	}{{testenv.SQLite(), testenv.Miniredis()}, {servers.Postgres(), testenv.RedisServer()}, {servers.MySQL(), testenv.RedisServer()}, {servers.Postgres(), testenv.RedisCluster()}} {
		t.Run(env.d.Name+"/"+env.r.Name, func(t *testing.T) { manyInstances(t, newHarness(t, env.d, env.r)) })
	}
}

func manyInstances(t *testing.T, h *harness) {
	db := h.db
	must(t, db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	now := time.Now().UTC().Truncate(time.Millisecond)
	want := map[int]time.Time{}
	users := make([]lastseen.User, instanceUsers)
	for i := range users {
		id := i + 1
		users[i].ID = uint64(id)
		switch {
		case id <= 10: // newer than any touch: must stay
			users[i].LastSeenAt = ptr(now)
		case id%2 == 0:
			users[i].LastSeenAt = ptr(now.Add(-2 * time.Hour))
		}
		if users[i].LastSeenAt != nil {
			want[id] = *users[i].LastSeenAt
		}
	}
	must(t, db.CreateInBatches(&users, 100).Error)
	var sessions []lastseen.Session
	live := map[string]bool{}
	for i := range 1000 {
		sessions = append(sessions, lastseen.Session{ID: fmt.Sprintf("p-%d-x", i), UserID: 1, ExpiresAt: now.Add(-time.Duration(1+i) * time.Second)})
	}
	for i := range 200 {
		id := fmt.Sprintf("p-%d-l", i)
		sessions = append(sessions, lastseen.Session{ID: id, UserID: 1, ExpiresAt: now.Add(2 * time.Hour)})
		live[id] = true
	}
	must(t, db.CreateInBatches(&sessions, 200).Error)

	if h.r.Mini != nil { // miniredis expires keys only when told: let real time pass
		stop := make(chan struct{})
		ticked := make(chan struct{})
		go func() {
			defer close(ticked)
			last := time.Now()
			for {
				select {
				case <-stop:
					return
				case now := <-time.After(5 * time.Millisecond):
					h.r.Mini.FastForward(now.Sub(last))
					last = now
				}
			}
		}()
		defer func() { close(stop); <-ticked }()
	}
	dir := t.TempDir()
	var children []*child
	for i := range instanceCount {
		spec := childTarget(t, h)
		spec.Role, spec.Seed, spec.Ops, spec.Now = "instance", uint64(i+1), instanceOps, now.Format(time.RFC3339Nano)
		spec.Log = filepath.Join(dir, fmt.Sprintf("instance-%d.log", i+1))
		children = append(children, startChild(t, "TestManyInstances", spec))
	}
	recorded := 0
	for i, c := range children {
		c.wait()
		t.Logf("instance %d: %s", i+1, c.printed("DONE "))
		data, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("instance-%d.log", i+1)))
		must(t, err)
		for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
			f := strings.Fields(line)
			switch {
			case len(f) == 3 && f[0] == "T":
				id, _ := strconv.Atoi(f[1])
				us, _ := strconv.ParseInt(f[2], 10, 64)
				if at := time.UnixMicro(us).UTC(); at.After(want[id]) {
					want[id] = at
				}
				recorded++
			case len(f) == 3 && f[0] == "S":
				if f[2] == "live" {
					live[f[1]] = true
				}
			default:
				t.Fatalf("instance %d log: bad line %q", i+1, line)
			}
		}
	}
	if recorded < instanceCount*instanceOps/2 { // 80% of the operations are touches, most recorded
		t.Fatalf("only %d touches recorded by %d instances", recorded, instanceCount)
	}

	mismatches := 0
	for id := 1; id <= instanceUsers; id++ {
		w := ""
		if at, ok := want[id]; ok {
			w = at.Format(time.RFC3339Nano)
		}
		if got := lastSeenColumn(t, db, "users", "id", "last_seen_at", id); got != w {
			if mismatches++; mismatches <= 10 {
				t.Errorf("user %d: last_seen_at %q, want %q", id, got, w)
			}
		}
	}
	equal(t, "users with a wrong last_seen_at", mismatches, 0)
	equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")

	var expired, total int64
	must(t, db.Model(&lastseen.Session{}).Where("expires_at <= ?", time.Now().UTC()).Count(&expired).Error)
	must(t, db.Model(&lastseen.Session{}).Count(&total).Error)
	equal(t, "expired sessions left", expired, 0)
	equal(t, "sessions left (all live)", total, int64(len(live)))
	var ids []string
	must(t, db.Model(&lastseen.Session{}).Pluck("id", &ids).Error)
	for _, id := range ids {
		if !live[id] {
			t.Errorf("session %s remains but is not a live one", id)
		}
	}
}

// printed returns the first line the child printed starting with prefix,
// or "".
func (c *child) printed(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range c.out {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}
