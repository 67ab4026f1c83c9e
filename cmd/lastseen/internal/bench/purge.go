package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/lastseen/lastseen"
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
	LiveLeft   int64                `json:"live_left"`
	Left       int64                `json:"rows_left"`
	Check      string               `json:"check"`
}

func (e *env) runPurge(ctx context.Context) (*purgeResult, error) {
	c := e.cmd
	res := &purgeResult{Expired: c.PurgeExpired, Live: c.PurgeLive, BatchSize: lastseen.DefaultPurgeBatchSize, Pause: c.PurgePause.String()}
	db, _, err := e.openPool(ctx, "purge_", 2)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	c.progress("purge: creating %d expired and %d live sessions", c.PurgeExpired, c.PurgeLive)
	if res.Table, err = e.createSessions(ctx, db, c.PurgeExpired, c.PurgeLive, now); err != nil {
		return nil, err
	}
	pause := c.PurgePause
	if pause == 0 {
		pause = -1 // the library's "no pause"
	}
	p := lastseen.New(lastseen.Config{Redis: e.timed, Prefix: e.prefix + "-purge", DisableScheduler: true,
		PurgePause: pause, Logger: e.pluginLogger()})
	if err := db.Use(p); err != nil {
		return nil, fmt.Errorf("lastseen: bench: db.Use: %w", err)
	}
	defer p.Close(context.WithoutCancel(ctx))
	e.checkpoint(ctx)

	c.progress("purge: PurgeExpiredSessions")
	heap := startHeap(time.Millisecond)
	e.tracer.start()
	e.timer.start()
	t0 := time.Now()
	res.Result, err = p.PurgeExpiredSessions(ctx)
	res.Wall = time.Since(t0)
	res.Redis = e.timer.stop()
	res.SQL = e.tracer.stop()
	res.Heap = heap.Stop()
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: purge: %w", err)
	}
	res.RowsPerSec = float64(res.Result.Deleted) / res.Wall.Seconds()

	q := db.WithContext(ctx).Table(res.Table)
	if err := q.Count(&res.Left).Error; err != nil {
		return nil, fmt.Errorf("lastseen: bench: count sessions: %w", err)
	}
	err = db.WithContext(ctx).Table(res.Table).Where(clause.Gt{Column: clause.Column{Name: "expires_at"}, Value: res.Result.Cutoff}).
		Count(&res.LiveLeft).Error
	if err != nil {
		return nil, fmt.Errorf("lastseen: bench: count live sessions: %w", err)
	}
	var problems []string
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
	c.progress("purge: %d deleted, %.0f rows/s, longest batch transaction %v, heap +%s, check %s",
		res.Result.Deleted, res.RowsPerSec, res.SQL.LongestTx, fmtBytes(res.Heap.PeakHeapGrowth), res.Check)
	return res, nil
}

// createSessions creates "purge_sessions" from lastseen.Session with
// expired sessions that expired up to 30 days before now and live ones
// spread evenly among them (row i is live when i*live/total steps up), so
// that the purge has to skip live rows all along the table. Ids are MD5
// hex strings, like random session tokens.
func (e *env) createSessions(ctx context.Context, db *gorm.DB, expired, live int, now time.Time) (string, error) {
	db = db.WithContext(ctx)
	if err := db.AutoMigrate(&lastseen.Session{}); err != nil {
		return "", fmt.Errorf("lastseen: bench: create sessions table: %w", err)
	}
	stmt := &gorm.Statement{DB: db}
	if err := stmt.Parse(&lastseen.Session{}); err != nil {
		return "", err
	}
	table := stmt.Schema.Table
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
