// Package dialect is the one place where PostgreSQL, MySQL/MariaDB and
// SQLite part ways: the bulk statements a flush writes (the forward-only
// UPDATE, the upsert, the count of existing rows), the comparison of time
// columns, the classification of database errors, the catalog queries
// (column types, table health, the server's identity) and the rules of
// what a key column can hold. Lookup finds a Dialect by GORM's dialector
// name; what a statement writes is described by a Target.
package dialect

import (
	"context"
	"errors"
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ErrNoTable is wrapped by ColumnTypes and Health when the catalog has
// no such table or column. Its text is "lastseen: not found in the
// database".
var ErrNoTable = errors.New("lastseen: not found in the database")

// Dialect is one database's way of doing what differs between databases.
// The Dialects Lookup returns are shared and never change; WithMaxParams
// returns a changed copy. Its methods take the database handle to run on
// (with the caller's context and transaction) where they run a statement.
type Dialect struct {
	name string
	// maxParams is the bind-parameter limit of one statement.
	maxParams int
	// update returns the bulk UPDATE that moves the time column of existing
	// rows forward to the batch's values and never inserts.
	update func(t *Target, ids []any, ts []time.Time) clause.Expr
	// returning returns update joined to each row as the statement found
	// it, returning the key and the previous value of each row written
	// (nil: the dialect reads them first, with readPrior).
	returning func(t *Target, ids []any, ts []time.Time) clause.Expr
	// returnsKeys is set where the UPDATE takes a RETURNING clause naming
	// the target's own columns only (SQLite 3.35+).
	returnsKeys bool
	// readPrior returns the SELECT of the batch's rows: key, time column and
	// whether update's guard holds (1 or 0), locking the rows where the
	// dialect can when lock is set (selectPrior).
	readPrior func(t *Target, ids []any, ts []time.Time, lock bool) clause.Expr
	// onConflict returns the newer-only assignment and condition for an
	// upsert.
	onConflict func(t *Target) clause.OnConflict
	// key is what a time column or value of an encoding compares and sorts
	// by (nil: itself).
	key func(enc timecol.Encoding, x any) clause.Expr
	// retryable reports deadlocks and serialization failures.
	retryable func(error) bool
	// errorKind names the kind of a database error, as the server reported
	// it ("" for none).
	errorKind func(error) string
	// exhausted reports kinds that name a resource of the server running
	// out.
	exhausted func(kind string) bool
	// transient reports the dialect's errors of the connection or of the
	// server's state (transientError adds the drivers' common ones).
	transient func(error) bool
	// timedOut reports the server's error for a statement it stopped at a
	// time bound (nil: none).
	timedOut func(error) bool
	// badText reports why a string key column can never hold s.
	badText func(s string) string
	// exactIn returns the filter "col is exactly one of vals" (nil: the
	// dialect's "=" is already exact).
	exactIn func(col any, vals []any) clause.Expr
	// maxUnsigned is the largest value of a column GORM creates for a
	// uint64 key (0: all of them).
	maxUnsigned uint64
	// upsertDoubleCounts is MySQL's rule that ON DUPLICATE KEY UPDATE
	// reports 1 affected row per insert and 2 per update.
	upsertDoubleCounts bool
	// count returns the SELECT count(*) of the batch's ids that have a row,
	// where the generic "WHERE pk IN (...)" does not do (nil: generic).
	count func(t *Target, ids []any) clause.Expr
	// columnTypes looks up what the statements need of the catalog (nil:
	// nothing).
	columnTypes func(db *gorm.DB, t *Target) error
	// columns reads a table's columns from the catalog (nil: through
	// GORM's Migrator).
	columns func(db *gorm.DB, table string) ([]Column, error)
	// health reads the table's indexes on the column and, where the
	// database has them, its HOT counters and fillfactor.
	health func(db *gorm.DB, table, column string) (Health, error)
	// classify tells what a column's declared type holds.
	classify func(typ string) timecol.Class
	// naive is the dialect's timestamp type without time zone.
	naive timecol.Naive
	// zones is set where the statements convert a naive column's wall
	// times in Target.Zone (PostgreSQL).
	zones bool
	// anyValue is set where a column may hold values of any type (SQLite),
	// so values its key cannot compare.
	anyValue bool
	// identity names the database server and database.
	identity func(ctx context.Context, db *gorm.DB) (Identity, error)
	// driverLocation is the location the driver writes a time in (nil: a
	// time's own).
	driverLocation func(db *gorm.DB) *time.Location
}

// Lookup returns the Dialect of GORM's dialector name
// (db.Dialector.Name()): "postgres", "mysql" (MySQL and MariaDB) or
// "sqlite"; nil for any other name.
func Lookup(name string) *Dialect {
	switch name {
	case postgres.name:
		return postgres
	case mysql.name:
		return mysql
	case sqlite.name:
		return sqlite
	}
	return nil
}

// Identity is what a database handle points at: Server names the database
// server ("postgres system_identifier <n>" or "postgres address
// <host:port>", "mysql server_uuid <uuid>" or "mysql server_id <n> on
// <host>:<port>", "sqlite"), Database the database within it
// (PostgreSQL's "<database>.<schema>", MySQL's database, the SQLite
// file's absolute path or ":memory:").
type Identity struct {
	Server, Database string
}

// Name is GORM's dialector name of the dialect: "postgres", "mysql" or
// "sqlite".
func (d *Dialect) Name() string { return d.name }

// MaxParams is the bind-parameter limit of one statement: 65535 on
// PostgreSQL (the wire protocol counts parameters in an int16) and MySQL
// (its prepared-statement protocol likewise), 32766 on SQLite
// (SQLITE_MAX_VARIABLE_NUMBER's default since 3.32.0).
func (d *Dialect) MaxParams() int { return d.maxParams }

// MaxBatch is the most rows one bulk statement writes: MaxParams / 2, two
// bind parameters per row.
func (d *Dialect) MaxBatch() int { return d.maxParams / 2 }

// WithMaxParams returns a copy of d whose bind-parameter limit is n.
func (d *Dialect) WithMaxParams(n int) *Dialect {
	c := *d
	c.maxParams = n
	return &c
}

// MaxUnsigned is the largest value of a column GORM creates for a uint64
// key: math.MaxInt64 on PostgreSQL (bigint) and SQLite (integer), both
// signed 64-bit; 0 on MySQL, whose BIGINT UNSIGNED takes them all. Larger
// ids must be refused before they reach a statement.
func (d *Dialect) MaxUnsigned() uint64 { return d.maxUnsigned }

// Naive is the dialect's timestamp type without time zone and its date
// type, for a timecol.Codec: PostgreSQL's timestamp and date, MySQL's
// DATETIME(6) (taken for naive until the catalog says otherwise, as GORM
// creates DATETIME) and DATE; SQLite has no timestamp type and keeps
// dates as text.
func (d *Dialect) Naive() timecol.Naive { return d.naive }

// Classify tells what a column's declared type holds, from Column.Type
// (GORM's ColumnType.DatabaseTypeName in lower case): PostgreSQL's udt_name
// ("timestamptz", "int8"), MySQL's DATA_TYPE ("datetime", "bigint"),
// SQLite's declared type by its affinity rules ("" holds any value).
func (d *Dialect) Classify(typ string) timecol.Class { return d.classify(typ) }

// Compare is the condition "a op b" (op "<", "<=", ">=" or ">") on a time
// column (or expression) a and a value b, both in enc, compared through
// Key. A nil Dialect (an unknown database) compares plainly.
func (d *Dialect) Compare(enc timecol.Encoding, a any, op string, b any) clause.Expr {
	return clause.Expr{SQL: "? " + op + " ?", Vars: []any{d.Key(enc, a), d.Key(enc, b)}}
}

// Key is what a time column or value x in enc compares and sorts by: on
// SQLite julianday(x) for a timestamp, since text with mixed offsets does
// not sort by instant, and x only when it is an integer for Unix time (a
// NULL key otherwise: never before or after another value); elsewhere,
// and for a nil Dialect, x itself.
func (d *Dialect) Key(enc timecol.Encoding, x any) any {
	if d == nil || d.key == nil {
		return x
	}
	return d.key(enc, x)
}

// Retryable reports a deadlock or serialization failure, which the same
// statement may pass when run again: PostgreSQL's SQLSTATE 40001 and
// 40P01, MySQL's errors 1213 and 1205 (lock wait timeout), SQLite's
// SQLITE_BUSY ("database is locked").
func (d *Dialect) Retryable(err error) bool { return err != nil && d.retryable(err) }

// ErrorKind names the kind of a database error as the server reported it:
// the SQLSTATE on PostgreSQL ("23505", "25006"), the error number on
// MySQL/MariaDB ("1062", "1290"), the primary result code on SQLite ("19"
// SQLITE_CONSTRAINT, "8" SQLITE_READONLY, "1" SQLITE_ERROR); "" when the
// error carries none (a connection error, a timeout on the client side,
// nil). The same refusal of every write (read-only, permission denied,
// disk full, a missing column) has the same kind, which tells it from a
// row refused on its own.
func (d *Dialect) ErrorKind(err error) string { return d.errorKind(err) }

// Exhausted reports kinds (ErrorKind) that name a resource of the server
// running out (a full disk, no memory), which no row can cause:
// PostgreSQL's SQLSTATE class 53; MySQL's 1021, 1114, 1037, 1038, 1041
// and 3; SQLite's SQLITE_FULL, SQLITE_NOMEM and SQLITE_IOERR.
func (d *Dialect) Exhausted(kind string) bool { return d.exhausted(kind) }

// Transient reports an error of the connection or of the server's state,
// never of the statement's rows: the same statement may pass on a new
// connection or once the server is back, so it must never count as a
// row's refusal. On every dialect: driver.ErrBadConn, sql.ErrConnDone,
// io.EOF and io.ErrUnexpectedEOF, a net.Error, ECONNRESET, ECONNREFUSED
// and EPIPE, and go-sql-driver/mysql's ErrInvalidConn ("invalid
// connection"); on PostgreSQL SQLSTATE class 08 (connection exception),
// 57P01 admin_shutdown (pg_terminate_backend), 57P02 crash_shutdown and
// 57P03 cannot_connect_now; on MySQL/MariaDB errors 2006 and 2013 (server
// gone, connection lost), 1053 (server shutdown), 1317 (query
// interrupted by KILL QUERY) and MariaDB's 1927 (connection killed); on
// SQLite SQLITE_BUSY and SQLITE_LOCKED. A nil error is not transient.
func (d *Dialect) Transient(err error) bool {
	return err != nil && (transientError(err) || (d.transient != nil && d.transient(err)))
}

// TimedOut reports the server's error for a statement it stopped at a
// time bound it was given (Target.ServerBound): MySQL's and MariaDB's
// 1969 ER_STATEMENT_TIMEOUT and MySQL's 3024 ER_QUERY_TIMEOUT. It is
// false elsewhere, where the client's context ends the statement.
func (d *Dialect) TimedOut(err error) bool {
	return err != nil && d.timedOut != nil && d.timedOut(err)
}

// BadText reports why a string key column can never hold s ("" when it
// can): a NUL byte on PostgreSQL and SQLite, invalid UTF-8 on PostgreSQL
// and MySQL (utf8mb4).
func (d *Dialect) BadText(s string) string { return d.badText(s) }

// ExactIn returns the filter "col is exactly one of vals" (binary
// comparison), to be ANDed to the indexed comparison on a string key whose
// collation may fold case, accents or trailing spaces; ok is false where
// the dialect's "=" is already exact (PostgreSQL's deterministic
// collations).
func (d *Dialect) ExactIn(col any, vals []any) (filter clause.Expr, ok bool) {
	if d.exactIn == nil {
		return clause.Expr{}, false
	}
	return d.exactIn(col, vals), true
}

// ColumnTypes reads from the catalog what the statements need to know of
// t's columns: on PostgreSQL the key's and the time column's types
// (Target.PKType, Target.ColType; a missing table or column wraps
// ErrNoTable), whether the server knows Target.Zone and whether the
// driver takes Go slices (Target.SliceArgs; an error of the connection
// while asking is returned), on MySQL a string
// key's character set and collation (left empty when not found) and
// whether the server takes Target.Bound (Target.ServerBound); nothing on
// SQLite. Target.Zone is cleared where the statements do not use it. Run
// it once, before Update, Upsert and Count.
func (d *Dialect) ColumnTypes(db *gorm.DB, t *Target) error {
	if !d.zones {
		t.Zone = ""
	}
	if d.columnTypes == nil {
		return nil
	}
	return d.columnTypes(db, t)
}

// DriverLocation is the location in which db's driver writes a time.Time
// into a naive column, where it converts it: MySQL's DSN loc (go-sql-driver
// converts every value to it; read from GORM's MySQL dialector,
// DSNConfig.Loc, by reflection, as the library imports no driver); nil
// elsewhere (pgx writes a time's own wall clock, SQLite keeps offsets) and
// when it cannot be read.
func (d *Dialect) DriverLocation(db *gorm.DB) *time.Location {
	if d.driverLocation == nil || db == nil {
		return nil
	}
	return d.driverLocation(db)
}

// Identity names the database server and the database db is connected
// to. PostgreSQL reads the cluster's system identifier where the role may
// (else the server's address and port), current_database() and
// current_schema(); MySQL server_uuid (MariaDB: server_id, hostname and
// port) and DATABASE(); SQLite the main file's path. The error is the
// database's.
func (d *Dialect) Identity(ctx context.Context, db *gorm.DB) (Identity, error) {
	return d.identity(ctx, db)
}
