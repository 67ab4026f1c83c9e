package dialect

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

// postgres is PostgreSQL's Dialect.
var postgres = &Dialect{
	name:        "postgres",
	maxParams:   65535,
	update:      postgresUpdate,
	returning:   postgresUpdateReturning,
	readPrior:   postgresReadPrior,
	onConflict:  postgresOnConflict,
	zones:       true,
	retryable:   postgresRetryable,
	exhausted:   postgresExhausted,
	transient:   postgresTransient,
	errorKind:   sqlState,
	badText:     postgresBadText,
	columnTypes: postgresColumnTypes,
	columns:     postgresColumns,
	count:       postgresCount,
	maxUnsigned: math.MaxInt64,
	health:      postgresHealth,
	classify:    classifyPostgres,
	naive: timecol.Naive{Cast: func(wall string) clause.Expr {
		return clause.Expr{SQL: "CAST(? AS timestamp)", Vars: []any{wall}}
	}, Date: func(day string) clause.Expr {
		return clause.Expr{SQL: "CAST(? AS date)", Vars: []any{day}}
	}},
	identity: postgresIdentity,
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
//
// A naive column in a zone with DST (Target.Zone) gets the instants
// instead, its wall time in the zone, and the guard compares instants, a
// repeated wall time taken for its first pass (pgEarliest):
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts AT TIME ZONE z.name
//	FROM unnest(CAST($1 AS text[])::bigint[], CAST($2 AS timestamptz[])) AS v(id, ts), (SELECT CAST($3 AS text) AS name) AS z
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR <earliest instant of t."last_seen_at"> < v.ts)
func postgresUpdate(t *Target, ids []any, ts []time.Time) clause.Expr {
	return clause.Expr{SQL: "UPDATE ? AS t SET ? = ? FROM ? WHERE t.? = v.id AND ?", Vars: []any{
		clause.Table{Name: t.Table}, clause.Column{Name: t.Column}, postgresNewValue(t), postgresBatch(t, ids, ts),
		clause.Column{Name: t.PK}, postgresGuard(t),
	}}
}

// postgresUpdateReturning is postgresUpdate joined to each row as the
// statement's snapshot holds it (o: a self-join on the key), returning the
// key and the previous value of every row written:
//
//	UPDATE "users" AS t SET "last_seen_at" = v.ts FROM unnest(...) AS v(id, ts), "users" AS o
//	WHERE t."id" = v.id AND (t."last_seen_at" IS NULL OR t."last_seen_at" < v.ts) AND o."id" = t."id"
//	RETURNING t."id", o."last_seen_at"
func postgresUpdateReturning(t *Target, ids []any, ts []time.Time) clause.Expr {
	table, pk, col := clause.Table{Name: t.Table}, clause.Column{Name: t.PK}, clause.Column{Name: t.Column}
	return clause.Expr{SQL: "UPDATE ? AS t SET ? = ? FROM ?, ? AS o WHERE t.? = v.id AND ? AND o.? = t.? RETURNING t.?, o.?", Vars: []any{
		table, col, postgresNewValue(t), postgresBatch(t, ids, ts), table,
		pk, postgresGuard(t), pk, pk, pk, col,
	}}
}

// postgresBatch is the batch as the rows (id, ts) of v, and for a naive
// column in a zone with DST (Target.Zone) the zone's name as z.name, the
// values then instants:
//
//	unnest(CAST($1 AS text[])::bigint[], CAST($2 AS timestamptz[])) AS v(id, ts)[, (SELECT CAST($3 AS text) AS name) AS z]
//
// Each array is the array text of pgIDs and pgTimes, or, where the driver
// takes Go slices (Target.SliceArgs), integer keys as a []int64 and
// instants as a []time.Time (pgIDArray, pgInstantArray).
func postgresBatch(t *Target, ids []any, ts []time.Time) clause.Expr {
	idSQL, idArg := pgIDArray(t, ids)
	if t.Zone != "" {
		tsSQL, tsArg := pgInstantArray(t, ts, true)
		return clause.Expr{SQL: "unnest(" + idSQL + ", " + tsSQL + ") AS v(id, ts), (SELECT CAST(? AS text) AS name) AS z",
			Vars: []any{idArg, tsArg, t.Zone}}
	}
	tsSQL, tsArg := pgInstantArray(t, ts, t.ColType == "timestamp with time zone")
	return clause.Expr{SQL: "unnest(" + idSQL + ", " + tsSQL + ") AS v(id, ts)", Vars: []any{idArg, tsArg}}
}

// pgIDArray is the batch's keys as one array parameter of the key's type:
// "CAST(? AS bigint[])" bound to a *[]int64 when the driver takes Go slices
// (Target.SliceArgs) and every id is an integer within int64, otherwise
// "CAST(? AS text[])::<key type>[]" bound to their array text (pgIDs). The
// slice goes by pointer: GORM expands a slice into a list of parameters.
func pgIDArray(t *Target, ids []any) (string, any) {
	if t.SliceArgs && t.IntKey {
		if ints, ok := pgInts(ids); ok {
			return "CAST(? AS bigint[])", &ints
		}
	}
	return "CAST(? AS text[])::" + t.PKType + "[]", pgIDs(ids)
}

// pgInstantArray is the batch's times as one array parameter: as instants,
// "CAST(? AS timestamptz[])" bound to a *[]time.Time, when instant is set
// and the driver takes Go slices (Target.SliceArgs); otherwise their array
// text cast to timestamptz[] (pgInstants) for instants, or to the column's
// type (pgTimes).
func pgInstantArray(t *Target, ts []time.Time, instant bool) (string, any) {
	switch {
	case instant && t.SliceArgs:
		return "CAST(? AS timestamptz[])", &ts
	case instant:
		return "CAST(? AS timestamptz[])", pgInstants(ts)
	}
	return "CAST(? AS " + t.ColType + "[])", pgTimes(t.Codec, ts)
}

// pgInts returns ids as int64s, or false when one is not an integer
// within int64.
func pgInts(ids []any) ([]int64, bool) {
	out := make([]int64, len(ids))
	for i, id := range ids {
		switch v := id.(type) {
		case int64:
			out[i] = v
		case uint64:
			if v > math.MaxInt64 {
				return nil, false
			}
			out[i] = int64(v)
		default:
			return nil, false
		}
	}
	return out, true
}

// postgresNewValue is what the column is set to: v.ts, or its wall time in
// z.name for a naive column in a zone with DST (Target.Zone).
func postgresNewValue(t *Target) clause.Expr {
	if t.Zone != "" {
		return clause.Expr{SQL: "v.ts AT TIME ZONE z.name"}
	}
	return clause.Expr{SQL: "v.ts"}
}

// postgresGuard is the forward-only condition on row t and batch row v:
// the column is NULL or older than v.ts; for a naive column in a zone
// with DST (Target.Zone) compared as instants, a repeated wall time taken
// for its first pass (pgEarliest).
func postgresGuard(t *Target) clause.Expr {
	col := clause.Column{Name: t.Column}
	if t.Zone != "" {
		return clause.Expr{SQL: "(t.? IS NULL OR ? < v.ts)", Vars: []any{col, pgEarliest(clause.Column{Table: "t", Name: t.Column}, clause.Expr{SQL: "z.name"})}}
	}
	return clause.Expr{SQL: "(t.? IS NULL OR t.? < v.ts)", Vars: []any{col, col}}
}

// postgresReadPrior is the batch's rows, their values and whether the
// guard holds, locked with FOR UPDATE OF t when lock is set (readPrior):
//
//	SELECT t."id", t."last_seen_at", CASE WHEN (guard) THEN 1 ELSE 0 END
//	FROM "users" AS t, unnest(...) AS v(id, ts) WHERE t."id" = v.id FOR UPDATE OF t
func postgresReadPrior(t *Target, ids []any, ts []time.Time, lock bool) clause.Expr {
	pk := clause.Column{Name: t.PK}
	on := clause.Expr{SQL: "t.? = v.id", Vars: []any{pk}}
	return selectPrior(t, postgresBatch(t, ids, ts), on, postgresGuard(t), map[bool]string{true: " FOR UPDATE OF t"}[lock])
}

// pgEarliest is the earliest instant whose wall time in zone is the naive
// timestamp c: "c AT TIME ZONE zone" takes a wall time that a DST fall-back
// repeats for its second pass, the later instant (the offset in force
// after the transition); this moves it back by the transition's size (2
// hours, 1 hour, 30 minutes) where the instant that much earlier shows the
// same wall time:
//
//	CASE WHEN ((c AT TIME ZONE zone) - interval '2 hours') AT TIME ZONE zone = c THEN (c AT TIME ZONE zone) - interval '2 hours'
//	WHEN ... '1 hour' ... WHEN ... '30 minutes' ... ELSE c AT TIME ZONE zone END
func pgEarliest(c, zone any) clause.Expr {
	var b strings.Builder
	var vars []any
	b.WriteString("CASE")
	for _, shift := range []string{"2 hours", "1 hour", "30 minutes"} {
		b.WriteString(" WHEN ((? AT TIME ZONE ?) - interval '" + shift + "') AT TIME ZONE ? = ? THEN (? AT TIME ZONE ?) - interval '" + shift + "'")
		vars = append(vars, c, zone, zone, c, c, zone)
	}
	b.WriteString(" ELSE ? AT TIME ZONE ? END")
	vars = append(vars, c, zone)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

// postgresOnConflict is the standard upsert; for a naive column in a zone
// with DST (Target.Zone) its guard compares instants: the row's earliest
// (pgEarliest) before the inserted wall time's later instant (its second
// pass, for a wall time a fall-back repeats).
func postgresOnConflict(t *Target) clause.OnConflict {
	oc := standardOnConflict(nil)(t)
	if t.Zone == "" {
		return oc
	}
	cur := clause.Column{Table: t.Table, Name: t.Column}
	excluded := clause.Column{Table: "excluded", Name: t.Column}
	oc.Where = clause.Where{Exprs: []clause.Expression{clause.Or(
		clause.Expr{SQL: "? IS NULL", Vars: []any{cur}},
		clause.Expr{SQL: "? < (? AT TIME ZONE ?)", Vars: []any{pgEarliest(cur, t.Zone), excluded, t.Zone}},
	)}}
	return oc
}

// pgInstants writes times as instants in UTC with microseconds, each
// element double-quoted, for a timestamptz[] cast.
func pgInstants(ts []time.Time) string {
	b := make([]byte, 0, 2+len(ts)*30)
	b = append(b, '{')
	for i, t := range ts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = t.UTC().AppendFormat(b, "2006-01-02T15:04:05.999999Z07:00")
		b = append(b, '"')
	}
	return string(append(b, '}'))
}

// postgresCount counts with the same array and cast as postgresUpdate, so an
// id too large for an integer key column matches nothing instead of failing
// to encode:
//
//	SELECT count(*) FROM "users" AS t WHERE t."id" = ANY(CAST($1 AS text[])::bigint[])
func postgresCount(t *Target, ids []any) clause.Expr {
	idSQL, idArg := pgIDArray(t, ids)
	return clause.Expr{SQL: "SELECT count(*) FROM ? AS t WHERE t.? = ANY(" + idSQL + ")",
		Vars: []any{clause.Table{Name: t.Table}, clause.Column{Name: t.PK}, idArg}}
}

// postgresSliceArgs reports whether db's driver takes a pointer to a Go
// slice as one array parameter and the server reads back what was sent:
// a bigint[] and a timestamptz[] (microseconds, a year before 1970
// included) compared with the same arrays sent as text. An error of the
// connection or the server's state (postgresTransient, transientError) or
// of db's context is returned, for the caller to ask again: the answer is
// kept for the life of the Target. Any other error, from the driver or
// the server, is a no. The probe goes to no logger: a driver's refusal is
// an answer, not an error for the app's log.
func postgresSliceArgs(db *gorm.DB) (bool, error) {
	ids := []any{int64(-1), int64(0), int64(math.MaxInt64)}
	ints, _ := pgInts(ids)
	at := []time.Time{time.Date(1969, 7, 20, 20, 17, 40, 123456000, time.UTC), time.Date(2026, 12, 2, 16, 0, 0, 999999000, time.FixedZone("", 3600))}
	var ok bool
	err := db.Session(&gorm.Session{Logger: logger.Discard}).Raw("SELECT CAST(? AS bigint[]) = CAST(? AS text[])::bigint[] AND CAST(? AS timestamptz[]) = CAST(? AS timestamptz[])",
		&ints, pgIDs(ids), &at, pgInstants(at)).Scan(&ok).Error
	switch {
	case err == nil:
		return ok, nil
	case transientError(err), postgresTransient(err), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		db.Statement.Context != nil && db.Statement.Context.Err() != nil:
		return false, fmt.Errorf("does the driver take Go slices: %w", err)
	}
	return false, nil
}

// pgIDs and pgTimes build the array text path's bound parameter (a driver
// that takes no Go slices, or keys and times of other types): a one-dimensional
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
// a third of the flush's client CPU.

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

// pgTimes writes times as the column's type reads them (Codec.AppendText),
// each element double-quoted: Unix seconds or milliseconds in decimal for
// an integer column; for timestamptz the instant in UTC with microseconds
// and a "Z" offset; for timestamp (without time zone) the wall time in
// the codec's location. The texts hold no quote or backslash.
func pgTimes(c *timecol.Codec, ts []time.Time) string {
	b := make([]byte, 0, 2+len(ts)*30)
	b = append(b, '{')
	for i, t := range ts {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = c.AppendText(b, t)
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
func postgresColumnTypes(db *gorm.DB, t *Target) error {
	var rows []struct {
		Name string `gorm:"column:name"` // columns named whatever db's NamingStrategy
		Type string `gorm:"column:type"`
	}
	err := db.Raw(`SELECT a.attname AS name, format_type(a.atttypid, NULL) AS type
FROM pg_attribute a WHERE a.attrelid = to_regclass(?) AND a.attname IN (?, ?) AND NOT a.attisdropped`,
		db.Statement.Quote(t.Table), t.PK, t.Column).Scan(&rows).Error
	if err != nil {
		return err
	}
	for _, r := range rows {
		switch r.Name {
		case t.PK:
			t.PKType = r.Type
		case t.Column:
			t.ColType = r.Type
		}
	}
	if t.PKType == "" || t.ColType == "" {
		return fmt.Errorf("%w: table %s with columns %s and %s", ErrNoTable, t.Table, t.PK, t.Column)
	}
	if t.IntKey {
		t.PKType = "bigint"
	}
	if t.SliceArgs, err = postgresSliceArgs(db); err != nil {
		return err
	}
	if t.Zone != "" && t.ColType == "timestamp without time zone" {
		var probe string // a name the server does not know fails: 22023
		if db.Raw("SELECT CAST(now() AT TIME ZONE ? AS text)", t.Zone).Scan(&probe).Error != nil {
			t.Zone = ""
		}
	} else {
		t.Zone = ""
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

// classifyPostgres reads information_schema.columns.udt_name.
func classifyPostgres(typ string) timecol.Class {
	switch typ {
	case "timestamptz":
		return timecol.ClassZoned
	case "timestamp":
		return timecol.ClassNaive
	case "date":
		return timecol.ClassDate
	case "int8", "int4", "int2":
		return timecol.ClassInteger
	}
	return timecol.ClassOther
}

// postgresHealth reads the indexes from pg_index (key columns by
// attribute number, expressions and predicates by the column's name in
// their text), the counters from pg_stat_user_tables and the fillfactor
// from pg_class.reloptions.
func postgresHealth(db *gorm.DB, table, column string) (Health, error) {
	h := Health{HOT: true, FillFactor: 100}
	rel := db.Statement.Quote(table)
	err := db.Raw(`SELECT i.relname AS name, pg_get_indexdef(x.indexrelid) AS definition
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = to_regclass(?) AND (
  EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = x.indrelid AND a.attname = ? AND a.attnum = ANY(x.indkey))
  OR coalesce(pg_get_expr(x.indexprs, x.indrelid), '') ~ ('\m' || ? || '\M')
  OR coalesce(pg_get_expr(x.indpred, x.indrelid), '') ~ ('\m' || ? || '\M'))
ORDER BY i.relname`, rel, column, column, column).Scan(&h.Indexes).Error
	if err != nil {
		return Health{}, fmt.Errorf("pg_index: %w", err)
	}
	var rows []struct {
		Upd  int64 `gorm:"column:upd"`
		Hot  int64 `gorm:"column:hot"`
		Fill *int  `gorm:"column:fill"`
	}
	err = db.Raw(`SELECT coalesce(s.n_tup_upd, 0) AS upd, coalesce(s.n_tup_hot_upd, 0) AS hot,
  (SELECT substring(o FROM '^fillfactor=([0-9]+)$')::int FROM unnest(c.reloptions) AS o WHERE o LIKE 'fillfactor=%') AS fill
FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid WHERE c.oid = to_regclass(?)`, rel).Scan(&rows).Error
	if err != nil {
		return Health{}, fmt.Errorf("pg_stat_user_tables: %w", err)
	}
	if len(rows) != 1 {
		return Health{}, fmt.Errorf("%w: table %s", ErrNoTable, table)
	}
	h.Updates, h.HOTUpdates = rows[0].Upd, rows[0].Hot
	if rows[0].Fill != nil {
		h.FillFactor = *rows[0].Fill
	}
	return h, nil
}

// postgresIdentity names the server by the cluster's system identifier from
// pg_control_system() (PostgreSQL 9.6+), which a physical replica promoted
// by failover keeps, when the role may execute it (has_function_privilege:
// every role may unless an administrator revoked it); else by the address
// and port the connection reached (inet_server_addr(), "local" on a Unix
// socket). The database is current_database() and current_schema(), the
// schema an unqualified table name resolves to first.
func postgresIdentity(ctx context.Context, db *gorm.DB) (Identity, error) {
	db = db.WithContext(ctx)
	var id Identity
	var allowed bool
	if err := db.Raw("SELECT has_function_privilege('pg_catalog.pg_control_system()', 'execute')").Scan(&allowed).Error; err != nil {
		return id, err
	}
	var sysid string
	if allowed {
		if err := db.Raw("SELECT system_identifier::text FROM pg_catalog.pg_control_system()").Scan(&sysid).Error; err != nil {
			return id, err
		}
		id.Server = "postgres system_identifier " + sysid
	} else {
		var addr string
		if err := db.Raw("SELECT coalesce(host(inet_server_addr()), 'local') || ':' || current_setting('port')").Scan(&addr).Error; err != nil {
			return id, err
		}
		id.Server = "postgres address " + addr
	}
	err := db.Raw("SELECT current_database() || '.' || coalesce(current_schema(), '')").Scan(&id.Database).Error
	return id, err
}
