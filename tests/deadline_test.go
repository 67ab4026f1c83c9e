package tests

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// Every public call returns by its context's deadline even when Redis
// accepts connections and never answers (a black hole).

// hangMargin is what a call may take past its deadline before the test
// calls it a hang: far above any scheduling delay, below go-redis's own
// 5s read timeout, which an unbounded call waits out.
const hangMargin = 2200 * time.Millisecond

// blackholeClients are the client kinds the black hole is tried with; open
// connects one through the proxy at addr.
var blackholeClients = []struct {
	name string
	open func(addr string) redis.UniversalClient
}{
	// The go-redis default: the plugin opens its own client from a copy of
	// these options, with ContextTimeoutEnabled.
	{"default client", func(addr string) redis.UniversalClient { return redis.NewClient(&redis.Options{Addr: addr}) }},
	// Used as it is: the sockets honour the deadline.
	{"ContextTimeoutEnabled", func(addr string) redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	}},
	// Used as it is, each call on a goroutine the caller stops waiting for.
	{"ring", func(addr string) redis.UniversalClient {
		return redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": addr}})
	}},
}

// logLine returns the first log line containing msg, or "".
func logLine(logs *testenv.Logs, msg string) string {
	for _, l := range strings.Split(logs.String(), "\n") {
		if strings.Contains(l, msg) {
			return l
		}
	}
	return ""
}

// TestEveryCallBoundedDuringBlackhole: with Redis behind a proxy that drops
// every byte (connections accepted, nothing ever answered), each public
// method returns an error wrapping context.DeadlineExceeded by its deadline
// (LastSeen answers from the column instead), for each kind of client.
// Durations are logged, not asserted; a call that takes hangMargin past its
// deadline fails: it waited for go-redis's own timeout.
func TestEveryCallBoundedDuringBlackhole(t *testing.T) {
	rs := startPrivateRedis(t)
	for _, kind := range blackholeClients {
		t.Run(kind.name, func(t *testing.T) {
			px := startFaultProxy(t, rs.Addr())
			rdb := kind.open(px.Addr())
			t.Cleanup(func() { rdb.Close() })
			h := newHarness(t, testenv.SQLite(), clientKind(rdb))
			t.Cleanup(func() { px.Restore() }) // before the harness deletes its keys
			var logs testenv.Logs
			cfg := h.config()
			cfg.Logger = testenv.TextLogger(&logs)
			cfg.Buffer.TouchTimeout = 100 * time.Millisecond
			cfg.Flush.Schedule, cfg.Sessions.Schedule = "", ""                   // the scheduler on
			cfg.Flush.Schedule, cfg.Sessions.Schedule = "@every 1h", "@every 1h" // run by hand below
			cfg.Flush.Timeout, testenv.Seam(&cfg).PurgeTimeout = 300*time.Millisecond, 300*time.Millisecond
			p, db := h.plugin(cfg)
			must(t, db.AutoMigrate(&lastseen.Session{}))
			want := seedFaultUsers(t, db, 5)
			buf(p).SetTouchTimeout(time.Second) // the first touch loads the script
			touchFaultUsers(t, p, 3, "2026-03-01T09:10:00Z", map[int]string{})
			buf(p).SetTouchTimeout(cfg.Buffer.TouchTimeout)
			must(t, db.Create(&lastseen.Session{ID: "s1", UserID: 1, ExpiresAt: mustTime("2026-03-01T08:00:00Z")}).Error)

			px.SetDrop(true)
			bounded := func(what string, deadline time.Duration, call func(ctx context.Context) error) error {
				t.Helper()
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				start := time.Now()
				err := call(ctx)
				took := time.Since(start)
				t.Logf("%s (deadline %v): %v, err: %v", what, deadline, took.Round(time.Millisecond), err)
				if took >= deadline+hangMargin {
					t.Errorf("%s took %v with a deadline of %v: not bounded", what, took, deadline)
				}
				return err
			}
			deadlineErr := func(what string, err error) {
				t.Helper()
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s: %v, want an error wrapping context.DeadlineExceeded", what, err)
				}
			}
			// Touch: TouchTimeout bounds it; the caller's context has no deadline.
			err := bounded("Touch", cfg.Buffer.TouchTimeout, func(context.Context) error {
				_, err := p.Touch(context.Background(), 4)
				return err
			})
			deadlineErr("Touch", err)
			equal(t, "touch kept in the backlog", p.Stats().Backlog, 1)
			deadlineErr("Pending", bounded("Pending", 300*time.Millisecond, func(ctx context.Context) error {
				_, _, err := p.Pending(ctx, 1)
				return err
			}))
			// LastSeen: 5×TouchTimeout for Redis, then the column.
			var at time.Time
			must(t, bounded("LastSeen", 5*cfg.Buffer.TouchTimeout, func(context.Context) (err error) {
				at, _, err = p.LastSeen(context.Background(), 2)
				return err
			}))
			equal(t, "LastSeen from the column", at.Format(time.RFC3339), want[2])
			deadlineErr("Status", bounded("Status", 300*time.Millisecond, func(ctx context.Context) error {
				_, err := p.Status(ctx)
				return err
			}))
			deadlineErr("Flush", bounded("Flush", 2*time.Second, func(ctx context.Context) error {
				_, err := p.Flush(ctx)
				return err
			}))
			deadlineErr("PurgeExpiredSessions", bounded("PurgeExpiredSessions", 300*time.Millisecond, func(ctx context.Context) error {
				_, err := p.PurgeExpiredSessions(ctx)
				return err
			}))
			bounded("scheduled flush", cfg.Flush.Timeout, func(context.Context) error {
				internals(p).Scheduler.Entry(1).Job.Run() // the flush, added first
				return nil
			})
			equal(t, "scheduled flush failures logged", logs.Count(`msg="lastseen: flush failed"`), 1)
			equal(t, "the scheduled flush ended by its deadline",
				strings.Contains(logLine(&logs, `msg="lastseen: flush failed"`), "context deadline exceeded"), true)
			bounded("scheduled purge", testenv.Seam(&cfg).PurgeTimeout, func(context.Context) error {
				internals(p).Scheduler.Entry(2).Job.Run() // the purge, after the one flush spec
				return nil
			})
			equal(t, "scheduled purge failures logged", logs.Count(`msg="lastseen: purge failed"`), 1)
			equal(t, "the scheduled purge ended by its deadline",
				strings.Contains(logLine(&logs, `msg="lastseen: purge failed"`), "context deadline exceeded"), true)
			deadlineErr("Close", bounded("Close", 500*time.Millisecond, p.Close))
			s := p.Stats()
			equal(t, "flush errors", s.FlushErrors, 3) // Flush, the scheduled flush, Close's
			equal(t, "purge errors", s.PurgeErrors, 2)
			// The backlog's one touch could not reach Redis by Close: dropped, counted.
			equal(t, "backlog dropped at Close", s.BacklogDropped, 1)
			equal(t, "backlog after Close", s.Backlog, 0)
		})
	}
}

// TestOwnClientFollowsAppOptions: with a client without
// ContextTimeoutEnabled the plugin opens its own from a copy of the app's
// options (same server, same database number), uses it for everything,
// closes it in Close, and goes on with the app's client after Close.
func TestOwnClientFollowsAppOptions(t *testing.T) {
	rs := startPrivateRedis(t)
	app := redis.NewClient(&redis.Options{Addr: rs.Addr(), DB: 3})
	t.Cleanup(func() { app.Close() })
	h := newHarness(t, testenv.SQLite(), clientKind(app))
	snapshot := goleak.IgnoreCurrent()
	p, db := h.plugin(h.config())
	must(t, db.AutoMigrate(&lastseen.User{}))
	client, own, deadlines := buf(p).Client()
	equal(t, "own client", own, true)
	equal(t, "own client honours deadlines", deadlines, true)
	equal(t, "own client's database", client.(*redis.Client).Options().DB, 3)
	equal(t, "own client has ContextTimeoutEnabled", client.(*redis.Client).Options().ContextTimeoutEnabled, true)
	equal(t, "the app's options untouched", app.Options().ContextTimeoutEnabled, false)

	ctx := context.Background()
	ok, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T09:20:00Z"))
	must(t, err)
	equal(t, "recorded", ok, true)
	n, err := app.Exists(ctx, pendingKey(p, "1")).Result()
	must(t, err)
	equal(t, "pending hash in database 3, seen by the app's client", n, int64(1))

	must(t, p.Close(ctx))
	if err := client.Ping(ctx).Err(); !errors.Is(err, redis.ErrClosed) {
		t.Errorf("own client after Close: %v, want redis.ErrClosed", err)
	}
	ok, err = p.TouchAt(ctx, 2, mustTime("2026-03-01T09:20:00Z"))
	must(t, err)
	equal(t, "touch after Close recorded through the app's client", ok, true)
	_, found, err := p.Pending(ctx, 2)
	must(t, err)
	equal(t, "pending after Close", found, true)
	goleak.VerifyNone(t, append(leakOptions(snapshot),
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))...) // the test's database handle
}

// goroutineID is the running goroutine's number, from runtime.Stack's
// first line ("goroutine 42 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	return strings.Fields(string(buf))[1]
}

// gidHook records the goroutine each command is sent from.
type gidHook struct{ last atomic.Value }

func (g *gidHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (g *gidHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.last.Store(goroutineID())
		return next(ctx, cmd)
	}
}
func (g *gidHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestTouchRunsOnCallersGoroutine: on a client that honours context
// deadlines a touch sends its script from the caller's own goroutine (no
// goroutine per touch); on a client that does not (a Ring) it is sent from
// another goroutine, which the touch stops waiting for at TouchTimeout.
func TestTouchRunsOnCallersGoroutine(t *testing.T) {
	rs := startPrivateRedis(t)
	for _, kind := range blackholeClients[1:] { // the copied client carries no hooks
		t.Run(kind.name, func(t *testing.T) {
			rdb := kind.open(rs.Addr())
			t.Cleanup(func() { rdb.Close() })
			hook := &gidHook{}
			rdb.AddHook(hook)
			h := newHarness(t, testenv.SQLite(), clientKind(rdb))
			p, _ := h.plugin(h.config())
			ok, err := p.TouchAt(context.Background(), 1, mustTime("2026-03-01T09:20:00Z"))
			must(t, err)
			equal(t, "recorded", ok, true)
			equal(t, "sent from the caller's goroutine", hook.last.Load() == goroutineID(), kind.name != "ring")
		})
	}
}

// TestTouchesRacingCloseGoOnAppClient: touches from 8 goroutines, half on
// contexts without a deadline, race Close, which closes the buffer's own
// client (a copy of the app's) under them. A touch whose call fails
// because its client or its connection was closed runs once more on the
// app's client: none fails, on one Redis and on a Redis Cluster, whose
// closed connections fail with "use of closed network connection" rather
// than redis.ErrClosed.
func TestTouchesRacingCloseGoOnAppClient(t *testing.T) {
	apps := map[string]func(t *testing.T) redis.UniversalClient{ // t: the subtest's, which Need skips
		"redis": func(t *testing.T) redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: testenv.Need(t, testenv.EnvRedis)})
		},
		"cluster": func(t *testing.T) redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(testenv.Need(t, testenv.EnvRedisCluster), ",")})
		},
	}
	for _, kind := range []string{"redis", "cluster"} {
		t.Run(kind, func(t *testing.T) {
			for round := range 5 {
				app := apps[kind](t)
				prefix := testenv.RandomName("closerace")
				t.Cleanup(func() {
					_ = testenv.DeleteKeys(context.Background(), app, prefix+"*")
					app.Close()
				})
				b := redisbuf.New(redisbuf.Options{Client: app, Prefix: prefix, Shards: 16,
					Throttle: time.Millisecond, TouchTimeout: 5 * time.Second, Now: time.Now})
				if _, own, _ := redisbuf.Client(b); !own {
					t.Fatal("the buffer did not open its own client")
				}
				var failed atomic.Int64
				var first atomic.Value
				var wg sync.WaitGroup
				start := make(chan struct{})
				for g := range 8 {
					wg.Go(func() {
						<-start
						for i := range 300 {
							ctx := context.Background()
							if i%2 == 0 {
								c, cancel := context.WithCancel(ctx)
								defer cancel()
								ctx = c
							}
							now := time.Now()
							_, _, err := b.Touch(ctx, fmt.Sprint("u", g, "-", i), now, now, now.Truncate(time.Millisecond).Add(time.Millisecond))
							if err != nil && failed.Add(1) == 1 {
								first.Store(err)
							}
						}
					})
				}
				close(start)
				time.Sleep(time.Duration(5+round*5) * time.Millisecond)
				must(t, b.Close())
				wg.Wait()
				if n := failed.Load(); n != 0 {
					t.Errorf("round %d: %d touches failed, the first: %v", round, n, first.Load())
				}
				c, own, _ := redisbuf.Client(b)
				equal(t, "after Close: the app's client", own == false && c == app, true)
			}
		})
	}
}
