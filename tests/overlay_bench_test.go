package tests

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// The read overlay's cost on a 100-row Find, beside the same query without
// the plugin. Run (docs/benchmarks.md, "The read overlay", has the command
// with benchstat):
//
//	go -C tests test -run '^$' -bench BenchmarkOverlayFind -count 10
//
// Each buffer kind (the in-process buffer, and the real Redis at
// LASTSEEN_REDIS_ADDR) has these variants on one SQLite database of 100
// users (ids 1,000,001..1,000,100, every column set an hour ago):
//
//	plugin=empty   the plugin with Overlay, nothing buffered at all
//	plugin=others  the plugin with Overlay, 10,000 other users buffered
//	               (ids 2,000,001..2,010,000), none of the 100
//	plugin=full    the plugin with Overlay, each of the 100 buffered with a
//	               value newer than its column, which the overlay loads
//	plugin=ping    (Redis only) a handle without the plugin, and one PING on
//	               the same Redis client after each query, bounded by a
//	               context deadline as the overlay's read is: the least a
//	               read of Redis can add
//
// Every variant is measured against its baseline, the same Find on a GORM
// handle without the plugin, in the same loop: each op runs one baseline
// query and one variant query, alternating which goes first, so both see
// the same load on a shared machine. Per query of each side it reports
// the wall time (base-ns/q, ns/q), the process's CPU time (user and
// system, every goroutine: base-cpu-ns/q, cpu-ns/q) and the heap
// allocations (base-allocs/q, allocs/q, base-B/q, B/q), and the variant's
// extra CPU in percent of the baseline's (cpu-extra-%) and its extra
// allocations (allocs-extra/q). Each checks after its loop that the last
// query of each side gave the values its name says (the column's, or the
// buffered ones).

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
			base := overlayQuery{db: h.openDB(), want: column}
			for _, v := range []struct {
				name string
				q    overlayQuery
			}{
				{"empty", overlayQuery{db: overlayBenchPlugin(b, h, "e", 0, fresh), want: column}},
				{"others", overlayQuery{db: overlayBenchPlugin(b, h, "o", overlayBenchOthers, fresh), want: column}},
				{"full", overlayQuery{db: overlayBenchPlugin(b, h, "f", overlayBenchOthers+overlayBenchRows, fresh), want: fresh}},
			} {
				b.Run("plugin="+v.name, func(b *testing.B) { benchOverlayPair(b, base, v.q) })
			}
			if rdb := h.r.Client; rdb != nil {
				ping := overlayQuery{db: h.openDB(), want: column, then: func(ctx context.Context) error {
					ctx, cancel := context.WithTimeout(ctx, time.Second)
					defer cancel()
					return rdb.Ping(ctx).Err()
				}}
				b.Run("plugin=ping", func(b *testing.B) { benchOverlayPair(b, base, ping) })
			}
		})
	}
}

// seedOverlayBench creates the users table with the 100 users seen at
// column.
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

// overlayQuery is one side of a pair: the 100-row Find on db, then then
// (unless nil); every user must come back with want.
type overlayQuery struct {
	db        *gorm.DB
	want      time.Time
	then      func(context.Context) error
	wall, cpu time.Duration // summed over the queries
	queries   int
	last      []lastseen.User
}

// run runs the query once and adds its wall and CPU time.
func (q *overlayQuery) run(b *testing.B, ctx context.Context) {
	cpu, wall := processCPU(), time.Now()
	q.find(b, ctx)
	q.wall += time.Since(wall)
	q.cpu += processCPU() - cpu
	q.queries++
}

func (q *overlayQuery) find(b *testing.B, ctx context.Context) {
	q.last = q.last[:0]
	if err := q.db.Find(&q.last).Error; err != nil {
		b.Fatal(err)
	}
	if q.then != nil {
		if err := q.then(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// allocs returns the heap allocations of one query (testing.AllocsPerRun
// over 100 queries) and the bytes they take (MemStats over 100 more).
func (q *overlayQuery) allocs(b *testing.B, ctx context.Context) (n, bytes float64) {
	const runs = 100
	n = testing.AllocsPerRun(runs, func() { q.find(b, ctx) })
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		q.find(b, ctx)
	}
	runtime.ReadMemStats(&after)
	return n, float64(after.TotalAlloc-before.TotalAlloc) / runs
}

// check fails b unless the last query gave every user want.
func (q *overlayQuery) check(b *testing.B, side string) {
	if len(q.last) != overlayBenchRows {
		b.Fatalf("%s: found %d users, want %d", side, len(q.last), overlayBenchRows)
	}
	for _, u := range q.last {
		if u.LastSeenAt == nil || !u.LastSeenAt.Equal(q.want) {
			b.Fatalf("%s: user %d: last seen %v, want %v", side, u.ID, u.LastSeenAt, q.want)
		}
	}
}

// benchOverlayPair runs b.N pairs of base and variant queries, alternating
// which goes first, and reports each side's cost per query.
func benchOverlayPair(b *testing.B, base, variant overlayQuery) {
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if i%2 == 0 {
			base.run(b, ctx)
			variant.run(b, ctx)
		} else {
			variant.run(b, ctx)
			base.run(b, ctx)
		}
	}
	b.StopTimer()
	base.check(b, "baseline")
	variant.check(b, "variant")
	perQuery := func(d time.Duration, q overlayQuery) float64 { return float64(d) / float64(q.queries) }
	b.ReportMetric(perQuery(base.wall, base), "base-ns/q")
	b.ReportMetric(perQuery(variant.wall, variant), "ns/q")
	if base.cpu > 0 { // getrusage(2) answered
		b.ReportMetric(perQuery(base.cpu, base), "base-cpu-ns/q")
		b.ReportMetric(perQuery(variant.cpu, variant), "cpu-ns/q")
		b.ReportMetric(100*(float64(variant.cpu)/float64(base.cpu)-1), "cpu-extra-%")
	}
	ba, bb := base.allocs(b, ctx)
	va, vb := variant.allocs(b, ctx)
	b.ReportMetric(ba, "base-allocs/q")
	b.ReportMetric(va, "allocs/q")
	b.ReportMetric(va-ba, "allocs-extra/q")
	b.ReportMetric(bb, "base-B/q")
	b.ReportMetric(vb, "B/q")
}
