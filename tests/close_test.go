package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"go.uber.org/goleak"
	"gorm.io/gorm"
)

// Shutdown: Close flushes, waits for running flushes and purges, and
// leaves no goroutine behind.

// leakOptions ignores the goroutines that existed before the plugin was
// created and those that belong to the app's own clients, which stay open
// after Close (the harness closes them at cleanup): miniredis serves each
// pooled connection of the app's go-redis client in a goroutine, and the
// MySQL driver watches each connection of the app's database handle.
func leakOptions(snapshot goleak.Option) []goleak.Option {
	return []goleak.Option{
		snapshot,
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
		// go-sql-driver/mysql watches each connection the app's handle opens
		// (a concurrent flush opens a second one) with a goroutine of its own.
		goleak.IgnoreTopFunction("github.com/go-sql-driver/mysql.(*mysqlConn).startWatcher.func1"),
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer.func2"),
	}
}

// closeLoad is what one touch during the load did.
type closeLoad struct {
	id          int
	recorded    bool
	err         error
	beforeClose bool // the touch returned before Close was called
}

// TestCloseDuringLoad: 8 goroutines touch new users while Close is called.
// Every touch that returned before the call is in the database after Close
// returns; later ones are in the database or still in Redis, never lost;
// Close returns nil (so within its context), a second Close returns the
// same, and no goroutine of the plugin (cron, local cache, touch calls) is
// left behind.
func TestCloseDuringLoad(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		db := h.openDB()
		must(t, db.AutoMigrate(&lastseen.User{}))
		cfg := h.config()
		cfg.Flush.Upsert = true                            // every id gets a row
		cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
		cfg.Flush.Schedule = "@every 1s"
		cfg.Flush.BatchSize = 100
		snapshot := goleak.IgnoreCurrent()
		p := lastseen.New(cfg)
		must(t, db.Use(p))

		const workers, beforeClose = 8, 2000
		var closing atomic.Bool
		var started atomic.Int64
		enough := make(chan struct{})
		stop := make(chan struct{})
		results := make([][]closeLoad, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 1; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					id := w*1_000_000 + i
					ok, err := p.TouchAt(ctx, id, h.clock.Now())
					results[w] = append(results[w], closeLoad{id: id, recorded: ok, err: err, beforeClose: !closing.Load()})
					if started.Add(1) == beforeClose {
						close(enough)
					}
				}
			}()
		}
		<-enough
		closing.Store(true)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := p.Close(cctx)
		cancel()
		must(t, err)
		close(stop)
		wg.Wait()
		must(t, p.Close(ctx)) // the first call's result again

		var before, after, inRedis int
		want := h.clock.Now().UTC().Format(time.RFC3339Nano)
		for _, rs := range results {
			for _, r := range rs {
				if !r.recorded && r.err == nil {
					t.Fatalf("touch of new user %d was not recorded", r.id)
				}
				col := lastSeenColumn(t, db, "users", "id", "last_seen_at", r.id)
				switch {
				case r.beforeClose:
					before++
					equal(t, fmt.Sprintf("user %d touched before Close", r.id), col, want)
				case col == want:
					after++
				default:
					at, ok, err := p.Pending(ctx, r.id)
					must(t, err)
					if !ok || at.Format(time.RFC3339Nano) != want {
						t.Errorf("user %d touched during Close: neither in the database (%q) nor pending (%v)", r.id, col, at)
					}
					inRedis++
				}
			}
		}
		if before < beforeClose {
			t.Fatalf("only %d touches before Close", before)
		}
		t.Logf("%d touches before Close, all flushed; during Close: %d flushed, %d pending in Redis", before, after, inRedis)
		goleak.VerifyNone(t, leakOptions(snapshot)...)
	})
}

// TestCloseReturnsWithinContext: a scheduled flush is stuck (a test hook
// holds it after its swap); Close gives up when its context ends, with an
// error naming what it waited for, and the second Close returns the same.
// When the flush comes free it stops at its canceled context, its in-flight
// entry stays in Redis, a new instance flushes it, and no goroutine of the
// closed plugin is left.
func TestCloseReturnsWithinContext(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	db := h.openDB()
	must(t, db.AutoMigrate(&lastseen.User{}))
	must(t, db.Create(&lastseen.User{ID: 7}).Error)
	cfg := h.config()
	cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
	cfg.Flush.Schedule = "@every 1s"
	snapshot := goleak.IgnoreCurrent()
	p := lastseen.New(cfg)
	stuck, release := make(chan struct{}), make(chan struct{})
	setHooks(p, &flushHooks{AfterSwap: func(int) {
		close(stuck)
		<-release
	}})
	must(t, db.Use(p))
	ok, err := p.TouchAt(ctx, 7, mustTime("2026-03-01T09:30:00Z"))
	must(t, err)
	equal(t, "recorded", ok, true)
	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the scheduled flush did not start within 10s")
	}

	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = p.Close(cctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close with a stuck flush: %v, want context.DeadlineExceeded", err)
	}
	equal(t, "error text", err.Error(), "lastseen: close: waiting for running jobs: context deadline exceeded")
	equal(t, "second Close", p.Close(ctx), err)

	close(release)
	// The released flush returns on its own, on the closed plugin's canceled
	// context; wait for it (cron's job waiter), not for a time, so that a
	// loaded machine cannot make a live goroutine look leaked.
	<-internals(p).Scheduler.Stop().Done()
	goleak.VerifyNone(t, leakOptions(snapshot)...)
	at, ok, err := p.Pending(ctx, 7)
	must(t, err)
	equal(t, "left in flight", ok && at.Equal(mustTime("2026-03-01T09:30:00Z")), true)
	equal(t, "redis buffers", fmt.Sprint(h.pendingKeys()), "[:{6}:inflight]")

	next, db2 := h.plugin(h.config())
	res, err := next.Flush(ctx)
	must(t, err)
	equal(t, "written by the next instance", res.Written, 1)
	equal(t, "user 7", lastSeenColumn(t, db2, "users", "id", "last_seen_at", 7), "2026-03-01T09:30:00Z")
}

// TestCloseFlushesOnceThenErrClosed: Close runs a final flush, returns the same result when called
// again, and Flush afterwards returns ErrClosed.
func TestCloseFlushesOnceThenErrClosed(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(h.config())
		seedUsers(t, db, 4)
		for id := 1; id <= 3; id++ {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:20:00Z"))
			must(t, err)
		}
		must(t, p.Close(ctx))
		must(t, p.Close(ctx))
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for id := 1; id <= 3; id++ {
			equal(t, fmt.Sprint("column ", id), got[fmt.Sprint(id)], "2026-03-01T09:20:00Z")
		}
		equal(t, "flushes", p.Stats().Flushes, 1)
		res, err := p.Flush(ctx)
		equal(t, "flush after close", err, lastseen.ErrClosed)
		equal(t, "flush after close result", res, lastseen.FlushResult{})
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")

		// A touch after Close still reaches Redis for the next instance.
		ok, err := p.Touch(ctx, 9)
		must(t, err)
		equal(t, "touch after close recorded", ok, true)
		at, _, err := p.Pending(ctx, 9)
		must(t, err)
		equal(t, "pending after close", at.Format(time.RFC3339), "2026-03-01T09:30:00Z")

		// A failing final flush: Close returns its error, twice, and keeps the data.
		q, qdb := h.plugin(h.config())
		down := failWrites(t, qdb)
		ok, err = q.TouchAt(ctx, 4, mustTime("2026-03-01T09:25:00Z"))
		must(t, err)
		equal(t, "touch 4 recorded", ok, true)
		down(true)
		err1 := q.Close(ctx)
		if err1 == nil || !strings.Contains(err1.Error(), "injected: database unreachable") {
			t.Fatalf("close with the database down: %v", err1)
		}
		err2 := q.Close(ctx)
		equal(t, "second close returns the first result", err2, err1)
		down(false)
		r, _ := h.plugin(h.config())
		res, err = r.Flush(ctx)
		must(t, err)
		equal(t, "next instance writes what the failed close kept", res.Written, 1)
		equal(t, "user 9 unknown", res.Unknown, 1)
		equal(t, "column 4", lastSeenColumn(t, db, "users", "id", "last_seen_at", 4), "2026-03-01T09:25:00Z")
	})
}

// TestCloseWaitsForAppFlush: Close waits for a Flush the app started (which
// holds shard locks Close's own final flush would skip), and a second Close
// made meanwhile returns the first one's result only once it is known.
func TestCloseWaitsForAppFlush(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 10
	p, db := h.plugin(cfg)
	must(t, db.AutoMigrate(&lastseen.User{}))
	for id := 1; id <= 30; id++ {
		must(t, db.Create(&lastseen.User{ID: uint64(id)}).Error)
		_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
		must(t, err)
	}
	committed, release := make(chan struct{}), make(chan struct{})
	setHooks(p, &flushHooks{AfterCommit: func(shard, batch int) {
		if batch == 1 {
			close(committed)
			<-release
		}
	}})
	flushed := make(chan error, 1)
	var flushDone atomic.Bool
	go func() { _, err := p.Flush(ctx); flushDone.Store(true); flushed <- err }()
	<-committed

	type closeResult struct {
		err           error
		afterTheFlush bool
	}
	closes := make(chan closeResult, 2)
	for range 2 {
		go func() { err := p.Close(ctx); closes <- closeResult{err, flushDone.Load()} }()
	}
	close(release)
	must(t, <-flushed)
	for range 2 {
		r := <-closes
		must(t, r.err)
		equal(t, "Close returned after the app's flush", r.afterTheFlush, true)
	}
	var n int64
	must(t, db.Model(&lastseen.User{}).Where("last_seen_at IS NOT NULL").Count(&n).Error)
	equal(t, "users written when Close returned", n, int64(30))
}

// TestCloseWaitsForPurge: Close lets the batch in progress commit, stops
// the purge after it, and returns after the purge did.
func TestCloseWaitsForPurge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		p, db := h.plugin(purgeConfig(h, 2))
		seedSessions(t, db,
			sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"), sess("c", "2026-03-01T09:02:00Z"),
			sess("d", "2026-03-01T09:03:00Z"), sess("e", "2026-03-01T09:04:00Z"), sess("z", "2026-03-02T00:00:00Z"))
		entered, release := make(chan struct{}), make(chan struct{})
		var calls atomic.Int64
		beforeDelete(t, db, "test:block", func(*gorm.DB) {
			if calls.Add(1) == 1 {
				close(entered)
				<-release
			}
		})
		type outcome struct {
			res lastseen.PurgeResult
			err error
		}
		purged, closed := make(chan outcome, 1), make(chan error, 1)
		go func() {
			res, err := p.PurgeExpiredSessions(context.Background())
			purged <- outcome{res, err}
		}()
		<-entered
		go func() { closed <- p.Close(context.Background()) }()
		<-internals(p).Closing // Close has begun
		select {
		case err := <-closed:
			t.Fatalf("Close returned (%v) while batch 1 was running", err)
		default:
		}
		close(release)
		must(t, <-closed)
		// Batch 1 committed before Close returned.
		equal(t, "ids left when Close returned", tableIDs(t, db, "sessions", "id"), "c,d,e,z")
		out := <-purged
		if !errors.Is(out.err, lastseen.ErrClosed) {
			t.Errorf("purge err = %v, want ErrClosed", out.err)
		}
		equal(t, "deleted", out.res.Deleted, 2)
		equal(t, "batches", out.res.Batches, 1)
		equal(t, "stopped", out.res.Stopped, true)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "c,d,e,z")
		if _, err := p.PurgeExpiredSessions(context.Background()); err != lastseen.ErrClosed {
			t.Errorf("purge after Close: err = %v, want ErrClosed", err)
		}
		if _, err := p.ExpiredSessions(context.Background()); err != lastseen.ErrClosed {
			t.Errorf("ExpiredSessions after Close: err = %v, want ErrClosed", err)
		}
	})
}

// TestCloseWaitsForScheduledFlush: Close stops the cron, cancels the
// running flush's context, waits for it to return, and then its own final
// flush writes what the interrupted one left in flight.
func TestCloseWaitsForScheduledFlush(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
	cfg.Flush.Schedule = "@every 1s"                   // robfig's shortest interval

	// The callback goes in before the plugin starts its cron: GORM's
	// callback registration must not race with a running flush.
	db := h.openDB()
	seedUsers(t, db, 1)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	var jobReturned atomic.Bool
	must(t, db.Callback().Raw().Before("gorm:raw").Register("test:block_first_update", func(tx *gorm.DB) {
		if hasVerb(tx.Statement.SQL.String(), "UPDATE") {
			once.Do(func() {
				close(entered)
				<-release
				jobReturned.Store(true)
			})
		}
	}))
	p := lastseen.New(cfg)
	must(t, db.Use(p))
	t.Cleanup(func() { p.Close(context.Background()) })
	_, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T09:29:00Z"))
	must(t, err)
	select {
	case <-entered:
	case <-time.After(30 * time.Second):
		t.Fatal("the scheduled flush did not start within 30s")
	}
	closed := make(chan error, 1)
	go func() { closed <- p.Close(ctx) }()
	<-internals(p).JobsContext.Done() // Close stopped the cron and canceled the jobs
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while the scheduled flush was still running", err)
	default:
	}
	close(release)
	must(t, <-closed)
	equal(t, "scheduled flush returned before Close", jobReturned.Load(), true)
	equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:29:00Z")
	equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	s := p.Stats()
	equal(t, "flushes (scheduled + final)", s.Flushes, 2)
	equal(t, "flush errors (the interrupted one)", s.FlushErrors, 1)
}

// TestCloseFlushesMemoryBuffer: Close writes every touch recorded before it;
// Flush, PurgeExpiredSessions and a touch that would open a throttle window
// return ErrClosed afterwards (nothing would ever flush it); a touch the
// local cache knows is throttled stays a no-op.
func TestCloseFlushesMemoryBuffer(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(h.config())
		seedUsers(t, db, 40)
		for id := 1; id <= 40; id++ { // ahead of the clock by id seconds: the current window, cached
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:30:00Z").Add(time.Duration(id)*time.Second))
			must(t, err)
		}
		must(t, p.Close(ctx))
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		written := 0
		for id := 1; id <= 40; id++ {
			if got[fmt.Sprint(id)] == mustTime("2026-03-01T09:30:00Z").Add(time.Duration(id)*time.Second).Format(time.RFC3339Nano) {
				written++
			}
		}
		equal(t, "rows written by Close", written, 40)
		equal(t, "stats drained", p.Stats().Drained, 40)
		_, err := p.Flush(ctx)
		equal(t, "flush after Close", err, lastseen.ErrClosed)
		_, err = p.PurgeExpiredSessions(ctx)
		equal(t, "purge after Close", err, lastseen.ErrClosed)
		ok, err := p.TouchAt(ctx, 41, mustTime("2026-03-01T09:01:00Z"))
		equal(t, "new touch after Close", fmt.Sprint(ok, " ", err), "false lastseen: plugin closed")
		ok, err = p.Touch(ctx, 40)
		equal(t, "throttled touch after Close", fmt.Sprint(ok, " ", err), "false <nil>")
		equal(t, "recorded after Close", p.Stats().Recorded, 40)
	})
}

// TestCloseWithEndedContext: Close with a context that already ended waits
// for no run when none is running: its error is the final flush's, not a
// wait for a run that does not exist.
func TestCloseWithEndedContext(t *testing.T) {
	forEachMemory(t, func(t *testing.T, h *harness) {
		p, db := h.plugin(h.config())
		seedUsers(t, db, 1)
		_, err := p.TouchAt(context.Background(), 1, mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		err = p.Close(ctx)
		equal(t, "Close with an ended context: a wait", strings.Contains(fmt.Sprint(err), "waiting for"), false)
		equal(t, "Close with an ended context: context.Canceled", errors.Is(err, context.Canceled), true)
	})
}

// TestCloseCountsLostInProcessTimestamps: without Redis, 1,000 timestamps
// held in memory (16 shards) and a database that refuses every write
// (SQLite PRAGMA query_only): Close's final flush writes nothing, and the
// timestamps end with the process. Close counts the 1,000 in
// Stats.Dropped, logs one ERROR line and returns one error, both saying
// that 1,000 timestamps were lost at Close (not "kept"), with the first
// shard's refusal; the error wraps ErrSystemic. Before, Close returned the
// shards' errors, each saying its entries were kept.
func TestCloseCountsLostInProcessTimestamps(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	before := seedFaultUsers(t, h.db, 1000)
	db, _ := refusingKinds("sqlite")[0].setup(t, h, "users")
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	cfg.Throttle = time.Minute
	p := usePlugin(t, db, cfg)
	touchFaultUsers(t, p, 1000, "2026-03-01T09:00:00Z", map[int]string{})

	err := p.Close(context.Background())
	const lost = "lastseen: 1000 timestamps lost at Close: the final flush could not write them (lastseen: flush shard 0: " +
		"lastseen: the database refuses every write (error kind 8): attempt to write a readonly database (8); and 15 more errors)"
	equal(t, "Close's error", fmt.Sprint(err), lost)
	equal(t, "wraps ErrSystemic", errors.Is(err, lastseen.ErrSystemic), true)
	equal(t, "ERROR lines", logs.Count("level=ERROR"), 1)
	equal(t, "the ERROR line", logs.Count(fmt.Sprintf("level=ERROR msg=%q %s lost=1000 drained=0 written=0 failed=0 batches=0", lost,
		"plugin="+p.Name()+" table=users prefix="+h.prefix)), 1)
	equal(t, "lines saying kept", logs.Count("kept"), 0)
	st := p.Stats()
	equal(t, "Stats", [5]int64{st.Dropped, st.Failed, st.RowsWritten, st.Flushes, st.FlushErrors}, [5]int64{1000, 0, 0, 1, 1})
	checkFaultColumns(t, h.db, "after Close", before)
}

// TestCloseCountsLostRefusedTimestamp: without Redis, 1,000 timestamps and
// one user the database refuses (a trigger RAISE(ABORT)): Close's final
// flush writes 999; the refused timestamp is lost with the process,
// counted in Stats.Dropped (and Failed), and Close's error and its ERROR
// line say so; the refused entry's own ERROR line names it without saying
// it goes back to pending.
func TestCloseCountsLostRefusedTimestamp(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), memoryKind())
	before := seedFaultUsers(t, h.db, 1000)
	refuseUser(t, h.db, "sqlite", 7)
	var logs testenv.Logs
	cfg := h.config()
	cfg.Logger = testenv.TextLogger(&logs)
	cfg.Throttle = time.Minute
	p, _ := h.plugin(cfg)
	want := map[int]string{}
	touchFaultUsers(t, p, 1000, "2026-03-01T09:00:00Z", want)

	err := p.Close(context.Background())
	const lost = "lastseen: 1 timestamp lost at Close: the final flush could not write them (lastseen: flush shard 6: " +
		"lastseen: database refused entries: 1 entries: constraint failed: user 7 refused (1811))"
	equal(t, "Close's error", fmt.Sprint(err), lost)
	equal(t, "wraps ErrRefused", errors.Is(err, lastseen.ErrRefused), true)
	attrs := "plugin=" + p.Name() + " table=users prefix=" + h.prefix
	equal(t, "ERROR lines", logs.Count("level=ERROR"), 2)
	equal(t, "the entry's line", logs.Count(`level=ERROR msg="lastseen: database refused a pending entry" `+attrs+
		` id=7 err="constraint failed: user 7 refused (1811)"`), 1)
	equal(t, "the loss line", logs.Count(fmt.Sprintf("level=ERROR msg=%q %s lost=1 drained=1000 written=999 failed=1 ", lost, attrs)), 1)
	equal(t, "lines saying pending", logs.Count("pending"), 1) // the entry's own message
	want[7] = before[7]
	checkFaultColumns(t, h.db, "after Close", want)
	st := p.Stats()
	equal(t, "Stats", [5]int64{st.Dropped, st.Failed, st.RowsWritten, st.Flushes, st.FlushErrors}, [5]int64{1, 1, 999, 1, 1})
}
