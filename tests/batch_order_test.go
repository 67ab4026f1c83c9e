package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// TestFlushWritesBatchesInKeyOrder: a flush hands each batch to the
// statement (and to OnBatch, in the same order) sorted by primary key,
// whatever order HSCAN returned, and writes every page when the in-flight
// hash spans several HSCAN pages (the next page fetched while a batch is
// written), on every dialect.
func TestFlushWritesBatchesInKeyOrder(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		must(t, h.db.AutoMigrate(&lastseen.User{}))
		users := make([]lastseen.User, 30)
		for i := range users {
			users[i] = lastseen.User{ID: uint64(i + 1)}
		}
		must(t, h.db.Create(&users).Error)
		var batches [][]any
		cfg := h.config()
		cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 8
		cfg.Flush.OnBatch = func(_ *gorm.DB, b []lastseen.Seen) error {
			ids := make([]any, len(b))
			for i, s := range b {
				ids[i] = s.ID
			}
			batches = append(batches, ids)
			return nil
		}
		p, _ := h.plugin(cfg)
		at := h.clock.Now().Add(-time.Minute)
		for _, id := range []uint64{30, 7, 19, 1, 26, 12, 3, 22, 15, 9, 28, 5, 17, 11, 24, 2, 20, 13, 29, 6, 18, 10, 25, 4, 21, 14, 27, 8, 16, 23} {
			_, err := p.TouchAt(ctx, id, at)
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 30)
		equal(t, "drained", res.Drained, 30)
		seen := map[any]bool{}
		for i, b := range batches {
			for j := 1; j < len(b); j++ {
				if b[j-1].(uint64) >= b[j].(uint64) {
					t.Fatalf("batch %d not in key order: %v", i, b)
				}
			}
			for _, id := range b {
				seen[id] = true
			}
		}
		equal(t, "users in the batches", len(seen), 30)
		equal(t, "batches", res.Batches, len(batches))
	})
}

// TestFlushReadsEveryPageOfALargeHash: on a real Redis an in-flight hash
// of 1,200 fields is hashtable-encoded (over 512 fields), so HSCAN returns
// it in pages of about BatchSize; with the next page fetched while a batch
// is written, every user is written exactly once.
func TestFlushReadsEveryPageOfALargeHash(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.RedisServer())
	ctx := context.Background()
	must(t, h.db.AutoMigrate(&lastseen.User{}))
	users := make([]lastseen.User, 1200)
	for i := range users {
		users[i] = lastseen.User{ID: uint64(i + 1)}
	}
	must(t, h.db.CreateInBatches(&users, 500).Error)
	cfg := h.config()
	cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 100
	p, _ := h.plugin(cfg)
	at := h.clock.Now().Add(-time.Minute)
	for id := uint64(1); id <= 1200; id++ {
		_, err := p.TouchAt(ctx, id, at)
		must(t, err)
	}
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "drained / written / stale", fmt.Sprint(res.Drained, res.Written, res.Stale), "1200 1200 0")
	var n int64
	must(t, h.db.Model(&lastseen.User{}).Where("last_seen_at IS NOT NULL").Count(&n).Error)
	equal(t, "rows with a time", n, int64(1200))
	st, err := p.Status(ctx)
	must(t, err)
	equal(t, "pending / in-flight left", fmt.Sprint(st.Pending, st.InFlight), "0 0")
}
