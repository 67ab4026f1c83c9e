package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// A connection killed under a statement (pg_terminate_backend, MariaDB's
// KILL, from another connection, as a failover or a pooler restart does) is
// the connection's failure, never the refusal of a row the statement held:
// the batch is retried, then kept, and no entry is ever counted toward
// MaxRefusals or dropped.

// backendKiller kills the plugin's one connection (singleConnection) while
// it runs a statement that sleeps in a trigger: armed by the flush's or the
// purge's hook before such a statement, it reads the connection's id on the
// plugin's handle (the statement takes that connection next), waits until
// the server shows that connection sleeping, and ends it from the harness's
// own handle.
type backendKiller struct {
	t       *testing.T
	dialect string
	plugin  *gorm.DB // the plugin's handle, one connection
	admin   *gorm.DB // another handle to the same database

	mu      sync.Mutex
	enabled bool
	kills   int
	wg      sync.WaitGroup
}

// arm starts the kill of the connection the next statement runs on, when
// the killer is enabled.
func (k *backendKiller) arm() {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.enabled {
		return
	}
	idQuery, sleeping, kill := "SELECT pg_backend_pid()",
		"SELECT count(*) FROM pg_stat_activity WHERE pid = ? AND wait_event = 'PgSleep'", "SELECT pg_terminate_backend(?, 10000)"
	if k.dialect == "mysql" {
		idQuery, sleeping, kill = "SELECT CONNECTION_ID()",
			"SELECT count(*) FROM information_schema.PROCESSLIST WHERE ID = ? AND STATE = 'User sleep'", "KILL ?"
	}
	var id int64
	if err := k.plugin.Raw(idQuery).Scan(&id).Error; err != nil {
		k.t.Errorf("backend id: %v", err)
		return
	}
	k.kills++
	k.wg.Add(1)
	go func() {
		defer k.wg.Done()
		deadline := time.Now().Add(20 * time.Second) // only a broken test waits this long
		for n := int64(0); n == 0; {
			if err := k.admin.Raw(sleeping, id).Scan(&n).Error; err != nil {
				k.t.Errorf("watch backend %d: %v", id, err)
				return
			}
			if n == 0 && time.Now().After(deadline) {
				k.t.Errorf("backend %d never slept in the trigger", id)
				return
			}
		}
		if err := k.admin.Exec(kill, id).Error; err != nil {
			k.t.Errorf("kill backend %d: %v", id, err)
		}
	}()
}

// set enables or disables the killer, after the kills under way are done.
func (k *backendKiller) set(on bool) {
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	k.enabled = on
}

// killed returns the number of kills so far.
func (k *backendKiller) killed() int {
	k.wg.Wait()
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.kills
}

// sleepOnRow makes every write of the row whose key is id (an UPDATE on
// table, or a DELETE with del) sleep 30s in a trigger, which the killer
// cuts short; drop removes the trigger.
func sleepOnRow(t *testing.T, db *gorm.DB, dialect, table string, id any, del bool) (drop func()) {
	t.Helper()
	event, row := "UPDATE", "NEW"
	if del {
		event, row = "DELETE", "OLD"
	}
	key := fmt.Sprint(id)
	if _, isString := id.(string); isString {
		key = "'" + key + "'"
	}
	switch dialect {
	case "postgres":
		must(t, db.Exec(fmt.Sprintf(`CREATE FUNCTION sleep_on_row() RETURNS trigger AS $$
BEGIN IF %s.id = %s THEN PERFORM pg_sleep(30); END IF; RETURN %s; END $$ LANGUAGE plpgsql`, row, key, row)).Error)
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER sleep_on_row BEFORE %s ON %s FOR EACH ROW EXECUTE FUNCTION sleep_on_row()`, event, table)).Error)
		return func() {
			must(t, db.Exec("DROP TRIGGER sleep_on_row ON "+table).Error)
			must(t, db.Exec("DROP FUNCTION sleep_on_row()").Error)
		}
	case "mysql":
		must(t, db.Exec(fmt.Sprintf(`CREATE TRIGGER sleep_on_row BEFORE %s ON %s FOR EACH ROW
IF %s.id = %s THEN DO SLEEP(30); END IF`, event, table, row, key)).Error)
		return func() { must(t, db.Exec("DROP TRIGGER sleep_on_row").Error) }
	}
	t.Fatalf("no trigger for %s", dialect)
	return nil
}

// TestKilledConnectionIsNeverARefusal: user 7's row update sleeps in a
// trigger, and every statement writing it has its connection killed from
// another connection while it sleeps (the flush's hook arms the kill).
// MaxRefusals is 2 and MaxRetries 1: each of 3 flushes under the fault
// meets 2 kills (the statement and its retry), 6 in all, 3 times
// MaxRefusals; each returns the connection's error, with no entry Failed
// or Dropped, and user 7's refusal count stays 0. Before, the kill was
// counted as user 7's refusal (the probe or the isolated entry met it),
// and the second flush dropped user 7's timestamp. Once the database is
// steady (trigger gone, no more kills), one flush writes what is left:
// every user's exact timestamp, Stats.Failed and Stats.Dropped 0.
func TestKilledConnectionIsNeverARefusal(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db := h.openDB()
			singleConnection(t, db)
			want := seedFaultUsers(t, h.db, 10)
			steady := sleepOnRow(t, h.db, h.dialect, "users", 7, false)
			cfg := faultFlushConfig(h)
			testenv.Seam(&cfg).MaxRefusals, testenv.Seam(&cfg).MaxRetries = 2, 1
			p := usePlugin(t, db, cfg)
			touchFaultUsers(t, p, 10, "2026-03-01T10:00:00Z", want)
			k := &backendKiller{t: t, dialect: h.dialect, plugin: db, admin: h.db, enabled: true}
			setHooks(p, &flushHooks{BeforeWrite: func(fields []string) {
				if slices.Contains(fields, "7") {
					k.arm()
				}
			}})

			written := 0
			for flush := 1; flush <= 3; flush++ {
				res, err := p.Flush(ctx)
				if err == nil || errors.Is(err, lastseen.ErrRefused) {
					t.Errorf("flush %d under kills: %v, want the connection's error", flush, err)
				}
				t.Logf("flush %d: %v", flush, err)
				equal(t, fmt.Sprintf("flush %d: failed, dropped", flush), [2]int{res.Failed, res.Dropped}, [2]int{0, 0})
				equal(t, fmt.Sprintf("flush %d: user 7 refusals", flush), refusalCount(t, p, 7), 0)
				equal(t, fmt.Sprintf("flush %d: user 7 still buffered", flush), pendingValue(t, p, 7), want[7])
				equal(t, fmt.Sprintf("flush %d: kills so far", flush), k.killed(), 2*flush)
				written += res.Written
			}

			k.set(false)
			steady()
			res, err := p.Flush(ctx)
			must(t, err)
			written += res.Written
			equal(t, "written in all", written, 10)
			equal(t, "failed, dropped once steady", [2]int{res.Failed, res.Dropped}, [2]int{0, 0})
			checkFaultColumns(t, h.db, "once steady", want)
			st := p.Stats()
			equal(t, "Stats failed, dropped", [2]int64{st.Failed, st.Dropped}, [2]int64{0, 0})
			equal(t, "kills", k.killed(), 6)
			equal(t, "buffers left", len(h.pendingKeys()), 0)
		})
	}
}

// TestKilledConnectionIsNeverARefusedSession: the purge's counterpart.
// Deleting session s3 sleeps in a trigger and every delete holding it has
// its connection killed (the purge's hook arms the kill), MaxRetries 1:
// the purge stops with the connection's error after 2 kills, with no
// session Refused (before, the kill made s3 a refused session, passed
// over). Once steady, the next purge deletes all 5.
func TestKilledConnectionIsNeverARefusedSession(t *testing.T) {
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			db := h.openDB()
			singleConnection(t, db)
			var rows []lastseen.Session
			for i := 1; i <= 5; i++ {
				rows = append(rows, sess(fmt.Sprintf("s%d", i), "2026-03-01T08:00:00Z"))
			}
			rows = append(rows, sess("live", "2026-03-02T00:00:00Z"))
			seedSessions(t, h.db, rows...)
			steady := sleepOnRow(t, h.db, h.dialect, "sessions", "s3", true)
			cfg := purgeConfig(h, 10)
			testenv.Seam(&cfg).MaxRetries = 1
			p := usePlugin(t, db, cfg)
			k := &backendKiller{t: t, dialect: h.dialect, plugin: db, admin: h.db, enabled: true}
			setHooks(p, &flushHooks{BeforeDelete: func(ids []any) {
				if slices.Contains(ids, any("s3")) {
					k.arm()
				}
			}})

			res, err := p.PurgeExpiredSessions(ctx)
			if err == nil {
				t.Fatal("purge under kills succeeded")
			}
			t.Logf("purge: %v", err)
			equal(t, "refused", res.Refused, 0)
			equal(t, "stopped", res.Stopped, true)
			equal(t, "kills", k.killed(), 2)
			equal(t, "left", tableIDs(t, h.db, "sessions", "id"), "live,s1,s2,s3,s4,s5")

			k.set(false)
			steady()
			res, err = p.PurgeExpiredSessions(ctx)
			must(t, err)
			equal(t, "deleted once steady", res.Deleted, 5)
			equal(t, "left once steady", tableIDs(t, h.db, "sessions", "id"), "live")
			equal(t, "Stats.PurgeRefused", p.Stats().PurgeRefused, 0)
		})
	}
}

// TestSQLiteBusyIsNeverARefusal: the app holds SQLite's write lock (an
// open BEGIN IMMEDIATE on a connection of its own) through two flushes,
// each statement of which waits out the busy timeout (5s) and fails with
// SQLITE_BUSY. With MaxRefusals 1 and MaxRetries 1, neither flush counts
// a refusal or drops an entry: each returns the lock's error, 0 written,
// Failed 0, Dropped 0, every value still pending. Once the app commits,
// one flush writes all 4 users with their exact values.
func TestSQLiteBusyIsNeverARefusal(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	want := seedFaultUsers(t, h.db, 4)
	cfg := faultFlushConfig(h)
	testenv.Seam(&cfg).MaxRefusals, testenv.Seam(&cfg).MaxRetries = 1, 1
	p := usePlugin(t, h.openDB(), cfg)
	touchFaultUsers(t, p, 4, "2026-03-01T10:00:00Z", want)

	sqlDB, err := h.openDB().DB()
	must(t, err)
	conn, err := sqlDB.Conn(ctx)
	must(t, err)
	defer conn.Close()
	_, err = conn.ExecContext(ctx, "BEGIN IMMEDIATE")
	must(t, err)
	for flush := 1; flush <= 2; flush++ {
		res, err := p.Flush(ctx)
		if err == nil || errors.Is(err, lastseen.ErrRefused) || errors.Is(err, lastseen.ErrSystemic) {
			t.Errorf("flush %d under the app's write lock: %v, want the lock's error", flush, err)
		}
		equal(t, fmt.Sprintf("flush %d: written, failed, dropped", flush), [3]int{res.Written, res.Failed, res.Dropped}, [3]int{0, 0, 0})
		for id := 1; id <= 4; id++ {
			equal(t, fmt.Sprintf("flush %d: user %d pending", flush, id), pendingValue(t, p, id), want[id])
		}
	}
	_, err = conn.ExecContext(ctx, "COMMIT")
	must(t, err)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written once the lock is gone", res.Written, 4)
	checkFaultColumns(t, h.db, "once the lock is gone", want)
	st := p.Stats()
	equal(t, "Stats failed, dropped", [2]int64{st.Failed, st.Dropped}, [2]int64{0, 0})
}
