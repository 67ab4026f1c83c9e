package bench

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/jackc/pgx/v5"
)

// ReplicaFlags are the flags of `lastseen bench replica`: the request
// stream replayed through the per-request design and through lastseen on
// a primary with a streaming standby, measuring the primary's WAL and the
// standby's replay lag. Without --replica-primary it starts a private
// primary and standby of its own.
type ReplicaFlags struct {
	// ReplicaPrimary is the DSN of an existing primary with at least one
	// streaming standby; empty starts a private pair. The DSN's user must
	// see pg_stat_replication's lag columns (superuser or
	// pg_read_all_stats) and may run CHECKPOINT.
	ReplicaPrimary string `name:"replica-primary" placeholder:"DSN" help:"replica: an existing primary with a streaming standby (its user must read pg_stat_replication's lag columns); default: start a private primary and standby."`
	// ReplicaStandby is the DSN of that standby, for the check that its
	// tables equal the primary's; without it the check is not made.
	ReplicaStandby string `name:"replica-standby" placeholder:"DSN" help:"replica: the standby of --replica-primary, to check that its tables equal the primary's."`
	// ReplicaOSUser is the account the private servers run as when the
	// benchmark runs as root (PostgreSQL refuses root). Default postgres.
	ReplicaOSUser string `name:"replica-os-user" default:"postgres" help:"replica: the OS user the private servers run as when the benchmark runs as root."`
	// ReplicaInterval is how often pg_stat_replication is sampled during
	// each variant's requests and flush. Default 100ms.
	ReplicaInterval time.Duration `name:"replica-interval" default:"100ms" help:"replica: how often pg_stat_replication.replay_lag is sampled."`
}

// replicaResult is `bench replica`'s result: the variants of the request
// benchmark that write to PostgreSQL differently, each with the standby's
// replay lag during its requests and flush.
type replicaResult struct {
	// Server says where it ran: the private pair's ports, or the given
	// primary.
	Server   string    `json:"server"`
	Interval string    `json:"sample_interval"`
	Users    int       `json:"users"`
	Requests int       `json:"requests"`
	Distinct int       `json:"distinct_users"`
	Zipf     float64   `json:"zipf_s"`
	Workers  int       `json:"workers"`
	Seed     uint64    `json:"seed"`
	Throttle string    `json:"throttle"`
	Variants []variant `json:"variants"`
}

// runReplica runs `bench replica`: it starts the private primary and
// standby (unless --replica-primary), runs the variants on the primary and
// prints the report; the servers are stopped at the end, also after an
// error or Ctrl-C.
func (c *Cmd) runReplica(ctx context.Context) (err error) {
	primary, standby := c.ReplicaPrimary, c.ReplicaStandby
	server := "the primary given by --replica-primary"
	if primary == "" {
		var pair *pgPair
		if pair, err = startPgPair(ctx, c.ReplicaOSUser, c.progress); err != nil {
			return err
		}
		defer func() { // err is the named result: a failed stop is reported
			if serr := pair.stop(); serr != nil && err == nil {
				err = serr
			}
		}()
		primary, standby = pair.primary.dsn(), pair.standby.dsn()
		server = fmt.Sprintf("a private primary (127.0.0.1:%d, initdb) and streaming standby (127.0.0.1:%d, pg_basebackup -R)",
			pair.primary.port, pair.standby.port)
	}
	sub := *c
	sub.Postgres = primary
	env, err := openEnv(ctx, &sub)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := env.close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	if env.lag, err = newLagWatch(ctx, primary, c.ReplicaInterval); err != nil {
		return err
	}
	defer env.lag.close(context.WithoutCancel(ctx))
	rep := &report{Info: env.info(ctx)}
	if rep.Replica, err = env.runReplicaVariants(ctx, standby); err != nil {
		return err
	}
	rep.Replica.Server = server
	return c.finish(rep)
}

// runReplicaVariants replays one stream through per-request, lastseen and
// lastseen+local, each on a table of its own, with the lag sampled, and
// checks each table on the standby.
func (e *env) runReplicaVariants(ctx context.Context, standby string) (*replicaResult, error) {
	c := e.cmd
	st := newStream(c.Users, c.Requests, c.Zipf, c.Seed)
	res := &replicaResult{Interval: c.ReplicaInterval.String(), Users: c.Users, Requests: c.Requests, Distinct: st.distinct,
		Zipf: c.Zipf, Workers: c.Workers, Seed: c.Seed, Throttle: c.Throttle.String()}
	c.progress("replica: %d requests from %d of %d users (Zipf s=%v, seed %d), %d workers",
		c.Requests, st.distinct, c.Users, c.Zipf, c.Seed, c.Workers)
	variants := e.designs(st, "replica", false)
	for _, v := range variants {
		r, err := e.runVariant(ctx, v.name, v.tablePrefix, st, v.open)
		if err != nil {
			return nil, err
		}
		r.StandbyCheck = "not checked: no --replica-standby"
		if standby != "" {
			if r.StandbyCheck, err = e.compareStandby(ctx, standby, r.Table); err != nil {
				return nil, err
			}
		}
		r.WALPer10k = float64(r.WALBytes) * 10_000 / float64(r.Requests)
		res.Variants = append(res.Variants, r)
	}
	setRatios(res.Variants)
	return res, nil
}

// lagStart waits until the standby has replayed everything written so far
// (the table's creation, the baseline's CHECKPOINT) and replay_lag reads
// NULL again, then starts sampling. PostgreSQL keeps showing the last lag
// measured until the standby has reported twice that it caught up: without
// the wait, a variant that writes nothing during its requests would be
// sampled with the lag of the records before it.
func (r *variantRun) lagStart(ctx context.Context) error {
	if _, err := r.e.lag.waitCaughtUp(ctx, 5*time.Minute); err != nil {
		return err
	}
	if err := r.e.lag.waitNull(ctx, 30*time.Second); err != nil {
		return err
	}
	r.e.lag.start(ctx)
	r.lagRunning = true
	return nil
}

// lagStop stops sampling, measures how long the standby takes to replay
// the WAL written up to now, takes one last sample (the reply that reported
// the catch-up carries the lag of the flush's last records, which a sample
// every interval may miss) and summarizes the samples.
func (r *variantRun) lagStop(ctx context.Context) error {
	r.lagRunning = false
	samples, err := r.e.lag.stop()
	if err != nil {
		return err
	}
	catchUp, err := r.e.lag.waitCaughtUp(ctx, 5*time.Minute)
	if err != nil {
		return err
	}
	last, err := r.e.lag.sample(ctx)
	if err != nil {
		return err
	}
	last.At = time.Since(r.e.lag.began)
	samples = append(samples, last)
	s := summarizeLag(samples)
	s.CatchUp = catchUp
	r.v.Lag, r.v.LagSamples = &s, samples
	r.e.cmd.progress("%s: replay lag p50 %s p99 %s max %s (%d samples, %d NULL), caught up %s after the flush", r.name,
		fmtDur(s.P50), fmtDur(s.P99), fmtDur(s.Max), s.Samples, s.Null, fmtDur(s.CatchUp))
	return nil
}

// compareStandby compares table on the standby with the primary's: row
// count and a digest of every (id, last_seen_at) in id order. The standby
// has replayed the whole run (lagStop waited for it).
func (e *env) compareStandby(ctx context.Context, dsn, table string) (string, error) {
	q := `SELECT count(*), coalesce(md5(string_agg(id::text || '@' || extract(epoch FROM last_seen_at)::text, ',' ORDER BY id)), '') FROM ` +
		pgx.Identifier{e.schema, table}.Sanitize()
	var n1, n2 int64
	var d1, d2 string
	if err := e.admin.WithContext(ctx).Raw(q).Row().Scan(&n1, &d1); err != nil {
		return "", fmt.Errorf("lastseen: bench: replica: digest of %s on the primary: %w", table, err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return "", fmt.Errorf("lastseen: bench: replica: connect to the standby: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := conn.QueryRow(ctx, q).Scan(&n2, &d2); err != nil {
		return "", fmt.Errorf("lastseen: bench: replica: digest of %s on the standby: %w", table, err)
	}
	if n1 != n2 || d1 != d2 {
		return fmt.Sprintf("standby differs: %d rows (digest %s) against %d on the primary (%s)", n2, d2, n1, d1), nil
	}
	return "ok", nil
}

// setRatios sets each variant's ratios to the first's (per-request).
func setRatios(vs []variant) {
	base := vs[0]
	for i := range vs {
		v := &vs[i]
		v.RowsRatio = ratio(float64(v.RowsWritten), float64(base.RowsWritten))
		v.WALRatio = ratio(float64(v.WALBytes), float64(base.WALBytes))
		v.OwnWALRatio = ratio(float64(v.OwnWALBytes), float64(base.OwnWALBytes))
		v.P50Ratio = ratio(float64(v.P50), float64(base.P50))
		if v.Lag != nil && base.Lag != nil {
			v.LagP99Ratio = ratio(float64(v.Lag.P99), float64(base.Lag.P99))
			v.LagMaxRatio = ratio(float64(v.Lag.Max), float64(base.Lag.Max))
		}
	}
}

func writeReplica(w io.Writer, q *replicaResult) {
	fmt.Fprintf(w, "\n## Replica: %s requests from %s of %s users (Zipf s=%v, seed %d), %d workers, throttle window %s\n\n",
		fmtInt(int64(q.Requests)), fmtInt(int64(q.Distinct)), fmtInt(int64(q.Users)), q.Zipf, q.Seed, q.Workers, q.Throttle)
	fmt.Fprintf(w, "On %s. Replay lag: pg_stat_replication.replay_lag on the primary, sampled every %s from the first request "+
		"to the end of the flush, and once more when the standby has replayed the flush (NULL, the standby caught up, counts as 0).\n\n", q.Server, q.Interval)
	writeVariantTable(w, q.Variants, replicaRows)
	for _, v := range q.Variants {
		if v.FirstError != "" {
			fmt.Fprintf(w, "\n%s: first tracking-call error: %s\n", v.Name, v.FirstError)
		}
	}
}

// lagCell shows f of the variant's lag summary, or "-" without one.
func lagCell(f func(s lagSummary) string) func(v variant) string {
	return func(v variant) string {
		if v.Lag == nil {
			return "-"
		}
		return f(*v.Lag)
	}
}

// replicaRows are the rows of the replica table, one cell per variant.
var replicaRows = []variantRow{
	{"requests/s", func(v variant) string { return fmtRate(v.RequestsPerSec) }},
	{"tracking call p50", func(v variant) string { return fmtDur(v.P50) }},
	{"rows written (pg_stat_user_tables)", func(v variant) string { return fmtInt(v.RowsWritten) }},
	{"rows written vs per-request", func(v variant) string { return fmtRatio(v.RowsRatio) }},
	{"WAL bytes (pg_current_wal_lsn)", func(v variant) string { return fmtBytes(v.WALBytes) }},
	{"**WAL bytes per 10,000 requests**", func(v variant) string { return fmtBytes(int64(v.WALPer10k + 0.5)) }},
	{"WAL vs per-request", func(v variant) string { return fmtRatio(v.WALRatio) }},
	{"WAL of the variant's own records (pg_walinspect)", func(v variant) string {
		if !v.OwnWAL {
			return "n/a"
		}
		return fmtBytes(v.OwnWALBytes) + " (" + fmtRatio(v.OwnWALRatio) + ")"
	}},
	{"**replay lag p50**", lagCell(func(s lagSummary) string { return fmtDur(s.P50) })},
	{"**replay lag p99**", lagCell(func(s lagSummary) string { return fmtDur(s.P99) })},
	{"**replay lag max**", lagCell(func(s lagSummary) string { return fmtDur(s.Max) })},
	{"replay lag p99 vs per-request", func(v variant) string { return fmtRatio(v.LagP99Ratio) }},
	{"replay lag max vs per-request", func(v variant) string { return fmtRatio(v.LagMaxRatio) }},
	{"WAL not yet replayed p50 / p99 / max", lagCell(func(s lagSummary) string {
		return fmtBytes(s.BytesP50) + " / " + fmtBytes(s.BytesP99) + " / " + fmtBytes(s.BytesMax)
	})},
	{"samples (of which NULL)", lagCell(func(s lagSummary) string { return fmtInt(int64(s.Samples)) + " (" + fmtInt(int64(s.Null)) + ")" })},
	{"samples with WAL not yet replayed", lagCell(func(s lagSummary) string {
		return fmtInt(int64(s.Behind)) + " (" + fmt.Sprintf("%.0f%%", 100*ratio(float64(s.Behind), float64(s.Samples))) + ")"
	})},
	{"standby caught up after the flush in", lagCell(func(s lagSummary) string { return fmtDur(s.CatchUp) })},
	{"flush wall time", flushOnly(func(v variant) string { return fmtDur(v.FlushWall) })},
	{"standby's table equals the primary's", func(v variant) string { return v.StandbyCheck }},
	{"check", func(v variant) string { return v.Check }},
}

// replicaTargets judges the replica figures of lastseen with its defaults
// (lastseen+local) against per-request.
func (q *replicaResult) targets() []target {
	var t []target
	for _, v := range q.Variants {
		if v.Name != "lastseen+local" || v.Lag == nil {
			continue
		}
		fewer := 0.0
		if v.WALRatio > 0 {
			fewer = 1 / v.WALRatio
		}
		t = append(t, target{"replica: lastseen+local writes >= 20x fewer WAL bytes per 10,000 requests than per-request",
			fmt.Sprintf("%.1fx (%s against %s)", fewer, fmtBytes(int64(v.WALPer10k+0.5)), fmtBytes(int64(q.Variants[0].WALPer10k+0.5))),
			fewer >= 20})
		// The worst lag, not p99: lastseen+local's run is over in a second
		// or two, so its p99 is the lag of its one flush.
		base := q.Variants[0].Lag
		if base != nil {
			t = append(t, target{"replica: lastseen+local's worst replay lag (max) at or below per-request's",
				fmtDur(v.Lag.Max) + " against " + fmtDur(base.Max), v.Lag.Max <= base.Max})
		}
	}
	return t
}
