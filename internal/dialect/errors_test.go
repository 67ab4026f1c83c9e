package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
)

// driverMySQLError has the shape of go-sql-driver/mysql's *MySQLError.
type driverMySQLError struct {
	Number  uint16
	Message string
}

func (e *driverMySQLError) Error() string { return fmt.Sprintf("Error %d: %s", e.Number, e.Message) }

// driverPgError has the method pgx's *pgconn.PgError and lib/pq's *pq.Error share.
type driverPgError struct{ code string }

func (e *driverPgError) Error() string    { return "ERROR: (SQLSTATE " + e.code + ")" }
func (e *driverPgError) SQLState() string { return e.code }

// driverSQLiteError has the method of modernc.org/sqlite's *Error.
type driverSQLiteError struct{ code int }

func (e *driverSQLiteError) Error() string { return fmt.Sprintf("sqlite error (%d)", e.code) }
func (e *driverSQLiteError) Code() int     { return e.code }

func TestErrorKinds(t *testing.T) {
	for _, c := range []struct {
		dialect string
		err     error
		want    string
	}{
		{"mysql", &driverMySQLError{Number: 1062, Message: "Duplicate entry"}, "1062"},
		{"mysql", fmt.Errorf("flush: %w", &driverMySQLError{Number: 1290}), "1290"},
		{"mysql", errors.Join(errors.New("first"), fmt.Errorf("second: %w", &driverMySQLError{Number: 1213})), "1213"},
		{"mysql", &driverMySQLError{Number: 0, Message: "no number"}, ""},
		{"mysql", errors.New("Error 1290 (HY000): The MySQL server is running with the --read-only option"), "1290"},
		{"mysql", errors.New("Error 1213: Deadlock found when trying to get lock"), "1213"},
		{"mysql", errors.New("wrapped: Error 12345 (HY000): five digits"), "12345"},
		{"mysql", errors.New("Error 12: too short"), ""},
		{"mysql", errors.New("invalid connection"), ""},
		{"mysql", nil, ""},
		{"postgres", &driverPgError{"23505"}, "23505"},
		{"postgres", fmt.Errorf("flush: %w", &driverPgError{"25006"}), "25006"},
		{"postgres", errors.New("ERROR: duplicate key (SQLSTATE 23505)"), ""},
		{"postgres", nil, ""},
		{"sqlite", &driverSQLiteError{2067}, "19"}, // SQLITE_CONSTRAINT_UNIQUE
		{"sqlite", fmt.Errorf("flush: %w", &driverSQLiteError{8}), "8"},
		{"sqlite", errors.New("constraint failed: UNIQUE constraint failed: users.id (1555)"), "19"},
		{"sqlite", errors.New("disk I/O error (266)"), "10"},
		{"sqlite", errors.New("database is locked (5) (SQLITE_BUSY)"), ""},
		{"sqlite", errors.New("sql: connection is already closed"), ""},
		{"sqlite", nil, ""},
	} {
		if got := Lookup(c.dialect).ErrorKind(c.err); got != c.want {
			t.Errorf("%s ErrorKind(%v) = %q, want %q", c.dialect, c.err, got, c.want)
		}
	}
}

func TestRetryable(t *testing.T) {
	for _, c := range []struct {
		dialect string
		err     error
		want    bool
	}{
		{"postgres", &driverPgError{"40001"}, true},
		{"postgres", fmt.Errorf("wrapped: %w", &driverPgError{"40P01"}), true},
		{"postgres", &driverPgError{"55P03"}, false}, // lock_not_available
		{"postgres", errors.New("deadlock detected"), false},
		{"mysql", &driverMySQLError{Number: 1213}, true},
		{"mysql", &driverMySQLError{Number: 1205}, true},
		{"mysql", errors.New("Error 1213 (40001): Deadlock found"), true},
		{"mysql", &driverMySQLError{Number: 1062}, false},
		{"sqlite", errors.New("database is locked (5) (SQLITE_BUSY)"), true},
		{"sqlite", errors.New("sqlite: step: SQLITE_BUSY"), true},
		{"sqlite", errors.New("UNIQUE constraint failed: users.id (1555)"), false},
		{"postgres", nil, false},
		{"mysql", nil, false},
		{"sqlite", nil, false},
	} {
		if got := Lookup(c.dialect).Retryable(c.err); got != c.want {
			t.Errorf("%s Retryable(%v) = %v, want %v", c.dialect, c.err, got, c.want)
		}
	}
}

func TestExhausted(t *testing.T) {
	for dialect, kinds := range map[string]map[string]bool{
		"postgres": {"53100": true, "53200": true, "53300": true, "53400": true, "25006": false, "42501": false, "": false},
		"mysql":    {"1021": true, "1114": true, "1037": true, "1038": true, "1041": true, "3": true, "1062": false, "1290": false, "": false},
		"sqlite":   {"13": true, "7": true, "10": true, "8": false, "19": false, "1": false, "": false},
	} {
		for kind, want := range kinds {
			if got := Lookup(dialect).Exhausted(kind); got != want {
				t.Errorf("%s Exhausted(%q) = %v, want %v", dialect, kind, got, want)
			}
		}
	}
}

func TestTransient(t *testing.T) {
	opErr := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	for _, c := range []struct {
		dialect string
		err     error
		want    bool
	}{
		{"postgres", &driverPgError{"57P01"}, true}, // pg_terminate_backend
		{"postgres", fmt.Errorf("flush: %w", &driverPgError{"57P02"}), true},
		{"postgres", &driverPgError{"57P03"}, true},
		{"postgres", &driverPgError{"08006"}, true},
		{"postgres", &driverPgError{"08003"}, true},
		{"postgres", &driverPgError{"57014"}, false}, // query_canceled: a statement timeout
		{"postgres", &driverPgError{"23505"}, false},
		{"postgres", &driverPgError{"40001"}, false}, // retryable, not transient
		{"postgres", errors.New("conn closed"), true},
		{"mysql", &driverMySQLError{Number: 1927}, true},
		{"mysql", &driverMySQLError{Number: 1053}, true},
		{"mysql", &driverMySQLError{Number: 1317}, true},
		{"mysql", errors.New("Error 2013 (HY000): Lost connection to server during query"), true},
		{"mysql", errors.New("Error 2006: MySQL server has gone away"), true},
		{"mysql", fmt.Errorf("flush: %w", errors.New("invalid connection")), true},
		{"mysql", &driverMySQLError{Number: 1969}, false}, // max_statement_time: TimedOut
		{"mysql", &driverMySQLError{Number: 1062}, false},
		{"sqlite", &driverSQLiteError{5}, true},
		{"sqlite", &driverSQLiteError{262}, true}, // SQLITE_LOCKED_SHAREDCACHE
		{"sqlite", errors.New("database is locked (5) (SQLITE_BUSY)"), true},
		{"sqlite", &driverSQLiteError{19}, false},
		{"sqlite", &driverSQLiteError{8}, false},
	} {
		if got := Lookup(c.dialect).Transient(c.err); got != c.want {
			t.Errorf("%s Transient(%v) = %v, want %v", c.dialect, c.err, got, c.want)
		}
	}
	for _, name := range []string{"postgres", "mysql", "sqlite"} {
		d := Lookup(name)
		for _, c := range []struct {
			err  error
			want bool
		}{
			{driver.ErrBadConn, true},
			{fmt.Errorf("exec: %w", sql.ErrConnDone), true},
			{io.EOF, true},
			{io.ErrUnexpectedEOF, true},
			{fmt.Errorf("write: %w", opErr), true},
			{fmt.Errorf("write: %w", syscall.EPIPE), true},
			{context.DeadlineExceeded, false}, // a net.Error too: the bound's, not the connection's
			{fmt.Errorf("query: %w", context.Canceled), false},
			{errors.New("some other error"), false},
			{nil, false},
		} {
			if got := d.Transient(c.err); got != c.want {
				t.Errorf("%s Transient(%v) = %v, want %v", name, c.err, got, c.want)
			}
		}
	}
}

func TestTimedOut(t *testing.T) {
	for _, c := range []struct {
		dialect string
		err     error
		want    bool
	}{
		{"mysql", &driverMySQLError{Number: 1969}, true},
		{"mysql", errors.New("Error 1969 (70100): Query execution was interrupted (max_statement_time exceeded)"), true},
		{"mysql", &driverMySQLError{Number: 3024}, true},
		{"mysql", &driverMySQLError{Number: 1317}, false},
		{"mysql", nil, false},
		{"postgres", &driverPgError{"57014"}, false},
		{"sqlite", &driverSQLiteError{9}, false}, // SQLITE_INTERRUPT
	} {
		if got := Lookup(c.dialect).TimedOut(c.err); got != c.want {
			t.Errorf("%s TimedOut(%v) = %v, want %v", c.dialect, c.err, got, c.want)
		}
	}
}
