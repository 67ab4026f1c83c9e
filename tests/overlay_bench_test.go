package tests

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// The read overlay's cost on a 100-row Find, beside the same query without
// the plugin. Run (docs/benchmarks.md, "The read overlay", has the command
// that interleaves the variants over several processes for benchstat):
//
//	go -C tests test -run '^$' -bench BenchmarkOverlayFind -benchmem
//
// Each buffer kind (the in-process buffer, and the real Redis at
// LASTSEEN_REDIS_ADDR) has these variants on one SQLite database of 100
// users (ids 1,000,001..1,000,100, every column set an hour ago):
//
//	plugin=none    a GORM handle without the plugin
//	plugin=empty   the plugin with Overlay, nothing buffered at all
//	plugin=others  the plugin with Overlay, 10,000 other users buffered
//	               (ids 2,000,001..2,010,000), none of the 100
//	plugin=full    the plugin with Overlay, each of the 100 buffered with a
//	               value newer than its column, which the overlay loads
//	plugin=ping    (Redis only) the handle without the plugin, and one PING
//	               on the same Redis client after each query, bounded by a
//	               context deadline as the overlay's read is: the least a
//	               read of Redis can add
//
// Each checks after its loop that the last query gave the values its name
// says (the column's, or the buffered ones). cpu-ns/op is the process's
// CPU time (user and system, every goroutine) per query, where sec/op is
// the wall time: with Redis they differ by the time spent waiting for it.

const (
	overlayBenchRows   = 100
	overlayBenchOthers = 10000
	overlayBenchFirst  = 1_000_001 // the first row's id: ids past 255 box and format as an app's do
	overlayBenchOther  = 2_000_001 // the first other user's id
)

func BenchmarkOverlayFind(b *testing.B) {
	for _, r := range []testenv.RedisKind{memoryKind(), testenv.RedisServer()} {
		b.Run("buffer="+r.Name, func(b *testing.B) {
			h := newHarness(b, testenv.SQLite(), r)
			column := time.Now().Add(-time.Hour).UTC().Truncate(time.Microsecond)
			seedOverlayBench(b, h.db, column)
			fresh := time.Now().UTC().Truncate(time.Microsecond)
			for _, v := range []struct {
				name    string
				db      *gorm.DB
				want    time.Time
				touched int // the user ids touched before the loop (others, then the rows too)
			}{
				{"none", h.openDB(), column, 0},
				{"empty", overlayBenchPlugin(b, h, "e", 0, fresh), column, 0},
				{"others", overlayBenchPlugin(b, h, "o", overlayBenchOthers, fresh), column, overlayBenchOthers},
				{"full", overlayBenchPlugin(b, h, "f", overlayBenchOthers+overlayBenchRows, fresh), fresh, overlayBenchOthers},
			} {
				b.Run("plugin="+v.name, func(b *testing.B) { benchOverlayFind(b, v.db, v.want, nil) })
			}
			if rdb := h.r.Client; rdb != nil {
				b.Run("plugin=ping", func(b *testing.B) {
					benchOverlayFind(b, h.openDB(), column, func(ctx context.Context) error {
						ctx, cancel := context.WithTimeout(ctx, time.Second)
						defer cancel()
						return rdb.Ping(ctx).Err()
					})
				})
			}
		})
	}
}

// seedOverlayBench creates the users table with users 1..100 seen at column.
func seedOverlayBench(b *testing.B, db *gorm.DB, column time.Time) {
	b.Helper()
	must(b, db.AutoMigrate(&lastseen.User{}))
	users := make([]lastseen.User, overlayBenchRows)
	for i := range users {
		users[i] = lastseen.User{ID: uint64(overlayBenchFirst + i), LastSeenAt: &column}
	}
	must(b, db.Create(&users).Error)
}

// overlayBenchPlugin registers a plugin with Overlay on the harness's
// database under a key prefix of its own, on the real clock, and touches
// the first n of the other users then of the rows at fresh.
func overlayBenchPlugin(b *testing.B, h *harness, prefix string, n int, fresh time.Time) *gorm.DB {
	b.Helper()
	cfg := h.config()
	cfg.Test.Now = nil // time.Now
	cfg.Presence.Overlay = true
	cfg.Buffer.Prefix = h.prefix + ":" + prefix
	p, db := h.plugin(cfg)
	ctx := context.Background()
	for i := range n {
		id := uint64(overlayBenchOther + i)
		if i >= overlayBenchOthers {
			id = uint64(overlayBenchFirst + i - overlayBenchOthers)
		}
		if rec, err := p.TouchAt(ctx, id, fresh); !rec || err != nil {
			b.Fatalf("touch %d: recorded=%v err=%v", id, rec, err)
		}
	}
	return db
}

// benchOverlayFind runs the 100-row Find b.N times, each followed by then
// unless nil, and checks that the last one gave every user want.
func benchOverlayFind(b *testing.B, db *gorm.DB, want time.Time, then func(context.Context) error) {
	var users []lastseen.User
	ctx := context.Background()
	cpu := startCPUClock()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		users = users[:0]
		if err := db.Find(&users).Error; err != nil {
			b.Fatal(err)
		}
		if then != nil {
			if err := then(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	cpu.report(b)
	if len(users) != overlayBenchRows {
		b.Fatalf("found %d users, want %d", len(users), overlayBenchRows)
	}
	for _, u := range users {
		if u.LastSeenAt == nil || !u.LastSeenAt.Equal(want) {
			b.Fatalf("user %d: last seen %v, want %v", u.ID, u.LastSeenAt, want)
		}
	}
}
