package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestSliceArgsProbeRetriedAfterConnectionError: the PostgreSQL flush asks
// the driver once whether it takes Go slices as array parameters. A
// connection error at that question (a backend terminated, SQLSTATE 57P01)
// is retried like any error of the connection, not taken for a driver
// that takes no slices: the flush writes, and its UPDATE binds the keys
// as a Go slice (pgx's binary array) rather than array text for the rest
// of the process.
func TestSliceArgsProbeRetriedAfterConnectionError(t *testing.T) {
	h := newHarness(t, servers.Postgres(), testenv.Miniredis())
	ctx := context.Background()
	must(t, h.db.AutoMigrate(&lastseen.User{}))
	must(t, h.db.Exec("INSERT INTO users (id) VALUES (1), (2)").Error)
	cfg := h.config()
	cfg.Buffer.Shards = 1
	cfg.Sessions.Disabled = true
	p, db := h.plugin(cfg)
	var mu sync.Mutex
	probes, bound := 0, []string{}
	must(t, db.Callback().Row().Before("gorm:row").Register("test:fail_probe", func(tx *gorm.DB) {
		if !strings.Contains(tx.Statement.SQL.String(), "AS bigint[]) = CAST(") {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if probes++; probes == 1 {
			tx.AddError(&pgconn.PgError{Severity: "FATAL", Code: "57P01", Message: "terminating connection due to administrator command"})
		}
	}))
	must(t, db.Callback().Raw().After("gorm:raw").Register("test:bound", func(tx *gorm.DB) {
		if hasVerb(tx.Statement.SQL.String(), "UPDATE") && len(tx.Statement.Vars) > 0 {
			mu.Lock()
			defer mu.Unlock()
			bound = append(bound, fmt.Sprintf("%T", tx.Statement.Vars[0]))
		}
	}))
	for _, id := range []uint64{1, 2} {
		_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:20:00.000001Z"))
		must(t, err)
	}
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written, stale, unknown", [3]int{res.Written, res.Stale, res.Unknown}, [3]int{2, 0, 0})
	equal(t, "probes", probes, 2)
	equal(t, "the UPDATE's keys", strings.Join(bound, " "), "*[]int64")
	var got []string
	must(t, h.db.Raw("SELECT to_char(last_seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM users ORDER BY id").Scan(&got).Error)
	equal(t, "column", strings.Join(got, " "), "2026-03-01 09:20:00.000001 2026-03-01 09:20:00.000001")
}

// TestNaiveColumnThroughAnyDriver: a PostgreSQL timestamp (without time
// zone) column is found naive whatever database/sql driver GORM was given
// (postgres.Config.Conn), here pgx wrapped without its NamedValueChecker,
// through which GORM's own Migrator().ColumnTypes fails. With NowFunc in
// Europe/Berlin the flush writes Berlin wall times, moves a row forward
// from 10:10 (09:10Z) to 09:30:00.000001Z, and leaves one at 10:40
// (09:40Z), as through pgx itself.
func TestNaiveColumnThroughAnyDriver(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	ctx := context.Background()
	pg := servers.Postgres().New(t)
	admin := pg.Open(t)
	for _, ddl := range naiveDDL["postgres"] {
		must(t, admin.Exec(ddl).Error)
	}
	must(t, admin.Exec("INSERT INTO naive_users (id, seen) VALUES (1, NULL), (2, '2026-03-01 10:10:00'), (3, '2026-03-01 10:40:00')").Error)
	sqlDB := sql.OpenDB(noSlicesConnector{dsn: pg.DSN})
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), quietGorm())
	must(t, err)
	db.Config.NowFunc = func() time.Time { return time.Now().In(berlin) }
	cfg := lastseen.Config{Model: &berlinUser{}, Field: "Seen", Logger: testenv.Discard,
		Buffer:   lastseen.BufferConfig{Prefix: randomName("ls")},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Model: &berlinSession{}, Schedule: "off"},
		Test:     lastseen.TestConfig{Now: testenv.ClockAt("2026-03-01T09:30:00Z").Now}}
	p := testenv.Use(t, db, cfg)
	for _, id := range []int64{1, 2, 3} {
		_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:30:00.000001Z"))
		must(t, err)
	}
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written, stale, unknown", [3]int{res.Written, res.Stale, res.Unknown}, [3]int{2, 1, 0})
	var walls []string
	must(t, admin.Raw("SELECT to_char(seen, 'YYYY-MM-DD HH24:MI:SS.US') FROM naive_users ORDER BY id").Scan(&walls).Error)
	equal(t, "walls", strings.Join(walls, " "), "2026-03-01 10:30:00.000001 2026-03-01 10:30:00.000001 2026-03-01 10:40:00.000000")
	at, ok, err := p.LastSeen(ctx, int64(3))
	must(t, err)
	equal(t, "LastSeen(3)", fmt.Sprint(at.UTC().Format(time.RFC3339Nano), " ", ok), "2026-03-01T09:40:00Z true")
}

// TestKeyLengthThroughAnyDriver: a varchar(64) key bounds the ids Touch
// takes to 64 characters through a database/sql driver other than pgx
// (postgres.Config.Conn), as through pgx: a 65-character id is refused at
// Touch, not taken and then refused by every flush.
func TestKeyLengthThroughAnyDriver(t *testing.T) {
	ctx := context.Background()
	pg := servers.Postgres().New(t)
	must(t, pg.Open(t).AutoMigrate(&shortUsernameUser{}))
	sqlDB := sql.OpenDB(noSlicesConnector{dsn: pg.DSN})
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), quietGorm())
	must(t, err)
	p := testenv.Use(t, db, lastseen.Config{Model: &shortUsernameUser{}, Logger: testenv.Discard,
		Buffer:   lastseen.BufferConfig{Prefix: randomName("ls")},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true}})
	_, err = p.Touch(ctx, strings.Repeat("ü", 65))
	equal(t, "65 characters", fmt.Sprint(err), "lastseen: invalid user id: string of 65 characters (at most 64)")
	_, err = p.Touch(ctx, strings.Repeat("ü", 64))
	equal(t, "64 characters", err, nil)
}

// errorLog is a GORM logger that records the statements that failed.
type errorLog struct {
	logger.Interface
	mu     sync.Mutex
	failed []string
}

func (l *errorLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), err error) {
	if err == nil {
		return
	}
	sql, _ := fc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.failed = append(l.failed, fmt.Sprintf("%s: %v", sql, err))
}

// TestSliceArgsProbeLogsNothing: through a driver that takes no Go slice
// as a parameter (pgx wrapped without its NamedValueChecker), the flush
// finds out and writes with array text, and the app's GORM logger sees no
// failed statement: the driver's refusal of the probe is an answer, not
// an error of the app's.
func TestSliceArgsProbeLogsNothing(t *testing.T) {
	ctx := context.Background()
	pg := servers.Postgres().New(t)
	admin := pg.Open(t)
	must(t, admin.AutoMigrate(&lastseen.User{}))
	must(t, admin.Exec("INSERT INTO users (id) VALUES (1)").Error)
	sqlDB := sql.OpenDB(noSlicesConnector{dsn: pg.DSN})
	t.Cleanup(func() { sqlDB.Close() })
	log := &errorLog{Interface: logger.Discard}
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: log})
	must(t, err)
	p := testenv.Use(t, db, lastseen.Config{Logger: testenv.Discard,
		Buffer:   lastseen.BufferConfig{Prefix: randomName("ls")},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true}})
	_, err = p.TouchAt(ctx, uint64(1), mustTime("2026-03-01T09:20:00.000001Z"))
	must(t, err)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written", res.Written, 1)
	var got string
	must(t, admin.Raw("SELECT to_char(last_seen_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.US') FROM users").Scan(&got).Error)
	equal(t, "column", got, "2026-03-01 09:20:00.000001")
	equal(t, "failed statements logged", strings.Join(log.failed, "; "), "")
}
