package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"go.uber.org/goleak"
)

// Shutdown (issue 4 behaviour 9).

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
		cfg.WriteMode = lastseen.Upsert // every id gets a row
		cfg.DisableScheduler = false
		cfg.FlushSchedule = "@every 1s"
		cfg.BatchSize = 100
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
	h := newHarness(t, sqliteOpener(), miniredisKind())
	ctx := context.Background()
	db := h.openDB()
	must(t, db.AutoMigrate(&lastseen.User{}))
	must(t, db.Create(&lastseen.User{ID: 7}).Error)
	cfg := h.config()
	cfg.DisableScheduler = false
	cfg.FlushSchedule = "@every 1s"
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
