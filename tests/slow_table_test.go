package tests

import (
	"context"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	gosqlite "github.com/glebarez/go-sqlite"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// A table whose every row update is slow: a trigger sleeps 3ms per row
// (PostgreSQL pg_sleep, MariaDB SLEEP; on SQLite a Go function the test
// registers with the driver), and the flush's statement bound is 1s, so a
// batch of more than 333 rows can never commit in time. And a table whose
// every UPDATE statement takes 1.5s whatever its size, under a lock TTL of
// 1s.

const (
	slowRow      = 3 * time.Millisecond
	slowBound    = time.Second
	slowUsers    = 3000
	slowAgain    = 500 // users touched again for the second flush
	slowMaxBatch = 250 // the largest size halving 1,000 gives under 334 rows (1000 / 2 / 2)
)

func init() {
	// A new SQLite connection gets the functions; no other test calls them.
	gosqlite.MustRegisterScalarFunction("lastseen_test_sleep_ms", 1, func(_ *gosqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		ms, _ := args[0].(int64)
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return nil, nil
	})
	// lastseen_test_sleep_once_ms(stamp, ms) sleeps ms the first time it
	// sees stamp: julianday('now'), which SQLite keeps the same for the
	// whole of one statement (its triggers included).
	var mu sync.Mutex
	var last float64
	gosqlite.MustRegisterScalarFunction("lastseen_test_sleep_once_ms", 2, func(_ *gosqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
		stamp, _ := args[0].(float64)
		ms, _ := args[1].(int64)
		mu.Lock()
		first := stamp != last
		last = stamp
		mu.Unlock()
		if first {
			time.Sleep(time.Duration(ms) * time.Millisecond)
		}
		return nil, nil
	})
}

// slowRowUpdates makes every row update of users sleep slowRow, by a
// trigger.
func slowRowUpdates(t *testing.T, db *gorm.DB, dialect string) {
	t.Helper()
	ms := slowRow.Milliseconds()
	switch dialect {
	case "sqlite":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER slow_row BEFORE UPDATE ON users BEGIN SELECT lastseen_test_sleep_ms(%d); END`, ms)).Error)
	case "postgres":
		must(t, db.Exec(fmt.Sprintf(`CREATE FUNCTION slow_row() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NEW; END $$ LANGUAGE plpgsql`,
			slowRow.Seconds())).Error)
		must(t, db.Exec(`CREATE TRIGGER slow_row BEFORE UPDATE ON users FOR EACH ROW EXECUTE FUNCTION slow_row()`).Error)
	case "mysql":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER slow_row BEFORE UPDATE ON users FOR EACH ROW DO SLEEP(%g)`, slowRow.Seconds())).Error)
	default:
		t.Fatalf("no slow trigger for %s", dialect)
	}
}

// slowStatements makes every UPDATE statement on users take d once,
// whatever its rows: a statement-level trigger on PostgreSQL; on MariaDB
// and SQLite, whose triggers run per row, a row trigger that sleeps for
// the first row of each statement (NOW(6) and julianday('now') hold the
// statement's start in a trigger).
func slowStatements(t *testing.T, db *gorm.DB, dialect string, d time.Duration) {
	t.Helper()
	switch dialect {
	case "sqlite":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER slow_statement BEFORE UPDATE ON users BEGIN
SELECT lastseen_test_sleep_once_ms(julianday('now'), %d); END`, d.Milliseconds())).Error)
	case "postgres":
		must(t, db.Exec(fmt.Sprintf(`CREATE FUNCTION slow_statement() RETURNS trigger AS $$ BEGIN PERFORM pg_sleep(%g); RETURN NULL; END $$ LANGUAGE plpgsql`,
			d.Seconds())).Error)
		must(t, db.Exec(`CREATE TRIGGER slow_statement BEFORE UPDATE ON users FOR EACH STATEMENT EXECUTE FUNCTION slow_statement()`).Error)
	case "mysql":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER slow_statement BEFORE UPDATE ON users FOR EACH ROW
IF @slow_statement IS NULL OR @slow_statement <> NOW(6) THEN SET @slow_statement = NOW(6); DO SLEEP(%g); END IF`, d.Seconds())).Error)
	default:
		t.Fatalf("no slow trigger for %s", dialect)
	}
}

// updateLog records the UPDATE statements a handle runs: the entries of
// each (its bound values, an id and a time per entry), the rows of each
// that committed, and how many failed.
type updateLog struct {
	mu        sync.Mutex
	attempted []int   // entries of each statement, in order
	committed []int64 // rows updated by each committed statement, in order
	failed    int
}

func logUpdates(t *testing.T, db *gorm.DB) *updateLog {
	l := &updateLog{}
	must(t, db.Callback().Raw().After("gorm:raw").Register("test:log_update", func(tx *gorm.DB) {
		if !hasVerb(tx.Statement.SQL.String(), "UPDATE") {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		l.attempted = append(l.attempted, statementEntries(tx.Statement.Vars))
		if tx.Error != nil {
			l.failed++
		} else {
			l.committed = append(l.committed, tx.Statement.RowsAffected)
		}
	}))
	return l
}

// statementEntries is the number of entries of a flush's UPDATE from its
// bound values: one id and one time per entry, or on PostgreSQL an array
// of the ids ("{1,2,3}") and one of the times.
func statementEntries(vars []any) int {
	if len(vars) == 2 {
		if ids, ok := vars[0].(string); ok && strings.HasPrefix(ids, "{") {
			return strings.Count(ids, ",") + 1
		}
	}
	return len(vars) / 2
}

// take returns what was logged since the last take.
func (l *updateLog) take() (attempted []int, committed []int64, failed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	attempted, committed, failed = l.attempted, l.committed, l.failed
	l.attempted, l.committed, l.failed = nil, nil, 0
	return attempted, committed, failed
}

// checkStatements checks the committed statements of one flush: as many
// as the flush's Batches, none larger than slowMaxBatch (a batch of 334
// rows or more takes at least 1.002s: it never commits), and want rows in
// all (each row written once: a statement past the bound committed
// nothing).
func checkStatements(t *testing.T, what string, committed []int64, batches int, want int64) {
	t.Helper()
	equal(t, what+": committed statements", len(committed), batches)
	var sum, largest int64
	for _, n := range committed {
		sum, largest = sum+n, max(largest, n)
	}
	equal(t, what+": rows of the committed statements", sum, want)
	if largest > slowMaxBatch {
		t.Errorf("%s: a statement of %d rows committed, want at most %d", what, largest, slowMaxBatch)
	}
}

// TestSlowTableFlushMakesProgress: 3,000 users pending in one shard, every
// row update 3ms, the statement bound 1s. Before, every flush ran the same
// batch of 1,000 into the bound and wrote nothing (8 flushes, 0 of 3,000).
// Now the first flush halves a batch that runs past the bound until it
// commits (1,000 and 500 always time out) and keeps the smaller size for
// the rest of the flush: all 3,000 written by that one flush, exact values,
// exact Stats; its first statements hold 1,000, 500 and 250 entries. The
// next flush starts at the size learned: its first statement is no larger
// than 250 entries, and it writes 500 new touches. On MariaDB the server
// itself stops each statement at the bound (SET STATEMENT
// max_statement_time) and rolls it back; before, its driver gave up by
// closing the connection while the server ran on, and the statement could
// still commit.
func TestSlowTableFlushMakesProgress(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			cfg := faultFlushConfig(h)
			cfg.Flush.BatchSize = 1000
			testenv.Seam(&cfg).StatementTimeout = slowBound
			p, db := h.plugin(cfg)
			want := seedFaultUsers(t, db, slowUsers)
			slowRowUpdates(t, db, h.dialect)
			updates := logUpdates(t, db)
			ctx := context.Background()

			touchFaultUsers(t, p, slowUsers, "2026-03-01T09:00:00Z", want)
			res, err := p.Flush(ctx)
			must(t, err)
			attempted, committed, failed := updates.take()
			t.Logf("flush 1: %d statements committed, %d past the bound, took %v", len(committed), failed, res.Duration)
			if len(attempted) < 3 {
				t.Fatalf("flush 1 ran %d statements, want at least 3", len(attempted))
			}
			equal(t, "the first 3 statements' entries", fmt.Sprint(attempted[:3]), "[1000 500 250]")
			equal(t, "drained", res.Drained, slowUsers)
			equal(t, "written", res.Written, slowUsers)
			equal(t, "stale, unknown, failed, dropped", [4]int{res.Stale, res.Unknown, res.Failed, res.Dropped}, [4]int{})
			checkStatements(t, "flush 1", committed, res.Batches, slowUsers)
			checkFaultColumns(t, db, "after one flush", want)
			st := p.Stats()
			equal(t, "Stats", [8]int64{st.Flushes, st.FlushErrors, st.Drained, st.RowsWritten, st.Stale, st.Unknown, st.Failed, st.Dropped},
				[8]int64{1, 0, slowUsers, slowUsers, 0, 0, 0, 0})
			equal(t, "buffer left", len(h.pendingKeys()), 0)

			h.expireThrottle(time.Hour)
			touchFaultUsers(t, p, slowAgain, "2026-03-01T10:00:00Z", want)
			res, err = p.Flush(ctx)
			must(t, err)
			attempted, committed, failed = updates.take()
			t.Logf("flush 2: %d statements committed, %d past the bound, took %v", len(committed), failed, res.Duration)
			if len(attempted) == 0 || attempted[0] > slowMaxBatch {
				t.Errorf("flush 2's statements: %v entries, want the first at most %d (the size flush 1 learned)", attempted, slowMaxBatch)
			}
			equal(t, "written by flush 2", res.Written, slowAgain)
			checkStatements(t, "flush 2", committed, res.Batches, slowAgain)
			checkFaultColumns(t, db, "after two flushes", want)
			st = p.Stats()
			equal(t, "Stats after 2", [4]int64{st.Flushes, st.FlushErrors, st.Drained, st.RowsWritten}, [4]int64{2, 0, slowUsers + slowAgain, slowUsers + slowAgain})
		})
	}
}

// TestLockTTLDoesNotBoundStatements: every UPDATE statement on users takes
// 1.5s whatever its size, the shard lock's TTL is 1s (in a real Redis,
// where it expires on the real clock) and 2,000 users are pending in one
// shard, batches of 1,000. Before, the statement bound was two thirds of
// the TTL (666ms): every statement, however small, ran past it and no user
// was ever written (0 of 2,000 after 4 flushes). Now the bound stays 20s
// while the lock's keeper refreshes the lock: one flush writes all 2,000
// in 2 statements of 1,000, none timed out, and the lock was refreshed
// while they ran.
func TestLockTTLDoesNotBoundStatements(t *testing.T) {
	const users, statement = 2000, 1500 * time.Millisecond
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.RedisServer())
			cfg := h.config()
			cfg.Buffer.Shards, cfg.Flush.BatchSize = 1, 1000
			testenv.Seam(&cfg).LockTTL = time.Second
			p, db := h.plugin(cfg)
			want := seedFaultUsers(t, db, users)
			slowStatements(t, db, h.dialect, statement)
			updates := logUpdates(t, db)
			var refreshes refreshCounter
			setHooks(p, refreshes.hooks())
			touchFaultUsers(t, p, users, "2026-03-01T09:00:00Z", want)

			// Bounded, so that the code before (every statement past its
			// bound, halved down to single rows) gives up in reasonable time.
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			res, err := p.Flush(ctx)
			must(t, err)
			attempted, committed, failed := updates.take()
			t.Logf("flush: %d statements, %d past the bound, %d lock refreshes, took %v", len(attempted), failed,
				refreshes.get(shardKeys(p, 0).Lock), res.Duration)
			equal(t, "statements' entries", fmt.Sprint(attempted), "[1000 1000]")
			equal(t, "statements past the bound", failed, 0)
			equal(t, "rows of the statements", fmt.Sprint(committed), "[1000 1000]")
			equal(t, "drained, written, batches", [3]int{res.Drained, res.Written, res.Batches}, [3]int{users, users, 2})
			equal(t, "stale, unknown, failed, dropped", [4]int{res.Stale, res.Unknown, res.Failed, res.Dropped}, [4]int{})
			if n := refreshes.get(shardKeys(p, 0).Lock); n < 2 { // each statement outlives the TTL
				t.Errorf("shard lock refreshed %d times, want at least 2", n)
			}
			checkFaultColumns(t, db, "after one flush", want)
			st := p.Stats()
			equal(t, "Stats", [4]int64{st.Flushes, st.FlushErrors, st.Drained, st.RowsWritten}, [4]int64{1, 0, users, users})
			equal(t, "buffer left", len(h.pendingKeys()), 0)
		})
	}
}
