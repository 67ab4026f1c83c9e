package bench

import (
	"fmt"
	"io"
	"strings"
)

func writeFlush(w io.Writer, f *flushResult) {
	fmt.Fprintf(w, "\n## Flush: %d connections for lastseen (FlushConcurrency) and for the raw limit, %d shards, batches of %d\n\n",
		f.Concurrency, f.Shards, f.BatchSize)
	fmt.Fprint(w, "| users | schema | raw unnest rows/s | raw COPY rows/s | raw limit rows/s (method: before, after) | lastseen rows/s | lastseen vs raw limit | "+
		"HOT share lastseen / raw | Redis command time (share of wall, round trips; the prefetched HSCAN overlaps the UPDATEs) | time in UPDATEs | peak heap growth | heap bytes per user | allocated per user | check |\n")
	fmt.Fprint(w, "|--:|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range f.Runs {
		best := r.RawUnnest
		if r.RawMethod == "copy" {
			best = r.RawCopy
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s (%s: %s, %s) | %s | %.2f | %.0f%% / %.0f%% | %s (%.0f%%, %s) | %s (%.0f%%) | %s | %.1f B | %.0f B | %s |\n",
			fmtInt(int64(r.Users)), r.Schema, fmtRate(r.RawUnnest.RowsPerSec), fmtRate(r.RawCopy.RowsPerSec),
			fmtRate(r.RawRowsPerSec), r.RawMethod, fmtRate(best.RowsPerSec), fmtRate(r.RawAfter.RowsPerSec),
			fmtRate(r.Lib.RowsPerSec), r.Ratio, 100*r.Lib.hotShare(), 100*best.hotShare(),
			fmtDur(r.Redis.Time), 100*r.Redis.Time.Seconds()/r.Lib.Wall.Seconds(), fmtInt(r.Redis.RoundTrips),
			fmtDur(r.Lib.SQL.WriteTime), 100*r.Lib.SQL.WriteTime.Seconds()/r.Lib.Wall.Seconds(),
			fmtBytes(r.Heap.PeakHeapGrowth), r.BytesPerUser, float64(r.Heap.Allocated)/float64(r.Users), r.Check)
	}
	writeFlushCPU(w, f)
	for _, n := range f.sizes() {
		plain, ok := f.run(n, "plain")
		if !ok {
			continue
		}
		var parts []string
		for _, r := range f.Runs {
			if r.Users == n && r.Schema != "plain" {
				parts = append(parts, fmt.Sprintf("%s %.2f× (raw limit %.2f×)", r.Schema,
					ratio(r.Lib.RowsPerSec, plain.Lib.RowsPerSec), ratio(r.RawRowsPerSec, plain.RawRowsPerSec)))
			}
		}
		if len(parts) > 0 {
			fmt.Fprintf(w, "\nSchemas at %s users, lastseen rows/s against plain (no index on last_seen_at): %s.\n", fmtInt(int64(n)), strings.Join(parts, "; "))
		}
	}
	fmt.Fprintf(w, "\nThe throttle windows' hashes were filled directly with HSET pipelines, as Touch calls leave them (the flush moves them to pending). "+
		"Raw: the same batches sorted by id, no Redis; unnest = one prepared UPDATE ... FROM unnest(ids, times) per batch, "+
		"COPY = per batch COPY into a temporary table and one UPDATE ... FROM it, in one transaction.\n")
}

// sizes are the distinct sizes of the runs, in order.
func (f *flushResult) sizes() []int {
	var out []int
	for _, r := range f.Runs {
		if len(out) == 0 || out[len(out)-1] != r.Users {
			out = append(out, r.Users)
		}
	}
	return out
}

func (f *flushResult) run(users int, schema string) (flushRun, bool) {
	for _, r := range f.Runs {
		if r.Users == users && r.Schema == schema {
			return r, true
		}
	}
	return flushRun{}, false
}

// targets judges the flush targets on the largest plain run (the
// default model), and the schemas' cost.
func (f *flushResult) targets() []target {
	var t []target
	add := func(goal, value string, met bool) { t = append(t, target{goal, value, met}) }
	sizes := f.sizes()
	if len(sizes) == 0 {
		return nil
	}
	n := sizes[len(sizes)-1]
	if r, ok := f.run(n, "plain"); ok {
		add(fmt.Sprintf("flush >= 0.9 of the raw limit at equal concurrency (%s users, plain)", fmtInt(int64(n))), fmt.Sprintf("%.2f", r.Ratio), r.Ratio >= 0.9)
		add("flush heap growth < 64 MiB", fmtBytes(r.Heap.PeakHeapGrowth), r.Heap.PeakHeapGrowth < 64<<20)
		if i, ok := f.run(n, "indexed"); ok {
			add("default model is HOT-friendly: plain faster than indexed", fmt.Sprintf("%.2f× (HOT %.0f%% vs %.0f%%)",
				ratio(r.Lib.RowsPerSec, i.Lib.RowsPerSec), 100*r.Lib.hotShare(), 100*i.Lib.hotShare()), r.Lib.RowsPerSec > i.Lib.RowsPerSec)
		}
	}
	if len(sizes) > 1 {
		lo, okLo := f.run(sizes[0], "plain")
		hi, okHi := f.run(n, "plain")
		if okLo && okHi {
			add("heap bytes per user flat with the work (largest / smallest size)", fmt.Sprintf("%.1f B / %.1f B", hi.BytesPerUser, lo.BytesPerUser),
				hi.BytesPerUser <= 2*lo.BytesPerUser)
		}
	}
	return t
}

// writeFlushCPU writes what each run's writes cost in CPU per 1,000 rows:
// the raw limit's database backends (the faster method, before the
// library's run), and the library's database backends, its client
// process and the Redis server. On one machine the parts share its cores,
// so the library's ratio to the raw limit cannot exceed the raw write's
// CPU over the library's whole CPU while the cores are all busy.
func writeFlushCPU(w io.Writer, f *flushResult) {
	fmt.Fprint(w, "\nCPU per 1,000 rows written (ms; /proc and INFO cpu; - where not readable here):\n\n")
	fmt.Fprint(w, "| users | schema | raw: database | lastseen: database | lastseen: client | lastseen: Redis | lastseen: all | all vs raw |\n")
	fmt.Fprint(w, "|--:|---|--:|--:|--:|--:|--:|--:|\n")
	ms := func(v float64) string {
		if v < 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f", v)
	}
	for _, r := range f.Runs {
		best := r.RawUnnest
		if r.RawMethod == "copy" {
			best = r.RawCopy
		}
		raw := perThousand(best.CPU.Database, best.Rows)
		db, client, rd := perThousand(r.Lib.CPU.Database, r.Lib.Rows), perThousand(r.Lib.CPU.Client, r.Lib.Rows), perThousand(r.Lib.CPU.Redis, r.Lib.Rows)
		all, vs := -1.0, "-"
		if db >= 0 && client >= 0 && rd >= 0 {
			all = db + client + rd
			if raw > 0 {
				vs = fmt.Sprintf("%.2f×", all/raw)
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s |\n", fmtInt(int64(r.Users)), r.Schema, ms(raw), ms(db), ms(client), ms(rd), ms(all), vs)
	}
}
