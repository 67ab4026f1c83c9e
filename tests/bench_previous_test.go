package tests

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// BenchmarkFlushPrevious is the cost of the previous values in OnBatch
// entries: one flush of one batch of 1000 users (every row written, each
// a minute newer than the last flush), on each dialect, with the
// in-process buffer so that only the database's part differs:
//
//   - nohook: no Flush.OnBatch, the bulk statement alone;
//   - previous-off: a hook that does nothing, run as before the previous
//     values were read (the statement and the hook in one transaction);
//   - previous-on: the same hook, its entries carrying their previous
//     values.
//
// Run it interleaved, and compare with benchstat:
//
//	go test -run '^$' -bench FlushPrevious -count 6 . | tee flush.txt
func BenchmarkFlushPrevious(b *testing.B) {
	for _, d := range servers.Dialects() {
		for _, mode := range []string{"nohook", "previous-off", "previous-on"} {
			b.Run(d.Name+"/"+mode, func(b *testing.B) {
				h := newHarness(b, d, memoryKind())
				cfg := h.config()
				cfg.Buffer.Shards, cfg.Flush.Concurrency, cfg.Flush.BatchSize = 1, 1, 1000
				if mode != "nohook" {
					cfg.Flush.OnBatch = func(*gorm.DB, []lastseen.Seen) error { return nil }
				}
				cfg.Test.Seam.NoPrevious = mode == "previous-off"
				p, db := h.plugin(cfg)
				seedUsers(b, db, 1000)
				ctx := context.Background()
				b.ResetTimer()
				for range b.N {
					b.StopTimer()
					h.clock.Add(time.Hour) // every window ended: each touch is recorded
					for id := 1; id <= 1000; id++ {
						if rec, err := p.Touch(ctx, id); err != nil || !rec {
							b.Fatalf("touch %d: recorded %v, %v", id, rec, err)
						}
					}
					b.StartTimer()
					res, err := p.Flush(ctx)
					if err != nil || res.Drained != 1000 || res.Batches != 1 {
						b.Fatalf("flush: %+v, %v; want 1000 drained in one batch", res, err)
					}
				}
				b.StopTimer()
				want := h.clock.Now().UTC().Format(time.RFC3339Nano)
				equal(b, "user 1000 written by the last flush", lastSeenColumn(b, db, "users", "id", "last_seen_at", 1000), want)
			})
		}
	}
}
