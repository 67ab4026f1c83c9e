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
	Scale    []scaleRun      `json:"requests_scale,omitempty"`
	Flush    *flushResult    `json:"flush,omitempty"`
	Purge    *purgeResult    `json:"purge,omitempty"`
	Replica  *replicaResult  `json:"replica,omitempty"`
	Targets  []target        `json:"targets"`
}

// target is one published target, judged on this run's figures.
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
	if r.Requests != nil && r.Requests.Touch != nil {
		for _, v := range r.Requests.Touch.Variants {
			if v.Requests != r.Requests.Requests {
				failed = append(failed, fmt.Sprintf("touch %s: %d calls, want %d", v.Name, v.Requests, r.Requests.Requests))
			}
		}
	}
	for _, s := range r.Scale {
		if s.Variant.Check != "ok" {
			failed = append(failed, fmt.Sprintf("scale %d: %s", s.Users, s.Variant.Check))
		}
	}
	if r.Flush != nil {
		for _, f := range r.Flush.Runs {
			if f.Check != "ok" {
				failed = append(failed, fmt.Sprintf("flush %d %s: %s", f.Users, f.Schema, f.Check))
			}
		}
	}
	if r.Purge != nil && r.Purge.Check != "ok" {
		failed = append(failed, "purge: "+r.Purge.Check)
	}
	if r.Replica != nil {
		for _, v := range r.Replica.Variants {
			if v.Check != "ok" {
				failed = append(failed, "replica "+v.Name+": "+v.Check)
			}
			if v.StandbyCheck != "ok" && v.StandbyCheck != "not checked: no --replica-standby" {
				failed = append(failed, "replica "+v.Name+": "+v.StandbyCheck)
			}
		}
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
		if q.Touch != nil {
			writeTouch(w, q.Touch) // requests_touch.go
		}
	}
	if len(r.Scale) > 0 {
		writeScale(w, r.Scale)
	}
	if f := r.Flush; f != nil {
		writeFlush(w, f)
	}
	if p := r.Purge; p != nil {
		writePurge(w, p)
	}
	if q := r.Replica; q != nil {
		writeReplica(w, q) // replica.go
	}
	if len(r.Targets) > 0 {
		fmt.Fprintf(w, "\n## Targets (judged on this run; reported, never asserted)\n\n| target | this run | met |\n|---|---|---|\n")
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
	writeVariantTable(w, q.Variants, requestRows)
	for _, v := range q.Variants {
		if v.FirstError != "" {
			fmt.Fprintf(w, "\n%s: first tracking-call error: %s\n", v.Name, v.FirstError)
		}
		if v.CheckpointNote != "" {
			fmt.Fprintf(w, "\n%s: CHECKPOINT failed (%s): WAL figures include full-page writes unevenly\n", v.Name, v.CheckpointNote)
		}
	}
}

// requestRows are the rows of the requests table, one cell per variant.
// variantRow is one row of a table with a column per variant: its label
// and how to print a variant's cell.
type variantRow struct {
	label string
	cell  func(v variant) string
}

// writeVariantTable prints a markdown table with a column per variant and
// a line per row.
func writeVariantTable(w io.Writer, variants []variant, rows []variantRow) {
	fmt.Fprint(w, "| |")
	for _, v := range variants {
		fmt.Fprintf(w, " %s |", v.Name)
	}
	fmt.Fprint(w, "\n|---|")
	for range variants {
		fmt.Fprint(w, "--:|")
	}
	fmt.Fprintln(w)
	for _, r := range rows {
		fmt.Fprintf(w, "| %s |", r.label)
		for _, v := range variants {
			fmt.Fprintf(w, " %s |", r.cell(v))
		}
		fmt.Fprintln(w)
	}
}

var requestRows = []variantRow{
	{"requests/s", func(v variant) string { return fmtRate(v.RequestsPerSec) }},
	{"tracking call p50", func(v variant) string { return fmtDur(v.P50) }},
	{"tracking call p99", func(v variant) string { return fmtDur(v.P99) }},
	{"p50 vs per-request", func(v variant) string { return fmtRatio(v.P50Ratio) }},
	{"Redis commands/request (INFO commandstats)", func(v variant) string { return fmt.Sprintf("%.4f", v.RedisPerRequest) }},
	{"Redis commands/request sent by the app", func(v variant) string { return fmt.Sprintf("%.4f", v.ClientPerRequest) }},
	{"rows written (pg_stat_user_tables)", func(v variant) string { return fmtInt(v.RowsWritten) }},
	{"rows written vs per-request", func(v variant) string { return fmtRatio(v.RowsRatio) }},
	{"WAL bytes (pg_current_wal_lsn)", func(v variant) string { return fmtBytes(v.WALBytes) }},
	{"WAL vs per-request", func(v variant) string { return fmtRatio(v.WALRatio) }},
	{"WAL of the variant's own records (pg_walinspect)", func(v variant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return fmtBytes(v.OwnWALBytes)
	}},
	{"own WAL vs per-request", func(v variant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return fmtRatio(v.OwnWALRatio)
	}},
	{"dead tuples left", func(v variant) string { return fmtInt(v.DeadTuples) }},
	{"flush wall time", flushOnly(func(v variant) string { return fmtDur(v.FlushWall) })},
	{"flush rows/s", flushOnly(func(v variant) string { return fmtRate(v.FlushRowsPerSec) })},
	{"tracking-call errors", func(v variant) string { return fmtInt(v.Errors) }},
	{"touches kept in the in-process backlog", func(v variant) string {
		if v.Library == nil {
			return "-"
		}
		return fmtInt(v.Library.Backlogged)
	}},
	{"check", func(v variant) string { return v.Check }},
}

// flushOnly shows f's cell for the buffering variants and "-" for the
// per-request one, which has no flush.
func flushOnly(f func(v variant) string) func(v variant) string {
	return func(v variant) string {
		if v.Name == "per-request" {
			return "-"
		}
		return f(v)
	}
}

func writePurge(w io.Writer, p *purgeResult) {
	pause := p.Pause
	if pause == "0s" {
		pause = "no pause"
	}
	fmt.Fprintf(w, "\n## Purge: %s expired + %s live sessions (batches of %d, %s)\n\n",
		fmtInt(int64(p.Expired)), fmtInt(int64(p.Live)), p.BatchSize, pause)
	fmt.Fprintf(w, "| | raw DELETE loop before | raw keyset loop before | lastseen PurgeExpiredSessions | raw keyset loop after | raw DELETE loop after |\n|---|--:|--:|--:|--:|--:|\n")
	raws := []rawPurge{p.RawBefore, p.KeysetBefore, {}, p.KeysetAfter, p.RawAfter}
	row := func(label, lib string, cell func(r rawPurge) string) {
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", label, cell(raws[0]), cell(raws[1]), lib, cell(raws[3]), cell(raws[4]))
	}
	row("deleted", fmtInt(int64(p.Result.Deleted)), func(r rawPurge) string { return fmtInt(r.Deleted) })
	row("wall time", fmtDur(p.Wall), func(r rawPurge) string { return fmtDur(r.Wall) })
	row("rows/s", fmtRate(p.RowsPerSec), func(r rawPurge) string { return fmtRate(r.RowsPerSec) })
	row("vs the raw DELETE loop (mean of before and after)", fmt.Sprintf("%.2f", p.Ratio), func(r rawPurge) string { return fmt.Sprintf("%.2f", ratio(r.RowsPerSec, p.RawLimit)) })
	row("vs the raw keyset loop (mean of before and after)", fmt.Sprintf("%.2f", p.KeysetRatio), func(r rawPurge) string { return fmt.Sprintf("%.2f", ratio(r.RowsPerSec, p.KeysetLimit)) })
	row("statements / batches", strconv.Itoa(p.Result.Batches), func(r rawPurge) string { return strconv.Itoa(r.Statements) })
	mean := time.Duration(0)
	if p.SQL.Txs > 0 {
		mean = p.SQL.TxTime / time.Duration(p.SQL.Txs)
	}
	libOnly := func(label, v string) { fmt.Fprintf(w, "| %s | - | - | %s | - | - |\n", label, v) }
	libOnly("longest / mean batch transaction", fmtDur(p.SQL.LongestTx)+" / "+fmtDur(mean))
	libOnly("in transactions / id reads / Redis", fmtDur(p.SQL.TxTime)+" / "+fmtDur(p.SQL.ReadTime)+" / "+fmtDur(p.Redis.Time))
	libOnly("peak heap growth", fmtBytes(p.Heap.PeakHeapGrowth))
	libOnly("live left / check", fmtInt(p.LiveLeft)+" of "+fmtInt(int64(p.Live))+" / "+p.Check)
}

// targets judges the published targets on the figures this run has.
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
	if q := r.Requests; q != nil && q.Touch != nil {
		t = append(t, q.Touch.targets()...)
	}
	if r.Flush != nil {
		t = append(t, r.Flush.targets()...)
	}
	if r.Replica != nil {
		t = append(t, r.Replica.targets()...)
	}
	if p := r.Purge; p != nil {
		add("purge >= 100,000 rows/s", fmtRate(p.RowsPerSec), p.RowsPerSec >= 100_000)
		add("purge >= 0.8 of the raw DELETE loop (mean of before and after)", fmt.Sprintf("%.2f", p.Ratio), p.Ratio >= 0.8)
		add("  same, against the raw keyset loop (id > last deleted)", fmt.Sprintf("%.2f", p.KeysetRatio), p.KeysetRatio >= 0.8)
		add("purge: no batch transaction over 200 ms", fmtDur(p.SQL.LongestTx), p.SQL.LongestTx <= 200*time.Millisecond)
	}
	return t
}
