package dialect

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// sqlite is SQLite's Dialect.
var sqlite = &Dialect{
	name:        "sqlite",
	maxParams:   32766,
	update:      sqliteUpdate,
	onConflict:  standardOnConflict(sqliteKey),
	key:         sqliteKey,
	retryable:   sqliteRetryable,
	exhausted:   sqliteExhausted,
	transient:   sqliteTransient,
	errorKind:   sqliteResultCode,
	badText:     sqliteBadText,
	exactIn:     sqliteExactIn,
	maxUnsigned: math.MaxInt64,
	classify:    classifySQLite,
	anyValue:    true,
	health:      sqliteHealth,
	identity:    sqliteIdentity,
}

// sqliteResultCode returns SQLite's primary result code of err ("8"
// SQLITE_READONLY, "13" SQLITE_FULL, "19" SQLITE_CONSTRAINT, "1"
// SQLITE_ERROR for a missing table or column), "" for none. It asks the
// driver's error for Code() int (modernc.org/sqlite and
// glebarez/go-sqlite), else reads the "(N)" those drivers end their
// message with; extended codes are reduced to their primary code (the low
// 8 bits, https://www.sqlite.org/rescode.html).
func sqliteResultCode(err error) string {
	var e interface{ Code() int }
	if errors.As(err, &e) {
		return strconv.Itoa(e.Code() & 0xff)
	}
	if err != nil {
		if m := sqliteCodeText.FindStringSubmatch(err.Error()); m != nil {
			n, _ := strconv.Atoi(m[1])
			return strconv.Itoa(n & 0xff)
		}
	}
	return ""
}

var sqliteCodeText = regexp.MustCompile(`\((\d+)\)$`)

// sqliteBadText: SQLite stores any bytes in a TEXT column, but its string
// functions and C API stop at a NUL byte, so an id with one is refused;
// invalid UTF-8 is stored and compared as the bytes given, and accepted.
func sqliteBadText(s string) string {
	if strings.IndexByte(s, 0) >= 0 {
		return "contains a NUL byte, which SQLite's text functions cut at"
	}
	return ""
}

// sqliteExactIn compares with the BINARY collation, "`id` COLLATE BINARY IN
// (?, ?)": a key column declared COLLATE NOCASE finds "Bob" for "bob". It
// is ANDed to the plain comparison, which keeps the key's index.
func sqliteExactIn(col any, vals []any) clause.Expr {
	return clause.Expr{SQL: "? COLLATE BINARY IN ?", Vars: []any{col, vals}}
}

// sqliteKey compares SQLite text timestamps as instants: julianday parses
// every offset ("+09:00", "Z") that drivers write, where comparing the text
// would order "10:00+09:00" after "02:00+00:00"; its resolution is 1ms. Unix
// time compares as integers, and only integers: text or a real in an
// integer column (SQLite stores any value anywhere) has a NULL key, never
// ordered before or after another value.
func sqliteKey(enc timecol.Encoding, x any) clause.Expr {
	if enc == timecol.Time {
		return clause.Expr{SQL: "julianday(?)", Vars: []any{x}}
	}
	return clause.Expr{SQL: "(CASE WHEN typeof(?) = 'integer' THEN ? END)", Vars: []any{x, x}}
}

// sqliteUpdate uses UPDATE ... FROM (SQLite 3.33+) over a VALUES list:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts
//	FROM (SELECT column1 AS id, column2 AS ts FROM (VALUES (?, ?), (?, ?))) AS v
//	WHERE t."id" = v.id [AND t."id" = v.id COLLATE BINARY, for a string key]
//	AND (t."last_seen_at" IS NULL OR julianday("t"."last_seen_at") < julianday(v.ts))
//
// (the guard compares through sqliteKey: integers for Unix time).
func sqliteUpdate(t *Target, ids []any, ts []time.Time) clause.Expr {
	var b strings.Builder
	b.WriteString("UPDATE ? AS t SET ? = v.ts FROM (SELECT column1 AS id, column2 AS ts FROM (VALUES ")
	col := clause.Column{Name: t.Column}
	vars := make([]any, 0, 2*len(ids)+5)
	vars = append(vars, clause.Table{Name: t.Table}, col)
	for i := range ids {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?)")
		vars = append(vars, ids[i], t.Codec.Value(ts[i]))
	}
	pk := clause.Column{Name: t.PK}
	b.WriteString(")) AS v WHERE t.? = v.id")
	vars = append(vars, pk)
	if t.ExactKey { // index lookup first, then the exact filter (sqliteExactIn)
		b.WriteString(" AND t.? = v.id COLLATE BINARY")
		vars = append(vars, pk)
	}
	b.WriteString(" AND (t.? IS NULL OR ?)")
	guard := (&Dialect{key: sqliteKey}).Compare(t.Codec.Encoding(), clause.Column{Table: "t", Name: t.Column}, "<", clause.Expr{SQL: "v.ts"})
	vars = append(vars, col, guard)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

func sqliteRetryable(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked")
}

// sqliteExhausted: the primary result codes SQLITE_FULL (13, the disk or
// max_page_count is full), SQLITE_NOMEM (7) and SQLITE_IOERR (10)
// (sqlite.org/rescode.html).
func sqliteExhausted(kind string) bool { return kind == "13" || kind == "7" || kind == "10" }

// sqliteIdentity names a SQLite database by the absolute path of its main
// file (PRAGMA database_list), or ":memory:" for an in-memory database,
// which has none; the server is "sqlite".
func sqliteIdentity(ctx context.Context, db *gorm.DB) (Identity, error) {
	var rows []struct {
		Seq  int    `gorm:"column:seq"` // columns named whatever db's NamingStrategy
		Name string `gorm:"column:name"`
		File string `gorm:"column:file"`
	}
	if err := db.WithContext(ctx).Raw("PRAGMA database_list").Scan(&rows).Error; err != nil {
		return Identity{}, err
	}
	for _, r := range rows {
		if r.Name == "main" {
			return Identity{Server: "sqlite", Database: cmp.Or(r.File, ":memory:")}, nil
		}
	}
	return Identity{}, errors.New("PRAGMA database_list has no main database")
}

// classifySQLite follows SQLite's type affinity rules (the declared type
// containing "INT" is an integer; "REAL", "FLOA", "DOUB" and "BLOB" hold
// neither timestamps nor integers here; no type holds anything). Other
// names (DATETIME, TIMESTAMP, TEXT) take the text drivers write.
func classifySQLite(typ string) timecol.Class {
	switch {
	case typ == "":
		return timecol.ClassAny
	case strings.Contains(typ, "int"):
		return timecol.ClassInteger
	case strings.Contains(typ, "real"), strings.Contains(typ, "floa"), strings.Contains(typ, "doub"), strings.Contains(typ, "blob"):
		return timecol.ClassOther
	}
	return timecol.ClassText
}

// sqliteHealth reads the indexes with the pragma_index_list and
// pragma_index_info table-valued functions (SQLite 3.16+).
func sqliteHealth(db *gorm.DB, table, column string) (Health, error) {
	var h Health
	var rows []struct {
		Name string `gorm:"column:name"`
		SQL  string `gorm:"column:sql"`
	}
	err := db.Raw(`SELECT il.name AS name, coalesce(m.sql, '') AS sql FROM pragma_index_list(?) AS il
JOIN pragma_index_info(il.name) AS ii LEFT JOIN sqlite_master AS m ON m.type = 'index' AND m.name = il.name
WHERE ii.name = ? ORDER BY il.name`, table, column).Scan(&rows).Error
	if err != nil {
		return Health{}, fmt.Errorf("pragma_index_list: %w", err)
	}
	for _, r := range rows {
		h.Indexes = append(h.Indexes, Index{Name: r.Name, Definition: r.SQL})
	}
	return h, nil
}
