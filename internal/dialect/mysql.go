package dialect

import (
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// mysql is MySQL's and MariaDB's Dialect.
var mysql = &Dialect{
	name:               "mysql",
	maxParams:          65535,
	update:             mysqlUpdate,
	onConflict:         mysqlOnConflict,
	retryable:          mysqlRetryable,
	exhausted:          mysqlExhausted,
	transient:          mysqlTransient,
	timedOut:           mysqlTimedOut,
	errorKind:          mysqlErrorNumber,
	badText:            mysqlBadText,
	exactIn:            mysqlExactIn,
	columnTypes:        mysqlColumnTypes,
	upsertDoubleCounts: true,
	health:             mysqlHealth,
	classify:           classifyMySQL,
	naive: timecol.Naive{Cast: func(wall string) clause.Expr {
		return clause.Expr{SQL: "CAST(? AS DATETIME(6))", Vars: []any{wall}}
	}, Default: true},
	identity:       mysqlIdentity,
	driverLocation: mysqlDriverLocation,
}

// mysqlErrorText is how go-sql-driver/mysql writes a server error:
// "Error 1290 (HY000): ..." (the SQLSTATE is left out by older versions).
var mysqlErrorText = regexp.MustCompile(`\bError (\d{4,5})(?: \([0-9A-Z]{5}\))?: `)

// mysqlErrorNumber returns the server's error number of a MySQL/MariaDB
// error, "" for none. It reads the Number field of the driver's error
// (go-sql-driver/mysql's *MySQLError) by reflection, anywhere in err's
// chain, so the library needs no import of the driver; failing that it
// parses the driver's text "Error 1290 (HY000):".
func mysqlErrorNumber(err error) string {
	var n string
	walkErrors(err, func(e error) bool {
		v := reflect.ValueOf(e)
		if v.Kind() != reflect.Pointer || v.IsNil() || v.Elem().Kind() != reflect.Struct {
			return false
		}
		if f := v.Elem().FieldByName("Number"); f.IsValid() && f.CanUint() && f.Uint() > 0 {
			n = strconv.FormatUint(f.Uint(), 10)
			return true
		}
		return false
	})
	if n == "" && err != nil {
		if m := mysqlErrorText.FindStringSubmatch(err.Error()); m != nil {
			n = m[1]
		}
	}
	return n
}

// walkErrors calls fn on err and every error it wraps (errors.Unwrap and
// Unwrap() []error, depth first) until fn returns true.
func walkErrors(err error, fn func(error) bool) bool {
	if err == nil {
		return false
	}
	if fn(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walkErrors(u.Unwrap(), fn)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walkErrors(e, fn) {
				return true
			}
		}
	}
	return false
}

// mysqlBadText: a utf8mb4 column refuses bytes that are not UTF-8 (error
// 1366 in strict mode; without it the value is silently mangled). NUL is a
// character like any other there.
func mysqlBadText(s string) string {
	if !utf8.ValidString(s) {
		return "not valid UTF-8, which a MySQL utf8mb4 key cannot store"
	}
	return ""
}

// mysqlExactIn compares as binary strings, "BINARY `id` IN (?, ?)": the
// default collation utf8mb4_general_ci (and every _ci, _ai or PAD SPACE
// one) finds "Bob" for "bob", "resume" for "résumé" and "pad" for "pad ".
// It is ANDed to the plain comparison, which keeps the primary key's index.
func mysqlExactIn(col any, vals []any) clause.Expr {
	return clause.Expr{SQL: "BINARY ? IN ?", Vars: []any{col, vals}}
}

// mysqlUpdate joins the batch as a derived table of SELECT ... UNION ALL
// rows, which MySQL 5.7+ and MariaDB 10.x all accept (on MariaDB behind
// "SET STATEMENT max_statement_time = N FOR", Target.ServerBound):
//
//	UPDATE `users` AS t JOIN (SELECT ? AS id, ? AS ts UNION ALL SELECT ?, ?) AS v ON t.`id` = v.id
//	SET ...
//
// and for a string key, exactly (mysqlExactIn), the index lookup first:
//
//	... JOIN (SELECT CAST(? AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_general_ci AS id, ...) AS v
//	ON t.`id` = v.id AND BINARY t.`id` = BINARY v.id SET ...
func mysqlUpdate(t *Target, ids []any, ts []time.Time) clause.Expr {
	var b strings.Builder
	b.WriteString(mysqlBoundPrefix(t))
	// A string key's first id is cast to CHAR, a VARCHAR: the column of a
	// UNION of bare parameters is a CHAR, whose values lose their trailing
	// spaces ("pad " would become "pad"). It is cast to the key's own
	// character set and collation (mysqlColumnTypes), so that the join
	// compares like with like and keeps the index.
	switch {
	case t.IntKey:
		b.WriteString("UPDATE ? AS t JOIN (SELECT ? AS id, ? AS ts")
	case t.PKCollation != "":
		b.WriteString("UPDATE ? AS t JOIN (SELECT CAST(? AS CHAR CHARACTER SET " + t.PKCharset + ") COLLATE " + t.PKCollation + " AS id, ? AS ts")
	default:
		b.WriteString("UPDATE ? AS t JOIN (SELECT CAST(? AS CHAR) AS id, ? AS ts")
	}
	vars := make([]any, 0, 2*len(ids)+5)
	vars = append(vars, clause.Table{Name: t.Table}, ids[0], t.Codec.Value(ts[0]))
	for i := 1; i < len(ids); i++ {
		b.WriteString(" UNION ALL SELECT ?, ?")
		vars = append(vars, ids[i], t.Codec.Value(ts[i]))
	}
	pk, col := clause.Column{Name: t.PK}, clause.Column{Name: t.Column}
	b.WriteString(") AS v ON t.? = v.id")
	vars = append(vars, pk)
	if t.ExactKey { // index lookup first, then the exact filter (mysqlExactIn)
		b.WriteString(" AND BINARY t.? = BINARY v.id")
		vars = append(vars, pk)
	}
	b.WriteString(" SET t.? = v.ts WHERE t.? IS NULL OR t.? < v.ts")
	vars = append(vars, col, col, col)
	return clause.Expr{SQL: b.String(), Vars: vars}
}

// mysqlOnConflict puts the newer-only guard into the assigned value, since
// MySQL's ON DUPLICATE KEY UPDATE has no WHERE.
func mysqlOnConflict(t *Target) clause.OnConflict {
	col := clause.Column{Name: t.Column}
	return clause.OnConflict{
		Columns: []clause.Column{{Name: t.PK}},
		DoUpdates: clause.Set{{Column: col, Value: clause.Expr{
			SQL:  "IF(? IS NULL OR ? < VALUES(?), VALUES(?), ?)",
			Vars: []any{col, col, col, col, col},
		}}},
	}
}

func mysqlRetryable(err error) bool {
	switch mysqlErrorNumber(err) {
	case "1213", "1205": // ER_LOCK_DEADLOCK, ER_LOCK_WAIT_TIMEOUT
		return true
	}
	return false
}

// mysqlName is what a character set or collation name read from
// information_schema must look like before it is written into a statement.
var mysqlName = regexp.MustCompile(`^[A-Za-z0-9_]{1,64}$`)

// mysqlColumnTypes reads a string key's character set and collation from
// information_schema.COLUMNS, for mysqlUpdate, and whether the server
// takes the statement bound itself (mysqlServerBound). Nothing found (an
// integer key, a missing table) leaves the character set and collation
// empty.
func mysqlColumnTypes(db *gorm.DB, t *Target) error {
	if err := mysqlServerBound(db, t); err != nil {
		return err
	}
	if t.IntKey {
		return nil
	}
	var rows []struct {
		Charset   *string `gorm:"column:charset"` // columns named whatever db's NamingStrategy
		Collation *string `gorm:"column:collation"`
	}
	err := db.Raw(`SELECT CHARACTER_SET_NAME AS charset, COLLATION_NAME AS collation FROM information_schema.COLUMNS
WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? AND COLUMN_NAME = ?`, t.Table, t.PK).Scan(&rows).Error
	if err != nil {
		return err
	}
	if len(rows) == 1 && rows[0].Charset != nil && rows[0].Collation != nil &&
		mysqlName.MatchString(*rows[0].Charset) && mysqlName.MatchString(*rows[0].Collation) {
		t.PKCharset, t.PKCollation = *rows[0].Charset, *rows[0].Collation
	}
	return nil
}

// mysqlDriverLocation reads DSNConfig.Loc of GORM's MySQL dialector
// (gorm.io/driver/mysql's Config, embedded in its Dialector) by
// reflection; nil for another dialector or an unset one.
func mysqlDriverLocation(db *gorm.DB) *time.Location {
	v := reflect.ValueOf(db.Dialector)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return nil
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return nil
	}
	cfg := v.FieldByName("DSNConfig")
	if !cfg.IsValid() || cfg.Kind() != reflect.Pointer || cfg.IsNil() || cfg.Elem().Kind() != reflect.Struct {
		return nil
	}
	loc := cfg.Elem().FieldByName("Loc")
	if !loc.IsValid() || !loc.CanInterface() {
		return nil
	}
	l, _ := loc.Interface().(*time.Location)
	return l
}

// mysqlServerBound sets t.ServerBound on MariaDB (VERSION() names it; it
// has SET STATEMENT ... FOR since 10.1) when t.Bound is set and the
// session's max_statement_time is not already as short (0 is none): the
// server then stops a bulk UPDATE that runs past the bound and rolls it
// back. MySQL has no such bound for an UPDATE (its max_execution_time
// bounds SELECTs alone): there only the client gives up, by closing the
// connection, and the server may still finish the statement.
func mysqlServerBound(db *gorm.DB, t *Target) error {
	t.ServerBound = false
	if t.Bound <= 0 {
		return nil
	}
	var version string
	if err := db.Raw("SELECT VERSION()").Scan(&version).Error; err != nil {
		return err
	}
	if !strings.Contains(version, "MariaDB") {
		return nil
	}
	var session float64
	if err := db.Raw("SELECT @@SESSION.max_statement_time").Scan(&session).Error; err != nil {
		return err
	}
	t.ServerBound = session == 0 || session > t.Bound.Seconds()
	return nil
}

// mysqlBoundPrefix is MariaDB's statement bound in front of a bulk UPDATE
// (Target.ServerBound), in seconds with microseconds: a number the library
// computes, written into the statement as the syntax requires.
func mysqlBoundPrefix(t *Target) string {
	if !t.ServerBound {
		return ""
	}
	return "SET STATEMENT max_statement_time = " + strconv.FormatFloat(t.Bound.Seconds(), 'f', 6, 64) + " FOR "
}

// mysqlExhausted: MySQL/MariaDB server errors for a full disk or table
// file, or memory running out (MySQL error reference): 1021
// ER_DISK_FULL, 1114 ER_RECORD_FILE_FULL ("The table is full"), 1037 and
// 1038 ER_OUTOFMEMORY / ER_OUT_OF_SORTMEMORY, 1041 ER_OUT_OF_RESOURCES,
// 3 ER_ERROR_ON_WRITE.
func mysqlExhausted(kind string) bool {
	switch kind {
	case "1021", "1114", "1037", "1038", "1041", "3":
		return true
	}
	return false
}

// mysqlIdentity names a MySQL server by server_uuid (MySQL 5.6+, kept in
// the data directory's auto.cnf), and a MariaDB server, which has no
// server_uuid, by server_id, hostname and port; SHOW VARIABLES lists what
// exists without failing on what does not. The database is DATABASE(),
// empty when the connection selected none.
func mysqlIdentity(ctx context.Context, db *gorm.DB) (Identity, error) {
	var rows []struct {
		Name  string `gorm:"column:Variable_name"`
		Value string `gorm:"column:Value"`
	}
	err := db.WithContext(ctx).Raw("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('server_uuid', 'server_id', 'hostname', 'port')").Scan(&rows).Error
	if err != nil {
		return Identity{}, err
	}
	v := map[string]string{}
	for _, r := range rows {
		v[r.Name] = r.Value
	}
	var id Identity
	if v["server_uuid"] != "" {
		id.Server = "mysql server_uuid " + v["server_uuid"]
	} else {
		id.Server = "mysql server_id " + v["server_id"] + " on " + v["hostname"] + ":" + v["port"]
	}
	var name *string
	err = db.WithContext(ctx).Raw("SELECT DATABASE()").Scan(&name).Error
	if name != nil {
		id.Database = *name
	}
	return id, err
}

// classifyMySQL reads information_schema.COLUMNS.DATA_TYPE.
func classifyMySQL(typ string) timecol.Class {
	switch typ {
	case "timestamp":
		return timecol.ClassZoned
	case "datetime":
		return timecol.ClassNaive
	case "bigint", "int", "integer", "mediumint":
		return timecol.ClassInteger
	}
	return timecol.ClassOther
}

// mysqlHealth reads the indexes from information_schema.STATISTICS (a
// "schema.table" name is split; else the connection's database).
func mysqlHealth(db *gorm.DB, table, column string) (Health, error) {
	var h Health
	schema := ""
	if i := strings.LastIndexByte(table, '.'); i >= 0 {
		schema, table = table[:i], table[i+1:]
	}
	var names []string
	err := db.Raw(`SELECT DISTINCT INDEX_NAME FROM information_schema.STATISTICS
WHERE TABLE_SCHEMA = COALESCE(NULLIF(?, ''), DATABASE()) AND TABLE_NAME = ? AND COLUMN_NAME = ? ORDER BY INDEX_NAME`,
		schema, table, column).Scan(&names).Error
	if err != nil {
		return Health{}, fmt.Errorf("information_schema.STATISTICS: %w", err)
	}
	for _, n := range names {
		h.Indexes = append(h.Indexes, Index{Name: n})
	}
	return h, nil
}
