package tests

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gomysql "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/internal/faultproxy"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// This file injects real faults: a redis-server of the test's own that is
// killed and started again, a TCP proxy (internal/faultproxy) that delays,
// drops, refuses and cuts traffic to Redis or to the database server, killed
// database connections, statement timeouts and a constraint that refuses one
// row. The shared servers are never stopped; only private processes and
// proxies are.

// ---------------------------------------------------------------- helpers --

// privateRedis is a redis-server of the test's own on a free loopback port,
// without persistence (--save "" --appendonly no), that the test kills and
// starts again on the same port.
type privateRedis struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	args []string // extra redis-server arguments, such as "--maxmemory", "4mb"

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

// startPrivateRedis starts the server with extra redis-server arguments
// (args, such as "--maxmemory", "4mb"). Without a redis-server binary it
// skips, or fails under LASTSEEN_REQUIRE_SERVICES.
func startPrivateRedis(t testing.TB, args ...string) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv(testenv.EnvRequire) != "" {
			t.Fatalf("redis-server not found but %s is set: this test must run", testenv.EnvRequire)
		}
		t.Skip("redis-server not installed")
	}
	r := &privateRedis{t: t, bin: bin, dir: t.TempDir(), args: args}
	t.Cleanup(r.kill)
	for attempt := 1; ; attempt++ {
		r.port = freePort(t)
		err := r.launch()
		if err == nil {
			return r
		}
		if attempt == 3 { // the free port was taken between probe and bind
			t.Fatalf("start private redis-server: %v", err)
		}
	}
}

func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (r *privateRedis) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.port) }

// launch runs redis-server and waits until it answers PING.
func (r *privateRedis) launch() error {
	cmd := exec.Command(r.bin, append([]string{"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", r.dir, "--daemonize", "no"}, r.args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlive the test binary
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	r.mu.Lock()
	r.cmd, r.exited = cmd, exited
	r.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			return fmt.Errorf("redis-server on port %d exited at start", r.port)
		default:
		}
		if r.ping() {
			return nil
		}
		if time.Now().After(deadline) {
			r.kill()
			return fmt.Errorf("redis-server on port %d did not answer PING within 10s", r.port)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *privateRedis) ping() bool {
	c, err := net.DialTimeout("tcp", r.Addr(), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return false
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	return err == nil && line == "+PONG\r\n"
}

// kill sends SIGKILL and waits for the process to end: the server is gone
// with its data, as in a crash.
func (r *privateRedis) kill() {
	r.mu.Lock()
	cmd, exited := r.cmd, r.exited
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Kill()
	<-exited
}

// restart starts the server again on the same port, empty.
func (r *privateRedis) restart() {
	r.t.Helper()
	if err := r.launch(); err != nil {
		r.t.Fatal(err)
	}
}

// waitForRedis polls PING until the client reaches Redis again, for at
// most 10s: after an outage go-redis's pool refuses to dial for up to a
// second (its own dial breaker), whatever the server does.
func waitForRedis(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the client did not reach Redis within 10s of its return")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func startFaultProxy(t testing.TB, target string) *faultproxy.Proxy {
	t.Helper()
	px, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { px.Close() })
	return px
}

// clientKind is a testenv.RedisKind for a client the test made itself (a private
// server, a proxy).
func clientKind(c redis.UniversalClient) testenv.RedisKind {
	return testenv.RedisKind{Name: "private", Open: func(testing.TB) *testenv.Redis { return &testenv.Redis{Client: c} }}
}

func newPrivateClient(t testing.TB, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true}) // see testRedis
	t.Cleanup(func() { c.Close() })
	return c
}

// commandCounter is a go-redis hook that counts commands sent and the
// replies that are a given error.
type commandCounter struct {
	sent     atomic.Int64
	noscript atomic.Int64
}

func countCommands(c redis.UniversalClient) *commandCounter {
	cc := &commandCounter{}
	c.AddHook(cc)
	return cc
}

func (cc *commandCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (cc *commandCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		cc.sent.Add(1)
		err := next(ctx, cmd)
		if err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
			cc.noscript.Add(1)
		}
		return err
	}
}

func (cc *commandCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		cc.sent.Add(int64(len(cmds)))
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if e := cmd.Err(); e != nil && strings.HasPrefix(e.Error(), "NOSCRIPT") {
				cc.noscript.Add(1)
			}
		}
		return err
	}
}

// percentile returns the q-th percentile (0 < q <= 1) of d by the
// nearest-rank method: the value at rank ceil(q*n) of the sorted sample.
func percentile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[int(math.Ceil(q*float64(len(s))))-1]
}

// seedFaultUsers creates users 1..n; even ids start with last_seen_at 09:00,
// odd ones with NULL. It returns the expected column per id.
func seedFaultUsers(t testing.TB, db *gorm.DB, n int) map[int]string {
	t.Helper()
	must(t, db.AutoMigrate(&lastseen.User{}))
	want := map[int]string{}
	users := make([]lastseen.User, n)
	for i := range users {
		id := i + 1
		users[i].ID = uint64(id)
		want[id] = ""
		if id%2 == 0 {
			users[i].LastSeenAt = ptr(mustTime("2026-03-01T09:00:00Z"))
			want[id] = "2026-03-01T09:00:00Z"
		}
	}
	must(t, db.Create(&users).Error)
	return want
}

// touchFaultUsers touches users 1..n at base + id seconds and records the expected
// column values.
func touchFaultUsers(t testing.TB, p *lastseen.Plugin, n int, base string, want map[int]string) {
	t.Helper()
	for id := 1; id <= n; id++ {
		at := mustTime(base).Add(time.Duration(id) * time.Second)
		ok, err := p.TouchAt(context.Background(), id, at)
		must(t, err)
		if !ok {
			t.Fatalf("touch %d at %s was not recorded", id, at.Format(time.RFC3339))
		}
		want[id] = at.Format(time.RFC3339)
	}
}

// checkFaultColumns compares every user's last_seen_at with want.
func checkFaultColumns(t testing.TB, db *gorm.DB, what string, want map[int]string) {
	t.Helper()
	for id := 1; id <= len(want); id++ {
		equal(t, fmt.Sprintf("%s: user %d", what, id), lastSeenColumn(t, db, "users", "id", "last_seen_at", id), want[id])
	}
}

// pendingValue is the user's timestamp still in Redis (pending or
// in-flight), "" when there is none.
func pendingValue(t testing.TB, p *lastseen.Plugin, id int) string {
	t.Helper()
	at, ok, err := p.Pending(context.Background(), id)
	must(t, err)
	if !ok {
		return ""
	}
	return at.Format(time.RFC3339)
}

// ------------------------------------------- 1. Redis slow or down: requests --

// Request-path budget of these tests. It is generous so that a touch on a
// healthy Redis never misses it, even under -race beside CPU-burning
// processes: the tests check behaviour (every request served, the breaker's
// counts, touches kept), never latency. Latency is measured by `lastseen
// bench requests`.
const requestBudget = time.Second

// hangLimit is what no request may reach: a request that waits for Redis
// past its budget by this much is a hang (go-redis's own 3s read timeout, or
// a blackholed connection), not a slow machine.
const hangLimit = requestBudget + 2*time.Second

// requestsPerPhase is the number of requests of each phase.
const requestsPerPhase = 200

// breakerCooldown is the BreakerCooldown of the request-path tests: long
// enough that the breaker cannot half-open during a phase, short enough to
// wait out twice.
const breakerCooldown = 700 * time.Millisecond

// requestRig drives requests through the Middleware, one new user each.
type requestRig struct {
	t       *testing.T
	p       *lastseen.Plugin
	cmds    *commandCounter
	handler http.Handler
	handled atomic.Int64
	next    int
}

func newRequestRig(t *testing.T, rdb *redis.Client) *requestRig {
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	cfg := h.config()
	cfg.Buffer.TouchTimeout = requestBudget
	testenv.Seam(&cfg).BreakerCooldown = breakerCooldown
	testenv.Seam(&cfg).BacklogSize = 10 * requestsPerPhase
	p, db := h.plugin(cfg)
	must(t, db.AutoMigrate(&lastseen.User{}))
	rig := &requestRig{t: t, p: p, cmds: countCommands(rdb)}
	next := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rig.handled.Add(1)
		w.WriteHeader(http.StatusNoContent)
	})
	rig.handler = p.Middleware(func(r *http.Request) (any, bool) {
		id, err := strconv.Atoi(r.Header.Get("X-User"))
		return id, err == nil
	})(next)
	return rig
}

// phase sends n requests for n new users. It returns their latencies and,
// if the breaker opened during the phase, after how many requests
// (0 if it did not) and the commands sent from then on.
func (r *requestRig) phase(n int) (lat []time.Duration, openedAfter int, sentWhileOpen int64) {
	r.t.Helper()
	before := r.handled.Load()
	var sentAtOpen int64
	for i := range n {
		r.next++
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.Header.Set("X-User", strconv.Itoa(r.next))
		rec := httptest.NewRecorder()
		start := time.Now()
		r.handler.ServeHTTP(rec, req)
		lat = append(lat, time.Since(start))
		if rec.Code != http.StatusNoContent {
			r.t.Fatalf("request %d: status %d, want 204", r.next, rec.Code)
		}
		if openedAfter == 0 && buf(r.p).Breaker() == gobreaker.StateOpen {
			openedAfter, sentAtOpen = i+1, r.cmds.sent.Load()
		}
	}
	equal(r.t, "requests that reached the handler", r.handled.Load()-before, int64(n))
	if openedAfter > 0 {
		sentWhileOpen = r.cmds.sent.Load() - sentAtOpen
	}
	return lat, openedAfter, sentWhileOpen
}

// checkBudget logs the phase's latencies and fails only on a hang: a
// request that took hangLimit or more did not honour its budget at all.
func (r *requestRig) checkBudget(what string, lat []time.Duration) {
	r.t.Helper()
	p50, p99, worst := percentile(lat, 0.50), percentile(lat, 0.99), percentile(lat, 1)
	r.t.Logf("%s: %d requests, p50 %v, p99 %v, max %v", what, len(lat), p50, p99, worst)
	if worst >= hangLimit {
		r.t.Errorf("%s: a request took %v, want under %v (budget %v): the budget was not honoured", what, worst, hangLimit, requestBudget)
	}
}

// outage runs a phase during an outage: every touch fails (RedisErrors and
// Backlogged grow by n), the breaker opens after exactly 5 requests and no
// command reaches Redis while it is open.
func (r *requestRig) outage(what string) {
	r.t.Helper()
	s0 := r.p.Stats()
	lat, openedAfter, sentWhileOpen := r.phase(requestsPerPhase)
	r.checkBudget(what, lat)
	s := r.p.Stats()
	equal(r.t, what+": redis errors", s.RedisErrors-s0.RedisErrors, int64(requestsPerPhase))
	equal(r.t, what+": backlogged", s.Backlogged-s0.Backlogged, int64(requestsPerPhase))
	equal(r.t, what+": recorded", s.Recorded-s0.Recorded, 0)
	equal(r.t, what+": breaker opened after", openedAfter, 5)
	equal(r.t, what+": commands sent while open", sentWhileOpen, int64(0))
	equal(r.t, what+": breaker state at the end", buf(r.p).Breaker(), gobreaker.StateOpen)
	// While open, a touch returns gobreaker's error at once, without I/O.
	_, err := r.p.Touch(context.Background(), 999_999)
	if !errors.Is(err, gobreaker.ErrOpenState) {
		r.t.Errorf("%s: touch while open: %v, want gobreaker.ErrOpenState", what, err)
	}
}

// recovered waits out the cooldown (measured from a moment after the
// breaker opened, so the breaker must be half-open then), sends one probe
// request, which leaves it half-open (64 successes in a row close it), then
// a healthy phase, after which it is closed.
func (r *requestRig) recovered(what string) {
	r.t.Helper()
	time.Sleep(breakerCooldown) // the breaker opened before this line: it is due to half-open now
	equal(r.t, what+": breaker after the cooldown", buf(r.p).Breaker(), gobreaker.StateHalfOpen)
	s0 := r.p.Stats()
	lat, _, _ := r.phase(1)
	equal(r.t, what+": breaker after the probe", buf(r.p).Breaker(), gobreaker.StateHalfOpen)
	lat2, openedAfter, _ := r.phase(requestsPerPhase - 1)
	equal(r.t, what+": breaker after the healthy phase", buf(r.p).Breaker(), gobreaker.StateClosed)
	r.checkBudget(what, append(lat, lat2...))
	s := r.p.Stats()
	equal(r.t, what+": recorded", s.Recorded-s0.Recorded, int64(requestsPerPhase))
	equal(r.t, what+": redis errors", s.RedisErrors-s0.RedisErrors, 0)
	equal(r.t, what+": breaker opened", openedAfter, 0)
}

// TestRedisOutageRequestPath: with Redis killed, slow or dropping traffic,
// a request through the Middleware never fails and never hangs past its
// budget; the breaker opens after 5 failures, makes touches return at once
// without I/O, and closes after the cooldown once Redis answers again.
func TestRedisOutageRequestPath(t *testing.T) {
	rs := startPrivateRedis(t)

	t.Run("killed", func(t *testing.T) {
		r := newRequestRig(t, newPrivateClient(t, rs.Addr()))
		lat, _, _ := r.phase(requestsPerPhase)
		r.checkBudget("healthy", lat)
		equal(t, "healthy: recorded", r.p.Stats().Recorded, int64(requestsPerPhase))

		rs.kill()
		r.outage("killed")
		rs.restart()
		r.recovered("restarted")
	})

	t.Run("slow and dropping", func(t *testing.T) {
		px := startFaultProxy(t, rs.Addr())
		r := newRequestRig(t, newPrivateClient(t, px.Addr()))
		lat, _, _ := r.phase(requestsPerPhase)
		r.checkBudget("through the proxy", lat)

		px.SetDelay(10 * requestBudget) // far past the budget, each way
		r.outage("delayed 10s")
		must(t, px.Restore())
		r.recovered("delay over")

		px.SetDrop(true)
		r.outage("dropping")
		must(t, px.Restore())
		r.recovered("drop over")
	})
}

// TestRedisDownFromTheStart: with Redis unreachable before db.Use, the
// buffer's manifest cannot be read, yet the flush writes this process's
// backlog straight to the table, and Close's final flush writes what came
// after: nothing is dropped. A manifest that disagrees still stops the
// flush (TestManifestCheckedByFirstFlush).
func TestRedisDownFromTheStart(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			rs := startPrivateRedis(t)
			px := startFaultProxy(t, rs.Addr())
			px.Down()
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			h := newHarness(t, d, clientKind(rdb))
			ctx := context.Background()
			cfg := h.config()
			cfg.Buffer.TouchTimeout = requestBudget
			p, db := h.plugin(cfg)
			want := seedFaultUsers(t, db, 4)
			for id := 1; id <= 3; id++ {
				ok, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
				equal(t, fmt.Sprint("touch ", id, " kept in the backlog"), ok == false && errors.Is(err, lastseen.ErrBuffered), true)
				want[id] = "2026-03-01T10:00:00Z"
			}
			res, err := p.Flush(ctx)
			if err == nil {
				t.Fatal("flush with Redis down from the start returned no error")
			}
			equal(t, "written from the backlog", res.Written, 3)
			equal(t, "backlog after the flush", p.Stats().Backlog, 0)
			checkFaultColumns(t, db, "after the flush", want)

			_, err = p.TouchAt(ctx, 4, mustTime("2026-03-01T10:01:00Z"))
			equal(t, "touch 4 kept in the backlog", errors.Is(err, lastseen.ErrBuffered), true)
			want[4] = "2026-03-01T10:01:00Z"
			_ = p.Close(ctx) // its final flush reports Redis unreachable
			checkFaultColumns(t, db, "after Close", want)
			equal(t, "backlog dropped", p.Stats().BacklogDropped, 0)
		})
	}
}

// ------------------------------------- 2. touches kept while Redis is down --

// TestBacklogReplayedAfterOutage: touches made while
// Redis is unreachable are kept in the bounded backlog (newest per user, at
// most BacklogSize users, the rest counted in BacklogDropped), and the first
// flush after Redis is back writes them: exact values in the database.
func TestBacklogReplayedAfterOutage(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			rs := startPrivateRedis(t)
			px := startFaultProxy(t, rs.Addr())
			// go-redis retries a failed command 3 times and a failed dial 5
			// times, 100ms apart; a flush during the outage pays that per
			// shard until the client's own dial breaker opens. Fewer
			// retries keep this test short without changing what happens.
			rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
			t.Cleanup(func() { rdb.Close() })
			h := newHarness(t, d, clientKind(rdb))
			ctx := context.Background()
			cfg := h.config()
			cfg.Buffer.TouchTimeout = requestBudget
			testenv.Seam(&cfg).BacklogSize = 50
			cfg.Throttle = time.Minute
			p, db := h.plugin(cfg)
			want := seedFaultUsers(t, db, 60)

			// Before the outage: users 1-5 recorded in Redis, not flushed;
			// then their throttle window passes.
			touchFaultUsers(t, p, 5, "2026-03-01T09:40:00Z", want)
			h.expireThrottle(time.Minute)

			px.Down() // Redis unreachable: refused, open connections reset
			outage := func(id int, at string) {
				t.Helper()
				ok, err := p.TouchAt(ctx, id, mustTime(at))
				if err == nil || ok {
					t.Fatalf("touch %d during the outage: recorded=%v err=%v, want an error", id, ok, err)
				}
				if !strings.HasPrefix(err.Error(), "lastseen: touch user "+strconv.Itoa(id)+": ") {
					t.Fatalf("touch error %q does not name the user", err)
				}
			}
			for id := 1; id <= 60; id++ { // 51-60 find the backlog full
				outage(id, "2026-03-01T10:00:00Z")
				if id <= 50 {
					want[id] = "2026-03-01T10:00:00Z"
				}
			}
			for id := 1; id <= 10; id++ { // newer: replaces the backlog entry
				outage(id, "2026-03-01T10:05:00Z")
				want[id] = "2026-03-01T10:05:00Z"
			}
			for id := 11; id <= 20; id++ { // older: the backlog keeps the newer
				outage(id, "2026-03-01T09:55:00Z")
			}
			s := p.Stats()
			equal(t, "redis errors", s.RedisErrors, 80)
			equal(t, "backlogged", s.Backlogged, 70)
			equal(t, "backlog dropped", s.BacklogDropped, 10)
			equal(t, "backlog", s.Backlog, 50)
			at, ok := buf(p).Backlog("7")
			equal(t, "backlog user 7", ok && at == mustTime("2026-03-01T10:05:00Z").UnixMicro(), true)
			at, ok = buf(p).Backlog("15")
			equal(t, "backlog user 15", ok && at == mustTime("2026-03-01T10:00:00Z").UnixMicro(), true)

			// A flush while Redis is still down fails (Redis is unreachable)
			// but writes the backlog straight to the table: presence reaches
			// the database, and survives Close, while Redis is down.
			res, err := p.Flush(ctx)
			if err == nil {
				t.Fatal("flush with Redis down returned no error")
			}
			equal(t, "written from the backlog during the outage", res.Written, 50)
			equal(t, "backlog after the flush during the outage", p.Stats().Backlog, 0)
			checkFaultColumns(t, db, "during the outage", want)

			must(t, px.Restore())
			waitForRedis(t, rdb)
			start := time.Now()
			res, err = p.Flush(ctx)
			must(t, err)
			t.Logf("first flush after the outage: %v", time.Since(start))
			// Users 1-5, recorded in Redis before the outage: older than
			// what the backlog wrote.
			equal(t, "drained", res.Drained, 5)
			equal(t, "written", res.Written, 0)
			equal(t, "stale", res.Stale, 5)
			equal(t, "backlog after the flush", p.Stats().Backlog, 0)
			checkFaultColumns(t, db, "after the outage", want)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)
		})
	}
}

// -------------------------------------------- 3. database fails in a flush --

// proxiedDB opens a handle to the harness's own database (schema or
// database) through a fault proxy in front of its server. PostgreSQL and
// MySQL only.
func proxiedDB(t *testing.T, h *harness) (*gorm.DB, *faultproxy.Proxy) {
	t.Helper()
	var d gorm.Dialector
	var px *faultproxy.Proxy
	switch h.dialect {
	case "postgres":
		dsn := os.Getenv(testenv.EnvPostgres)
		pc, err := pgx.ParseConfig(dsn)
		must(t, err)
		var schema string
		must(t, h.db.Raw("SELECT current_schema()").Scan(&schema).Error)
		px = startFaultProxy(t, net.JoinHostPort(pc.Host, strconv.Itoa(int(pc.Port))))
		host, port, _ := net.SplitHostPort(px.Addr())
		d = postgres.Open(dsn + " search_path=" + schema + " host=" + host + " port=" + port) // later keys win
	case "mysql":
		mc, err := gomysql.ParseDSN(os.Getenv(testenv.EnvMySQL))
		must(t, err)
		must(t, h.db.Raw("SELECT DATABASE()").Scan(&mc.DBName).Error)
		px = startFaultProxy(t, mc.Addr)
		mc.Addr = px.Addr()
		d = mysql.Open(mc.FormatDSN())
	default:
		t.Fatalf("no proxy for %s", h.dialect)
	}
	db, err := gorm.Open(d, quietGorm())
	must(t, err)
	t.Cleanup(func() { testenv.CloseDB(db) })
	return db, px
}

// faultFlushConfig flushes one shard in batches of 3, so that ten users
// make four batches in a known order of events.
func faultFlushConfig(h *harness) lastseen.Config {
	cfg := h.config()
	cfg.Buffer.Shards = 1
	cfg.Flush.BatchSize = 3
	cfg.Throttle = time.Minute
	return cfg
}

// usePlugin registers a plugin on db (a handle the test prepared) and
// closes it at cleanup.
func usePlugin(t *testing.T, db *gorm.DB, cfg lastseen.Config) *lastseen.Plugin {
	t.Helper()
	p := lastseen.New(cfg)
	must(t, db.Use(p))
	t.Cleanup(func() { p.Close(context.Background()) })
	return p
}

// committedAndKept splits users 1..n after a failed flush into those whose
// column has the touched value (committed) and the rest, and checks that
// each of the rest still has its exact timestamp in Redis: nothing left
// Redis before its commit.
func committedAndKept(t *testing.T, p *lastseen.Plugin, db *gorm.DB, before, touched map[int]string) (committed int) {
	t.Helper()
	for id := 1; id <= len(touched); id++ {
		switch col := lastSeenColumn(t, db, "users", "id", "last_seen_at", id); col {
		case touched[id]:
			committed++
		case before[id]:
			equal(t, fmt.Sprintf("user %d kept in Redis", id), pendingValue(t, p, id), touched[id])
		default:
			t.Errorf("user %d: column %q is neither the old %q nor the touched %q", id, col, before[id], touched[id])
		}
	}
	return committed
}

// TestDatabaseStoppedDuringFlush: a database failure during a flush, with the server
// gone: a proxy in front of PostgreSQL or MariaDB refuses and cuts every
// connection after the flush's first batch committed. The rest stays in
// Redis; a flush while the server is down changes nothing; newer and older
// touches arrive; the first flush after the server is back writes the
// newest timestamp of every user.
func TestDatabaseStoppedDuringFlush(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db, px := proxiedDB(t, h)
			before := seedFaultUsers(t, h.db, 10)
			p := usePlugin(t, db, faultFlushConfig(h))
			touched := map[int]string{}
			touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", touched)

			setHooks(p, &flushHooks{AfterCommit: func(_, batch int) {
				if batch == 1 {
					px.Down()
				}
			}})
			res, err := p.Flush(ctx)
			if err == nil {
				t.Fatal("flush with the database stopped returned no error")
			}
			setHooks(p, nil)
			equal(t, "written before the stop", res.Written, 3)
			equal(t, "batches before the stop", res.Batches, 1)
			equal(t, "committed", committedAndKept(t, p, h.db, before, touched), 3)
			equal(t, "redis keys", strings.Join(h.pendingKeys(), " "), ":{0}:inflight")

			_, err = p.Flush(ctx)
			if err == nil {
				t.Fatal("second flush with the database stopped returned no error")
			}
			equal(t, "committed after a second failed flush", committedAndKept(t, p, h.db, before, touched), 3)

			// Meanwhile users come back: 1-4 newer, 5-6 with an older
			// (delayed) request; the newest must win.
			h.expireThrottle(time.Minute)
			want := map[int]string{}
			for id, at := range touched {
				want[id] = at
			}
			for id := 1; id <= 6; id++ {
				at := mustTime("2026-03-01T10:20:00Z")
				if id > 4 {
					at = mustTime("2026-03-01T09:59:00Z")
				} else {
					want[id] = at.Format(time.RFC3339)
				}
				ok, err := p.TouchAt(ctx, id, at)
				must(t, err)
				equal(t, fmt.Sprintf("touch %d recorded", id), ok, true)
			}

			must(t, px.Restore())
			res, err = p.Flush(ctx)
			must(t, err)
			equal(t, "drained after recovery", res.Drained, 7+6) // in-flight rest, then the new pending hash
			checkFaultColumns(t, h.db, "after recovery", want)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)
		})
	}
}

// TestAckErrorInFlightIsReported: the acknowledgement of batch 1 runs
// while batch 2's statement does, and both fail: another flusher took the
// shard lock and the database went away right after batch 1 committed. The
// flush returns both errors (the lock lost, and the database's), counts
// batch 1 written and nothing drained, and keeps every entry in flight;
// once the lock is free and the database back, the next flush drains all
// 10, rewriting batch 1 as no-ops.
func TestAckErrorInFlightIsReported(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db, px := proxiedDB(t, h)
			before := seedFaultUsers(t, h.db, 10)
			p := usePlugin(t, db, faultFlushConfig(h))
			touched := map[int]string{}
			touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", touched)
			lockKey := shardKeys(p, 0).Lock
			setHooks(p, &flushHooks{AfterCommit: func(_, batch int) {
				if batch == 1 { // before batch 1's acknowledgement starts
					must(t, h.r.Client.Set(ctx, lockKey, "another flusher", time.Minute).Err())
					px.Down()
				}
			}})
			res, err := p.Flush(ctx)
			setHooks(p, nil)
			if !isLockLost(err) {
				t.Fatalf("flush error %v, want one wrapping buffer.ErrLockLost", err)
			}
			if !strings.Contains(err.Error(), "ack: ") || strings.Count(err.Error(), "\n") < 1 {
				t.Errorf("flush error %q, want the acknowledgement's error joined with the statement's", err)
			}
			equal(t, "written", res.Written, 3)
			equal(t, "batches", res.Batches, 1)
			equal(t, "drained", res.Drained, 0)
			equal(t, "committed", committedAndKept(t, p, h.db, before, touched), 3)
			equal(t, "redis keys", strings.Join(h.pendingKeys(), " "), ":{0}:inflight")

			must(t, px.Restore())
			must(t, h.r.Client.Del(ctx, lockKey).Err()) // the other flusher is done
			res, err = p.Flush(ctx)
			must(t, err)
			equal(t, "drained by the next flush", res.Drained, 10)
			equal(t, "written by the next flush", res.Written, 7)
			equal(t, "rewritten as no-ops", res.Stale, 3)
			checkFaultColumns(t, h.db, "after recovery", touched)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)
		})
	}
}

// singleConnection limits db to one connection, so that a session setting
// or a backend id applies to every statement of the plugin.
func singleConnection(t *testing.T, db *gorm.DB) {
	t.Helper()
	sqlDB, err := db.DB()
	must(t, err)
	sqlDB.SetMaxOpenConns(1)
	sqlDB.SetMaxIdleConns(1)
}

// TestDatabaseConnectionKilledDuringFlush: a database failure during a flush, with the
// plugin's database connection killed between two batches
// (pg_terminate_backend, MySQL KILL) before its last batch, of one entry:
// the flush goes on over a new connection and writes every timestamp, with
// no entry reported as refused.
func TestDatabaseConnectionKilledDuringFlush(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db := h.openDB()
			singleConnection(t, db)
			want := seedFaultUsers(t, h.db, 10)
			p := usePlugin(t, db, faultFlushConfig(h))
			touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", want)
			var failed atomic.Int64 // statements of the plugin's handle that failed
			must(t, db.Callback().Raw().After("gorm:raw").Register("test:count_failed", func(tx *gorm.DB) {
				if tx.Error != nil {
					failed.Add(1)
				}
			}))

			idQuery, kill, alive := "SELECT pg_backend_pid()", "SELECT pg_terminate_backend(?, 10000)", // waits for the end
				"SELECT count(*) FROM pg_stat_activity WHERE pid = ?"
			if h.dialect == "mysql" {
				idQuery, kill, alive = "SELECT CONNECTION_ID()", "KILL ?",
					"SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = ?"
			}
			var killed []int64
			setHooks(p, &flushHooks{AfterCommit: func(_, batch int) {
				if batch != 3 { // the last batch, of one entry, meets the killed connection
					return
				}
				var id int64
				must(t, db.Raw(idQuery).Scan(&id).Error) // the plugin's one connection
				must(t, h.db.Exec(kill, id).Error)
				deadline := time.Now().Add(10 * time.Second)
				for n := int64(1); n > 0; { // the server ends the backend asynchronously
					must(t, h.db.Raw(alive, id).Scan(&n).Error)
					if time.Now().After(deadline) {
						t.Fatalf("connection %d still alive 10s after the kill", id)
					}
				}
				killed = append(killed, id)
			}})
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "connections killed", len(killed), 1)
			// PostgreSQL: the last batch meets the dead connection (pgx pings
			// only after 1s idle), fails once and is tried again whole.
			// MySQL: the driver sees the closed socket before it sends and
			// database/sql retries on a new connection by itself.
			equal(t, "statements that failed", failed.Load(), map[string]int64{"postgres": 1, "mysql": 0}[h.dialect])
			equal(t, "drained", res.Drained, 10)
			equal(t, "written", res.Written, 10)
			equal(t, "failed", res.Failed, 0)
			checkFaultColumns(t, h.db, "after the kill", want)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)
			var now int64
			must(t, db.Raw(idQuery).Scan(&now).Error)
			if now == killed[0] {
				t.Fatalf("the plugin still uses connection %d", now)
			}
		})
	}
}

// TestDatabaseStatementTimeoutDuringFlush: a database failure during a flush, with a
// statement timeout: another transaction holds user 5's row, the plugin's
// session has a 250ms statement timeout (PostgreSQL statement_timeout,
// MariaDB max_statement_time). The batch holding user 5 is split until user
// 5 stands alone; the other nine are written, user 5 goes back to pending
// and is reported (Failed, ErrRefused); once the lock is gone the next flush
// writes it.
func TestDatabaseStatementTimeoutDuringFlush(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db := h.openDB()
			singleConnection(t, db)
			setTimeout, timeoutText := "SET statement_timeout = 250", "canceling statement due to statement timeout"
			if h.dialect == "mysql" {
				setTimeout, timeoutText = "SET SESSION max_statement_time = 0.25", "max_statement_time exceeded"
			}
			must(t, db.Exec(setTimeout).Error)
			before := seedFaultUsers(t, h.db, 10)
			p := usePlugin(t, db, faultFlushConfig(h))
			want := map[int]string{}
			touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", want)

			locker := h.db.Begin()
			must(t, locker.Error)
			var locked []int
			must(t, locker.Raw("SELECT id FROM users WHERE id = ? FOR UPDATE", 5).Scan(&locked).Error)
			res, err := p.Flush(ctx)
			must(t, locker.Rollback().Error)
			if !errors.Is(err, lastseen.ErrRefused) || !strings.Contains(err.Error(), timeoutText) {
				t.Fatalf("flush with a locked row: %v, want ErrRefused with %q", err, timeoutText)
			}
			equal(t, "error text", strings.SplitN(err.Error(), " back in pending", 2)[0],
				"lastseen: flush shard 0: lastseen: database refused entries: 1 entries,")
			equal(t, "written", res.Written, 9)
			equal(t, "failed", res.Failed, 1)
			equal(t, "drained", res.Drained, 10)
			expect := map[int]string{}
			for id, at := range want {
				expect[id] = at
			}
			expect[5] = before[5]
			checkFaultColumns(t, h.db, "with user 5 locked", expect)
			equal(t, "user 5 back in pending", pendingValue(t, p, 5), want[5])
			equal(t, "redis keys", strings.Join(h.pendingKeys(), " "), ":{0}:pending")

			res, err = p.Flush(ctx)
			must(t, err)
			equal(t, "written after the lock", res.Written, 1)
			checkFaultColumns(t, h.db, "after the lock", want)
			equal(t, "redis buffers left", len(h.pendingKeys()), 0)
		})
	}
}

// refuseUser makes the users table refuse any non-NULL last_seen_at for
// user id: a CHECK constraint on PostgreSQL, a trigger on MariaDB (which
// refuses CHECK constraints on an AUTO_INCREMENT column) and SQLite. allow
// drops it again.
func refuseUser(t testing.TB, db *gorm.DB, dialect string, id int) (allow func()) {
	t.Helper()
	name := fmt.Sprintf("refuse_%d", id)
	switch dialect {
	case "sqlite":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER %s BEFORE UPDATE ON users
WHEN NEW.id = %d AND NEW.last_seen_at IS NOT NULL BEGIN SELECT RAISE(ABORT, 'user %d refused'); END`, name, id, id)).Error)
	case "mysql":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER %s BEFORE UPDATE ON users FOR EACH ROW
IF NEW.id = %d AND NEW.last_seen_at IS NOT NULL THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'user %d refused'; END IF`, name, id, id)).Error)
	default:
		must(t, db.Exec(fmt.Sprintf("ALTER TABLE users ADD CONSTRAINT %s CHECK (id <> %d OR last_seen_at IS NULL)", name, id)).Error)
	}
	return func() {
		t.Helper()
		if dialect == "postgres" {
			must(t, db.Exec("ALTER TABLE users DROP CONSTRAINT "+name).Error)
		} else {
			must(t, db.Exec("DROP TRIGGER "+name).Error)
		}
	}
}

// TestDatabaseRefusesOneRow: a database failure during a flush, with a constraint that
// refuses one row (a CHECK constraint on PostgreSQL, a trigger on MariaDB
// and SQLite): the row is isolated and reported while the rest of its batch
// is written; it keeps being refused, without blocking anyone else, until
// the constraint is gone; then the next flush writes it.
func TestDatabaseRefusesOneRow(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		before := seedFaultUsers(t, h.db, 10)
		allow := refuseUser(t, h.db, h.dialect, 7)
		p, _ := h.plugin(faultFlushConfig(h))
		want := map[int]string{}
		touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", want)

		res, err := p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) {
			t.Fatalf("flush with a refused row: %v, want ErrRefused", err)
		}
		equal(t, "error text", strings.SplitN(err.Error(), " back in pending", 2)[0],
			"lastseen: flush shard 0: lastseen: database refused entries: 1 entries,")
		equal(t, "written", res.Written, 9)
		equal(t, "failed", res.Failed, 1)
		equal(t, "drained", res.Drained, 10)
		equal(t, "stats failed", p.Stats().Failed, 1)
		equal(t, "stats last flush (the flush failed)", p.Stats().LastFlush, time.Time{})
		expect := map[int]string{}
		for id, at := range want {
			expect[id] = at
		}
		expect[7] = before[7]
		checkFaultColumns(t, h.db, "with the constraint", expect)
		equal(t, "user 7 back in pending", pendingValue(t, p, 7), want[7])

		// Still refused: it does not hold up the others' new touches.
		h.expireThrottle(time.Minute)
		for _, id := range []int{3, 7, 8} {
			at := mustTime("2026-03-01T10:10:00Z").Add(time.Duration(id) * time.Second)
			ok, err := p.TouchAt(ctx, id, at)
			must(t, err)
			equal(t, "recorded", ok, true)
			want[id] = at.Format(time.RFC3339)
		}
		res, err = p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrRefused) {
			t.Fatalf("second flush: %v, want ErrRefused", err)
		}
		equal(t, "second flush written", res.Written, 2)
		equal(t, "second flush failed", res.Failed, 1)
		equal(t, "user 3", lastSeenColumn(t, h.db, "users", "id", "last_seen_at", 3), want[3])
		equal(t, "user 8", lastSeenColumn(t, h.db, "users", "id", "last_seen_at", 8), want[8])
		equal(t, "user 7 newest in pending", pendingValue(t, p, 7), want[7])

		allow()
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after the fix", res.Written, 1)
		checkFaultColumns(t, h.db, "after the fix", want)
		equal(t, "redis buffers left", len(h.pendingKeys()), 0)
	})
}

// ------------------------------------------- 5. Redis restart and failover --

// TestRedisScriptCacheFlushed: Redis failures, part one: after
// SCRIPT FLUSH (what a restart or a failover to a replica leaves) every
// script gets NOSCRIPT once and go-redis falls back to EVAL (a pipeline
// loads the script and runs again); no error reaches the caller of Touch
// or Flush. A touch runs no script.
func TestRedisScriptCacheFlushed(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	cfg := faultFlushConfig(h)
	cfg.Buffer.TouchTimeout = requestBudget
	p, db := h.plugin(cfg)
	want := seedFaultUsers(t, db, 4)
	touchFaultUsers(t, p, 2, "2026-03-01T10:00:00Z", want)
	_, err := p.Flush(ctx) // loads the flush scripts
	must(t, err)

	cmds := countCommands(rdb)
	must(t, rdb.ScriptFlush(ctx).Err())
	ok, err := p.TouchAt(ctx, 3, mustTime("2026-03-01T10:00:03Z"))
	must(t, err)
	equal(t, "recorded after SCRIPT FLUSH", ok, true)
	want[3] = "2026-03-01T10:00:03Z"
	equal(t, "NOSCRIPT replies to the touch", cmds.noscript.Load(), int64(0))
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written", res.Written, 1)
	// The active script (pipelined), redislock's obtain and release
	// scripts, and the swap and ack scripts.
	equal(t, "NOSCRIPT replies to the flush", cmds.noscript.Load(), int64(5))
	checkFaultColumns(t, db, "after SCRIPT FLUSH", want)
	equal(t, "redis errors", p.Stats().RedisErrors, 0)
}

// TestRedisLostItsData: Redis failures, part two: a Redis that lost
// its data (killed and restarted empty, or FLUSHALL in the middle of a
// flush) loses only the presence not yet flushed; the database keeps every
// committed value and never moves backwards, and the plugin goes on.
func TestRedisLostItsData(t *testing.T) {
	rs := startPrivateRedis(t)
	rdb := newPrivateClient(t, rs.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	ctx := context.Background()
	cfg := faultFlushConfig(h)
	cfg.Buffer.TouchTimeout = requestBudget
	cfg.Flush.BatchSize = 2
	h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
	p, db := h.plugin(cfg)
	want := seedFaultUsers(t, db, 8)
	touchFaultUsers(t, p, 8, "2026-03-01T10:00:00Z", want)
	_, err := p.Flush(ctx)
	must(t, err)
	checkFaultColumns(t, db, "flushed", want)

	// Restart: touches of users 1-4 not flushed yet are lost with the data.
	h.expireThrottle(time.Minute)
	touchFaultUsers(t, p, 4, "2026-03-01T10:10:00Z", map[int]string{})
	rs.kill()
	rs.restart()
	h.expireThrottle(time.Minute) // the local cache's windows pass too
	ok, err := p.TouchAt(ctx, 5, mustTime("2026-03-01T10:20:00Z"))
	want[5] = "2026-03-01T10:20:00Z"
	if err != nil { // only the first command on a dead connection may miss the budget
		equal(t, "backlogged", p.Stats().Backlogged, 1)
	} else {
		equal(t, "recorded after the restart", ok, true)
	}
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written after the restart", res.Written, 1)
	checkFaultColumns(t, db, "after the restart", want) // 1-4 keep their flushed value

	// FLUSHALL while a flush is between batches: the first batch is
	// committed and acknowledged, then the in-flight hashes and the lock
	// are gone. What else is written depends on a race the test does not
	// control: a page is a pipeline of HSCAN over about BatchSize entries'
	// worth of buckets, and the next page is fetched while the current
	// batch is written, so the entries read before the FLUSHALL (2 to 6)
	// are written, those not yet read are lost. Whatever the race, the
	// next acknowledgement (of a batch, or the final one) finds the lock
	// gone and the flush reports it; the database holds exactly the
	// entries the flush counts as written (the first batch at least) and
	// every other user keeps its flushed value.
	h.expireThrottle(time.Minute)
	touched := map[int]string{}
	touchFaultUsers(t, p, 6, "2026-03-01T10:30:00Z", touched)
	setHooks(p, &flushHooks{AfterAck: func(_, batch int) {
		if batch == 1 {
			must(t, rdb.FlushAll(ctx).Err()) // the private instance only
		}
	}})
	res, err = p.Flush(ctx)
	setHooks(p, nil)
	if !isLockLost(err) {
		t.Fatalf("flush across FLUSHALL: %v, want buffer.ErrLockLost", err)
	}
	if res.Written < cfg.Flush.BatchSize || res.Written > 6 {
		t.Errorf("written across FLUSHALL = %d, want the first batch (%d) up to all 6", res.Written, cfg.Flush.BatchSize)
	}
	committed := 0
	for id := 1; id <= 6; id++ {
		switch col := lastSeenColumn(t, db, "users", "id", "last_seen_at", id); col {
		case touched[id]:
			committed++
			want[id] = col
		case want[id]: // lost with Redis's data: the flushed value stays
		default:
			t.Errorf("user %d: column %q, want %q or %q", id, col, want[id], touched[id])
		}
	}
	equal(t, "committed across FLUSHALL", committed, res.Written)
	res, err = p.Flush(ctx)
	must(t, err)
	equal(t, "drained after FLUSHALL", res.Drained, 0)
	checkFaultColumns(t, db, "after FLUSHALL", want)

	// And the plugin goes on: a new window records and flushes normally.
	h.expireThrottle(time.Minute)
	touchFaultUsers(t, p, 8, "2026-03-01T10:40:00Z", want)
	_, err = p.Flush(ctx)
	must(t, err)
	checkFaultColumns(t, db, "afterwards", want)
}
