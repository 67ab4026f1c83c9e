package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// report is everything one run measured; it is printed as markdown
// and written as JSON.
type report struct {
	Info     runInfo         `json:"info"`
	Requests *requestsResult `json:"requests,omitempty"`
	Flush    *flushResult    `json:"flush,omitempty"`
	Purge    *purgeResult    `json:"purge,omitempty"`
	Targets  []target        `json:"targets"`
}

// target is one target of issue 5, judged on this run's figures.
type target struct {
	Target string `json:"target"`
	Value  string `json:"value"`
	Met    bool   `json:"met"`
}

func (r *report) failedChecks() []string {
	var failed []string
	if r.Requests != nil {
		for _, v := range r.Requests.Variants {
			if v.Check != "ok" {
				failed = append(failed, v.Name+": "+v.Check)
			}
		}
	}
	if r.Flush != nil && r.Flush.Check != "ok" {
		failed = append(failed, "flush: "+r.Flush.Check)
	}
	if r.Purge != nil && r.Purge.Check != "ok" {
		failed = append(failed, "purge: "+r.Purge.Check)
	}
	return failed
}

func (r *report) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("lastseen: bench: json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("lastseen: bench: --json: %w", err)
	}
	return nil
}

// fmtInt writes n with thousands separators.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, ch := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(ch)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtBytes writes a byte count in B, KiB or MiB.
func fmtBytes(n int64) string {
	switch a := max(n, -n); {
	case a >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case a >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// fmtDur writes a duration with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	case d >= time.Microsecond:
		return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
	}
	return fmt.Sprintf("%d ns", d)
}

// fmtRatio writes a ratio to per-request, with "1/x" when below 1.
func fmtRatio(r float64) string {
	switch {
	case r == 0:
		return "0"
	case r < 1:
		return fmt.Sprintf("%.4f (1/%.1f)", r, 1/r)
	}
	return fmt.Sprintf("%.2f", r)
}

func fmtRate(x float64) string { return fmtInt(int64(x + 0.5)) }

func (r *report) writeMarkdown(w io.Writer, c *Cmd) {
	in := r.Info
	fmt.Fprintf(w, "# lastseen bench %s\n\n", c.What)
	fmt.Fprintf(w, "%s; %s, %d CPUs (GOMAXPROCS %d), load average %s at the start and %s at the end; PostgreSQL %s; Redis %s; WAL attribution: %s.\n",
		in.Date, in.GoVersion, in.CPUs, in.GOMAXPROCS, in.LoadStart, in.LoadEnd, in.Postgres, in.Redis, in.WALInspect)
	if q := r.Requests; q != nil {
		writeRequests(w, q)
	}
	if f := r.Flush; f != nil {
		writeFlush(w, f)
	}
	if p := r.Purge; p != nil {
		writePurge(w, p)
	}
	if len(r.Targets) > 0 {
		fmt.Fprintf(w, "\n## Targets of issue 5 (judged on this run; reported, never asserted)\n\n| target | this run | met |\n|---|---|---|\n")
		for _, t := range r.Targets {
			met := "no"
			if t.Met {
				met = "yes"
			}
			fmt.Fprintf(w, "| %s | %s | %s |\n", t.Target, t.Value, met)
		}
	}
}

func writeRequests(w io.Writer, q *requestsResult) {
	fmt.Fprintf(w, "\n## Requests: %s requests from %s of %s users (Zipf s=%v, seed %d), %d workers, throttle window %s, touch timeout %s\n\n",
		fmtInt(int64(q.Requests)), fmtInt(int64(q.Distinct)), fmtInt(int64(q.Users)), q.Zipf, q.Seed, q.Workers, q.Throttle, q.Timeout)
	fmt.Fprint(w, "| |")
	for _, v := range q.Variants {
		fmt.Fprintf(w, " %s |", v.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range q.Variants {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w)
	row := func(label string, f func(v variant) string) {
		fmt.Fprintf(w, "| %s |", label)
		for _, v := range q.Variants {
			fmt.Fprintf(w, " %s |", f(v))
		}
		fmt.Fprintln(w)
	}
	flushOnly := func(f func(v variant) string) func(v variant) string {
		return func(v variant) string {
			if v.Name == "per-request" {
				return "-"
			}
			return f(v)
		}
	}
	row("requests/s", func(v variant) string { return fmtRate(v.RequestsPerSec) })
	row("tracking call p50", func(v variant) string { return fmtDur(v.P50) })
	row("tracking call p99", func(v variant) string { return fmtDur(v.P99) })
	row("p50 vs per-request", func(v variant) string { return fmtRatio(v.P50Ratio) })
	row("Redis commands/request (INFO commandstats)", func(v variant) string { return fmt.Sprintf("%.4f", v.RedisPerRequest) })
	row("Redis commands/request sent by the app", func(v variant) string { return fmt.Sprintf("%.4f", v.ClientPerRequest) })
	row("rows written (pg_stat_user_tables)", func(v variant) string { return fmtInt(v.RowsWritten) })
	row("rows written vs per-request", func(v variant) string { return fmtRatio(v.RowsRatio) })
	row("WAL bytes (pg_current_wal_lsn)", func(v variant) string { return fmtBytes(v.WALBytes) })
	row("WAL vs per-request", func(v variant) string { return fmtRatio(v.WALRatio) })
	row("WAL of the variant's own records (pg_walinspect)", func(v variant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return fmtBytes(v.OwnWALBytes)
	})
	row("own WAL vs per-request", func(v variant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return fmtRatio(v.OwnWALRatio)
	})
	row("dead tuples left", func(v variant) string { return fmtInt(v.DeadTuples) })
	row("flush wall time", flushOnly(func(v variant) string { return fmtDur(v.FlushWall) }))
	row("flush rows/s", flushOnly(func(v variant) string { return fmtRate(v.FlushRowsPerSec) }))
	row("tracking-call errors", func(v variant) string { return fmtInt(v.Errors) })
	row("touches kept in the in-process backlog", func(v variant) string {
		if v.Library == nil {
			return "-"
		}
		return fmtInt(v.Library.Backlogged)
	})
	row("check", func(v variant) string { return v.Check })
	for _, v := range q.Variants {
		if v.FirstError != "" {
			fmt.Fprintf(w, "\n%s: first tracking-call error: %s\n", v.Name, v.FirstError)
		}
		if v.CheckpointNote != "" {
			fmt.Fprintf(w, "\n%s: CHECKPOINT failed (%s): WAL figures include full-page writes unevenly\n", v.Name, v.CheckpointNote)
		}
	}
}

func writeFlush(w io.Writer, f *flushResult) {
	fmt.Fprintf(w, "\n## Flush: %s pending users into a %s-row table (%d shards, batches of %d)\n\n",
		fmtInt(int64(f.Users)), fmtInt(int64(f.Users)), f.Shards, f.BatchSize)
	sides := []flushSide{f.Raw, f.Lib, f.RawAfter}
	row := func(label string, cell func(i int, s flushSide) string) {
		fmt.Fprintf(w, "| %s |", label)
		for i, s := range sides {
			fmt.Fprintf(w, " %s |", cell(i, s))
		}
		fmt.Fprintln(w)
	}
	libOnly := func(v string) func(i int, s flushSide) string {
		return func(i int, _ flushSide) string {
			if i == 1 {
				return v
			}
			return "-"
		}
	}
	fmt.Fprintf(w, "| | raw bulk UPDATE before (pgx, no Redis) | lastseen Flush | raw bulk UPDATE after |\n|---|--:|--:|--:|\n")
	row("wall time", func(_ int, s flushSide) string { return fmtDur(s.Wall) })
	row("rows written", func(_ int, s flushSide) string { return fmtInt(s.Rows) })
	row("rows/s", func(_ int, s flushSide) string { return fmtRate(s.RowsPerSec) })
	row("vs raw (mean of before and after)", func(_ int, s flushSide) string {
		return fmt.Sprintf("%.2f", s.RowsPerSec/f.RawRowsPerSec)
	})
	row("UPDATE statements", func(_ int, s flushSide) string { return fmtInt(s.SQL.Writes) })
	row("time inside UPDATE statements", func(_ int, s flushSide) string {
		return fmt.Sprintf("%s (%.0f%%)", fmtDur(s.SQL.WriteTime), 100*s.SQL.WriteTime.Seconds()/s.Wall.Seconds())
	})
	row("longest UPDATE", func(_ int, s flushSide) string { return fmtDur(s.SQL.LongestWrite) })
	row("time waiting for Redis (round trips)", libOnly(fmt.Sprintf("%s (%.0f%%, %s)", fmtDur(f.Redis.Time),
		100*f.Redis.Time.Seconds()/f.Lib.Wall.Seconds(), fmtInt(f.Redis.RoundTrips))))
	row("peak heap growth (heap objects, incl. garbage)", libOnly(fmtBytes(f.Heap.PeakHeapGrowth)))
	row("peak live heap growth (after GC mark)", libOnly(fmtBytes(f.Heap.PeakLiveGrowth)))
	row("allocated during the flush / GC cycles", libOnly(fmt.Sprintf("%s / %d", fmtBytes(f.Heap.Allocated), f.Heap.GCCycles)))
	row("check", libOnly(f.Check))
	fmt.Fprintf(w, "\nThe pending hashes were filled directly with HSET pipelines (%s), not by %s Touch calls.\n",
		fmtDur(f.FillWall), fmtInt(int64(f.Users)))
}

func writePurge(w io.Writer, p *purgeResult) {
	pause := p.Pause
	if pause == "0s" {
		pause = "no pause"
	}
	fmt.Fprintf(w, "\n## Purge: %s expired + %s live sessions (batches of %d, %s)\n\n",
		fmtInt(int64(p.Expired)), fmtInt(int64(p.Live)), p.BatchSize, pause)
	fmt.Fprintf(w, "| deleted | wall time | rows/s | batches | longest batch transaction | mean batch transaction | in transactions / id reads / Redis | peak heap growth | live left | check |\n")
	fmt.Fprintf(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	mean := time.Duration(0)
	if p.SQL.Txs > 0 {
		mean = p.SQL.TxTime / time.Duration(p.SQL.Txs)
	}
	fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s / %s / %s | %s | %s of %s | %s |\n",
		fmtInt(int64(p.Result.Deleted)), fmtDur(p.Wall), fmtRate(p.RowsPerSec), p.Result.Batches,
		fmtDur(p.SQL.LongestTx), fmtDur(mean), fmtDur(p.SQL.TxTime), fmtDur(p.SQL.ReadTime), fmtDur(p.Redis.Time),
		fmtBytes(p.Heap.PeakHeapGrowth), fmtInt(p.LiveLeft), fmtInt(int64(p.Live)), p.Check)
}

// targets judges issue 5's targets on the figures this run has.
func (r *report) targets() []target {
	var t []target
	add := func(goal, value string, met bool) { t = append(t, target{goal, value, met}) }
	if q := r.Requests; q != nil && len(q.Variants) == 4 {
		local := q.Variants[3]
		fewer := func(ratio float64) float64 {
			if ratio == 0 {
				return 0
			}
			return 1 / ratio
		}
		add("lastseen+local writes >= 40x fewer rows than per-request",
			fmt.Sprintf("%.1fx", fewer(local.RowsRatio)), local.RowsRatio > 0 && fewer(local.RowsRatio) >= 40)
		add("lastseen+local writes >= 20x fewer WAL bytes (pg_current_wal_lsn)",
			fmt.Sprintf("%.1fx", fewer(local.WALRatio)), local.WALRatio > 0 && fewer(local.WALRatio) >= 20)
		if local.OwnWAL {
			add("  same, counting only each variant's own WAL records (pg_walinspect)",
				fmt.Sprintf("%.1fx", fewer(local.OwnWALRatio)), local.OwnWALRatio > 0 && fewer(local.OwnWALRatio) >= 20)
		}
		add("lastseen+local sends <= 0.05 Redis commands/request (INFO commandstats, counts commands run inside Lua scripts)",
			fmt.Sprintf("%.4f", local.RedisPerRequest), local.RedisPerRequest <= 0.05)
		add("  same, commands sent by the app (one EVALSHA counts once)",
			fmt.Sprintf("%.4f", local.ClientPerRequest), local.ClientPerRequest <= 0.05)
	}
	if f := r.Flush; f != nil {
		add("flush >= 150,000 rows/s", fmtRate(f.Lib.RowsPerSec), f.Lib.RowsPerSec >= 150_000)
		add("flush >= 0.7 of the raw bulk UPDATE rate (mean of the runs before and after)", fmt.Sprintf("%.2f", f.Ratio), f.Ratio >= 0.7)
		add("flush heap growth < 64 MiB", fmtBytes(f.Heap.PeakHeapGrowth), f.Heap.PeakHeapGrowth < 64<<20)
	}
	if p := r.Purge; p != nil {
		add("purge >= 100,000 rows/s", fmtRate(p.RowsPerSec), p.RowsPerSec >= 100_000)
		add("purge: no batch transaction over 200 ms", fmtDur(p.SQL.LongestTx), p.SQL.LongestTx <= 200*time.Millisecond)
	}
	return t
}
