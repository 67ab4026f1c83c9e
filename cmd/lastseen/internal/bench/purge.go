package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// purgeResult is the purge-at-scale result.
type purgeResult struct {
	Expired    int                  `json:"expired"`
	Live       int                  `json:"live"`
	BatchSize  int                  `json:"batch_size"`
	Pause      string               `json:"pause"`
	Table      string               `json:"table"`
	Wall       time.Duration        `json:"wall_ns"`
	RowsPerSec float64              `json:"rows_per_sec"`
	Result     lastseen.PurgeResult `json:"result"`
	SQL        sqlStats             `json:"sql"`
	Redis      redisTime            `json:"redis"`
	Heap       heapResult           `json:"heap"`
	RawBefore  rawPurge             `json:"raw_before"` // the raw DELETE loop, before the library's purge
	RawAfter   rawPurge             `json:"raw_after"`  // and after it, on a table of its own each
	RawLimit   float64              `json:"raw_limit_rows_per_sec"`
	Ratio      float64              `json:"lastseen_vs_raw"`
	// The same loop resuming after the last deleted id (keyset), which
	// does not walk the deleted rows' index entries again.
	KeysetBefore rawPurge `json:"keyset_before"`
	KeysetAfter  rawPurge `json:"keyset_after"`
	KeysetLimit  float64  `json:"keyset_limit_rows_per_sec"`
	KeysetRatio  float64  `json:"lastseen_vs_keyset"`
	LiveLeft     int64    `json:"live_left"`
	Left         int64    `json:"rows_left"`
	Check        string   `json:"check"`
}

func (e *env) runPurge(ctx context.Context) (*purgeResult, error) {
	c := e.cmd
	res := &purgeResult{Expired: c.PurgeExpired, Live: c.PurgeLive, BatchSize: lastseen.DefaultBatchSize, Pause: c.PurgePause.String()}
	now := time.Now().UTC().Truncate(time.Microsecond)
	db, err := e.createPurgeTables(ctx, res, now)
	if err != nil {
		return nil, err
	}
	if err := e.rawPurges(ctx, now, res.BatchSize, rawLoop{&res.RawBefore, false}, rawLoop{&res.KeysetBefore, true}); err != nil {
		return nil, err
	}
	if err := e.libraryPurge(ctx, db, res); err != nil {
		return nil, err
	}
	if err := e.rawPurges(ctx, now, res.BatchSize, rawLoop{&res.KeysetAfter, true}, rawLoop{&res.RawAfter, false}); err != nil {
		return nil, err
	}
	res.RawLimit = (res.RawBefore.RowsPerSec + res.RawAfter.RowsPerSec) / 2
	res.Ratio = ratio(res.RowsPerSec, res.RawLimit)
	res.KeysetLimit = (res.KeysetBefore.RowsPerSec + res.KeysetAfter.RowsPerSec) / 2
	res.KeysetRatio = ratio(res.RowsPerSec, res.KeysetLimit)
	if err := e.checkPurge(ctx, db, res); err != nil {
		return nil, err
	}
	c.progress("purge: raw loop %.0f and %.0f rows/s, keyset %.0f and %.0f, lastseen %.0f (%.2f of raw, %.2f of keyset)", res.RawBefore.RowsPerSec,
		res.RawAfter.RowsPerSec, res.KeysetBefore.RowsPerSec, res.KeysetAfter.RowsPerSec, res.RowsPerSec, res.Ratio, res.KeysetRatio)
	c.progress("purge: %d deleted, %.0f rows/s, longest batch transaction %v, heap +%s, check %s",
		res.Result.Deleted, res.RowsPerSec, res.SQL.LongestTx, fmtBytes(res.Heap.PeakHeapGrowth), res.Check)
	return res, nil
}

// createPurgeTables creates the five sessions tables of the purge
// benchmark, each of its own pool: the raw and keyset loops' before and
// after the library's run, and the library's (returned).
func (e *env) createPurgeTables(ctx context.Context, res *purgeResult, now time.Time) (*gorm.DB, error) {
	c := e.cmd
	c.progress("purge: creating three tables of %d expired and %d live sessions", c.PurgeExpired, c.PurgeLive)
	var db *gorm.DB
	for _, t := range []struct {
		prefix string
		table  *string
	}{{"purgeraw_", &res.RawBefore.Table}, {"purgekeyset_", &res.KeysetBefore.Table}, {"purge_", &res.Table},
		{"purgekeysetafter_", &res.KeysetAfter.Table}, {"purgerawafter_", &res.RawAfter.Table}} {
		tdb, _, err := e.openPool(ctx, t.prefix, 2)
		if err != nil {
			return nil, err
		}
		if *t.table, err = e.createSessions(ctx, tdb, c.PurgeExpired, c.PurgeLive, now); err != nil {
			return nil, err
		}
		if t.prefix == "purge_" {
			db = tdb
		}
	}
	return db, nil
}

// rawLoop is one run of a hand-written purge loop: its result, and whether
// it walks the keys (keyset) or repeats the plain batched DELETE (raw).
type rawLoop struct {
	side   *rawPurge
	keyset bool
}

// rawPurges runs the loops in order, each after a checkpoint.
func (e *env) rawPurges(ctx context.Context, now time.Time, batch int, loops ...rawLoop) error {
	for _, r := range loops {
		e.checkpoint(ctx)
		if err := e.rawPurge(ctx, r.side, now, batch, r.keyset); err != nil {
			return err
		}
	}
	return nil
}

// libraryPurge runs the library's PurgeExpiredSessions on db's table,
// timing it and tracing its SQL and Redis commands.
func (e *env) libraryPurge(ctx context.Context, db *gorm.DB, res *purgeResult) error {
	c := e.cmd
	pause := c.PurgePause
	if pause == 0 {
		pause = -1 // the library's "no pause"
	}
	p := lastseen.New(lastseen.Config{
		Redis:    e.timed,
		Logger:   e.pluginLogger(),
		Buffer:   lastseen.BufferConfig{Prefix: e.prefix + "-purge"},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Test:     lastseen.TestConfig{Seam: &testseam.Seam{PurgePause: pause}},
	})
	if err := db.Use(p); err != nil {
		return fmt.Errorf("lastseen: bench: db.Use: %w", err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	e.checkpoint(ctx)

	c.progress("purge: PurgeExpiredSessions")
	heap := startHeap(time.Millisecond)
	e.tracer.start()
	e.timer.start()
	t0 := time.Now()
	var err error
	res.Result, err = p.PurgeExpiredSessions(ctx)
	res.Wall = time.Since(t0)
	res.Redis = e.timer.stop()
	res.SQL = e.tracer.stop()
	res.Heap = heap.Stop()
	if err != nil {
		return fmt.Errorf("lastseen: bench: purge: %w", err)
	}
	res.RowsPerSec = float64(res.Result.Deleted) / res.Wall.Seconds()
	return nil
}

// checkPurge counts the rows the library's purge left and sets res.Check:
// "ok" when every loop and the library deleted every expired session and
// only the live ones are left, else the list of problems.
func (e *env) checkPurge(ctx context.Context, db *gorm.DB, res *purgeResult) error {
	c := e.cmd
	if err := db.WithContext(ctx).Table(res.Table).Count(&res.Left).Error; err != nil {
		return fmt.Errorf("lastseen: bench: count sessions: %w", err)
	}
	err := db.WithContext(ctx).Table(res.Table).Where(clause.Gt{Column: clause.Column{Name: "expires_at"}, Value: res.Result.Cutoff}).
		Count(&res.LiveLeft).Error
	if err != nil {
		return fmt.Errorf("lastseen: bench: count live sessions: %w", err)
	}
	var problems []string
	for _, r := range []rawPurge{res.RawBefore, res.KeysetBefore, res.KeysetAfter, res.RawAfter} {
		if r.Deleted != int64(c.PurgeExpired) {
			problems = append(problems, fmt.Sprintf("raw loop on %s deleted %d, want %d", r.Table, r.Deleted, c.PurgeExpired))
		}
	}
	if res.Result.Deleted != c.PurgeExpired {
		problems = append(problems, fmt.Sprintf("deleted %d, want %d", res.Result.Deleted, c.PurgeExpired))
	}
	if res.LiveLeft != int64(c.PurgeLive) || res.Left != int64(c.PurgeLive) {
		problems = append(problems, fmt.Sprintf("%d rows left of which %d live, want %d live and nothing else", res.Left, res.LiveLeft, c.PurgeLive))
	}
	res.Check = "ok"
	if len(problems) > 0 {
		res.Check = fmt.Sprint(problems)
	}
	return nil
}

// createSessions creates "purge_sessions" from lastseen.Session with
// expired sessions that expired up to 30 days before now and live ones
// spread evenly among them (row i is live when i*live/total steps up), so
// that the purge has to skip live rows all along the table. Ids are MD5
// hex strings, like random session tokens.
func (e *env) createSessions(ctx context.Context, db *gorm.DB, expired, live int, now time.Time) (string, error) {
	db = db.WithContext(ctx)
	table, err := migrateTable(db, &lastseen.Session{}, "sessions")
	if err != nil {
		return "", err
	}
	total := int64(expired + live)
	if total > 0 {
		err := db.Exec(`INSERT INTO ? (?, ?, ?, ?)
SELECT md5(g::text), g % 100000 + 1,
  CASE WHEN g * ?::bigint / ?::bigint > (g - 1) * ?::bigint / ?::bigint
    THEN ?::timestamptz + (g % 1440) * interval '1 minute'
    ELSE ?::timestamptz - (g % 43200) * interval '1 minute' END,
  ?::timestamptz - interval '30 days'
FROM generate_series(1, ?::bigint) AS g`,
			clause.Table{Name: table}, clause.Column{Name: "id"}, clause.Column{Name: "user_id"}, clause.Column{Name: "expires_at"},
			clause.Column{Name: "created_at"}, live, total, live, total, now.Add(24*time.Hour), now.Add(-time.Minute), now, total).Error
		if err != nil {
			return "", fmt.Errorf("lastseen: bench: fill %s: %w", table, err)
		}
	}
	if err := db.Exec("VACUUM (ANALYZE) ?", clause.Table{Name: table}).Error; err != nil {
		return "", fmt.Errorf("lastseen: bench: vacuum %s: %w", table, err)
	}
	return table, nil
}

// rawPurge is the database's limit for a purge on one connection: the loop
//
//	DELETE FROM sessions WHERE id IN
//	  (SELECT id FROM sessions WHERE expires_at <= $1 ORDER BY id LIMIT n)
//
// as one prepared statement in autocommit, until it deletes nothing; no
// Redis, no pause. The keyset variant adds "AND id > $3", the last id the
// previous statement deleted (WITH d AS (DELETE ... RETURNING id) SELECT
// count(*), max(id) FROM d), as the library's FindInBatches does.
type rawPurge struct {
	Table      string        `json:"table"`
	Keyset     bool          `json:"keyset"`
	Wall       time.Duration `json:"wall_ns"`
	Deleted    int64         `json:"deleted"`
	Statements int           `json:"statements"`
	RowsPerSec float64       `json:"rows_per_sec"`
}

func (e *env) rawPurge(ctx context.Context, side *rawPurge, cutoff time.Time, n int, keyset bool) error {
	e.cmd.progress("purge: raw DELETE loop (keyset %v) on %s", keyset, side.Table)
	side.Keyset = keyset
	conn, err := pgx.ConnectConfig(ctx, e.pg.Copy())
	if err != nil {
		return fmt.Errorf("lastseen: bench: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	t := pgx.Identifier{side.Table}.Sanitize()
	sql := "DELETE FROM " + t + ` WHERE "id" IN (SELECT "id" FROM ` + t + ` WHERE "expires_at" <= $1 ORDER BY "id" LIMIT $2)`
	if keyset {
		sql = "WITH d AS (DELETE FROM " + t + ` WHERE "id" IN (SELECT "id" FROM ` + t +
			` WHERE "expires_at" <= $1 AND "id" > $3 ORDER BY "id" LIMIT $2) RETURNING "id") SELECT count(*), coalesce(max("id"), '') FROM d`
	}
	if _, err := conn.Prepare(ctx, sql, sql); err != nil {
		return fmt.Errorf("lastseen: bench: prepare: %w", err)
	}
	last := ""
	t0 := time.Now()
	for {
		var deleted int64
		if keyset {
			err = conn.QueryRow(ctx, sql, cutoff, n, last).Scan(&deleted, &last)
		} else {
			var tag pgconn.CommandTag
			tag, err = conn.Exec(ctx, sql, cutoff, n)
			deleted = tag.RowsAffected()
		}
		if err != nil {
			return fmt.Errorf("lastseen: bench: raw purge: %w", err)
		}
		side.Statements++
		side.Deleted += deleted
		if deleted == 0 {
			break
		}
	}
	side.Wall = time.Since(t0)
	side.RowsPerSec = float64(side.Deleted) / side.Wall.Seconds()
	return nil
}
