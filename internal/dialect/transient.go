package dialect

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
)

// transientError reports the errors of a connection that broke, whatever
// the driver: database/sql's and the drivers' sentinels, the socket's
// errors, and go-sql-driver/mysql's ErrInvalidConn, matched by its text
// ("invalid connection") so that the library imports no driver.
func transientError(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false // the caller's context or a time bound ended it (a DeadlineExceeded is a net.Error too)
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, sql.ErrConnDone),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EPIPE),
		errors.As(err, &ne):
		return true
	}
	return walkErrors(err, func(e error) bool { return e.Error() == "invalid connection" })
}

// postgresTransient: SQLSTATE class 08, connection exception (08000,
// 08003 connection_does_not_exist, 08006 connection_failure, ...), and of
// class 57, operator intervention, 57P01 admin_shutdown (what
// pg_terminate_backend and a smart or fast shutdown send), 57P02
// crash_shutdown and 57P03 cannot_connect_now (PostgreSQL manual,
// appendix A); pgx's "conn closed" for a connection it closed after one.
func postgresTransient(err error) bool {
	switch s := sqlState(err); {
	case strings.HasPrefix(s, "08"), s == "57P01", s == "57P02", s == "57P03":
		return true
	case s != "":
		return false
	}
	return walkErrors(err, func(e error) bool { return e.Error() == "conn closed" })
}

// mysqlTransient: the client errors 2006 CR_SERVER_GONE_ERROR and 2013
// CR_SERVER_LOST (in a server's or a proxy's error text), and the server
// errors 1053 ER_SERVER_SHUTDOWN, 1317 ER_QUERY_INTERRUPTED (KILL QUERY)
// and MariaDB's 1927 ER_CONNECTION_KILLED (KILL).
func mysqlTransient(err error) bool {
	switch mysqlErrorNumber(err) {
	case "2006", "2013", "1053", "1317", "1927":
		return true
	}
	return false
}

// mysqlTimedOut: 1969 ER_STATEMENT_TIMEOUT (MariaDB's max_statement_time)
// and 3024 ER_QUERY_TIMEOUT (MySQL's max_execution_time).
func mysqlTimedOut(err error) bool {
	switch mysqlErrorNumber(err) {
	case "1969", "3024":
		return true
	}
	return false
}

// sqliteTransient: the primary result codes SQLITE_BUSY (5: another
// connection holds the write lock past the busy timeout) and SQLITE_LOCKED
// (6: a table locked by the same connection's other statement), by the
// driver's code or its message.
func sqliteTransient(err error) bool {
	switch sqliteResultCode(err) {
	case "5", "6":
		return true
	}
	msg := err.Error()
	return strings.Contains(msg, "SQLITE_BUSY") || strings.Contains(msg, "database is locked") ||
		strings.Contains(msg, "SQLITE_LOCKED") || strings.Contains(msg, "database table is locked")
}
