package lastseen

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgtype"
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
	// compare compares two time expressions with op ("<", "<=", ">=").
	compare func(a any, op string, b any) clause.Expr
	// sortKey is what a time column sorts by in ORDER BY: the column itself,
	// or on SQLite julianday(column), since text with mixed offsets does
	// not sort by instant.
	sortKey func(col any) clause.Expr
	// retryable reports deadlocks and serialization failures.
	retryable func(error) bool
	// statementError reports errors no single row can cause: a missing
	// table or column, a syntax error, an ON CONFLICT without a matching
	// unique index. A flush keeps the whole batch in Redis and reports
	// them, rather than splitting the batch and refusing every entry.
	statementError func(error) bool
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
}

// maxBatch is the largest BatchSize: two bind parameters per user.
func (d *dialect) maxBatch() int { return d.maxParams / 2 }

var dialects = map[string]*dialect{
	"postgres": {
		name:       "postgres",
		maxParams:  65535,
		update:     postgresUpdate,
		onConflict: standardOnConflict(plainCompare),
		compare:    plainCompare,
		sortKey:    plainKey,
		retryable:  postgresRetryable,
		statementError: func(err error) bool {
			// Class 42: syntax error or access rule violation (undefined
			// table 42P01, undefined column 42703, no unique constraint for
			// ON CONFLICT 42P10); 0A: feature not supported; 3F: invalid schema.
			var e interface{ SQLState() string }
			if errors.As(err, &e) {
				c := e.SQLState()
				return strings.HasPrefix(c, "42") || strings.HasPrefix(c, "0A") || strings.HasPrefix(c, "3F")
			}
			return false
		},
		columnTypes: postgresColumnTypes,
		count:       postgresCount,
		maxUnsigned: math.MaxInt64,
	},
	"mysql": {
		name:       "mysql",
		maxParams:  65535,
		update:     mysqlUpdate,
		onConflict: mysqlOnConflict,
		compare:    plainCompare,
		sortKey:    plainKey,
		retryable:  mysqlRetryable,
		statementError: func(err error) bool {
			var e *mysql.MySQLError
			if errors.As(err, &e) {
				switch e.Number {
				case 1054, 1146, 1064, 1142, 1143, 1049: // bad field, no such table, syntax, denied, no database
					return true
				}
			}
			return false
		},
		upsertDoubleCounts: true,
	},
	"sqlite": {
		name:       "sqlite",
		maxParams:  32766,
		update:     sqliteUpdate,
		onConflict: standardOnConflict(julianCompare),
		compare:    julianCompare,
		sortKey:    julianKey,
		retryable:  sqliteRetryable,
		statementError: func(err error) bool {
			msg := err.Error()
			for _, m := range []string{"no such table", "no such column", "has no column", "syntax error", "does not match any PRIMARY KEY or UNIQUE"} {
				if strings.Contains(msg, m) {
					return true
				}
			}
			return false
		},
		maxUnsigned: math.MaxInt64,
	},
}

func plainCompare(a any, op string, b any) clause.Expr {
	return clause.Expr{SQL: "? " + op + " ?", Vars: []any{a, b}}
}

// julianCompare compares SQLite text timestamps as instants: julianday parses
// every offset ("+09:00", "Z") that drivers write, where comparing the text
// would order "10:00+09:00" after "02:00+00:00". Its resolution is 1ms.
func julianCompare(a any, op string, b any) clause.Expr {
	return clause.Expr{SQL: "julianday(?) " + op + " julianday(?)", Vars: []any{a, b}}
}

func plainKey(col any) clause.Expr { return clause.Expr{SQL: "?", Vars: []any{col}} }

func julianKey(col any) clause.Expr { return clause.Expr{SQL: "julianday(?)", Vars: []any{col}} }

// postgresUpdate sends the batch as two arrays and joins them with unnest,
// so the statement has two parameters whatever the batch size:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts
//	FROM unnest(CAST($1 AS text[])::bigint[], CAST($2 AS timestamptz[])) AS v(id, ts)
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts)
func postgresUpdate(t *writeTarget, ids []any, ts []time.Time) clause.Expr {
	text := pgText(ids)
	sql := "UPDATE ? AS t SET ? = v.ts FROM unnest(CAST(? AS text[])::" + t.pkType + "[], CAST(? AS " + t.colType + "[])) AS v(id, ts)" +
		" WHERE t.? = v.id AND (t.? IS NULL OR t.? < v.ts)"
	col := clause.Column{Name: t.col}
	return clause.Expr{SQL: sql, Vars: []any{
		clause.Table{Name: t.table}, col, pgArray(text), pgArray(ts),
		clause.Column{Name: t.pk}, col, col,
	}}
}

// postgresCount counts with the same array and cast as postgresUpdate, so an
// id too large for an integer key column matches nothing instead of failing
// to encode:
//
//	SELECT count(*) FROM "users" AS t WHERE t."id" = ANY(CAST($1 AS text[])::bigint[])
func postgresCount(t *writeTarget, ids []any) clause.Expr {
	return clause.Expr{SQL: "SELECT count(*) FROM ? AS t WHERE t.? = ANY(CAST(? AS text[])::" + t.pkType + "[])",
		Vars: []any{clause.Table{Name: t.table}, clause.Column{Name: t.pk}, pgArray(pgText(ids))}}
}

func pgText(ids []any) []string {
	text := make([]string, len(ids))
	for i, id := range ids {
		text[i] = fmt.Sprint(id)
	}
	return text
}

func pgArray[T any](v []T) pgtype.Array[T] {
	return pgtype.Array[T]{Elements: v, Dims: []pgtype.ArrayDimension{{Length: int32(len(v)), LowerBound: 1}}, Valid: true}
}

// postgresColumnTypes reads the primary key's and the time column's types
// from pg_attribute. format_type with a NULL type modifier gives the type
// without length or precision ("character varying", not "character
// varying(64)"): an explicit cast to varchar(64) would silently truncate a
// longer id into another user's id. Integer keys are sent as bigint
// whatever the column's width, so an id too large for an integer column
// matches no row (counted Unknown) instead of failing the whole statement.
func postgresColumnTypes(db *gorm.DB, t *writeTarget) error {
	var rows []struct{ Name, Type string }
	err := db.Raw(`SELECT a.attname AS name, format_type(a.atttypid, NULL) AS type
FROM pg_attribute a WHERE a.attrelid = to_regclass(?) AND a.attname IN (?, ?) AND NOT a.attisdropped`,
		db.Statement.Quote(t.table), t.pk, t.col).Scan(&rows).Error
	if err != nil {
		return err
	}
	for _, r := range rows {
		switch r.Name {
		case t.pk:
			t.pkType = r.Type
		case t.col:
			t.colType = r.Type
		}
	}
	if t.pkType == "" || t.colType == "" {
		return fmt.Errorf("%w: table %s with columns %s and %s", errNoTable, t.table, t.pk, t.col)
	}
	if t.intKey {
		t.pkType = "bigint"
	}
	return nil
}

func postgresRetryable(err error) bool {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		switch e.SQLState() {
		case "40001", "40P01": // serialization_failure, deadlock_detected
			return true
		}
	}
	return false
}

// mysqlUpdate joins the batch as a derived table of SELECT ... UNION ALL
// rows, which MySQL 5.7+ and MariaDB 10.x all accept:
//
//	UPDATE `users` AS t JOIN (SELECT ? AS id, ? AS ts UNION ALL SELECT ?, ?) AS v ON t.`id` = v.id
//	SET t.`last_seen_at` = v.ts WHERE t.`last_seen_at` IS NULL OR t.`last_seen_at` < v.ts
func mysqlUpdate(t *writeTarget, ids []any, ts []time.Time) clause.Expr {
	var b strings.Builder
	b.WriteString("UPDATE ? AS t JOIN (SELECT ? AS id, ? AS ts")
	vars := make([]any, 0, 2*len(ids)+5)
	vars = append(vars, clause.Table{Name: t.table}, ids[0], ts[0])
	for i := 1; i < len(ids); i++ {
		b.WriteString(" UNION ALL SELECT ?, ?")
		vars = append(vars, ids[i], ts[i])
	}
	b.WriteString(") AS v ON t.? = v.id SET t.? = v.ts WHERE t.? IS NULL OR t.? < v.ts")
	col := clause.Column{Name: t.col}
	vars = append(vars, clause.Column{Name: t.pk}, col, col, col)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

// mysqlOnConflict puts the newer-only guard into the assigned value, since
// MySQL's ON DUPLICATE KEY UPDATE has no WHERE.
func mysqlOnConflict(t *writeTarget) clause.OnConflict {
	col := clause.Column{Name: t.col}
	return clause.OnConflict{
		Columns: []clause.Column{{Name: t.pk}},
		DoUpdates: clause.Set{{Column: col, Value: clause.Expr{
			SQL:  "IF(? IS NULL OR ? < VALUES(?), VALUES(?), ?)",
			Vars: []any{col, col, col, col, col},
		}}},
	}
}

func mysqlRetryable(err error) bool {
	var e *mysql.MySQLError
	if errors.As(err, &e) {
		switch e.Number {
		case 1213, 1205: // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
			return true
		}
	}
	return false
}

// sqliteUpdate uses UPDATE ... FROM (SQLite 3.33+) over a VALUES list:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts
//	FROM (SELECT column1 AS id, column2 AS ts FROM (VALUES (?, ?), (?, ?))) AS v
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR julianday(t."last_seen_at") < julianday(v.ts))
func sqliteUpdate(t *writeTarget, ids []any, ts []time.Time) clause.Expr {
	var b strings.Builder
	b.WriteString("UPDATE ? AS t SET ? = v.ts FROM (SELECT column1 AS id, column2 AS ts FROM (VALUES ")
	col := clause.Column{Name: t.col}
	vars := make([]any, 0, 2*len(ids)+5)
	vars = append(vars, clause.Table{Name: t.table}, col)
	for i := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
		vars = append(vars, ids[i], ts[i])
	}
	b.WriteString(")) AS v WHERE t.? = v.id AND (t.? IS NULL OR julianday(t.?) < julianday(v.ts))")
	vars = append(vars, clause.Column{Name: t.pk}, col, col)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

func sqliteRetryable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// standardOnConflict is PostgreSQL's and SQLite's ON CONFLICT (pk) DO UPDATE
// with the newer-only guard in its WHERE.
func standardOnConflict(compare func(a any, op string, b any) clause.Expr) func(t *writeTarget) clause.OnConflict {
	return func(t *writeTarget) clause.OnConflict {
		cur := clause.Column{Table: t.table, Name: t.col}
		excluded := clause.Column{Table: "excluded", Name: t.col}
		return clause.OnConflict{
			Columns:   []clause.Column{{Name: t.pk}},
			DoUpdates: clause.Set{{Column: clause.Column{Name: t.col}, Value: excluded}},
			Where: clause.Where{Exprs: []clause.Expression{clause.Or(
				clause.Expr{SQL: "? IS NULL", Vars: []any{cur}},
				compare(cur, "<", excluded),
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
