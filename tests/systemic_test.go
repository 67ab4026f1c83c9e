package tests

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// statementLog is a GORM logger that records every statement a handle
// runs, failed ones included, once armed.
type statementLog struct {
	logger.Interface
	armed atomic.Bool
	mu    sync.Mutex
	sql   []string
}

func (l *statementLog) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	if !l.armed.Load() {
		return
	}
	sql, _ := fc()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sql = append(l.sql, sql)
}

// count returns how many statements start with one of the verbs (all of
// them without verbs) and forgets every statement recorded so far.
func (l *statementLog) count(verbs ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, s := range l.sql {
		match := len(verbs) == 0
		for _, v := range verbs {
			match = match || hasVerb(s, v)
		}
		if match {
			n++
		}
	}
	l.sql = nil
	return n
}

// logStatements records db's statements (and those of the plugin's handle
// derived from it) from now on.
func logStatements(db *gorm.DB) *statementLog {
	l := &statementLog{Interface: logger.Default.LogMode(logger.Silent)}
	db.Config.Logger = l
	l.armed.Store(true)
	return l
}

// refusingWrites is one way a database refuses every write: setup returns
// a handle for the plugin on h's database that refuses writes, and allow,
// which makes it accept them again.
type refusingWrites struct {
	name  string
	setup func(t *testing.T, h *harness, tables ...string) (db *gorm.DB, allow func())
}

// refusingKinds lists, per dialect, the refusals no row causes that the
// tests inject: a read-only session (PostgreSQL default_transaction_read_only,
// MySQL/MariaDB SET SESSION TRANSACTION READ ONLY, SQLite PRAGMA query_only)
// and, on the servers, a user with SELECT privileges only (permission
// denied; on MariaDB root ignores read_only, so a user of its own it is).
func refusingKinds(dialect string) []refusingWrites {
	readOnly := refusingWrites{name: "read-only", setup: func(t *testing.T, h *harness, _ ...string) (*gorm.DB, func()) {
		db := h.openDB()
		singleConnection(t, db) // the session setting holds for every statement of the plugin
		sw := map[string][2]string{
			"postgres": {"SET default_transaction_read_only = on", "SET default_transaction_read_only = off"},
			"mysql":    {"SET SESSION TRANSACTION READ ONLY", "SET SESSION TRANSACTION READ WRITE"},
			"sqlite":   {"PRAGMA query_only = 1", "PRAGMA query_only = 0"},
		}[dialect]
		on, off := sw[0], sw[1]
		must(t, db.Exec(on).Error)
		return db, func() { must(t, db.Exec(off).Error) }
	}}
	if dialect == "sqlite" {
		return []refusingWrites{readOnly}
	}
	denied := refusingWrites{name: "permission denied", setup: func(t *testing.T, h *harness, tables ...string) (*gorm.DB, func()) {
		return selectOnlyUser(t, h, tables)
	}}
	return []refusingWrites{readOnly, denied}
}

// selectOnlyUser creates a database user that may only read the tables,
// and returns a handle logged in as that user and allow, which grants it
// UPDATE and DELETE.
func selectOnlyUser(t *testing.T, h *harness, tables []string) (*gorm.DB, func()) {
	user := randomName("ls_ro_")
	var open gorm.Dialector
	var grant func(priv, table string) string
	switch h.dialect {
	case "postgres":
		var schema string
		must(t, h.db.Raw("SELECT current_schema()").Scan(&schema).Error)
		must(t, h.db.Exec("CREATE ROLE "+user+" LOGIN").Error)
		t.Cleanup(func() { h.db.Exec("DROP OWNED BY " + user); h.db.Exec("DROP ROLE " + user) })
		must(t, h.db.Exec("GRANT USAGE ON SCHEMA "+schema+" TO "+user).Error)
		grant = func(priv, table string) string {
			return "GRANT " + priv + " ON " + schema + "." + table + " TO " + user
		}
		open = postgres.Open(os.Getenv(testenv.EnvPostgres) + " user=" + user + " search_path=" + schema)
	case "mysql":
		var name string
		must(t, h.db.Raw("SELECT DATABASE()").Scan(&name).Error)
		must(t, h.db.Exec("CREATE USER '"+user+"'@'%'").Error)
		t.Cleanup(func() { h.db.Exec("DROP USER '" + user + "'@'%'") })
		grant = func(priv, table string) string {
			return "GRANT " + priv + " ON " + name + "." + table + " TO '" + user + "'@'%'"
		}
		dsn := os.Getenv(testenv.EnvMySQL)
		at, slash, q := strings.Index(dsn, "@"), strings.Index(dsn, "/"), strings.Index(dsn, "?")
		if q < 0 {
			q = len(dsn)
		}
		open = mysql.Open(user + dsn[at:slash+1] + name + dsn[q:])
	}
	for _, table := range tables {
		must(t, h.db.Exec(grant("SELECT", table)).Error)
	}
	db, err := gorm.Open(open, quietGorm())
	must(t, err)
	t.Cleanup(func() { testenv.CloseDB(db) })
	return db, func() {
		for _, table := range tables {
			must(t, h.db.Exec(grant("UPDATE, DELETE", table)).Error)
		}
	}
}

// TestFlushSystemicRefusalKeepsEverything: a database that refuses every
// write (read-only, permission denied) costs a flush three statements per
// shard (the batch, one entry alone, a write touching no row), two for a
// shard holding a single entry (the entry, then the write touching no row), logs
// nothing per entry, refuses no entry and keeps every entry in Redis with
// its exact value, flush after flush; the first flush after the database
// accepts writes again writes them all.
func TestFlushSystemicRefusalKeepsEverything(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, kind := range refusingKinds(h.dialect) {
			t.Run(kind.name, func(t *testing.T) {
				ctx := context.Background()
				before := seedFaultUsers(t, h.db, 40)
				t.Cleanup(func() { h.db.Exec("DROP TABLE users") })
				db, allow := kind.setup(t, h, "users")
				stmts := logStatements(db)
				logs := &purgeLog{}
				cfg := h.config()
				cfg.Buffer.Prefix = randomName("ls")
				cfg.Buffer.Shards, cfg.Flush.Concurrency, cfg.Flush.BatchSize = 4, 1, 5 // 40 users: 4 shards of 2+ batches
				cfg.Logger = logs.logger()
				cfg.Throttle = time.Minute
				p := usePlugin(t, db, cfg)
				want := map[int]string{}
				touchFaultUsers(t, p, 40, "2026-03-01T10:00:00Z", want)

				err := internals(p).WriteTarget(ctx) // PostgreSQL's one catalogue lookup, not a write
				must(t, err)
				for round := 1; round <= 2; round++ {
					stmts.count()
					res, err := p.Flush(ctx)
					if !errors.Is(err, lastseen.ErrSystemic) {
						t.Fatalf("flush %d: %v, want ErrSystemic", round, err)
					}
					equal(t, fmt.Sprintf("flush %d: shards", round), res.Shards, 4)
					equal(t, fmt.Sprintf("flush %d: write statements (3 per shard)", round), stmts.count("UPDATE", "INSERT", "DELETE"), 12)
					equal(t, fmt.Sprintf("flush %d: written", round), res.Written, 0)
					equal(t, fmt.Sprintf("flush %d: failed", round), res.Failed, 0)
					equal(t, fmt.Sprintf("flush %d: dropped", round), res.Dropped, 0)
				}
				equal(t, "log lines", len(logs.lines(t)), 0)
				for id := 1; id <= 40; id++ {
					equal(t, fmt.Sprintf("user %d kept in Redis", id), pendingValue(t, p, id), want[id])
				}
				checkFaultColumns(t, h.db, "while refused", before)

				allow()
				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, "written once writes are accepted", res.Written, 40)
				equal(t, "drained", res.Drained, 40)
				checkFaultColumns(t, h.db, "after", want)
				equal(t, "redis buffers left", len(bufferKeys(t, h, cfg.Buffer.Prefix)), 0)
			})
		}
	})
}

// TestFlushSystemicRefusalOneEntry: a shard holding one entry was its own
// probe; the write touching no row witnesses: two statements, ErrSystemic, the entry kept and never counted as refused.
func TestFlushSystemicRefusalOneEntry(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedFaultUsers(t, h.db, 1)
		db, allow := refusingKinds(h.dialect)[0].setup(t, h)
		stmts := logStatements(db)
		cfg := faultFlushConfig(h)
		testenv.Seam(&cfg).MaxRefusals = 1
		p := usePlugin(t, db, cfg)
		_, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T10:00:00Z"))
		must(t, err)
		err = internals(p).WriteTarget(ctx)
		must(t, err)
		stmts.count()
		for round := 1; round <= 2; round++ {
			res, err := p.Flush(ctx)
			if !errors.Is(err, lastseen.ErrSystemic) {
				t.Fatalf("flush %d: %v, want ErrSystemic", round, err)
			}
			equal(t, "write statements", stmts.count("UPDATE", "INSERT", "DELETE"), 2)
			equal(t, "failed", res.Failed, 0)
			equal(t, "dropped", res.Dropped, 0)
		}
		allow()
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 1)
		equal(t, "user 1", lastSeenColumn(t, h.db, "users", "id", "last_seen_at", 1), "2026-03-01T10:00:00Z")
	})
}

// bufferKeys lists the pending, in-flight and refusals hashes under prefix.
func bufferKeys(t *testing.T, h *harness, prefix string) []string {
	t.Helper()
	saved := h.prefix
	h.prefix = prefix
	defer func() { h.prefix = saved }()
	var out []string
	for _, k := range h.keys() {
		if strings.HasSuffix(k, ":pending") || strings.HasSuffix(k, ":inflight") || strings.HasSuffix(k, ":refusals") {
			out = append(out, k)
		}
	}
	return out
}
