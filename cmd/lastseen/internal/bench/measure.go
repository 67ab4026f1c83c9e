package bench

import (
	"context"
	"fmt"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm/clause"
)

// tableCounters are one table's cumulative counters from
// pg_stat_user_tables.
type tableCounters struct {
	Inserted, Updated, HotUpdated, Deleted, Live, Dead int64
}

// written is the rows written: inserted + updated + deleted.
func (s tableCounters) written() int64 { return s.Inserted + s.Updated + s.Deleted }

func (e *env) tableStats(ctx context.Context, table string) (tableCounters, error) {
	var rows []struct {
		Ins, Upd, Hot, Del, Live, Dead int64
	}
	err := e.admin.WithContext(ctx).Raw(`SELECT n_tup_ins AS ins, n_tup_upd AS upd, n_tup_hot_upd AS hot, n_tup_del AS del,
n_live_tup AS live, n_dead_tup AS dead FROM pg_stat_user_tables WHERE schemaname = ? AND relname = ?`, e.schema, table).Scan(&rows).Error
	if err != nil {
		return tableCounters{}, fmt.Errorf("lastseen: bench: pg_stat_user_tables %s: %w", table, err)
	}
	if len(rows) != 1 {
		return tableCounters{}, fmt.Errorf("lastseen: bench: pg_stat_user_tables has %d rows for %s.%s", len(rows), e.schema, table)
	}
	r := rows[0]
	return tableCounters{Inserted: r.Ins, Updated: r.Upd, HotUpdated: r.Hot, Deleted: r.Del, Live: r.Live, Dead: r.Dead}, nil
}

// checkpoint runs CHECKPOINT so that every variant starts with the same
// full-page-write state: the first change of each page after a checkpoint
// writes the whole page to the WAL. It returns "" or why it could not.
func (e *env) checkpoint(ctx context.Context) string {
	if err := e.admin.WithContext(ctx).Exec("CHECKPOINT").Error; err != nil {
		return err.Error()
	}
	return ""
}

// walLSN returns pg_current_wal_lsn() as text.
func (e *env) walLSN(ctx context.Context) (string, error) {
	var lsn []string
	if err := e.admin.WithContext(ctx).Raw("SELECT pg_current_wal_lsn()::text").Scan(&lsn).Error; err != nil || len(lsn) != 1 {
		return "", fmt.Errorf("lastseen: bench: pg_current_wal_lsn: %v", err)
	}
	return lsn[0], nil
}

// walBytes returns the bytes of WAL between two LSNs.
func (e *env) walBytes(ctx context.Context, from, to string) (int64, error) {
	var n []int64
	if err := e.admin.WithContext(ctx).Raw("SELECT pg_wal_lsn_diff(?::pg_lsn, ?::pg_lsn)::bigint", to, from).Scan(&n).Error; err != nil || len(n) != 1 {
		return 0, fmt.Errorf("lastseen: bench: pg_wal_lsn_diff: %v", err)
	}
	return n[0], nil
}

// ownWAL sums the WAL records between from and to that belong to table:
// those whose block references name the table, its indexes or its TOAST
// table, and every record (such as COMMIT) of a transaction that wrote one
// of those. Other sessions' records in the same range (the server is
// shared) are left out. It needs pg_walinspect; ok is false without it.
func (e *env) ownWAL(ctx context.Context, from, to, table string) (bytes, records int64, ok bool, err error) {
	if e.walSchema == "" {
		return 0, 0, false, nil
	}
	db := e.admin.WithContext(ctx)
	// pg_get_wal_records_info refuses an end past the flushed WAL; wait
	// (bounded) until the WAL writer has flushed up to `to`.
	deadline := time.Now().Add(10 * time.Second)
	for {
		var done []bool
		if err := db.Raw("SELECT pg_current_wal_flush_lsn() >= ?::pg_lsn", to).Scan(&done).Error; err != nil {
			return 0, 0, false, fmt.Errorf("lastseen: bench: pg_current_wal_flush_lsn: %w", err)
		}
		if len(done) == 1 && done[0] {
			break
		}
		if time.Now().After(deadline) {
			return 0, 0, false, fmt.Errorf("lastseen: bench: WAL not flushed up to %s after 10s", to)
		}
		select {
		case <-ctx.Done():
			return 0, 0, false, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	qualified := db.Statement.Quote(e.schema + "." + table)
	var nodes []int64
	err = db.Raw(`SELECT pg_relation_filenode(c.oid)::bigint FROM pg_class c
WHERE c.oid = to_regclass(?) OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = to_regclass(?))
OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = to_regclass(?))`, qualified, qualified, qualified).Scan(&nodes).Error
	if err != nil || len(nodes) == 0 {
		return 0, 0, false, fmt.Errorf("lastseen: bench: relfilenodes of %s: %v", qualified, err)
	}
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		ids[i] = strconv.FormatInt(n, 10)
	}
	pattern := "rel [0-9]+/[0-9]+/(" + strings.Join(ids, "|") + ") "
	var out []struct{ Bytes, Records int64 }
	err = db.Raw(`WITH r AS (
  SELECT xid::text::bigint AS x, record_length AS len, coalesce(block_ref ~ ?, false) AS mine
  FROM ?.pg_get_wal_records_info(?::pg_lsn, ?::pg_lsn))
SELECT coalesce(sum(len), 0)::bigint AS bytes, count(*) AS records FROM r
WHERE mine OR (x <> 0 AND x IN (SELECT x FROM r WHERE mine AND x <> 0))`,
		pattern, clause.Table{Name: e.walSchema}, from, to).Scan(&out).Error
	if err != nil || len(out) != 1 {
		return 0, 0, false, fmt.Errorf("lastseen: bench: pg_get_wal_records_info: %v", err)
	}
	return out[0].Bytes, out[0].Records, true, nil
}

// commandStats returns INFO commandstats as command -> calls. Redis counts
// every command a Lua script runs as well as the EVALSHA itself.
func (e *env) commandStats(ctx context.Context) (map[string]int64, error) {
	s, err := e.plain.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: INFO commandstats: %w", err)
	}
	return parseCommandStats(s)
}

// parseCommandStats parses lines "cmdstat_<name>:calls=N,usec=...".
func parseCommandStats(s string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, fields, ok := strings.Cut(rest, ":")
		if !ok {
			return nil, fmt.Errorf("lastseen: bench: commandstats line %q has no ':'", line)
		}
		calls := int64(-1)
		for _, f := range strings.Split(fields, ",") {
			if v, ok := strings.CutPrefix(f, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					return nil, fmt.Errorf("lastseen: bench: commandstats line %q: %v", line, err)
				}
				calls = n
			}
		}
		if calls < 0 {
			return nil, fmt.Errorf("lastseen: bench: commandstats line %q has no calls=", line)
		}
		out[name] = calls
	}
	return out, nil
}

// commandDelta is after - before per command, leaving out INFO (the
// measurement's own command). It returns the total and the non-zero
// commands.
func commandDelta(before, after map[string]int64) (int64, map[string]int64) {
	var total int64
	per := map[string]int64{}
	for name, n := range after {
		if name == "info" {
			continue
		}
		if d := n - before[name]; d != 0 {
			per[name] = d
			total += d
		}
	}
	return total, per
}

// percentile returns the nearest-rank percentile p (0-100] of sorted.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(float64(len(sorted))*p/100+0.999999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// heapSampler samples the Go heap in a goroutine while a phase runs.
type heapSampler struct {
	stop chan struct{}
	done chan heapResult
}

// heapResult is the heap growth of one phase, over the heap measured
// right after a GC at its start.
type heapResult struct {
	PeakHeapGrowth int64  `json:"peak_heap_growth_bytes"` // heap objects (live and not yet swept), like MemStats.HeapAlloc
	PeakLiveGrowth int64  `json:"peak_live_growth_bytes"` // live heap as of the latest GC mark
	Allocated      int64  `json:"allocated_bytes"`        // bytes allocated during the phase
	GCCycles       int64  `json:"gc_cycles"`
	Samples        int    `json:"samples"`
	Interval       string `json:"interval"`
}

var heapMetrics = []string{"/memory/classes/heap/objects:bytes", "/gc/heap/live:bytes", "/gc/heap/allocs:bytes", "/gc/cycles/total:gc-cycles"}

// startHeap runs a GC, takes the baseline and samples every interval
// with runtime/metrics (no stop-the-world) until Stop.
func startHeap(interval time.Duration) *heapSampler {
	runtime.GC()
	h := &heapSampler{stop: make(chan struct{}), done: make(chan heapResult, 1)}
	samples := make([]metrics.Sample, len(heapMetrics))
	for i, name := range heapMetrics {
		samples[i].Name = name
	}
	metrics.Read(samples)
	base := make([]uint64, len(samples))
	for i := range samples {
		base[i] = samples[i].Value.Uint64()
	}
	go func() {
		res := heapResult{Interval: interval.String()}
		var peakObj, peakLive uint64
		t := time.NewTicker(interval)
		defer t.Stop()
		read := func() {
			metrics.Read(samples)
			peakObj = max(peakObj, samples[0].Value.Uint64())
			peakLive = max(peakLive, samples[1].Value.Uint64())
			res.Samples++
		}
		for {
			select {
			case <-t.C:
				read()
				continue
			case <-h.stop:
				read()
			}
			break
		}
		res.PeakHeapGrowth = int64(peakObj) - int64(base[0])
		res.PeakLiveGrowth = int64(peakLive) - int64(base[1])
		res.Allocated = int64(samples[2].Value.Uint64() - base[2])
		res.GCCycles = int64(samples[3].Value.Uint64() - base[3])
		h.done <- res
	}()
	return h
}

func (h *heapSampler) Stop() heapResult {
	close(h.stop)
	return <-h.done
}

// sortedDurations merges and sorts per-worker latencies.
func sortedDurations(parts [][]time.Duration) []time.Duration {
	var all []time.Duration
	for _, p := range parts {
		all = append(all, p...)
	}
	slices.Sort(all)
	return all
}
