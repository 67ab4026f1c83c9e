package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// benchReport is everything one run measured; it is printed as markdown
// and written as JSON.
type benchReport struct {
	Info     benchInfo      `json:"info"`
	Requests *benchRequests `json:"requests,omitempty"`
	Flush    *benchFlush    `json:"flush,omitempty"`
	Purge    *benchPurge    `json:"purge,omitempty"`
	Targets  []benchTarget  `json:"targets"`
}

// benchTarget is one target of issue 5, judged on this run's figures.
type benchTarget struct {
	Target string `json:"target"`
	Value  string `json:"value"`
	Met    bool   `json:"met"`
}

func (r *benchReport) failedChecks() []string {
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

func (r *benchReport) writeJSON(path string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("lastseen: bench: json: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("lastseen: bench: --json: %w", err)
	}
	return nil
}

// benchInt writes n with thousands separators.
func benchInt(n int64) string {
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

// benchBytes writes a byte count in B, KiB or MiB.
func benchBytes(n int64) string {
	switch a := max(n, -n); {
	case a >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case a >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// benchDur writes a duration with three significant digits.
func benchDur(d time.Duration) string {
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

// benchRatioText writes a ratio to per-request, with "1/x" when below 1.
func benchRatioText(r float64) string {
	switch {
	case r == 0:
		return "0"
	case r < 1:
		return fmt.Sprintf("%.4f (1/%.1f)", r, 1/r)
	}
	return fmt.Sprintf("%.2f", r)
}

func benchRate(x float64) string { return benchInt(int64(x + 0.5)) }

func (r *benchReport) writeMarkdown(w io.Writer, c *benchCmd) {
	in := r.Info
	fmt.Fprintf(w, "# lastseen bench %s\n\n", c.What)
	fmt.Fprintf(w, "%s; %s, %d CPUs (GOMAXPROCS %d), load average %s at the start and %s at the end; PostgreSQL %s; Redis %s; WAL attribution: %s.\n",
		in.Date, in.GoVersion, in.CPUs, in.GOMAXPROCS, in.LoadStart, in.LoadEnd, in.Postgres, in.Redis, in.WALInspect)
	if q := r.Requests; q != nil {
		writeBenchRequests(w, q)
	}
	if f := r.Flush; f != nil {
		writeBenchFlush(w, f)
	}
	if p := r.Purge; p != nil {
		writeBenchPurge(w, p)
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

func writeBenchRequests(w io.Writer, q *benchRequests) {
	fmt.Fprintf(w, "\n## Requests: %s requests from %s of %s users (Zipf s=%v, seed %d), %d workers, throttle window %s, touch timeout %s\n\n",
		benchInt(int64(q.Requests)), benchInt(int64(q.Distinct)), benchInt(int64(q.Users)), q.Zipf, q.Seed, q.Workers, q.Throttle, q.Timeout)
	fmt.Fprint(w, "| |")
	for _, v := range q.Variants {
		fmt.Fprintf(w, " %s |", v.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range q.Variants {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w)
	row := func(label string, f func(v benchVariant) string) {
		fmt.Fprintf(w, "| %s |", label)
		for _, v := range q.Variants {
			fmt.Fprintf(w, " %s |", f(v))
		}
		fmt.Fprintln(w)
	}
	flushOnly := func(f func(v benchVariant) string) func(v benchVariant) string {
		return func(v benchVariant) string {
			if v.Name == "per-request" {
				return "-"
			}
			return f(v)
		}
	}
	row("requests/s", func(v benchVariant) string { return benchRate(v.RequestsPerSec) })
	row("tracking call p50", func(v benchVariant) string { return benchDur(v.P50) })
	row("tracking call p99", func(v benchVariant) string { return benchDur(v.P99) })
	row("p50 vs per-request", func(v benchVariant) string { return benchRatioText(v.P50Ratio) })
	row("Redis commands/request (INFO commandstats)", func(v benchVariant) string { return fmt.Sprintf("%.4f", v.RedisPerRequest) })
	row("Redis commands/request sent by the app", func(v benchVariant) string { return fmt.Sprintf("%.4f", v.ClientPerRequest) })
	row("rows written (pg_stat_user_tables)", func(v benchVariant) string { return benchInt(v.RowsWritten) })
	row("rows written vs per-request", func(v benchVariant) string { return benchRatioText(v.RowsRatio) })
	row("WAL bytes (pg_current_wal_lsn)", func(v benchVariant) string { return benchBytes(v.WALBytes) })
	row("WAL vs per-request", func(v benchVariant) string { return benchRatioText(v.WALRatio) })
	row("WAL of the variant's own records (pg_walinspect)", func(v benchVariant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return benchBytes(v.OwnWALBytes)
	})
	row("own WAL vs per-request", func(v benchVariant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return benchRatioText(v.OwnWALRatio)
	})
	row("dead tuples left", func(v benchVariant) string { return benchInt(v.DeadTuples) })
	row("flush wall time", flushOnly(func(v benchVariant) string { return benchDur(v.FlushWall) }))
	row("flush rows/s", flushOnly(func(v benchVariant) string { return benchRate(v.FlushRowsPerSec) }))
	row("tracking-call errors", func(v benchVariant) string { return benchInt(v.Errors) })
	row("touches kept in the in-process backlog", func(v benchVariant) string {
		if v.Library == nil {
			return "-"
		}
		return benchInt(v.Library.Backlogged)
	})
	row("check", func(v benchVariant) string { return v.Check })
	for _, v := range q.Variants {
		if v.FirstError != "" {
			fmt.Fprintf(w, "\n%s: first tracking-call error: %s\n", v.Name, v.FirstError)
		}
		if v.CheckpointNote != "" {
			fmt.Fprintf(w, "\n%s: CHECKPOINT failed (%s): WAL figures include full-page writes unevenly\n", v.Name, v.CheckpointNote)
		}
	}
}

func writeBenchFlush(w io.Writer, f *benchFlush) {
	fmt.Fprintf(w, "\n## Flush: %s pending users into a %s-row table (%d shards, batches of %d)\n\n",
		benchInt(int64(f.Users)), benchInt(int64(f.Users)), f.Shards, f.BatchSize)
	sides := []benchFlushSide{f.Raw, f.Lib, f.RawAfter}
	row := func(label string, cell func(i int, s benchFlushSide) string) {
		fmt.Fprintf(w, "| %s |", label)
		for i, s := range sides {
			fmt.Fprintf(w, " %s |", cell(i, s))
		}
		fmt.Fprintln(w)
	}
	libOnly := func(v string) func(i int, s benchFlushSide) string {
		return func(i int, _ benchFlushSide) string {
			if i == 1 {
				return v
			}
			return "-"
		}
	}
	fmt.Fprintf(w, "| | raw bulk UPDATE before (pgx, no Redis) | lastseen Flush | raw bulk UPDATE after |\n|---|--:|--:|--:|\n")
	row("wall time", func(_ int, s benchFlushSide) string { return benchDur(s.Wall) })
	row("rows written", func(_ int, s benchFlushSide) string { return benchInt(s.Rows) })
	row("rows/s", func(_ int, s benchFlushSide) string { return benchRate(s.RowsPerSec) })
	row("vs raw (mean of before and after)", func(_ int, s benchFlushSide) string {
		return fmt.Sprintf("%.2f", s.RowsPerSec/f.RawRowsPerSec)
	})
	row("UPDATE statements", func(_ int, s benchFlushSide) string { return benchInt(s.SQL.Writes) })
	row("time inside UPDATE statements", func(_ int, s benchFlushSide) string {
		return fmt.Sprintf("%s (%.0f%%)", benchDur(s.SQL.WriteTime), 100*s.SQL.WriteTime.Seconds()/s.Wall.Seconds())
	})
	row("longest UPDATE", func(_ int, s benchFlushSide) string { return benchDur(s.SQL.LongestWrite) })
	row("time waiting for Redis (round trips)", libOnly(fmt.Sprintf("%s (%.0f%%, %s)", benchDur(f.Redis.Time),
		100*f.Redis.Time.Seconds()/f.Lib.Wall.Seconds(), benchInt(f.Redis.RoundTrips))))
	row("peak heap growth (heap objects, incl. garbage)", libOnly(benchBytes(f.Heap.PeakHeapGrowth)))
	row("peak live heap growth (after GC mark)", libOnly(benchBytes(f.Heap.PeakLiveGrowth)))
	row("allocated during the flush / GC cycles", libOnly(fmt.Sprintf("%s / %d", benchBytes(f.Heap.Allocated), f.Heap.GCCycles)))
	row("check", libOnly(f.Check))
	fmt.Fprintf(w, "\nThe pending hashes were filled directly with HSET pipelines (%s), not by %s Touch calls.\n",
		benchDur(f.FillWall), benchInt(int64(f.Users)))
}

func writeBenchPurge(w io.Writer, p *benchPurge) {
	pause := p.Pause
	if pause == "0s" {
		pause = "no pause"
	}
	fmt.Fprintf(w, "\n## Purge: %s expired + %s live sessions (batches of %d, %s)\n\n",
		benchInt(int64(p.Expired)), benchInt(int64(p.Live)), p.BatchSize, pause)
	fmt.Fprintf(w, "| deleted | wall time | rows/s | batches | longest batch transaction | mean batch transaction | in transactions / id reads / Redis | peak heap growth | live left | check |\n")
	fmt.Fprintf(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	mean := time.Duration(0)
	if p.SQL.Txs > 0 {
		mean = p.SQL.TxTime / time.Duration(p.SQL.Txs)
	}
	fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %s | %s / %s / %s | %s | %s of %s | %s |\n",
		benchInt(int64(p.Result.Deleted)), benchDur(p.Wall), benchRate(p.RowsPerSec), p.Result.Batches,
		benchDur(p.SQL.LongestTx), benchDur(mean), benchDur(p.SQL.TxTime), benchDur(p.SQL.ReadTime), benchDur(p.Redis.Time),
		benchBytes(p.Heap.PeakHeapGrowth), benchInt(p.LiveLeft), benchInt(int64(p.Live)), p.Check)
}

// targets judges issue 5's targets on the figures this run has.
func (r *benchReport) targets() []benchTarget {
	var t []benchTarget
	add := func(target, value string, met bool) { t = append(t, benchTarget{target, value, met}) }
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
		add("flush >= 150,000 rows/s", benchRate(f.Lib.RowsPerSec), f.Lib.RowsPerSec >= 150_000)
		add("flush >= 0.7 of the raw bulk UPDATE rate (mean of the runs before and after)", fmt.Sprintf("%.2f", f.Ratio), f.Ratio >= 0.7)
		add("flush heap growth < 64 MiB", benchBytes(f.Heap.PeakHeapGrowth), f.Heap.PeakHeapGrowth < 64<<20)
	}
	if p := r.Purge; p != nil {
		add("purge >= 100,000 rows/s", benchRate(p.RowsPerSec), p.RowsPerSec >= 100_000)
		add("purge: no batch transaction over 200 ms", benchDur(p.SQL.LongestTx), p.SQL.LongestTx <= 200*time.Millisecond)
	}
	return t
}
