package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/lastseen/lastseen/tests/testenv"
)

func TestSummarizeLagCountsNullAsCaughtUp(t *testing.T) {
	var samples []lagSample
	for i := 1; i <= 100; i++ { // 1ms..100ms, 10 KiB behind each; every 10th NULL
		s := lagSample{At: time.Duration(i) * 100 * time.Millisecond, Replay: time.Duration(i) * time.Millisecond, Bytes: int64(i) * 1024}
		if i%10 == 0 {
			s = lagSample{At: s.At, Null: true}
		}
		samples = append(samples, s)
	}
	got := summarizeLag(samples)
	want := lagSummary{Samples: 100, Null: 10, Behind: 90,
		// sorted: ten zeros, then 1..99ms without the multiples of ten; rank 50 is the 40th of those
		P50: 44 * time.Millisecond, P99: 98 * time.Millisecond, Max: 99 * time.Millisecond,
		BytesP50: 44 * 1024, BytesP99: 98 * 1024, BytesMax: 99 * 1024}
	testenv.Equal(t, "summary", got, want)
	testenv.Equal(t, "no samples", summarizeLag(nil), lagSummary{})
}

func TestWriteReplicaShowsBothAndTheRatio(t *testing.T) {
	lag := func(p50, p99, max time.Duration) *lagSummary {
		return &lagSummary{Samples: 120, Null: 3, Behind: 60, P50: p50, P99: p99, Max: max, BytesP50: 900, BytesP99: 20 << 10, BytesMax: 30 << 10,
			CatchUp: 4 * time.Millisecond}
	}
	q := &replicaResult{Server: "a private primary and standby", Interval: "100ms", Users: 2000, Requests: 100_000, Distinct: 1993,
		Zipf: 1.1, Workers: 8, Seed: 1, Throttle: "5m0s", Variants: []variant{
			{Name: "per-request", Requests: 100_000, RequestsPerSec: 1200, P50: 3 * time.Millisecond, RowsWritten: 100_000,
				WALBytes: 15 << 20, WALPer10k: 1.5 * (1 << 20), Lag: lag(2*time.Millisecond, 40*time.Millisecond, 50*time.Millisecond),
				StandbyCheck: "ok", Check: "ok"},
			{Name: "lastseen+local", Requests: 100_000, RequestsPerSec: 50_000, P50: 200, RowsWritten: 1993,
				WALBytes: 350 << 10, WALPer10k: 35 << 10, Lag: lag(0, 10*time.Millisecond, 10*time.Millisecond),
				FlushWall: 300 * time.Millisecond, StandbyCheck: "ok", Check: "ok"},
		}}
	setRatios(q.Variants)
	var b bytes.Buffer
	writeReplica(&b, q)
	want := `
## Replica: 100,000 requests from 1,993 of 2,000 users (Zipf s=1.1, seed 1), 8 workers, throttle window 5m0s

On a private primary and standby. Replay lag: pg_stat_replication.replay_lag on the primary, sampled every 100ms from the first request to the end of the flush, and once more when the standby has replayed the flush (NULL, the standby caught up, counts as 0).

| | per-request | lastseen+local |
|---|--:|--:|
| requests/s | 1,200 | 50,000 |
| tracking call p50 | 3.00 ms | 200 ns |
| rows written (pg_stat_user_tables) | 100,000 | 1,993 |
| rows written vs per-request | 1.00 | 0.0199 (1/50.2) |
| WAL bytes (pg_current_wal_lsn) | 15.0 MiB | 350.0 KiB |
| **WAL bytes per 10,000 requests** | 1.5 MiB | 35.0 KiB |
| WAL vs per-request | 1.00 | 0.0228 (1/43.9) |
| WAL of the variant's own records (pg_walinspect) | n/a | n/a |
| **replay lag p50** | 2.00 ms | 0 ns |
| **replay lag p99** | 40.00 ms | 10.00 ms |
| **replay lag max** | 50.00 ms | 10.00 ms |
| replay lag p99 vs per-request | 1.00 | 0.2500 (1/4.0) |
| replay lag max vs per-request | 1.00 | 0.2000 (1/5.0) |
| WAL not yet replayed p50 / p99 / max | 900 B / 20.0 KiB / 30.0 KiB | 900 B / 20.0 KiB / 30.0 KiB |
| samples (of which NULL) | 120 (3) | 120 (3) |
| samples with WAL not yet replayed | 60 (50%) | 60 (50%) |
| standby caught up after the flush in | 4.00 ms | 4.00 ms |
| flush wall time | - | 300.00 ms |
| standby's table equals the primary's | ok | ok |
| check | ok | ok |
`
	testenv.Equal(t, "markdown", b.String(), want)

	got := q.targets()
	want2 := []target{
		{"replica: lastseen+local writes >= 20x fewer WAL bytes per 10,000 requests than per-request", "43.9x (35.0 KiB against 1.5 MiB)", true},
		{"replica: lastseen+local's worst replay lag (max) at or below per-request's", "10.00 ms against 50.00 ms", true},
	}
	if !slices.Equal(got, want2) {
		t.Errorf("targets = %+v, want %+v", got, want2)
	}
}

func TestValidateReplica(t *testing.T) {
	ok := Cmd{What: "replica", Redis: "y", Users: 1, Requests: 1, Zipf: 1.1, Workers: 1, Throttle: time.Second, FlushUsers: []int{1},
		FlushSchemas: []string{"plain"}, FlushConcurrency: 1, ReplicaFlags: ReplicaFlags{ReplicaInterval: 100 * time.Millisecond}}
	testenv.Must(t, ok.validate()) // no --postgres needed
	for _, c := range []struct {
		edit func(c *Cmd)
		want string
	}{
		{func(c *Cmd) { c.ReplicaInterval = 0 }, "lastseen: bench: --replica-interval is 0s, want at least 1ms"},
		{func(c *Cmd) { c.ReplicaStandby = "x" }, "lastseen: bench: --replica-standby needs --replica-primary (the private pair is checked without it)"},
		{func(c *Cmd) { c.Redis = "" }, "lastseen: bench: --redis is required"},
	} {
		bad := ok
		c.edit(&bad)
		if err := bad.validate(); err == nil || err.Error() != c.want {
			t.Errorf("validate = %v, want %q", err, c.want)
		}
	}
}

func TestReadPostmasterPid(t *testing.T) {
	dir := t.TempDir()
	testenv.Must(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte("24912\n/tmp/x/primary\n1764680000\n5499\n"), 0o600))
	pid, err := readPostmasterPid(dir)
	testenv.Must(t, err)
	testenv.Equal(t, "pid", pid, 24912)
	testenv.Must(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte("\n"), 0o600))
	if _, err := readPostmasterPid(dir); err == nil || err.Error() != `postmaster.pid starts with ""` {
		t.Errorf("empty pid file: err = %v", err)
	}
}
