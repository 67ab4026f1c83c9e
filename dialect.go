package lastseen

import (
	"fmt"
	"strings"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// dialect holds everything that differs between databases. It is the one
// place where PostgreSQL, MySQL/MariaDB and SQLite part ways; the rest of the
// package asks it, by db.Dialector.Name().
type dialect struct {
	name string
	// maxParams is the bind-parameter limit of one statement: PostgreSQL's
	// wire protocol counts parameters in an int16 (65535), MySQL's
	// prepared-statement protocol likewise (65535), and SQLite's
	// SQLITE_MAX_VARIABLE_NUMBER defaults to 32766 since 3.32.0.
	maxParams int
	// update returns the bulk UPDATE that moves the time column of existing
	// rows forward to the batch's values and never inserts.
	update func(t *writeTarget, ids []any, ts []time.Time) clause.Expr
	// guard returns the newer-only assignment and condition for an upsert.
	onConflict func(t *writeTarget) clause.OnConflict
	// key is what a time column or value of an encoding compares and sorts
	// by (nil: itself): on SQLite julianday(x) for text, since text with
	// mixed offsets does not sort by instant, and x only when it is an
	// integer for Unix time. It is NULL for a value the guard cannot
	// compare (see uncomparable).
	key func(enc Encoding, x any) clause.Expr
	// retryable reports deadlocks and serialization failures.
	retryable func(error) bool
	// errorKind names the kind of a database error, as the server reported
	// it: the SQLSTATE on PostgreSQL, the error number on MySQL/MariaDB,
	// the primary result code on SQLite; "" when the error carries none (a
	// connection error, a timeout on the client side). A flush and a purge
	// compare kinds to tell a refusal no row can cause (every write fails
	// the same way: read-only, permission denied, disk full, a missing
	// column) from a row refused on its own (systemic.go).
	errorKind func(error) string
	// exhausted reports kinds that name a resource of the server running
	// out (a full disk, no memory), which no row can cause. A full disk
	// may still accept a write that touches no row, so probeBatch's
	// witness alone would take its refusals for rows refused on their
	// own, and MaxRefusals would drop them: such a kind is systemic as
	// soon as the probe fails with it too.
	exhausted func(kind string) bool
	// badText reports why a string key column can never hold s ("" when
	// it can), so that Touch refuses such an id (ErrInvalidUserID) instead
	// of every flush failing on it.
	badText func(s string) string
	// exactIn returns the filter "col is exactly one of vals" (binary
	// comparison), ANDed to the indexed comparison on a string key where
	// the key's collation may fold case, accents or trailing spaces (nil:
	// the dialect's "=" is already exact).
	exactIn func(col any, vals []any) clause.Expr
	// maxUnsigned is the largest value of a column GORM creates for a
	// uint64 key: PostgreSQL's bigint and SQLite's integer are signed 64-bit
	// (math.MaxInt64); MySQL's BIGINT UNSIGNED takes them all (0). Larger
	// ids are refused at Touch and rejected by a flush, never retried.
	maxUnsigned uint64
	// upsertDoubleCounts is MySQL's rule that ON DUPLICATE KEY UPDATE
	// reports 1 affected row per insert and 2 per update.
	upsertDoubleCounts bool
	// count returns the SELECT count(*) of the batch's ids that have a row,
	// where the generic "WHERE pk IN (...)" does not do (nil: generic).
	count func(t *writeTarget, ids []any) clause.Expr
	// columnTypes looks up the SQL types a statement must cast to, where
	// the dialect needs them (PostgreSQL's unnest arrays).
	columnTypes func(db *gorm.DB, t *writeTarget) error
	// health fills the tracked table's indexes on the last-seen column
	// and, where the database has them, its HOT counters and fillfactor
	// (health.go).
	health func(db *gorm.DB, h *TableHealth) error

	// Column types (coltype.go, coltype_check.go).

	// classify tells what a column's declared type (GORM's
	// ColumnType.DatabaseTypeName, lower case) holds.
	classify func(typ string) colClass
	// naiveCast casts a wall-time literal ("2006-01-02 15:04:05.999999")
	// to the dialect's timestamp without time zone, so that the driver's
	// own location never shifts it (nil: no naive type, SQLite).
	naiveCast func(wall string) clause.Expr
	// naiveDefault is whether a time column is taken for naive until the
	// catalog was read: MySQL, where GORM creates DATETIME.
	naiveDefault bool
	// uncomparable is set where a column may hold values its key cannot
	// compare (SQLite: any value in any column); a flush then finds the
	// rows whose key is NULL while the column is not (uncomparable.go).
	uncomparable bool
}

// compare compares a time column (or expression) a with b, both in enc,
// with op ("<", "<=", ">="), through the dialect's key. A nil dialect (an
// unknown database) compares plainly.
func (d *dialect) compare(enc Encoding, a any, op string, b any) clause.Expr {
	return clause.Expr{SQL: "? " + op + " ?", Vars: []any{d.keyOf(enc, a), d.keyOf(enc, b)}}
}

// keyOf is x's compare and sort key in enc (dialect.key).
func (d *dialect) keyOf(enc Encoding, x any) any {
	if d == nil || d.key == nil {
		return x
	}
	return d.key(enc, x)
}

// maxBatch is the largest BatchSize: two bind parameters per user.
func (d *dialect) maxBatch() int { return d.maxParams / 2 }

// dialects is the one seam for dialect differences, keyed by
// db.Dialector.Name(); each entry lives in its dialect_<name>.go file.
var dialects = map[string]*dialect{
	postgresDialect.name: postgresDialect,
	mysqlDialect.name:    mysqlDialect,
	sqliteDialect.name:   sqliteDialect,
}

// standardOnConflict is PostgreSQL's and SQLite's ON CONFLICT (pk) DO UPDATE
// with the newer-only guard in its WHERE, compared through key (nil: plain).
func standardOnConflict(key func(enc Encoding, x any) clause.Expr) func(t *writeTarget) clause.OnConflict {
	d := &dialect{key: key}
	return func(t *writeTarget) clause.OnConflict {
		cur := clause.Column{Table: t.table, Name: t.col}
		excluded := clause.Column{Table: "excluded", Name: t.col}
		return clause.OnConflict{
			Columns:   []clause.Column{{Name: t.pk}},
			DoUpdates: clause.Set{{Column: clause.Column{Name: t.col}, Value: excluded}},
			Where: clause.Where{Exprs: []clause.Expression{clause.Or(
				clause.Expr{SQL: "? IS NULL", Vars: []any{cur}},
				d.compare(t.codec.enc, cur, "<", excluded),
			)}},
		}
	}
}

// columnTime scans a time column as every dialect returns it: a time.Time,
// NULL, or, from SQLite for a column not declared DATE, DATETIME, TIME or
// TIMESTAMP (such as TIMESTAMPTZ or TEXT), the text SQLite drivers write,
// read as UTC unless it has an offset (the layouts of
// github.com/glebarez/go-sqlite and mattn/go-sqlite3).
type columnTime struct {
	Time  time.Time
	Valid bool
}

var sqliteTimeLayouts = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	"2006-01-02 15:04",
	"2006-01-02T15:04",
	"2006-01-02",
}

// Scan implements sql.Scanner.
func (c *columnTime) Scan(v any) error {
	var s string
	switch v := v.(type) {
	case nil:
		*c = columnTime{}
		return nil
	case time.Time:
		*c = columnTime{Time: v, Valid: true}
		return nil
	case string:
		s = v
	case []byte:
		s = string(v)
	default:
		return fmt.Errorf("lastseen: cannot read a %T as a time", v)
	}
	ts := strings.TrimSuffix(s, "Z")
	for _, layout := range sqliteTimeLayouts {
		if t, err := time.ParseInLocation(layout, ts, time.UTC); err == nil {
			*c = columnTime{Time: t, Valid: true}
			return nil
		}
	}
	return fmt.Errorf("lastseen: cannot read %q as a time", truncate(s))
}
