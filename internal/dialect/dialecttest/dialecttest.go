// Package dialecttest is the contract every Dialect keeps, run on a real
// database: Exercise checks, on a database of its own, the bulk update
// (forward only, never a row created), the upsert, the count of existing
// rows, exact matching of a string key whatever its collation, the
// classification of the errors the database produces and of the column
// types GORM creates, the table-health query and the server's identity.
//
// The package imports no database driver: the caller opens the database
// (the tests module does, on SQLite, PostgreSQL and MySQL/MariaDB).
package dialecttest

import (
	"context"
	"database/sql"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// The instants the suite writes: whole seconds, which every column type
// GORM creates for a time.Time holds exactly.
var (
	t0 = time.Date(2026, 3, 1, 9, 0, 0, 0, time.UTC)
	t1 = t0.Add(time.Hour)
	t2 = t0.Add(2 * time.Hour)
)

// The suite's tables, created and dropped by Exercise.
type (
	intRow struct {
		ID         int64 `gorm:"primaryKey;autoIncrement:false"`
		LastSeenAt *time.Time
	}
	stringRow struct {
		ID         string `gorm:"primaryKey;size:64"`
		LastSeenAt *time.Time
	}
	millisRow struct {
		ID   int64  `gorm:"primaryKey;autoIncrement:false"`
		Seen *int64 `lastseen:"unixmilli"`
	}
	indexedRow struct {
		ID         int64      `gorm:"primaryKey;autoIncrement:false"`
		LastSeenAt *time.Time `gorm:"index"`
	}
	typesRow struct {
		ID      int64 `gorm:"primaryKey;autoIncrement:false"`
		At      *time.Time
		Seconds *int64
		Ratio   *float64
		Name    *string    `gorm:"size:64"`
		Day     *time.Time `gorm:"type:date"`
	}
	dateRow struct {
		ID  int64      `gorm:"primaryKey;autoIncrement:false"`
		Day *time.Time `gorm:"type:date"`
	}
)

func (intRow) TableName() string     { return "dialecttest_int" }
func (stringRow) TableName() string  { return "dialecttest_string" }
func (millisRow) TableName() string  { return "dialecttest_millis" }
func (indexedRow) TableName() string { return "dialecttest_indexed" }
func (typesRow) TableName() string   { return "dialecttest_types" }
func (dateRow) TableName() string    { return "dialecttest_date" }

// Exercise runs the contract on db, which must be a database of the
// test's own, on a dialect Lookup knows: it creates tables named
// dialecttest_* (dropping them first when they exist) and drops them at
// cleanup. Subtests name what failed.
func Exercise(t *testing.T, db *gorm.DB) {
	s := newSuite(t, db)
	d := s.d
	t.Run("update", s.update)
	t.Run("update unix millis", s.updateMillis)
	t.Run("update date", s.updateDate)
	t.Run("upsert", s.upsert)
	t.Run("update reading previous values", s.updatePrior)
	t.Run("upsert reading previous values", s.upsertPrior)
	t.Run("count", s.count)
	t.Run("exact string key", s.exact)
	t.Run("error kinds", s.errorKinds)
	t.Run("retryable contention", s.contention)
	t.Run("transient connection errors", s.transient)
	t.Run("server statement bound", s.serverBound)
	t.Run("column classes", s.classes)
	t.Run("health", s.health)
	t.Run("identity", s.identity)
	if tg := s.target(t, &intRow{}, "LastSeenAt"); tg.SliceArgs {
		// The driver takes Go slices (PostgreSQL with pgx): the statements
		// again, their arrays sent as array text, as for any other driver.
		t.Run("array text", (&suite{d: d, db: db, arrayText: true}).statements)
	}
}

// ExerciseArrayText runs the statements' part of the contract on db, a
// PostgreSQL database reached through a driver that does not take a Go
// slice as one parameter: ColumnTypes must say so (Target.SliceArgs false)
// and every statement must still write exactly, with array text; Columns
// must read the column types as through pgx. It creates and drops the
// tables Exercise does.
func ExerciseArrayText(t *testing.T, db *gorm.DB) {
	s := newSuite(t, db)
	if tg := s.target(t, &intRow{}, "LastSeenAt"); tg.SliceArgs {
		t.Fatalf("ColumnTypes set SliceArgs through a driver that takes no slices")
	}
	t.Run("column classes", s.classes)
	s.statements(t)
}

// statements runs the subtests of the bulk statements.
func (s *suite) statements(t *testing.T) {
	t.Run("update", s.update)
	t.Run("update unix millis", s.updateMillis)
	t.Run("update date", s.updateDate)
	t.Run("update reading previous values", s.updatePrior)
	t.Run("upsert", s.upsert)
	t.Run("count", s.count)
	t.Run("exact string key", s.exact)
}

// newSuite looks up db's dialect and creates the suite's tables on db
// (dropping them first when they exist), dropped again at cleanup.
func newSuite(t *testing.T, db *gorm.DB) *suite {
	d := dialect.Lookup(db.Dialector.Name())
	if d == nil {
		t.Fatalf("dialect.Lookup(%q) is nil", db.Dialector.Name())
	}
	models := []any{&intRow{}, &stringRow{}, &millisRow{}, &indexedRow{}, &typesRow{}, &dateRow{}}
	must(t, db.Migrator().DropTable(models...))
	must(t, db.AutoMigrate(models...))
	t.Cleanup(func() { _ = db.Migrator().DropTable(models...) })
	return &suite{d: d, db: db}
}

type suite struct {
	d  *dialect.Dialect
	db *gorm.DB
	// arrayText clears Target.SliceArgs after ColumnTypes.
	arrayText bool
}

// target describes model's table and its time column field for the
// statements, with its codec and the catalog's column types.
func (s *suite) target(t *testing.T, model any, field string) *dialect.Target {
	t.Helper()
	stmt := &gorm.Statement{DB: s.db}
	must(t, stmt.Parse(model))
	f := stmt.Schema.LookUpField(field)
	codec, err := timecol.New(stmt.Schema, f, field, timecol.Auto, "Field", s.d.Naive(), nil)
	must(t, err)
	pk := stmt.Schema.PrimaryFields[0]
	tg := &dialect.Target{Table: stmt.Schema.Table, PK: pk.DBName, Column: f.DBName, Codec: codec,
		IntKey: pk.FieldType.Kind() == reflect.Int64, ExactKey: pk.FieldType.Kind() == reflect.String}
	must(t, s.d.ColumnTypes(s.db, tg))
	if s.arrayText {
		tg.SliceArgs = false
	}
	return tg
}

// seed empties tg's table and inserts rows: id and the time column's
// value (nil: NULL), bound through the codec.
func (s *suite) seed(t *testing.T, tg *dialect.Target, rows ...any) {
	t.Helper()
	must(t, s.db.Exec("DELETE FROM ?", clause.Table{Name: tg.Table}).Error)
	for i := 0; i < len(rows); i += 2 {
		var v any
		if at, ok := rows[i+1].(time.Time); ok {
			v = tg.Codec.Value(at)
		}
		must(t, s.db.Exec("INSERT INTO ? (?, ?) VALUES (?, ?)", clause.Table{Name: tg.Table},
			clause.Column{Name: tg.PK}, clause.Column{Name: tg.Column}, rows[i], v).Error)
	}
}

// dump is tg's table as "id=value" in key order, NULL as "id=NULL", the
// values read through the codec in UTC (RFC 3339).
func (s *suite) dump(t *testing.T, tg *dialect.Target) string {
	t.Helper()
	rows, err := s.db.Table("?", clause.Table{Name: tg.Table}).Select("?, ?", clause.Column{Name: tg.PK}, clause.Column{Name: tg.Column}).
		Order(clause.OrderByColumn{Column: clause.Column{Name: tg.PK}}).Rows()
	must(t, err)
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id any
		at := timecol.Scan{Codec: tg.Codec}
		must(t, rows.Scan(&id, &at))
		if b, ok := id.([]byte); ok {
			id = string(b)
		}
		v := "NULL"
		if at.Valid {
			v = at.Time.UTC().Format(time.RFC3339)
		}
		out = append(out, fmt.Sprintf("%v=%s", id, v))
	}
	must(t, rows.Err())
	return strings.Join(out, " ")
}

// update: the bulk UPDATE writes the rows whose column is NULL or older,
// leaves a newer one, and creates no row for an unknown id.
func (s *suite) update(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	s.seed(t, tg, int64(1), nil, int64(2), t0, int64(3), t2, int64(4), t1)
	n, err := s.d.Update(s.db, tg, []any{int64(1), int64(2), int64(3), int64(4), int64(5)}, []time.Time{t1, t1, t1, t1, t1})
	must(t, err)
	equal(t, "rows written", n, 2)
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T10:00:00Z 2=2026-03-01T10:00:00Z 3=2026-03-01T11:00:00Z 4=2026-03-01T10:00:00Z")
}

// updateMillis: the same on an integer column of Unix milliseconds,
// compared as integers.
func (s *suite) updateMillis(t *testing.T) {
	tg := s.target(t, &millisRow{}, "Seen")
	equal(t, "encoding", tg.Codec.Encoding(), timecol.UnixMillis)
	s.seed(t, tg, int64(1), nil, int64(2), t0, int64(3), t2)
	n, err := s.d.Update(s.db, tg, []any{int64(1), int64(2), int64(3), int64(9)}, []time.Time{t1, t1, t1, t1})
	must(t, err)
	equal(t, "rows written", n, 2)
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T10:00:00Z 2=2026-03-01T10:00:00Z 3=2026-03-01T11:00:00Z")
	var raw int64
	must(t, s.db.Raw("SELECT seen FROM dialecttest_millis WHERE id = 2").Scan(&raw).Error)
	equal(t, "stored milliseconds", raw, t1.UnixMilli())
}

// updateDate: on a date column the bulk statements write each timestamp's
// day (UTC here), forward only: a row already on that day or later is
// left, and so is it by the upsert; the previous values are days.
func (s *suite) updateDate(t *testing.T) {
	tg := s.target(t, &dateRow{}, "Day")
	equal(t, "a date column", tg.Codec.Date(), true)
	day := func(d int) time.Time { return time.Date(2026, 3, d, 0, 0, 0, 0, time.UTC) }
	at := time.Date(2026, 3, 2, 21, 30, 0, 0, time.UTC)
	s.seed(t, tg, int64(1), nil, int64(2), day(1), int64(3), day(2), int64(4), day(3))
	n, err := s.d.Update(s.db, tg, []any{int64(1), int64(2), int64(3), int64(4)}, []time.Time{at, at, at, at})
	must(t, err)
	equal(t, "rows written", n, 2)
	equal(t, "table", s.dump(t, tg), "1=2026-03-02T00:00:00Z 2=2026-03-02T00:00:00Z 3=2026-03-02T00:00:00Z 4=2026-03-03T00:00:00Z")
	prior, n := s.writePrior(t, s.d.UpdatePrior, tg, []any{int64(1), int64(4)}, []time.Time{at.Add(24 * time.Hour), at.Add(24 * time.Hour)})
	equal(t, "prior", fmt.Sprint(n, " ", prior), "1 1 written over 00:00, 4 kept 00:00")
	n, err = s.d.Upsert(s.db, tg, []any{int64(2), int64(5)}, []time.Time{at, at})
	must(t, err)
	equal(t, "upserted", n, 1)
	equal(t, "table after", s.dump(t, tg), "1=2026-03-03T00:00:00Z 2=2026-03-02T00:00:00Z 3=2026-03-02T00:00:00Z 4=2026-03-03T00:00:00Z 5=2026-03-02T00:00:00Z")
}

// upsert: an unknown id is inserted, an older row moves forward, a newer
// one stays; the count is of the rows inserted or moved.
func (s *suite) upsert(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	s.seed(t, tg, int64(1), t0, int64(2), t2, int64(3), nil)
	n, err := s.d.Upsert(s.db, tg, []any{int64(1), int64(2), int64(3), int64(4)}, []time.Time{t1, t1, t1, t1})
	must(t, err)
	equal(t, "rows written", n, 3)
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T10:00:00Z 2=2026-03-01T11:00:00Z 3=2026-03-01T10:00:00Z 4=2026-03-01T10:00:00Z")
	n, err = s.d.Upsert(s.db, tg, []any{int64(1), int64(4)}, []time.Time{t1, t0})
	must(t, err)
	equal(t, "rows written again", n, 0)
}

// updatePrior: UpdatePrior writes what Update writes and returns, per
// entry, whether its row exists, whether it was written, and the value the
// column held before (or kept); on a string key exactly, and on an integer
// column of Unix milliseconds.
func (s *suite) updatePrior(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	s.seed(t, tg, int64(1), nil, int64(2), t0, int64(3), t2, int64(4), t1)
	ids := []any{int64(1), int64(2), int64(3), int64(4), int64(5)}
	prior, n := s.writePrior(t, s.d.UpdatePrior, tg, ids, []time.Time{t1, t1, t1, t1, t1})
	equal(t, "rows written", n, 2)
	equal(t, "prior", prior, "1 written over NULL, 2 written over 09:00, 3 kept 11:00, 4 kept 10:00, 5 no row")
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T10:00:00Z 2=2026-03-01T10:00:00Z 3=2026-03-01T11:00:00Z 4=2026-03-01T10:00:00Z")
	// All written: nothing is read after the statement.
	prior, n = s.writePrior(t, s.d.UpdatePrior, tg, ids[:2], []time.Time{t2, t2})
	equal(t, "all written", fmt.Sprint(n, " ", prior), "2 1 written over 10:00, 2 written over 10:00")

	tg = s.target(t, &stringRow{}, "LastSeenAt")
	s.seed(t, tg, "bob", t0, "pad", t0, `q"\`, t0)
	prior, n = s.writePrior(t, s.d.UpdatePrior, tg, []any{"Bob", "pad ", `q"\`, "bob"}, []time.Time{t1, t1, t1, t0})
	equal(t, "string key: rows written", n, 1)
	equal(t, "string key: prior", prior, `Bob no row, pad  no row, q"\ written over 09:00, bob kept 09:00`)

	tg = s.target(t, &millisRow{}, "Seen")
	s.seed(t, tg, int64(1), nil, int64(2), t0, int64(3), t2)
	prior, n = s.writePrior(t, s.d.UpdatePrior, tg, []any{int64(1), int64(2), int64(3)}, []time.Time{t1, t1, t1})
	equal(t, "unix millis: rows written", n, 2)
	equal(t, "unix millis: prior", prior, "1 written over NULL, 2 written over 09:00, 3 kept 11:00")
}

// upsertPrior: UpsertPrior writes what Upsert writes and returns, per
// entry, the row as it was: an unknown id is written (created) with no
// value before.
func (s *suite) upsertPrior(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	s.seed(t, tg, int64(1), t0, int64(2), t2, int64(3), nil)
	prior, n := s.writePrior(t, s.d.UpsertPrior, tg, []any{int64(1), int64(2), int64(3), int64(4)}, []time.Time{t1, t1, t1, t1})
	equal(t, "rows written", n, 3)
	equal(t, "prior", prior, "1 written over 09:00, 2 kept 11:00, 3 written over NULL, 4 written, no row before")
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T10:00:00Z 2=2026-03-01T11:00:00Z 3=2026-03-01T10:00:00Z 4=2026-03-01T10:00:00Z")
}

// writePrior runs write (UpdatePrior or UpsertPrior) in a transaction and
// describes what it returned, entry by entry: "<id> written over <before>",
// "<id> kept <value>", "<id> no row" or "<id> written, no row before";
// values as 15:04 in UTC, NULL for none.
func (s *suite) writePrior(t *testing.T, write func(*gorm.DB, *dialect.Target, []any, []time.Time) ([]dialect.Prior, int, error),
	tg *dialect.Target, ids []any, ts []time.Time) (string, int) {
	t.Helper()
	var prior []dialect.Prior
	var n int
	must(t, s.db.Transaction(func(tx *gorm.DB) error {
		var err error
		prior, n, err = write(tx, tg, ids, ts)
		return err
	}))
	equal(t, "entries", len(prior), len(ids))
	out := make([]string, len(prior))
	for i, p := range prior {
		v := "NULL"
		if !p.Before.IsZero() {
			v = p.Before.Format("15:04")
		}
		switch {
		case p.Written && !p.Found:
			out[i] = fmt.Sprintf("%v written, no row before", ids[i])
		case p.Written:
			out[i] = fmt.Sprintf("%v written over %s", ids[i], v)
		case p.Found:
			out[i] = fmt.Sprintf("%v kept %s", ids[i], v)
		default:
			out[i] = fmt.Sprintf("%v no row", ids[i])
		}
	}
	return strings.Join(out, ", "), n
}

// count: the ids of the batch that have a row, whatever their value; on
// PostgreSQL an id beyond the key column's range matches nothing.
func (s *suite) count(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	s.seed(t, tg, int64(1), nil, int64(2), t0, int64(3), t2)
	n, err := s.d.Count(s.db, tg, []any{int64(1), int64(3), int64(7), int64(8)})
	must(t, err)
	equal(t, "existing", n, 2)
	n, err = s.d.Count(s.db, tg, []any{int64(2)})
	must(t, err)
	equal(t, "existing of one", n, 1)
}

// exact: a string key is matched byte for byte by the update, the upsert's
// count and ExactIn, whatever the column's collation folds ("Bob" for
// "bob", "pad " for "pad" on MySQL's default collation).
func (s *suite) exact(t *testing.T) {
	tg := s.target(t, &stringRow{}, "LastSeenAt")
	s.seed(t, tg, "bob", t0, "pad", t0, `q"\`, t0)
	n, err := s.d.Update(s.db, tg, []any{"Bob", "pad ", `q"\`}, []time.Time{t1, t1, t1})
	must(t, err)
	equal(t, "rows written", n, 1)
	equal(t, "table", s.dump(t, tg), `bob=2026-03-01T09:00:00Z pad=2026-03-01T09:00:00Z q"\=2026-03-01T10:00:00Z`)
	n, err = s.d.Count(s.db, tg, []any{"Bob", "bob", "pad "})
	must(t, err)
	equal(t, "existing", n, 1)
	pk := clause.Column{Name: tg.PK}
	q := s.db.Table("?", clause.Table{Name: tg.Table}).Where(clause.IN{Column: pk, Values: []any{"BOB", "pad "}})
	if exact, ok := s.d.ExactIn(pk, []any{"BOB", "pad "}); ok {
		q = q.Where(exact)
	}
	var found int64
	must(t, q.Count(&found).Error)
	equal(t, "rows exactly BOB or 'pad '", found, int64(0))
}

// errorKinds: the kinds of errors the database produces, and that none of
// them is retryable or a resource running out.
func (s *suite) errorKinds(t *testing.T) {
	want := map[string]map[string]string{
		"postgres": {"unique": "23505", "syntax": "42601", "no table": "42P01", "read-only": "25006"},
		"mysql":    {"unique": "1062", "syntax": "1064", "no table": "1146", "read-only": "1792"},
		"sqlite":   {"unique": "19", "syntax": "1", "no table": "1", "read-only": "8"},
	}[s.d.Name()]
	must(t, s.db.Exec("DELETE FROM dialecttest_int").Error)
	must(t, s.db.Exec("INSERT INTO dialecttest_int (id) VALUES (1)").Error)
	errs := map[string]error{
		"unique":   s.db.Exec("INSERT INTO dialecttest_int (id) VALUES (1)").Error,
		"syntax":   s.db.Exec("SELEC 1").Error,
		"no table": s.db.Exec("UPDATE dialecttest_missing SET id = 1").Error,
	}
	// A read-only session, on one connection, writable again afterwards.
	readOnly := map[string][2]string{
		"postgres": {"SET default_transaction_read_only = on", "SET default_transaction_read_only = off"},
		"mysql":    {"SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"},
		"sqlite":   {"PRAGMA query_only = 1", "PRAGMA query_only = 0"},
	}[s.d.Name()]
	must(t, s.db.Connection(func(conn *gorm.DB) error {
		conn = conn.Session(&gorm.Session{}) // each statement's error its own
		if err := conn.Exec(readOnly[0]).Error; err != nil {
			return err
		}
		errs["read-only"] = conn.Exec("INSERT INTO dialecttest_int (id) VALUES (2)").Error
		return conn.Exec(readOnly[1]).Error
	}))
	for name, err := range errs {
		if err == nil {
			t.Errorf("%s: no error", name)
			continue
		}
		kind := s.d.ErrorKind(err)
		equal(t, name+" kind ("+err.Error()+")", kind, want[name])
		equal(t, name+" retryable", s.d.Retryable(err), false)
		equal(t, name+" exhausted", s.d.Exhausted(kind), false)
		equal(t, name+" transient", s.d.Transient(err), false)
		equal(t, name+" timed out", s.d.TimedOut(err), false)
	}
	equal(t, "kind of nil", s.d.ErrorKind(nil), "")
	equal(t, "kind of a client-side error", s.d.ErrorKind(fmt.Errorf("query: %w", context.DeadlineExceeded)), "")
	equal(t, "retryable nil", s.d.Retryable(nil), false)
}

// contention: the error of two writers in each other's way is retryable:
// PostgreSQL's serialization failure (a REPEATABLE READ transaction
// updating a row updated since its snapshot), MySQL's deadlock (two
// transactions each waiting for the other's row lock), SQLite's busy
// database (a write while another connection holds the write lock, with
// no busy timeout).
func (s *suite) contention(t *testing.T) {
	must(t, s.db.Exec("DELETE FROM dialecttest_int").Error)
	must(t, s.db.Exec("INSERT INTO dialecttest_int (id) VALUES (1), (2)").Error)
	var err error
	kind := map[string]string{"postgres": "40001", "mysql": "1213", "sqlite": "5"}[s.d.Name()]
	switch s.d.Name() {
	case "postgres":
		err = s.serializationFailure(t)
	case "mysql":
		err = s.deadlock(t)
	case "sqlite":
		err = s.busy(t)
	}
	if err == nil {
		t.Fatal("no contention error")
	}
	equal(t, "kind ("+err.Error()+")", s.d.ErrorKind(err), kind)
	equal(t, "retryable", s.d.Retryable(err), true)
	equal(t, "retryable wrapped", s.d.Retryable(fmt.Errorf("flush: %w", err)), true)
}

func (s *suite) serializationFailure(t *testing.T) error {
	tx := s.db.Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	must(t, tx.Error)
	defer tx.Rollback()
	var n int64
	must(t, tx.Raw("SELECT count(*) FROM dialecttest_int").Scan(&n).Error) // the snapshot
	must(t, s.db.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t0).Error)
	return tx.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t1).Error
}

func (s *suite) deadlock(t *testing.T) error {
	a, b := s.db.Begin(), s.db.Begin()
	must(t, a.Error)
	must(t, b.Error)
	defer a.Rollback()
	defer b.Rollback()
	must(t, a.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t0).Error)
	must(t, b.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 2", t0).Error)
	// Each now waits for the other's row: InnoDB picks one as the victim,
	// whose statement fails and whose transaction rolls back, and the
	// other's statement then goes through.
	var wg sync.WaitGroup
	var errA, errB error
	wg.Add(2)
	go func() {
		defer wg.Done()
		errA = a.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 2", t1).Error
	}()
	go func() {
		defer wg.Done()
		errB = b.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t1).Error
	}()
	wg.Wait()
	if (errA == nil) == (errB == nil) {
		t.Fatalf("want exactly one deadlock victim, got %v and %v", errA, errB)
	}
	if errA != nil {
		return errA
	}
	return errB
}

func (s *suite) busy(t *testing.T) error {
	var err error
	must(t, s.db.Connection(func(holder *gorm.DB) error {
		holder = holder.Session(&gorm.Session{}) // each statement's error its own
		if err := holder.Exec("BEGIN IMMEDIATE").Error; err != nil {
			return err
		}
		defer holder.Exec("ROLLBACK")
		return s.db.Connection(func(writer *gorm.DB) error {
			writer = writer.Session(&gorm.Session{})
			var timeout int
			if err := writer.Raw("PRAGMA busy_timeout").Scan(&timeout).Error; err != nil {
				return err
			}
			if err := writer.Exec("PRAGMA busy_timeout = 0").Error; err != nil {
				return err
			}
			err = writer.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t1).Error
			return writer.Exec(fmt.Sprintf("PRAGMA busy_timeout = %d", timeout)).Error
		})
	}))
	return err
}

// transient: the error of a statement whose connection the server ended
// from another connection (PostgreSQL pg_terminate_backend on an idle
// connection, MySQL KILL during a SLEEP) and SQLite's busy database are
// Transient, not retryable contention on PostgreSQL and MySQL; nil is not.
func (s *suite) transient(t *testing.T) {
	var err error
	switch s.d.Name() {
	case "postgres":
		err = s.terminated(t)
	case "mysql":
		err = s.killed(t)
	case "sqlite":
		err = s.busy(t)
	}
	if err == nil {
		t.Fatal("no error from the killed connection")
	}
	equal(t, "transient ("+err.Error()+")", s.d.Transient(err), true)
	equal(t, "transient wrapped", s.d.Transient(fmt.Errorf("flush: %w", err)), true)
	equal(t, "timed out", s.d.TimedOut(err), false)
	if s.d.Name() != "sqlite" { // SQLITE_BUSY is contention too
		equal(t, "retryable", s.d.Retryable(err), false)
	}
	equal(t, "transient nil", s.d.Transient(nil), false)
}

// terminated ends a pinned connection's backend from another connection,
// waits until it is gone, and returns the pinned connection's next error.
func (s *suite) terminated(t *testing.T) error {
	var err error
	must(t, s.db.Connection(func(conn *gorm.DB) error {
		conn = conn.Session(&gorm.Session{})
		var pid int64
		if err := conn.Raw("SELECT pg_backend_pid()").Scan(&pid).Error; err != nil {
			return err
		}
		if err := s.db.Exec("SELECT pg_terminate_backend(?, 10000)", pid).Error; err != nil { // waits for the end
			return err
		}
		err = conn.Exec("UPDATE dialecttest_int SET last_seen_at = ? WHERE id = 1", t1).Error
		return nil
	}))
	return err
}

// killed runs SLEEP(30) on a pinned connection and KILLs that connection
// from another one once the server shows it sleeping, and returns the
// sleeping statement's error.
func (s *suite) killed(t *testing.T) error {
	var err error
	must(t, s.db.Connection(func(conn *gorm.DB) error {
		conn = conn.Session(&gorm.Session{})
		var id int64
		if err := conn.Raw("SELECT CONNECTION_ID()").Scan(&id).Error; err != nil {
			return err
		}
		done := make(chan error, 1)
		go func() { done <- conn.Exec("DO SLEEP(30)").Error }()
		deadline := time.Now().Add(20 * time.Second)
		for state := ""; state != "User sleep"; {
			if time.Now().After(deadline) {
				return fmt.Errorf("connection %d never showed its SLEEP", id)
			}
			var rows []string
			if err := s.db.Raw("SELECT STATE FROM information_schema.PROCESSLIST WHERE ID = ?", id).Scan(&rows).Error; err != nil {
				return err
			}
			if len(rows) == 1 {
				state = rows[0]
			}
		}
		if err := s.db.Exec(fmt.Sprintf("KILL %d", id)).Error; err != nil {
			return err
		}
		err = <-done
		return nil
	}))
	return err
}

// serverBound: where ColumnTypes sets Target.ServerBound (MariaDB), an
// update past Target.Bound is stopped by the server with an error TimedOut
// reports, and writes nothing; elsewhere ServerBound stays false.
func (s *suite) serverBound(t *testing.T) {
	tg := s.target(t, &intRow{}, "LastSeenAt")
	equal(t, "no bound without Target.Bound", tg.ServerBound, false)
	tg.Bound = 200 * time.Millisecond
	must(t, s.d.ColumnTypes(s.db, tg))
	if !tg.ServerBound {
		if s.d.Name() == "mysql" && strings.Contains(s.version(t), "MariaDB") {
			t.Fatal("MariaDB without ServerBound")
		}
		return
	}
	s.seed(t, tg, int64(1), t0, int64(2), t0)
	must(t, s.db.Exec("CREATE TRIGGER dialecttest_slow BEFORE UPDATE ON dialecttest_int FOR EACH ROW DO SLEEP(1)").Error)
	defer s.db.Exec("DROP TRIGGER dialecttest_slow")
	_, err := s.d.Update(s.db, tg, []any{int64(1), int64(2)}, []time.Time{t1, t1})
	if err == nil {
		t.Fatal("an update past its bound succeeded")
	}
	equal(t, "timed out ("+err.Error()+")", s.d.TimedOut(err), true)
	equal(t, "transient", s.d.Transient(err), false)
	equal(t, "table", s.dump(t, tg), "1=2026-03-01T09:00:00Z 2=2026-03-01T09:00:00Z")
}

// version is the server's VERSION().
func (s *suite) version(t *testing.T) string {
	var v string
	must(t, s.db.Raw("SELECT VERSION()").Scan(&v).Error)
	return v
}

// classes: the class of each column type GORM creates, by the catalog's
// type name as Columns reports it, and which encodings fit; a string key's
// declared length.
func (s *suite) classes(t *testing.T) {
	want := map[string]map[string]timecol.Class{
		"postgres": {"id": timecol.ClassInteger, "at": timecol.ClassZoned, "seconds": timecol.ClassInteger, "ratio": timecol.ClassOther, "name": timecol.ClassOther, "day": timecol.ClassDate},
		"mysql":    {"id": timecol.ClassInteger, "at": timecol.ClassNaive, "seconds": timecol.ClassInteger, "ratio": timecol.ClassOther, "name": timecol.ClassOther, "day": timecol.ClassDate},
		"sqlite":   {"id": timecol.ClassInteger, "at": timecol.ClassText, "seconds": timecol.ClassInteger, "ratio": timecol.ClassOther, "name": timecol.ClassText, "day": timecol.ClassDate},
	}[s.d.Name()]
	cols, err := s.d.Columns(s.db, "dialecttest_types")
	must(t, err)
	got := map[string]timecol.Class{}
	for _, c := range cols {
		got[c.Name] = s.d.Classify(c.Type)
	}
	for name, class := range want {
		equal(t, "class of "+name, got[name], class)
	}
	equal(t, "columns", len(got), len(want))
	keys, err := s.d.Columns(s.db, "dialecttest_string")
	must(t, err)
	lengths := make([]string, len(keys))
	for i, c := range keys {
		lengths[i] = fmt.Sprintf("%s %d", c.Name, c.Length)
	}
	// GORM creates a SQLite string key as text, without a length.
	equal(t, "declared lengths", strings.Join(lengths, ", "), map[bool]string{true: "id 0, last_seen_at 0", false: "id 64, last_seen_at 0"}[s.d.Name() == "sqlite"])
	// A codec takes a column for naive until the catalog was read exactly
	// where GORM creates a naive column for a time.Time.
	equal(t, "naive by default", s.d.Naive().Default, got["at"] == timecol.ClassNaive)
	at := s.target(t, &intRow{}, "LastSeenAt").Codec
	ms := s.target(t, &millisRow{}, "Seen").Codec
	for name, class := range got {
		equal(t, "timestamp fits "+name, at.Fits(class), class != timecol.ClassInteger && class != timecol.ClassOther) // a date holds its day
		equal(t, "unix millis fits "+name, ms.Fits(class), class == timecol.ClassInteger)
	}
	equal(t, "undeclared type", s.d.Classify(""), map[string]timecol.Class{"postgres": timecol.ClassOther, "mysql": timecol.ClassOther, "sqlite": timecol.ClassAny}[s.d.Name()])
}

// health: the indexes that include the column, by name, and on PostgreSQL
// the HOT counters and the default fillfactor.
func (s *suite) health(t *testing.T) {
	h, err := s.d.Health(s.db, "dialecttest_indexed", "last_seen_at")
	must(t, err)
	names := make([]string, len(h.Indexes))
	for i, x := range h.Indexes {
		names[i] = x.Name
	}
	equal(t, "indexes", strings.Join(names, ","), "idx_dialecttest_indexed_last_seen_at")
	equal(t, "HOT", h.HOT, s.d.Name() == "postgres")
	if h.HOT {
		equal(t, "fillfactor", h.FillFactor, 100)
		equal(t, "index definition", strings.HasSuffix(h.Indexes[0].Definition, "USING btree (last_seen_at)"), true)
	}
	h, err = s.d.Health(s.db, "dialecttest_int", "last_seen_at")
	must(t, err)
	equal(t, "indexes of an unindexed column", len(h.Indexes), 0)
}

// identity: the server and database are named, the same on every call.
func (s *suite) identity(t *testing.T) {
	ctx := context.Background()
	id, err := s.d.Identity(ctx, s.db)
	must(t, err)
	again, err := s.d.Identity(ctx, s.db)
	must(t, err)
	equal(t, "identity again", again, id)
	equal(t, "server names the dialect", strings.HasPrefix(id.Server, s.d.Name()), true)
	equal(t, "database named", id.Database != "", true)
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	if got != want {
		t.Errorf("%s: got %v, want %v", what, got, want)
	}
}
