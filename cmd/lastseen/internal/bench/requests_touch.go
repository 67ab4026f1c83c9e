package bench

import (
	"context"
	"fmt"
	"io"
	"runtime/metrics"
	"time"

	"github.com/redis/go-redis/v9"
)

// touchRounds is the number of slices the interleaved tracking-call
// comparison cuts the request stream into.
const touchRounds = 20

// touchResult is the tracking call of the seed design against lastseen
// without its local cache, measured in the same run and
// interleaved: the stream is cut into Rounds slices, and each slice is
// replayed by both designs one after the other (seed first in even rounds,
// lastseen first in odd ones), on the same Redis client and the same
// number of workers, so that a change of load on the machine falls on
// both. Each design's latencies are pooled over its rounds.
type touchResult struct {
	Rounds   int            `json:"rounds"`
	Workers  int            `json:"workers"`
	Variants []touchVariant `json:"variants"` // seed, lastseen
	P50Ratio float64        `json:"p50_lastseen_vs_seed"`
	P99Ratio float64        `json:"p99_lastseen_vs_seed"`
}

// touchVariant is one design's pooled figures in touchResult.
type touchVariant struct {
	Name       string        `json:"name"`
	Requests   int           `json:"requests"`
	P50        time.Duration `json:"p50_ns"`
	P99        time.Duration `json:"p99_ns"`
	Max        time.Duration `json:"max_ns"`
	Errors     int64         `json:"errors"`
	FirstError string        `json:"first_error,omitempty"`
	// Goroutines is the goroutines the runtime started during the
	// variant's slices (runtime/metrics /sched/goroutines-created), less
	// the replay's own workers; -1 when the runtime does not report it.
	Goroutines int64 `json:"goroutines_started"`
	// Dials is how many of them go-redis started to dial a new connection
	// of the shared client's pool (PoolStats.Misses: one per connection,
	// not per call).
	Dials int64 `json:"pool_dials"`
	// GoroutinesPerCall is (Goroutines - Dials) / Requests: what the
	// tracking call itself starts.
	GoroutinesPerCall float64 `json:"goroutines_per_call"`
}

// runTouch measures touchResult on st: the seed design and lastseen
// without its local cache each on a Redis key prefix of their own (and
// lastseen on a users table of its own, which it never writes: there is no
// flush).
func (e *env) runTouch(ctx context.Context, st stream) (*touchResult, error) {
	c := e.cmd
	db, pool, err := e.openPool(ctx, "touch_", c.Workers+2)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if _, err := e.createUsers(ctx, db, st.users, time.Now().Add(-24*time.Hour), tableSchema{}); err != nil {
		return nil, err
	}
	p := e.prefix + "-touch-seed"
	seed := &seedDesign{rdb: e.rdb, db: db, marker: p + ":seen:", pending: p + ":pending", throttle: c.Throttle, ids: st.ids}
	ls, err := e.openLastseen(db, e.prefix+"-touch-lastseen", -1, st.boxed)
	if err != nil {
		return nil, err
	}
	defer ls.close(context.WithoutCancel(ctx))
	if err := e.warmRedis(ctx, c.Workers); err != nil {
		return nil, err
	}
	c.progress("touch: seed and lastseen (no local cache), %d requests each in %d interleaved rounds", len(st.ids), touchRounds)
	res := &touchResult{Rounds: touchRounds, Workers: c.Workers}
	designs := []design{seed, ls}
	runs := []*touchRun{{name: "seed"}, {name: "lastseen"}}
	n := len(st.ids)
	for r := range touchRounds {
		from, to := r*n/touchRounds, (r+1)*n/touchRounds
		for k := range designs {
			i := (k + r) % 2 // seed first in even rounds, lastseen first in odd ones
			runs[i].slice(ctx, designs[i], from, to, c.Workers, e.rdb.PoolStats)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
	}
	for _, run := range runs {
		res.Variants = append(res.Variants, run.result())
	}
	s, l := res.Variants[0], res.Variants[1]
	res.P50Ratio, res.P99Ratio = ratio(float64(l.P50), float64(s.P50)), ratio(float64(l.P99), float64(s.P99))
	c.progress("touch: p50 seed %v lastseen %v (%.2f), p99 seed %v lastseen %v (%.2f), goroutines per call %.3f / %.3f",
		s.P50, l.P50, res.P50Ratio, s.P99, l.P99, res.P99Ratio, s.GoroutinesPerCall, l.GoroutinesPerCall)
	return res, nil
}

// touchRun gathers one design's rounds of runTouch.
type touchRun struct {
	name       string
	lat        [][]time.Duration
	errs       int64
	first      error
	goroutines int64
	dials      int64
	noMetric   bool
}

// slice replays requests from..to-1 through d with workers goroutines;
// pool reads the Redis client's pool counters.
func (t *touchRun) slice(ctx context.Context, d design, from, to, workers int, pool func() *redis.PoolStats) {
	m0 := pool().Misses
	g0, ok := goroutinesCreated()
	lat, errs, first := replayRange(ctx, d, from, to, workers)
	g1, _ := goroutinesCreated()
	t.dials += int64(pool().Misses - m0)
	t.noMetric = t.noMetric || !ok
	t.goroutines += int64(g1-g0) - int64(workers)
	t.lat = append(t.lat, lat)
	t.errs += errs
	if t.first == nil {
		t.first = first
	}
}

func (t *touchRun) result() touchVariant {
	lat := sortedDurations(t.lat)
	v := touchVariant{Name: t.name, Requests: len(lat), Errors: t.errs, Goroutines: t.goroutines, Dials: t.dials}
	if len(lat) > 0 {
		v.P50, v.P99, v.Max = percentile(lat, 50), percentile(lat, 99), lat[len(lat)-1]
	}
	if t.first != nil {
		v.FirstError = t.first.Error()
	}
	if t.noMetric {
		v.Goroutines = -1
	}
	v.GoroutinesPerCall = ratio(float64(v.Goroutines-v.Dials), float64(v.Requests))
	return v
}

// goroutinesCreated reads runtime/metrics /sched/goroutines-created; ok is
// false when the runtime does not have it (before Go 1.26).
func goroutinesCreated() (n uint64, ok bool) {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindUint64 {
		return 0, false
	}
	return s[0].Value.Uint64(), true
}

func writeTouch(w io.Writer, t *touchResult) {
	fmt.Fprintf(w, "\n## Tracking call: seed against lastseen without its local cache, interleaved (%d rounds, %d workers)\n\n", t.Rounds, t.Workers)
	fmt.Fprint(w, "| | seed | lastseen (no local cache) | lastseen / seed |\n|---|--:|--:|--:|\n")
	s, l := t.Variants[0], t.Variants[1]
	fmt.Fprintf(w, "| calls | %s | %s | |\n", fmtInt(int64(s.Requests)), fmtInt(int64(l.Requests)))
	fmt.Fprintf(w, "| p50 | %s | %s | %.2f |\n", fmtDur(s.P50), fmtDur(l.P50), t.P50Ratio)
	fmt.Fprintf(w, "| p99 | %s | %s | %.2f |\n", fmtDur(s.P99), fmtDur(l.P99), t.P99Ratio)
	fmt.Fprintf(w, "| max | %s | %s | |\n", fmtDur(s.Max), fmtDur(l.Max))
	gr := func(v touchVariant) string {
		if v.Goroutines < 0 {
			return "n/a"
		}
		return fmt.Sprintf("%.3f (%s started, %s of them pool dials)", v.GoroutinesPerCall, fmtInt(v.Goroutines), fmtInt(v.Dials))
	}
	fmt.Fprintf(w, "| goroutines started per call, less go-redis's dials of new connections | %s | %s | |\n", gr(s), gr(l))
	fmt.Fprintf(w, "| errors | %s | %s | |\n", fmtInt(s.Errors), fmtInt(l.Errors))
	for _, v := range t.Variants {
		if v.FirstError != "" {
			fmt.Fprintf(w, "\n%s: first tracking-call error: %s\n", v.Name, v.FirstError)
		}
	}
}

// touchTargets judges the uncached-touch target on t.
func (t *touchResult) targets() []target {
	s, l := t.Variants[0], t.Variants[1]
	return []target{
		{"lastseen without its local cache: tracking call p50 and p99 <= the seed's (interleaved rounds, no errors)",
			fmt.Sprintf("p50 %.2f, p99 %.2f of the seed's; errors %d / %d", t.P50Ratio, t.P99Ratio, s.Errors, l.Errors),
			l.P50 <= s.P50 && l.P99 <= s.P99 && s.Errors == 0 && l.Errors == 0},
		// A goroutine per touch reads 1.000; the process's own background
		// work (the plugin's jobs, timers that fire) starts a few per run.
		{"  0 goroutines started per uncached touch (under 1 per 1,000 calls)",
			fmt.Sprintf("%.5f (%d started, %d of them go-redis dials of new connections)", l.GoroutinesPerCall, l.Goroutines, l.Dials),
			l.Goroutines >= 0 && l.GoroutinesPerCall < 0.001},
	}
}
