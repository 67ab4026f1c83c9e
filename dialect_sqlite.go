package lastseen

import (
	"math"
	"strings"
	"time"

	"gorm.io/gorm/clause"
)

// sqliteDialect is SQLite's entry in dialects.
var sqliteDialect = &dialect{
	name:           "sqlite",
	maxParams:      32766,
	update:         sqliteUpdate,
	onConflict:     standardOnConflict(sqliteKey),
	key:            sqliteKey,
	retryable:      sqliteRetryable,
	statementError: sqliteStatementError,
	maxUnsigned:    math.MaxInt64,
	classify:       classifySQLite,
	uncomparable:   true,
}

// sqliteStatementError matches the messages of SQLite's statement errors
// (SQLite has no error codes for them).
func sqliteStatementError(err error) bool {
	msg := err.Error()
	for _, m := range []string{"no such table", "no such column", "has no column", "syntax error", "does not match any PRIMARY KEY or UNIQUE"} {
		if strings.Contains(msg, m) {
			return true
		}
	}
	return false
}

// sqliteKey compares SQLite text timestamps as instants: julianday parses
// every offset ("+09:00", "Z") that drivers write, where comparing the text
// would order "10:00+09:00" after "02:00+00:00"; its resolution is 1ms. Unix
// time compares as integers, and only integers: text or a real in an
// integer column (SQLite stores any value anywhere) has a NULL key, never
// ordered before or after another value.
func sqliteKey(enc Encoding, x any) clause.Expr {
	if enc == EncodingTime {
		return clause.Expr{SQL: "julianday(?)", Vars: []any{x}}
	}
	return clause.Expr{SQL: "(CASE WHEN typeof(?) = 'integer' THEN ? END)", Vars: []any{x, x}}
}

// sqliteUpdate uses UPDATE ... FROM (SQLite 3.33+) over a VALUES list:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts
//	FROM (SELECT column1 AS id, column2 AS ts FROM (VALUES (?, ?), (?, ?))) AS v
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR julianday("t"."last_seen_at") < julianday(v.ts))
//
// (the guard compares through sqliteKey: integers for Unix time).
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
		vars = append(vars, ids[i], t.codec.value(ts[i]))
	}
	b.WriteString(")) AS v WHERE t.? = v.id AND (t.? IS NULL OR ?)")
	guard := (&dialect{key: sqliteKey}).compare(t.codec.enc, clause.Column{Table: "t", Name: t.col}, "<", clause.Expr{SQL: "v.ts"})
	vars = append(vars, clause.Column{Name: t.pk}, col, guard)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

func sqliteRetryable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}
