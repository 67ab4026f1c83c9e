package bench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// lagSample is one reading of pg_stat_replication on the primary; with
// several standbys, the largest lag of any.
type lagSample struct {
	At     time.Duration `json:"at_ns"`     // since sampling began
	Replay time.Duration `json:"replay_ns"` // replay_lag; 0 when Null
	// Null is set when replay_lag was NULL: PostgreSQL clears it once the
	// standby reports twice in a row that it has replayed everything (or
	// before its first report).
	Null  bool  `json:"null"`
	Bytes int64 `json:"bytes"` // pg_current_wal_lsn() - replay_lsn
}

// lagSummary is the replay lag of one variant's run: nearest-rank
// percentiles over every sample, a NULL replay_lag counting as 0 (caught
// up).
type lagSummary struct {
	Samples int `json:"samples"`
	Null    int `json:"null_samples"`
	// Behind counts the samples where the standby had not replayed all the
	// WAL the primary had written: the share of the run it was behind,
	// which a short run's percentiles hide.
	Behind   int           `json:"behind_samples"`
	P50      time.Duration `json:"replay_lag_p50_ns"`
	P99      time.Duration `json:"replay_lag_p99_ns"`
	Max      time.Duration `json:"replay_lag_max_ns"`
	BytesP50 int64         `json:"bytes_behind_p50"`
	BytesP99 int64         `json:"bytes_behind_p99"`
	BytesMax int64         `json:"bytes_behind_max"`
	// CatchUp is the time from the end of the flush until every standby
	// had replayed the WAL written up to then.
	CatchUp time.Duration `json:"catch_up_ns"`
}

// summarizeLag computes the percentiles of samples (CatchUp is left 0).
func summarizeLag(samples []lagSample) lagSummary {
	s := lagSummary{Samples: len(samples)}
	if len(samples) == 0 {
		return s
	}
	lags := make([]time.Duration, len(samples))
	bytes := make([]time.Duration, len(samples)) // percentile works on durations: bytes as ns
	for i, x := range samples {
		lags[i], bytes[i] = x.Replay, time.Duration(x.Bytes)
		if x.Null {
			s.Null++
		}
		if x.Bytes > 0 {
			s.Behind++
		}
	}
	slices.Sort(lags)
	slices.Sort(bytes)
	s.P50, s.P99, s.Max = percentile(lags, 50), percentile(lags, 99), lags[len(lags)-1]
	s.BytesP50, s.BytesP99, s.BytesMax = int64(percentile(bytes, 50)), int64(percentile(bytes, 99)), int64(bytes[len(bytes)-1])
	return s
}

// lagWatch samples pg_stat_replication on the primary, on a connection of
// its own, every interval between start and stop.
type lagWatch struct {
	conn     *pgx.Conn
	interval time.Duration
	stopCh   chan struct{}
	done     chan struct{}
	samples  []lagSample
	err      error
	began    time.Time // start of the current sampling
}

func newLagWatch(ctx context.Context, dsn string, interval time.Duration) (*lagWatch, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: replica: connect to the primary: %w", err)
	}
	return &lagWatch{conn: conn, interval: interval}, nil
}

func (w *lagWatch) close(ctx context.Context) { _ = w.conn.Close(ctx) }

// sample reads the largest replay_lag and byte distance of any standby.
func (w *lagWatch) sample(ctx context.Context) (lagSample, error) {
	var n int
	var us *int64
	var bytes int64
	err := w.conn.QueryRow(ctx, `SELECT count(*), (max(EXTRACT(epoch FROM replay_lag)) * 1e6)::bigint,
coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)), 0)::bigint FROM pg_stat_replication`).Scan(&n, &us, &bytes)
	if err != nil {
		return lagSample{}, fmt.Errorf("lastseen: bench: replica: pg_stat_replication: %w", err)
	}
	if n == 0 {
		return lagSample{}, errors.New("lastseen: bench: replica: pg_stat_replication lists no standby on the primary")
	}
	s := lagSample{Bytes: bytes, Null: us == nil}
	if us != nil {
		s.Replay = time.Duration(*us) * time.Microsecond
	}
	return s, nil
}

// waitCaughtUp waits (at most bound) until every standby has replayed
// the WAL written up to now, and returns how long that took.
func (w *lagWatch) waitCaughtUp(ctx context.Context, bound time.Duration) (time.Duration, error) {
	t0 := time.Now()
	var lsn string
	if err := w.conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&lsn); err != nil {
		return 0, fmt.Errorf("lastseen: bench: replica: pg_current_wal_lsn: %w", err)
	}
	for {
		var behind, all int
		err := w.conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE replay_lsn IS NULL OR replay_lsn < $1::pg_lsn), count(*)
FROM pg_stat_replication`, lsn).Scan(&behind, &all)
		if err != nil {
			return 0, fmt.Errorf("lastseen: bench: replica: pg_stat_replication: %w", err)
		}
		if all == 0 {
			return 0, errors.New("lastseen: bench: replica: pg_stat_replication lists no standby on the primary")
		}
		if behind == 0 {
			return time.Since(t0), nil
		}
		if time.Since(t0) > bound {
			return 0, fmt.Errorf("lastseen: bench: replica: %d of %d standbys have not replayed up to %s after %v", behind, all, lsn, bound)
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitNull waits (at most bound) until replay_lag reads NULL: the
// standby has reported twice that it replayed everything. After bound it
// returns nil and the samples start with the last lag measured (a standby
// whose wal_receiver_status_interval is long replies rarely when idle).
func (w *lagWatch) waitNull(ctx context.Context, bound time.Duration) error {
	t0 := time.Now()
	for time.Since(t0) < bound {
		s, err := w.sample(ctx)
		if err != nil {
			return err
		}
		if s.Null {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// start begins sampling: one sample now, then one per interval.
func (w *lagWatch) start(ctx context.Context) {
	w.stopCh, w.done, w.samples, w.err = make(chan struct{}), make(chan struct{}), nil, nil
	w.began = time.Now()
	go func() {
		defer close(w.done)
		t0 := w.began
		t := time.NewTicker(w.interval)
		defer t.Stop()
		for {
			s, err := w.sample(ctx)
			if err != nil {
				w.err = err
				return
			}
			s.At = time.Since(t0)
			w.samples = append(w.samples, s)
			select {
			case <-t.C:
			case <-w.stopCh:
				return
			case <-ctx.Done():
				w.err = ctx.Err()
				return
			}
		}
	}()
}

// stop ends sampling and returns the samples, or the error that ended it.
func (w *lagWatch) stop() ([]lagSample, error) {
	close(w.stopCh)
	<-w.done
	return w.samples, w.err
}
