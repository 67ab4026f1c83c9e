package tests

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bsm/redislock"
	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// purgeConfig is h.config() for purge tests: batches of batch sessions, no
// pause between batches.
func purgeConfig(h *harness, batch int) lastseen.Config {
	cfg := h.config()
	cfg.Sessions.BatchSize = batch
	testenv.Seam(&cfg).PurgePause = -1
	return cfg
}

// sess is a row of the plugin's Session model.
func sess(id, expires string) lastseen.Session {
	return lastseen.Session{ID: id, UserID: 1, ExpiresAt: mustTime(expires), CreatedAt: mustTime("2026-02-01T00:00:00Z")}
}

// seedSessions creates the sessions table and rows.
func seedSessions(t testing.TB, db *gorm.DB, rows ...lastseen.Session) {
	t.Helper()
	must(t, db.AutoMigrate(&lastseen.Session{}))
	if len(rows) > 0 {
		must(t, db.Create(&rows).Error)
	}
}

// tableIDs lists every row's primary key (soft-deleted rows included),
// sorted, joined with ",".
func tableIDs(t testing.TB, db *gorm.DB, table, pk string) string {
	t.Helper()
	var ids []string
	must(t, db.Table(table).Pluck(pk, &ids).Error)
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// beforeDelete runs fn before GORM deletes, on db and on the plugin's
// handle derived from it.
func beforeDelete(t testing.TB, db *gorm.DB, name string, fn func(tx *gorm.DB)) {
	t.Helper()
	must(t, db.Callback().Delete().Before("gorm:delete").Register(name, fn))
}

// purgeLog collects a JSON slog handler's lines.
type purgeLog struct{ testenv.Logs }

func (l *purgeLog) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// debugLogger also keeps Debug lines (empty and skipped runs).
func (l *purgeLog) debugLogger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// lines parses every line logged so far, but for Initialize's warnings
// about tables the test creates after db.Use (schema_test.go tests those).
func (l *purgeLog) lines(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(l.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if msg, _ := m["msg"].(string); strings.HasPrefix(msg, "lastseen: table ") && strings.Contains(msg, " does not exist") {
			continue
		}
		out = append(out, m)
	}
	return out
}

// AppSession is an app's session model with soft deletes.
type AppSession struct {
	gorm.Model
	Token     string    `gorm:"uniqueIndex;size:64;not null"`
	UserID    uint      `gorm:"index;not null"`
	ExpiresAt time.Time `gorm:"index;not null"`
}

// TestSoftDeletedExpiredSessions: a session
// model embedding gorm.Model. The scope follows GORM's soft-delete filter;
// the purge deletes for real, soft-deleted expired rows included, and
// leaves unexpired rows (soft-deleted or not) untouched.
func TestSoftDeletedExpiredSessions(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		now := mustTime("2026-03-01T12:00:00Z")
		h.clock.Set(now)
		cfg := purgeConfig(h, 1000)
		cfg.Sessions.Model = &AppSession{}
		p, db := h.plugin(cfg)
		db.Config.NowFunc = func() time.Time { return now.Local() }
		must(t, db.AutoMigrate(&AppSession{}))
		deleted := func(at string) gorm.DeletedAt { return gorm.DeletedAt{Time: mustTime(at), Valid: true} }
		must(t, db.Create(&[]AppSession{
			{Model: gorm.Model{ID: 1}, Token: "t1", UserID: 11, ExpiresAt: mustTime("2026-03-01T11:00:00Z")},
			{Model: gorm.Model{ID: 2, DeletedAt: deleted("2026-03-01T11:30:00Z")}, Token: "t2", UserID: 12, ExpiresAt: mustTime("2026-03-01T11:59:59Z")},
			{Model: gorm.Model{ID: 3}, Token: "t3", UserID: 13, ExpiresAt: mustTime("2026-03-01T12:00:01Z")},
			{Model: gorm.Model{ID: 4, DeletedAt: deleted("2026-03-01T11:00:00Z")}, Token: "t4", UserID: 14, ExpiresAt: mustTime("2026-03-02T00:00:00Z")},
		}).Error)

		ids := func(q *gorm.DB) string {
			var rows []AppSession
			must(t, q.Scopes(lastseen.Expired).Order("id").Find(&rows).Error)
			var out []string
			for _, r := range rows {
				out = append(out, fmt.Sprint(r.ID))
			}
			return strings.Join(out, ",")
		}
		equal(t, "Expired scope", ids(db), "1")
		equal(t, "Unscoped Expired scope", ids(db.Unscoped()), "1,2")

		ec, err := p.ExpiredSessions(ctx)

		count, oldest := ec.Expired, ec.Oldest
		must(t, err)
		equal(t, "dry-run count", count, 2)
		equal(t, "dry-run oldest", oldest.Format(time.RFC3339), "2026-03-01T11:00:00Z")

		snapshot := func() string {
			var rows []AppSession
			must(t, db.Unscoped().Where("id IN ?", []uint{3, 4}).Order("id").Find(&rows).Error)
			var b strings.Builder
			for _, r := range rows {
				fmt.Fprintf(&b, "%d %s %d exp=%s created=%s updated=%s deleted=%v/%s\n", r.ID, r.Token, r.UserID,
					r.ExpiresAt.UTC().Format(time.RFC3339Nano), r.CreatedAt.UTC().Format(time.RFC3339Nano),
					r.UpdatedAt.UTC().Format(time.RFC3339Nano), r.DeletedAt.Valid, r.DeletedAt.Time.UTC().Format(time.RFC3339Nano))
			}
			return b.String()
		}
		before := snapshot()

		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "deleted", res.Deleted, 2)
		equal(t, "batches", res.Batches, 1)
		equal(t, "cutoff", res.Cutoff.Format(time.RFC3339), "2026-03-01T12:00:00Z")
		equal(t, "stopped", res.Stopped, false)

		var n int64
		must(t, db.Raw("SELECT count(*) FROM app_sessions").Scan(&n).Error)
		equal(t, "rows left (raw count)", n, 2)
		equal(t, "ids left", tableIDs(t, db, "app_sessions", "id"), "3,4")
		equal(t, "rows 3 and 4 untouched", snapshot(), before)
		equal(t, "row 4 still soft-deleted", strings.Contains(before, "\n4 t4 14 exp=2026-03-02T00:00:00Z created=2026-03-01T12:00:00Z updated=2026-03-01T12:00:00Z deleted=true/2026-03-01T11:00:00Z\n"), true)
		equal(t, "scope after purge", ids(db.Unscoped()), "")
	})
}

// sessionUUID is a UUID primary key the way apps declare one: uuid.UUID
// underneath, a uuid column on PostgreSQL, char(36) on MySQL, text on
// SQLite.
type sessionUUID uuid.UUID

func (u sessionUUID) Value() (driver.Value, error) { return uuid.UUID(u).String(), nil }
func (u *sessionUUID) Scan(src any) error          { return (*uuid.UUID)(u).Scan(src) }
func (u sessionUUID) String() string               { return uuid.UUID(u).String() }

// GormDBDataType gives the column type per dialect (GORM's
// GormDBDataTypeInterface).
func (sessionUUID) GormDBDataType(db *gorm.DB, _ *schema.Field) string {
	switch db.Dialector.Name() {
	case "postgres":
		return "uuid"
	case "mysql":
		return "char(36)"
	}
	return "text"
}

// authSession is an app's own session model: custom table name, UUID
// primary key, a soft-delete field of its own name, expiry by column name.
type authSession struct {
	ID         sessionUUID `gorm:"primaryKey"`
	AccountID  int64       `gorm:"index;not null"`
	ValidUntil time.Time   `gorm:"index;not null"`
	Revoked    gorm.DeletedAt
}

func (authSession) TableName() string { return "auth_sessions" }

// TestPurgeModels runs the same purge over the plugin's Session and an app
// model with a custom table name, a soft-delete field and a UUID primary
// key, in batches of 2: every expired row goes (soft-deleted ones too),
// every live row stays.
func TestPurgeModels(t *testing.T) {
	type row struct {
		expires string
		deleted bool
		live    bool
	}
	rows := []row{
		{"2026-03-01T08:00:00Z", false, false},
		{"2026-03-01T09:00:00Z", true, false},
		{"2026-03-01T09:29:59Z", false, false},
		{"2026-03-01T09:30:00Z", false, false}, // equal to the cutoff: expired
		{"2026-02-01T00:00:00Z", true, false},
		{"2026-03-01T09:30:01Z", false, true},
		{"2026-03-02T00:00:00Z", true, true},
	}
	for _, m := range []struct {
		name, table, pk, field string
		model                  any
		create                 func(db *gorm.DB, i int, r row) (string, error)
	}{
		{"Session", "sessions", "id", "", &lastseen.Session{}, func(db *gorm.DB, i int, r row) (string, error) {
			s := sess(fmt.Sprintf("s%d", i), r.expires)
			return s.ID, db.Create(&s).Error // Session has no soft delete
		}},
		{"authSession", "auth_sessions", "id", "valid_until", &authSession{}, func(db *gorm.DB, i int, r row) (string, error) {
			s := authSession{ID: sessionUUID(uuid.New()), AccountID: int64(i), ValidUntil: mustTime(r.expires)}
			if r.deleted {
				s.Revoked = gorm.DeletedAt{Time: mustTime("2026-03-01T07:00:00Z"), Valid: true}
			}
			return s.ID.String(), db.Create(&s).Error
		}},
	} {
		t.Run(m.name, func(t *testing.T) {
			forEachDialect(t, func(t *testing.T, h *harness) {
				ctx := context.Background()
				cfg := purgeConfig(h, 2)
				cfg.Sessions.Model = m.model
				cfg.Sessions.ExpiresField = m.field
				p, db := h.plugin(cfg)
				db.Config.NowFunc = h.clock.Now
				must(t, db.AutoMigrate(m.model))
				var live, all []string
				expiredVisible := 0
				for i, r := range rows {
					id, err := m.create(db, i, r)
					must(t, err)
					all = append(all, id)
					if r.live {
						live = append(live, id)
					} else if !r.deleted || m.name == "Session" {
						expiredVisible++
					}
				}
				slices.Sort(live)
				slices.Sort(all)
				equal(t, "rows", tableIDs(t, db, m.table, m.pk), strings.Join(all, ","))

				var n int64
				must(t, db.Model(m.model).Scopes(lastseen.Expired).Count(&n).Error)
				equal(t, "Expired scope count", n, int64(expiredVisible))
				must(t, db.Unscoped().Model(m.model).Scopes(lastseen.Expired).Count(&n).Error)
				equal(t, "Unscoped Expired scope count", n, 5)

				res, err := p.PurgeExpiredSessions(ctx)
				must(t, err)
				equal(t, "deleted", res.Deleted, 5)
				equal(t, "batches", res.Batches, 3)
				equal(t, "ids left", tableIDs(t, db, m.table, m.pk), strings.Join(live, ","))
				if m.name == "authSession" {
					must(t, db.Table("auth_sessions").Where("revoked IS NOT NULL").Count(&n).Error)
					equal(t, "live soft-deleted row kept", n, 1)
				}

				res, err = p.PurgeExpiredSessions(ctx)
				must(t, err)
				equal(t, "second run deleted", res.Deleted, 0)
				equal(t, "second run batches", res.Batches, 0)
			})
		})
	}
}

// queryWatch records the purge's selects: their SQL and the most rows one
// of them loaded into its destination.
type queryWatch struct {
	mu       sync.Mutex
	sql      []string
	maxRows  int64
	maxSlice int
}

func watchQueries(t testing.TB, db *gorm.DB) *queryWatch {
	w := &queryWatch{}
	must(t, db.Callback().Query().After("gorm:query").Register("test:watch_query", func(tx *gorm.DB) {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.sql = append(w.sql, tx.Statement.SQL.String())
		w.maxRows = max(w.maxRows, tx.RowsAffected)
		if v := reflect.Indirect(reflect.ValueOf(tx.Statement.Dest)); v.Kind() == reflect.Slice {
			w.maxSlice = max(w.maxSlice, v.Len())
		}
	}))
	return w
}

// TestPurgeBatches: FindInBatches walks the expired rows by primary key,
// selecting the primary key only, and each batch is deleted on its own.
func TestPurgeBatches(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 2))
		seedSessions(t, db,
			sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:30:00Z"), sess("c", "2026-03-01T10:00:00Z"),
			sess("d", "2026-03-01T08:00:00Z"), sess("e", "2026-03-01T09:31:00Z"), sess("f", "2026-03-01T01:00:00Z"),
			sess("g", "2026-02-28T23:00:00Z"))
		w := watchQueries(t, db)
		var deletes atomic.Int64
		must(t, db.Callback().Delete().After("gorm:delete").Register("test:count", func(tx *gorm.DB) { deletes.Add(1) }))

		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "deleted", res.Deleted, 5)
		equal(t, "batches", res.Batches, 3)
		equal(t, "retries", res.Retries, 0)
		equal(t, "stopped", res.Stopped, false)
		w.mu.Lock()
		selects := slices.Clone(w.sql)
		w.mu.Unlock()
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "c,e")
		equal(t, "delete statements", deletes.Load(), 3)
		equal(t, "selects", len(selects), 3) // 2 + 2 + 1 rows; a short batch ends the walk
		selectPK := "SELECT " + db.Statement.Quote(clause.Column{Table: "sessions", Name: "id"}) + " FROM "
		for i, q := range selects {
			if !strings.HasPrefix(q, selectPK) {
				t.Errorf("select %d = %q, want it to start with %q", i+1, q, selectPK)
			}
		}
		equal(t, "most rows in one select", w.maxRows, 2)
		s := p.Stats()
		equal(t, "stats purges", s.Purges, 1)
		equal(t, "stats sessions deleted", s.SessionsDeleted, 5)
	})
}

// TestPurgeInterrupted: a context canceled while batch 1 is being deleted
// stops the run after that batch, which commits; a second run deletes the
// rest.
func TestPurgeInterrupted(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		p, db := h.plugin(purgeConfig(h, 2))
		seedSessions(t, db,
			sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"), sess("c", "2026-03-01T09:02:00Z"),
			sess("d", "2026-03-01T09:03:00Z"), sess("e", "2026-03-01T09:04:00Z"), sess("z", "2026-03-01T10:00:00Z"))
		ctx, cancel := context.WithCancel(context.Background())
		var calls atomic.Int64
		beforeDelete(t, db, "test:cancel", func(tx *gorm.DB) {
			if calls.Add(1) == 1 {
				cancel()
			}
		})

		res, err := p.PurgeExpiredSessions(ctx)
		if err != context.Canceled {
			t.Fatalf("interrupted purge: err = %v, want context.Canceled", err)
		}
		equal(t, "deleted", res.Deleted, 2)
		equal(t, "batches", res.Batches, 1)
		equal(t, "stopped", res.Stopped, true)
		equal(t, "ids left after the interrupted run", tableIDs(t, db, "sessions", "id"), "c,d,e,z")

		res, err = p.PurgeExpiredSessions(context.Background())
		must(t, err)
		equal(t, "second run deleted", res.Deleted, 3)
		equal(t, "second run batches", res.Batches, 2)
		equal(t, "second run stopped", res.Stopped, false)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "z")
		s := p.Stats()
		equal(t, "stats purges", s.Purges, 2)
		equal(t, "stats purge errors", s.PurgeErrors, 1)
		equal(t, "stats sessions deleted", s.SessionsDeleted, 5)
	})
}

// TestPurgeFrozenCutoff: the clock moves an hour per batch while the purge
// runs; rows expiring meanwhile are left for the next run.
func TestPurgeFrozenCutoff(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 2)) // clock 2026-03-01T09:30:00Z
		seedSessions(t, db,
			sess("a1", "2026-03-01T06:00:00Z"), sess("a2", "2026-03-01T07:00:00Z"),
			sess("a3", "2026-03-01T08:00:00Z"), sess("a4", "2026-03-01T09:30:00Z"),
			sess("b1", "2026-03-01T09:30:01Z"), sess("b2", "2026-03-01T10:00:00Z"), sess("b3", "2026-03-01T10:29:00Z"),
			sess("c1", "2026-03-01T15:00:00Z"))
		must(t, db.Callback().Delete().After("gorm:delete").Register("test:tick", func(*gorm.DB) { h.clock.Add(time.Hour) }))

		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "cutoff", res.Cutoff.Format(time.RFC3339), "2026-03-01T09:30:00Z")
		equal(t, "deleted", res.Deleted, 4)
		equal(t, "batches", res.Batches, 2)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "b1,b2,b3,c1")
		equal(t, "clock after the run", h.clock.Now().Format(time.RFC3339), "2026-03-01T11:30:00Z")

		res, err = p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "second cutoff", res.Cutoff.Format(time.RFC3339), "2026-03-01T11:30:00Z")
		equal(t, "second run deleted", res.Deleted, 3)
		equal(t, "ids left after the second run", tableIDs(t, db, "sessions", "id"), "c1")
	})
}

// retryableError is an error the dialect reports for a deadlock.
func retryableError(dialect string) error {
	switch dialect {
	case "postgres":
		return &pgconn.PgError{Severity: "ERROR", Code: "40P01", Message: "deadlock detected"}
	case "mysql":
		return &mysqldrv.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}
	}
	return errors.New("database is locked (5) (SQLITE_BUSY)")
}

func TestRetryableErrors(t *testing.T) {
	for _, c := range []struct {
		dialect string
		err     error
		want    bool
	}{
		{"postgres", &pgconn.PgError{Code: "40P01"}, true},
		{"postgres", &pgconn.PgError{Code: "40001"}, true},
		{"postgres", fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40001"}), true},
		{"postgres", &pgconn.PgError{Code: "23505"}, false},
		{"postgres", errors.New("deadlock detected"), false},
		{"mysql", &mysqldrv.MySQLError{Number: 1213}, true},
		{"mysql", &mysqldrv.MySQLError{Number: 1205}, true},
		{"mysql", &mysqldrv.MySQLError{Number: 1062}, false},
		{"sqlite", errors.New("database is locked (5) (SQLITE_BUSY)"), true},
		{"sqlite", errors.New("sqlite: step: SQLITE_BUSY"), true},
		{"sqlite", errors.New("constraint failed: UNIQUE constraint failed: sessions.id (1555)"), false},
	} {
		equal(t, fmt.Sprintf("%s retryable(%v)", c.dialect, c.err), dialect.Lookup(c.dialect).Retryable(c.err), c.want)
	}
}

// TestPurgeRetries: deadlocks and serialization failures are retried a
// bounded number of times per batch; other errors stop the run at once and
// name their batch.
func TestPurgeRetries(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := purgeConfig(h, 2)
		testenv.Seam(&cfg).MaxRetries = 3
		p, db := h.plugin(cfg)
		deadlock := retryableError(h.dialect)
		var (
			mu       sync.Mutex
			attempts int
			inject   func(attempt int) error
		)
		beforeDelete(t, db, "test:inject", func(tx *gorm.DB) {
			mu.Lock()
			defer mu.Unlock()
			attempts++
			if inject != nil {
				if err := inject(attempts); err != nil {
					tx.AddError(err)
				}
			}
		})
		run := func(f func(attempt int) error) (lastseen.PurgeResult, error, int) {
			mu.Lock()
			attempts, inject = 0, f
			mu.Unlock()
			res, err := p.PurgeExpiredSessions(ctx)
			mu.Lock()
			defer mu.Unlock()
			return res, err, attempts
		}
		seed := func() {
			must(t, db.Exec("DELETE FROM sessions").Error)
			must(t, db.Create(&[]lastseen.Session{sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"),
				sess("c", "2026-03-01T09:02:00Z"), sess("d", "2026-03-01T09:03:00Z"), sess("z", "2026-03-02T00:00:00Z")}).Error)
		}
		seedSessions(t, db)

		// Two deadlocks in batch 1: retried, then both batches commit.
		seed()
		res, err, n := run(func(a int) error {
			if a <= 2 {
				return deadlock
			}
			return nil
		})
		must(t, err)
		equal(t, "recovered: deleted", res.Deleted, 4)
		equal(t, "recovered: batches", res.Batches, 2)
		equal(t, "recovered: retries", res.Retries, 2)
		equal(t, "recovered: attempts", n, 4)
		equal(t, "recovered: ids left", tableIDs(t, db, "sessions", "id"), "z")

		// Deadlocks every time: 1 + MaxRetries attempts, then the error.
		seed()
		res, err, n = run(func(int) error { return deadlock })
		if err == nil {
			t.Fatal("persistent deadlock: no error")
		}
		equal(t, "persistent: error", err.Error(), "lastseen: purge batch 1: "+deadlock.Error())
		equal(t, "persistent: error wraps the driver's", errors.Is(err, deadlock), true)
		equal(t, "persistent: attempts", n, 4)
		equal(t, "persistent: retries", res.Retries, 3)
		equal(t, "persistent: deleted", res.Deleted, 0)
		equal(t, "persistent: stopped", res.Stopped, true)
		equal(t, "persistent: ids left", tableIDs(t, db, "sessions", "id"), "a,b,c,d,z")

		// Another error in batch 2: no retry, batch 1 stays committed.
		seed()
		diskFull := errors.New("injected: disk full")
		res, err, n = run(func(a int) error {
			if a == 2 {
				return diskFull
			}
			return nil
		})
		if err == nil {
			t.Fatal("disk full: no error")
		}
		equal(t, "disk full: error", err.Error(), "lastseen: purge batch 2: injected: disk full")
		equal(t, "disk full: attempts", n, 2)
		equal(t, "disk full: deleted", res.Deleted, 2)
		equal(t, "disk full: batches", res.Batches, 1)
		equal(t, "disk full: stopped", res.Stopped, true)
		equal(t, "disk full: ids left", tableIDs(t, db, "sessions", "id"), "c,d,z")

		// A select that fails names its batch too.
		seed()
		var selects atomic.Int64
		must(t, db.Callback().Query().Before("gorm:query").Register("test:fail_select", func(tx *gorm.DB) {
			if selects.Add(1) == 2 {
				tx.AddError(errors.New("injected: connection reset"))
			}
		}))
		res, err, _ = run(nil)
		if err == nil {
			t.Fatal("failed select: no error")
		}
		equal(t, "failed select: error", err.Error(), "lastseen: purge batch 2: select: injected: connection reset")
		equal(t, "failed select: deleted", res.Deleted, 2)
		equal(t, "failed select: ids left", tableIDs(t, db, "sessions", "id"), "c,d,z")

		s := p.Stats()
		equal(t, "stats purges", s.Purges, 4)
		equal(t, "stats purge errors", s.PurgeErrors, 3)
		equal(t, "stats sessions deleted", s.SessionsDeleted, 8)
	})
}

// TestPurgeNoRetry: MaxRetries < 0 turns retries off.
func TestPurgeNoRetry(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		cfg := purgeConfig(h, 2)
		testenv.Seam(&cfg).MaxRetries = -1
		p, db := h.plugin(cfg)
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"))
		deadlock := retryableError(h.dialect)
		var attempts atomic.Int64
		beforeDelete(t, db, "test:inject", func(tx *gorm.DB) {
			attempts.Add(1)
			tx.AddError(deadlock)
		})
		res, err := p.PurgeExpiredSessions(context.Background())
		if err == nil {
			t.Fatal("no error")
		}
		equal(t, "error", err.Error(), "lastseen: purge batch 1: "+deadlock.Error())
		equal(t, "attempts", attempts.Load(), 1)
		equal(t, "retries", res.Retries, 0)
	})
}

// TestPurgeOneInstance: several instances on the same database and Redis
// run the scheduled job at once; one purges, the others skip the tick
// without error, and each row is deleted once.
func TestPurgeOneInstance(t *testing.T) {
	const instances = 4
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "instances share one Redis purge lock")
		ctx := context.Background()
		var (
			ps      []*lastseen.Plugin
			logs    []*purgeLog
			blocked atomic.Bool
			entered = make(chan struct{})
			release = make(chan struct{})
		)
		for range instances {
			l := &purgeLog{}
			cfg := purgeConfig(h, 3)
			cfg.Logger = l.debugLogger()
			p, db := h.plugin(cfg)
			// The first batch of whichever instance wins blocks until released.
			beforeDelete(t, db, "test:block", func(*gorm.DB) {
				if blocked.CompareAndSwap(false, true) {
					close(entered)
					<-release
				}
			})
			ps, logs = append(ps, p), append(logs, l)
		}
		db := h.db
		seedSessions(t, db,
			sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"), sess("c", "2026-03-01T09:02:00Z"),
			sess("d", "2026-03-01T09:03:00Z"), sess("e", "2026-03-01T09:04:00Z"), sess("f", "2026-03-01T09:05:00Z"),
			sess("g", "2026-03-01T09:06:00Z"), sess("y", "2026-03-01T11:00:00Z"), sess("z", "2026-03-01T12:00:00Z"))

		tick := func() chan int {
			start, done := make(chan struct{}), make(chan int, instances)
			for i, p := range ps {
				go func() {
					<-start
					purgeJob(p, ctx)
					done <- i
				}()
			}
			close(start)
			return done
		}
		done := tick()
		<-entered
		for range instances - 1 {
			<-done // the instances that skipped the tick return while the winner is blocked
		}
		if _, err := ps[0].PurgeExpiredSessions(ctx); err != lastseen.ErrLocked {
			t.Errorf("PurgeExpiredSessions while another instance purges: err = %v, want ErrLocked", err)
		}
		close(release)
		<-done

		var sum lastseen.Stats
		var msgs []string
		for i, p := range ps {
			s := p.Stats()
			sum.Purges += s.Purges
			sum.PurgeSkipped += s.PurgeSkipped
			sum.PurgeErrors += s.PurgeErrors
			sum.SessionsDeleted += s.SessionsDeleted
			lines := logs[i].lines(t)
			equal(t, fmt.Sprintf("instance %d log lines", i), len(lines), 1)
			for _, l := range lines {
				msgs = append(msgs, fmt.Sprintf("%v %v deleted=%v", l["level"], l["msg"], l["deleted"]))
			}
		}
		slices.Sort(msgs)
		want := []string{"INFO lastseen: purge deleted=7"}
		for range instances - 1 {
			want = append(want, "DEBUG lastseen: purge skipped: another instance holds the lock deleted=0")
		}
		slices.Sort(want)
		equal(t, "log lines", strings.Join(msgs, "\n"), strings.Join(want, "\n"))
		equal(t, "purges", sum.Purges, 1)
		equal(t, "skipped", sum.PurgeSkipped, instances) // instances-1 ticks and the PurgeExpiredSessions call
		equal(t, "errors", sum.PurgeErrors, 0)
		equal(t, "deleted", sum.SessionsDeleted, 7)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "y,z")

		// A free-running tick: whoever gets the lock deletes the newly
		// expired rows, once.
		h.clock.Set(mustTime("2026-03-01T11:30:00Z"))
		must(t, db.Create(&[]lastseen.Session{sess("h", "2026-03-01T10:00:00Z"), sess("i", "2026-03-01T10:30:00Z")}).Error)
		done = tick()
		for range instances {
			<-done
		}
		var after lastseen.Stats
		for _, p := range ps {
			s := p.Stats()
			after.Purges += s.Purges
			after.PurgeSkipped += s.PurgeSkipped
			after.PurgeErrors += s.PurgeErrors
			after.SessionsDeleted += s.SessionsDeleted
		}
		equal(t, "second tick: runs", after.Purges+after.PurgeSkipped-sum.Purges-sum.PurgeSkipped, instances)
		equal(t, "second tick: errors", after.PurgeErrors, 0)
		equal(t, "second tick: deleted", after.SessionsDeleted-sum.SessionsDeleted, 3)
		equal(t, "second tick: ids left", tableIDs(t, db, "sessions", "id"), "z")
	})
}

// TestPurgeJobLogsAndStats: every job run logs one structured line (Debug
// when it deleted nothing or was skipped), and
// Stats counts runs, errors, skipped ticks and deleted rows.
func TestPurgeJobLogsAndStats(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		l := &purgeLog{}
		cfg := purgeConfig(h, 2)
		cfg.Logger = l.debugLogger()
		p, db := h.plugin(cfg)
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"),
			sess("c", "2026-03-01T09:02:00Z"), sess("z", "2026-03-02T00:00:00Z"))

		purgeJob(p, ctx) // deletes 3 in 2 batches
		purgeJob(p, ctx) // nothing left

		must(t, db.Create(&lastseen.Session{ID: "d", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:03:00Z")}).Error)
		fail := atomic.Bool{}
		fail.Store(true)
		beforeDelete(t, db, "test:fail", func(tx *gorm.DB) {
			if fail.Load() {
				tx.AddError(errors.New("injected: disk full"))
			}
		})
		purgeJob(p, ctx) // fails in batch 1
		fail.Store(false)

		other := redislock.New(h.r.Client)
		lock, err := other.Obtain(ctx, h.prefix+":purge:lock", time.Minute, nil)
		must(t, err)
		purgeJob(p, ctx) // skipped: the lock is held
		must(t, lock.Release(ctx))

		lines := l.lines(t)
		equal(t, "log lines", len(lines), 4)
		want := []string{
			"INFO lastseen: purge deleted=3 batches=2 retries=0 stopped=false err=<nil>",
			"DEBUG lastseen: purge: nothing expired deleted=0 batches=0 retries=0 stopped=false err=<nil>",
			"ERROR lastseen: purge failed deleted=0 batches=0 retries=0 stopped=true err=lastseen: purge batch 1: injected: disk full",
			"DEBUG lastseen: purge skipped: another instance holds the lock deleted=0 batches=0 retries=0 stopped=false err=<nil>",
		}
		for i, line := range lines {
			if i >= len(want) {
				break
			}
			got := fmt.Sprintf("%v %v deleted=%v batches=%v retries=%v stopped=%v err=%v",
				line["level"], line["msg"], line["deleted"], line["batches"], line["retries"], line["stopped"], line["err"])
			equal(t, fmt.Sprintf("line %d", i+1), got, want[i])
			equal(t, fmt.Sprintf("line %d plugin", i+1), line["plugin"], any(p.Name()))
			d, ok := line["duration"].(float64) // slog's JSON handler writes nanoseconds
			equal(t, fmt.Sprintf("line %d has a duration", i+1), ok, true)
			if i < 3 && d <= 0 {
				t.Errorf("line %d duration = %v, want > 0", i+1, d)
			}
		}
		equal(t, "first line cutoff", lines[0]["cutoff"], any("2026-03-01T09:30:00Z"))

		s := p.Stats()
		equal(t, "stats purges", s.Purges, 3)
		equal(t, "stats purge errors", s.PurgeErrors, 1)
		equal(t, "stats purge skipped", s.PurgeSkipped, 1)
		equal(t, "stats sessions deleted", s.SessionsDeleted, 3)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "d,z")
	})
}

// TestPurgeScheduled: PurgeSchedule takes several specs; each becomes a
// cron entry running the purge job, and Close stops them.
func TestPurgeScheduled(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		l := &purgeLog{}
		cfg := purgeConfig(h, 1000)
		cfg.Flush.Schedule, cfg.Sessions.Schedule = "", "" // the scheduler on
		cfg.Flush.Schedule = "@every 1h"
		cfg.Sessions.Schedule = "@every 1h; 0 3 * * *"
		cfg.Logger = l.logger()
		p, db := h.plugin(cfg)
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"), sess("z", "2026-03-02T00:00:00Z"))

		equal(t, "cron entries", len(internals(p).Scheduler.Entries()), 3) // flush, purge hourly, purge nightly
		purge := internals(p).Scheduler.Entry(3)                           // IDs follow the order added: flush 1, purges 2 and 3
		purge.Job.Run()
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "z")
		lines := l.lines(t)
		equal(t, "log lines", len(lines), 1)
		equal(t, "log line", fmt.Sprint(lines[0]["msg"], " deleted=", lines[0]["deleted"]), "lastseen: purge deleted=1")
		must(t, p.Close(context.Background()))
	})
}

// TestPurgeConfigRefused: problems with the session model or the purge
// options fail Initialize with a message naming them.
func TestPurgeConfigRefused(t *testing.T) {
	type compositeSession struct {
		Token     string `gorm:"primaryKey"`
		UserID    uint64 `gorm:"primaryKey"`
		ExpiresAt time.Time
	}
	forEachDialect(t, func(t *testing.T, h *harness) {
		limit := map[string]int{"postgres": 65534, "mysql": 65534, "sqlite": 32765}[h.dialect]
		for _, c := range []struct {
			name string
			set  func(*lastseen.Config)
			want string
		}{
			{"composite primary key", func(c *lastseen.Config) { c.Sessions.Model = &compositeSession{} },
				"lastseen: invalid config: Sessions.Model compositeSession has 2 primary key fields [Token UserID], want exactly one"},
			{"missing expiry field", func(c *lastseen.Config) { c.Sessions.ExpiresField = "Expiry" },
				`lastseen: invalid config: Sessions.ExpiresField "Expiry": Session has no such field or column`},
			{"expiry not a time", func(c *lastseen.Config) { c.Sessions.ExpiresField = "user_id" },
				`lastseen: invalid config: Sessions.ExpiresField "user_id": Session.UserID is a uint64: ` + wantIntUnit},
			{"batch too large", func(c *lastseen.Config) { c.Sessions.BatchSize = limit + 1 },
				fmt.Sprintf("lastseen: invalid config: Sessions.BatchSize %d exceeds the %s limit of %d sessions per delete (%d bind parameters, 1 per session and 1 for the cutoff)",
					limit+1, h.dialect, limit, limit+1)},
			{"batch negative", func(c *lastseen.Config) { c.Sessions.BatchSize = -1 },
				fmt.Sprintf("lastseen: invalid config: Sessions.BatchSize is -1, want 1 to %d", limit)},
			{"bad schedule", func(c *lastseen.Config) { c.Sessions.Schedule = "@every 1h;nightly" },
				`lastseen: invalid config: Sessions.Schedule "nightly": expected exactly 5 fields, found 1: [nightly]`},
		} {
			cfg := h.config()
			c.set(&cfg)
			err := h.openDB().Use(lastseen.New(cfg))
			if err == nil {
				t.Errorf("%s: Initialize accepted it", c.name)
				continue
			}
			equal(t, c.name, err.Error(), c.want)
			equal(t, c.name+" wraps ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
		}
		cfg := h.config()
		cfg.Sessions.BatchSize = limit
		p := lastseen.New(cfg)
		must(t, h.openDB().Use(p))
		must(t, p.Close(context.Background()))
	})
}

// TestPurgeNotInitialized: the purge methods need db.Use first.
func TestPurgeNotInitialized(t *testing.T) {
	p := lastseen.New(lastseen.Config{})
	if _, err := p.PurgeExpiredSessions(context.Background()); err != lastseen.ErrNotInitialized {
		t.Errorf("PurgeExpiredSessions: err = %v, want ErrNotInitialized", err)
	}
	if _, err := p.ExpiredSessions(context.Background()); err != lastseen.ErrNotInitialized {
		t.Errorf("ExpiredSessions: err = %v, want ErrNotInitialized", err)
	}
}

// TestExpiredSessionsDryRun: the count and oldest expiry a purge would
// delete, without deleting.
func TestExpiredSessionsDryRun(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 1000))
		seedSessions(t, db)
		ec, err := p.ExpiredSessions(ctx)
		count, oldest := ec.Expired, ec.Oldest
		must(t, err)
		equal(t, "empty: count", count, 0)
		equal(t, "empty: oldest is zero", oldest.IsZero(), true)

		must(t, db.Create(&[]lastseen.Session{sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-02-27T23:59:58.5Z"),
			sess("c", "2026-03-01T09:30:00Z"), sess("z", "2026-03-01T09:30:01Z")}).Error)
		ec, err = p.ExpiredSessions(ctx)
		count, oldest = ec.Expired, ec.Oldest
		must(t, err)
		equal(t, "count", count, 3)
		equal(t, "oldest", oldest.Format(time.RFC3339Nano), "2026-02-27T23:59:58.5Z")
		equal(t, "oldest is UTC", oldest.Location(), time.UTC)
		equal(t, "nothing deleted", tableIDs(t, db, "sessions", "id"), "a,b,c,z")
	})
}

// TestPurgeLarge: 25,000 expired sessions among 5,000 live ones go in 25
// batches of 1,000; no select loads more than a batch of primary keys.
func TestPurgeLarge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 1000)) // clock 2026-03-01T09:30:00Z
		now := h.clock.Now()
		rows := make([]lastseen.Session, 30_000)
		for i := range rows {
			d := time.Duration(i%50+1) * time.Minute
			if i%6 == 0 { // 5,000 live, spread between the expired ones in key order
				d = -d
			}
			rows[i] = lastseen.Session{ID: fmt.Sprintf("s%05d", i), UserID: uint64(i), ExpiresAt: now.Add(-d), CreatedAt: now}
		}
		must(t, db.AutoMigrate(&lastseen.Session{}))
		seeded := time.Now()
		if h.dialect == "sqlite" {
			// The same rows in one statement: GORM binding 120,000 values is
			// most of this test's time under -race with the pure-Go SQLite.
			must(t, db.Exec(`INSERT INTO sessions (id, user_id, expires_at, created_at)
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < ? - 1)
SELECT printf('s%05d', i), i,
  strftime('%Y-%m-%d %H:%M:%S+00:00', ?, CASE WHEN i % 6 = 0 THEN '+' ELSE '-' END || (i % 50 + 1) || ' minutes'), ?
FROM n`, len(rows), now.Format("2006-01-02 15:04:05"), now).Error)
			var got []lastseen.Session
			must(t, db.Where("id IN ?", []string{"s00000", "s00001", "s29999"}).Order("id").Find(&got).Error)
			for i, s := range got {
				want := rows[[]int{0, 1, 29999}[i]]
				equal(t, "seeded "+s.ID, fmt.Sprint(s.ID, s.UserID, s.ExpiresAt.UTC(), s.CreatedAt.UTC()),
					fmt.Sprint(want.ID, want.UserID, want.ExpiresAt.UTC(), want.CreatedAt.UTC()))
			}
		} else {
			must(t, db.CreateInBatches(&rows, 1000).Error)
		}
		t.Logf("%s: inserted %d rows in %v", h.dialect, len(rows), time.Since(seeded))
		w := watchQueries(t, db)

		start := time.Now()
		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		t.Logf("%s: purged %d rows in %d batches in %v", h.dialect, res.Deleted, res.Batches, time.Since(start))
		equal(t, "deleted", res.Deleted, 25_000)
		equal(t, "batches", res.Batches, 25)
		w.mu.Lock()
		equal(t, "selects", len(w.sql), 26) // 25 full batches and the empty one that ends the walk
		equal(t, "most rows one select loaded", w.maxRows, 1000)
		equal(t, "largest batch destination", w.maxSlice, 1000)
		w.mu.Unlock()

		var left, live int64
		must(t, db.Model(&lastseen.Session{}).Count(&left).Error)
		must(t, db.Model(&lastseen.Session{}).Where("id IN ?", []string{"s00000", "s00006", "s29994"}).Count(&live).Error)
		equal(t, "rows left", left, 5000)
		equal(t, "sampled live rows left", live, 3)
		ec, err := p.ExpiredSessions(ctx)
		count := ec.Expired
		must(t, err)
		equal(t, "expired left", count, 0)
	})
}

// TestSessionExpired: an expiry equal to now counts as expired, as in the
// Expired scope; locations do not matter.
func TestSessionExpired(t *testing.T) {
	now := mustTime("2026-03-01T12:00:00Z")
	for _, c := range []struct {
		expires time.Time
		want    bool
	}{
		{mustTime("2026-03-01T11:00:00Z"), true},
		{mustTime("2026-03-01T11:59:59.999999999Z"), true},
		{now, true}, // the boundary
		{mustTime("2026-03-01T12:00:00.000000001Z"), false},
		{mustTime("2026-03-01T12:00:01Z"), false},
		{now.In(time.FixedZone("+14", 14*3600)), true}, // the same instant, written 2026-03-02T02:00:00+14:00
		{mustTime("2026-03-02T01:00:00+14:00"), true},  // 11:00Z
		{mustTime("2026-03-01T02:00:01-10:00"), false}, // 12:00:01Z
		{time.Time{}, true},
	} {
		s := lastseen.Session{ID: "s", ExpiresAt: c.expires}
		equal(t, "Expired at "+c.expires.Format(time.RFC3339Nano), s.Expired(now, 0), c.want)
	}
}

// TestPurgeBatchTimeout: PurgeBatchTimeout bounds a batch's select and its
// transaction; a batch past it stops the run with an error naming it.
func TestPurgeBatchTimeout(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		rows := []lastseen.Session{sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"), sess("z", "2026-03-02T00:00:00Z")}

		// The first select waits for its context: only the timeout ends it.
		cfg := purgeConfig(h, 2)
		testenv.Seam(&cfg).PurgeBatchTimeout = 200 * time.Millisecond
		p, db := h.plugin(cfg)
		seedSessions(t, db, rows...)
		var selects atomic.Int64
		must(t, db.Callback().Query().Before("gorm:query").Register("test:hang", func(tx *gorm.DB) {
			if selects.Add(1) == 1 {
				<-tx.Statement.Context.Done()
			}
		}))
		res, err := p.PurgeExpiredSessions(ctx)
		if err == nil {
			t.Fatal("hung select: no error")
		}
		if want := "lastseen: purge batch 1: select: timed out after 200ms (PurgeBatchTimeout): "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("hung select: err = %q, want it to start with %q", err, want)
		}
		equal(t, "hung select: stopped", res.Stopped, true)
		equal(t, "hung select: deleted", res.Deleted, 0)
		equal(t, "hung select: ids left", tableIDs(t, db, "sessions", "id"), "a,b,z")

		// The first delete waits for its context. The select before it is
		// far inside the 1s the batch has.
		testenv.Seam(&cfg).PurgeBatchTimeout = time.Second
		p, db = h.plugin(cfg)
		var deletes atomic.Int64
		beforeDelete(t, db, "test:hang", func(tx *gorm.DB) {
			if deletes.Add(1) == 1 {
				<-tx.Statement.Context.Done()
			}
		})
		res, err = p.PurgeExpiredSessions(ctx)
		if err == nil {
			t.Fatal("hung delete: no error")
		}
		if want := "lastseen: purge batch 1: timed out after 1s (PurgeBatchTimeout): "; !strings.HasPrefix(err.Error(), want) {
			t.Errorf("hung delete: err = %q, want it to start with %q", err, want)
		}
		equal(t, "hung delete: deleted", res.Deleted, 0)
		equal(t, "hung delete: ids left", tableIDs(t, db, "sessions", "id"), "a,b,z")

		res, err = p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "next run: deleted", res.Deleted, 2)
	})
}

// TestPurgeIgnoresHandleState: a Model or conditions left on the handle the
// plugin was given do not leak into the purge's statements. (The plugin's
// handle is a GORM chain root: a caller that runs a statement directly on
// it leaves its Model behind, and GORM's Delete would add that Model's
// primary keys to the purge's WHERE.)
func TestPurgeIgnoresHandleState(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := h.plugin(purgeConfig(h, 2))
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T09:01:00Z"), sess("c", "2026-03-01T09:02:00Z"))
		base, err := internals(p).Handle()
		must(t, err)
		other := []lastseen.Session{sess("x", "2026-03-01T08:00:00Z"), sess("z", "2026-03-02T00:00:00Z")}
		must(t, base.Create(&other).Error) // leaves Model = &other on the plugin's handle
		ec, err := p.ExpiredSessions(ctx)
		count := ec.Expired
		must(t, err)
		equal(t, "dry-run count", count, 4)
		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "deleted", res.Deleted, 4)
		equal(t, "ids left", tableIDs(t, db, "sessions", "id"), "z")
	})
}
