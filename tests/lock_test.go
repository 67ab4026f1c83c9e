package tests

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// A lock outlives a slow batch: while a flush or a purge works, a keeper
// refreshes its lock every LockTTL/3.

// lockTTL is the LockTTL of these tests; slowBatch, what one batch takes,
// is longer. The locks live in a real Redis, where they expire on the real
// clock.
const (
	lockTTL   = time.Second
	slowBatch = 1200 * time.Millisecond
)

// refreshCounter counts the keeper's refreshes per lock key.
type refreshCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *refreshCounter) hooks() *flushHooks {
	c.n = map[string]int{}
	return &flushHooks{LockRefreshed: func(key string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.n[key]++
	}}
}

func (c *refreshCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

// slowUpdates makes every UPDATE on db take slowBatch longer, after it ran
// (a GORM callback after gorm:raw, as a slow network would), and counts
// them.
func slowUpdates(t *testing.T, db *gorm.DB) *atomic.Int64 {
	var updates atomic.Int64
	must(t, db.Callback().Raw().After("gorm:raw").Register("test:slow_update", func(tx *gorm.DB) {
		if hasVerb(tx.Statement.SQL.String(), "UPDATE") {
			updates.Add(1)
			time.Sleep(slowBatch)
		}
	}))
	return &updates
}

// TestSlowBatchKeepsItsLock: every batch takes longer than LockTTL. The
// flush completes (before the keeper it lost its lock after the first
// statement and the next flush wrote the same batch again, forever): the
// shard lock is refreshed while the batches run, each of the 2 batches is
// written by exactly one statement, every user has its timestamp, and the
// next flush drains nothing.
func TestSlowBatchKeepsItsLock(t *testing.T) {
	for _, r := range testenv.RedisKinds()[1:] { // miniredis expires keys only when told to
		for _, d := range servers.Dialects() {
			t.Run(d.Name+"/"+r.Name, func(t *testing.T) {
				h := newHarness(t, d, r)
				cfg := h.config()
				cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 5
				testenv.Seam(&cfg).LockTTL, testenv.Seam(&cfg).StatementTimeout = lockTTL, lockTTL/2
				p, db := h.plugin(cfg)
				want := seedFaultUsers(t, db, 10)
				touchFaultUsers(t, p, 10, "2026-03-01T09:20:00Z", want)
				var refreshes refreshCounter
				setHooks(p, refreshes.hooks())
				updates := slowUpdates(t, db)

				res, err := p.Flush(context.Background())
				must(t, err)
				equal(t, "written", res.Written, 10)
				equal(t, "batches", res.Batches, 2)
				equal(t, "UPDATE statements", updates.Load(), int64(2))
				lockKey := shardKeys(p, 0).Lock
				t.Logf("refreshes of the shard lock during 2 batches of %v: %d", slowBatch, refreshes.get(lockKey))
				if refreshes.get(lockKey) < 2 { // at least one per batch: each outlives LockTTL
					t.Errorf("shard lock refreshed %d times, want at least 2", refreshes.get(lockKey))
				}
				checkFaultColumns(t, db, "after the slow flush", want)

				res, err = p.Flush(context.Background())
				must(t, err)
				equal(t, "drained by the next flush", res.Drained, 0)
				equal(t, "UPDATE statements after the next flush", updates.Load(), int64(2))
				equal(t, "redis buffers left", fmt.Sprint(h.pendingKeys()), "[]")
			})
		}
	}
}

// TestSlowPurgeKeepsItsLock: PurgePause (1.2s) is longer than LockTTL
// (1s), so the purge lock would expire between two batches; the keeper
// refreshes it and the purge deletes all 6 sessions in 3 batches.
func TestSlowPurgeKeepsItsLock(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.RedisServer())
			cfg := h.config()
			testenv.Seam(&cfg).LockTTL, testenv.Seam(&cfg).PurgeBatchTimeout = lockTTL, lockTTL/2
			cfg.Sessions.BatchSize, testenv.Seam(&cfg).PurgePause = 2, slowBatch
			p, db := h.plugin(cfg)
			var rows []lastseen.Session
			for i := 1; i <= 6; i++ {
				rows = append(rows, lastseen.Session{ID: fmt.Sprint("s", i), UserID: 1, ExpiresAt: mustTime("2026-03-01T08:00:00Z")})
			}
			seedSessions(t, db, rows...)
			var refreshes refreshCounter
			setHooks(p, refreshes.hooks())
			res, err := p.PurgeExpiredSessions(context.Background())
			must(t, err)
			equal(t, "deleted", res.Deleted, 6)
			equal(t, "batches", res.Batches, 3)
			t.Logf("refreshes of the purge lock: %d", refreshes.get(keys.PurgeLock(p.Config().Buffer.Prefix)))
			if refreshes.get(keys.PurgeLock(p.Config().Buffer.Prefix)) < 2 {
				t.Errorf("purge lock refreshed %d times, want at least 2", refreshes.get(keys.PurgeLock(p.Config().Buffer.Prefix)))
			}
		})
	}
}

// TestLostLockStopsForwardOnly: another flusher takes the shard lock right
// after batch 1 committed. The flusher stops at its next acknowledgement,
// which finds another token: batch 1's 5 users are committed and no entry
// is acknowledged; the statement the flusher runs while that
// acknowledgement is in flight (batch 2) may commit too, forward-only. The
// next flusher finds the whole in-flight hash and writes all 10: the ones
// the first committed as no-ops (Stale, no row moves back), the others
// forward.
func TestLostLockStopsForwardOnly(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "another instance takes the Redis lock; the in-process lock is never lost")
		cfg := h.config()
		cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 5
		p, db := h.plugin(cfg)
		want := seedFaultUsers(t, db, 10)
		touchFaultUsers(t, p, 10, "2026-03-01T09:20:00Z", want)
		lockKey := shardKeys(p, 0).Lock
		ctx := context.Background()
		setHooks(p, &flushHooks{AfterCommit: func(_, batch int) {
			if batch == 1 { // another instance holds the lock from now on
				must(t, h.r.Client.Set(ctx, lockKey, "another flusher", time.Minute).Err())
			}
		}})
		res, err := p.Flush(ctx)
		if !isLockLost(err) {
			t.Fatalf("flush that lost its lock: %v, want buffer.ErrLockLost", err)
		}
		first := res
		if first.Written < 5 {
			t.Errorf("written before the lock was lost = %d, want batch 1 (5) at least", first.Written)
		}
		equal(t, "written: whole batches", first.Written, 5*first.Batches)
		equal(t, "acknowledged (drained)", first.Drained, 0)
		setHooks(p, nil)
		must(t, h.r.Client.Del(ctx, lockKey).Err()) // the other instance is done

		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "drained by the next flush", res.Drained, 10)
		equal(t, "written by the next flush", res.Written, 10-first.Written)
		equal(t, "rewritten as no-ops", res.Stale, first.Written)
		checkFaultColumns(t, db, "after both flushes", want)
		equal(t, "redis buffers left", fmt.Sprint(h.pendingKeys()), "[]")
	})
}
