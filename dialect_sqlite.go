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
	onConflict:     standardOnConflict(julianCompare),
	compare:        julianCompare,
	sortKey:        julianKey,
	retryable:      sqliteRetryable,
	statementError: sqliteStatementError,
	maxUnsigned:    math.MaxInt64,
	health:         sqliteHealth,
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

// julianCompare compares SQLite text timestamps as instants: julianday parses
// every offset ("+09:00", "Z") that drivers write, where comparing the text
// would order "10:00+09:00" after "02:00+00:00". Its resolution is 1ms.
func julianCompare(a any, op string, b any) clause.Expr {
	return clause.Expr{SQL: "julianday(?) " + op + " julianday(?)", Vars: []any{a, b}}
}

func julianKey(col any) clause.Expr { return clause.Expr{SQL: "julianday(?)", Vars: []any{col}} }

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
