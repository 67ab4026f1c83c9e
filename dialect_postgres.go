package lastseen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// postgresDialect is PostgreSQL's entry in dialects.
var postgresDialect = &dialect{
	name:        "postgres",
	maxParams:   65535,
	update:      postgresUpdate,
	onConflict:  standardOnConflict(nil),
	retryable:   postgresRetryable,
	exhausted:   postgresExhausted,
	errorKind:   sqlState,
	badText:     postgresBadText,
	columnTypes: postgresColumnTypes,
	count:       postgresCount,
	maxUnsigned: math.MaxInt64,
	health:      postgresHealth,
	classify:    classifyPostgres,
	naiveCast:   func(wall string) clause.Expr { return clause.Expr{SQL: "CAST(? AS timestamp)", Vars: []any{wall}} },
	identity:    postgresIdentity,
}

// sqlState returns the SQLSTATE of a PostgreSQL error anywhere in err's
// chain ("25006" read_only_sql_transaction, "42501" insufficient_privilege),
// "" for none. pgx's *pgconn.PgError and lib/pq's *pq.Error both have a
// SQLState method, so the library imports neither. PostgreSQL's "="
// on text is exact under the default (deterministic) collations, so the
// dialect has no exactIn; a key column with a nondeterministic ICU
// collation (CREATE COLLATION ... deterministic = false) is not handled.
func sqlState(err error) string {
	var e interface{ SQLState() string }
	if errors.As(err, &e) {
		return e.SQLState()
	}
	return ""
}

// postgresBadText: text refuses the NUL character (22021,
// character_not_in_repertoire) and, in a UTF8 database, invalid UTF-8.
func postgresBadText(s string) string {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte, which a PostgreSQL text key cannot store"
	case !utf8.ValidString(s):
		return "not valid UTF-8, which a PostgreSQL text key cannot store"
	}
	return ""
}

// postgresUpdate sends the batch as two arrays, each one bound parameter in
// PostgreSQL's array input syntax (pgIDs, pgTimes), and joins them with unnest, so
// the statement has two parameters whatever the batch size:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts
//	FROM unnest(CAST($1 AS text[])::bigint[], CAST($2 AS timestamptz[])) AS v(id, ts)
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts)
func postgresUpdate(t *writeTarget, ids []any, ts []time.Time) clause.Expr {
	sql := "UPDATE ? AS t SET ? = v.ts FROM unnest(CAST(? AS text[])::" + t.pkType + "[], CAST(? AS " + t.colType + "[])) AS v(id, ts)" +
		" WHERE t.? = v.id AND (t.? IS NULL OR t.? < v.ts)"
	col := clause.Column{Name: t.col}
	return clause.Expr{SQL: sql, Vars: []any{
		clause.Table{Name: t.table}, col, pgIDs(ids), pgTimes(t.codec, ts),
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
		Vars: []any{clause.Table{Name: t.table}, clause.Column{Name: t.pk}, pgIDs(ids)}}
}

// pgIDs and pgTimes build one bound parameter holding a one-dimensional
// array in PostgreSQL's array input syntax: every element but an integer
// double-quoted, with '"' and '\\' escaped by a backslash (PostgreSQL
// manual, "Array Value Input"), so the statement casts it (CAST(? AS
// text[])) and the library needs no driver package: GORM would expand a Go
// slice into a list of parameters instead. The literal is built once, in
// one buffer, and bound as a plain string: pgx sends a string argument as
// text, as it is (ExtendedQueryBuilder.chooseParameterFormatCode), where
// any other type, a driver.Valuer returning the same string included, is
// first tried in binary, fails with an error quoting the whole literal, is
// parsed into a Go slice and encoded again (pgtype.encodePlanDriverValuer):
// a third of the flush's client CPU (issue 11).

// appendQuoted appends s as a quoted array element.
func appendQuoted(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b = append(b, '\\')
		}
		b = append(b, s[i])
	}
	return append(b, '"')
}

// pgIDs writes ids as their decimal or string form (a UUID as its String).
// Integers need no quotes; everything else is quoted and escaped.
func pgIDs(ids []any) string {
	b := make([]byte, 0, 2+len(ids)*12)
	b = append(b, '{')
	for i, id := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		switch v := id.(type) {
		case int64:
			b = strconv.AppendInt(b, v, 10)
		case uint64:
			b = strconv.AppendUint(b, v, 10)
		case string:
			b = appendQuoted(b, v)
		default:
			b = appendQuoted(b, fmt.Sprint(v))
		}
	}
	return string(append(b, '}'))
}

// pgTimes writes times as the column's type reads them (timeCodec.appendText),
// each element double-quoted: Unix seconds or milliseconds in decimal for
// an integer column; for timestamptz the instant in UTC with microseconds
// and a "Z" offset; for timestamp (without time zone) the wall time in
// ColumnLocation. The texts hold no quote or backslash.
func pgTimes(c *timeCodec, ts []time.Time) string {
	b := make([]byte, 0, 2+len(ts)*30)
	b = append(b, '{')
	for i, t := range ts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = c.appendText(b, t)
		b = append(b, '"')
	}
	return string(append(b, '}'))
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
	switch sqlState(err) {
	case "40001", "40P01": // serialization_failure, deadlock_detected
		return true
	}
	return false
}

// postgresExhausted: SQLSTATE class 53, insufficient resources (53100
// disk_full, 53200 out_of_memory, 53300 too_many_connections, 53400
// configuration_limit_exceeded), PostgreSQL manual appendix A.
func postgresExhausted(kind string) bool { return strings.HasPrefix(kind, "53") }

// postgresIdentity names the server by the cluster's system identifier from
// pg_control_system() (PostgreSQL 9.6+), which a physical replica promoted
// by failover keeps, when the role may execute it (has_function_privilege:
// every role may unless an administrator revoked it); else by the address
// and port the connection reached (inet_server_addr(), "local" on a Unix
// socket). The database is current_database() and current_schema(), the
// schema an unqualified table name resolves to first.
func postgresIdentity(ctx context.Context, db *gorm.DB) (targetIdentity, error) {
	db = db.WithContext(ctx)
	var id targetIdentity
	var allowed bool
	if err := db.Raw("SELECT has_function_privilege('pg_catalog.pg_control_system()', 'execute')").Scan(&allowed).Error; err != nil {
		return id, err
	}
	var sysid string
	if allowed {
		if err := db.Raw("SELECT system_identifier::text FROM pg_catalog.pg_control_system()").Scan(&sysid).Error; err != nil {
			return id, err
		}
		id.server = "postgres system_identifier " + sysid
	} else {
		var addr string
		if err := db.Raw("SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')").Scan(&addr).Error; err != nil {
			return id, err
		}
		id.server = "postgres address " + addr
	}
	err := db.Raw("SELECT current_database() || '.' || coalesce(current_schema(), '')").Scan(&id.database).Error
	return id, err
}
