package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/lastseen/lastseen"
)

// protectSession makes the database refuse to delete session id: a row of
// another table referencing it with ON DELETE RESTRICT on PostgreSQL and
// MariaDB, a BEFORE DELETE trigger on SQLite (whose foreign keys are off
// unless the connection turns them on).
func protectSession(t *testing.T, h *harness, id string) {
	t.Helper()
	if h.dialect == "sqlite" {
		must(t, h.db.Exec(`CREATE TRIGGER protect_session BEFORE DELETE ON sessions
WHEN OLD.id = '`+id+`' BEGIN SELECT RAISE(ABORT, 'session `+id+` is protected'); END`).Error)
		return
	}
	must(t, h.db.Exec(`CREATE TABLE session_refs (id INT PRIMARY KEY, session_id VARCHAR(64) NOT NULL,
CONSTRAINT fk_session FOREIGN KEY (session_id) REFERENCES sessions (id) ON DELETE RESTRICT)`).Error)
	t.Cleanup(func() { h.db.Exec("DROP TABLE session_refs") })
	must(t, h.db.Exec("INSERT INTO session_refs (id, session_id) VALUES (1, ?)", id).Error)
}

// TestPurgePassesUndeletableSessions: 25 expired sessions, one of them
// (s07) referenced with ON DELETE RESTRICT (a trigger on SQLite), batches
// of 10: the purge isolates s07, deletes the other 24 and reports s07
// (Refused 1, FirstRefusal naming it, Stats.PurgeRefused); every later run
// deletes the sessions expired since and reports s07 again, never blocked.
func TestPurgePassesUndeletableSessions(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var rows []lastseen.Session
		for i := 1; i <= 25; i++ {
			rows = append(rows, sess(fmt.Sprintf("s%02d", i), "2026-03-01T08:00:00Z"))
		}
		rows = append(rows, sess("live", "2026-03-02T00:00:00Z"))
		seedSessions(t, h.db, rows...)
		protectSession(t, h, "s07")
		logs := &purgeLog{}
		cfg := purgeConfig(h, 10)
		cfg.Logger = logs.logger()
		p, db := h.plugin(cfg)

		res, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "deleted", res.Deleted, 24)
		equal(t, "refused", res.Refused, 1)
		equal(t, "stopped", res.Stopped, false)
		if res.FirstRefusal == nil || !strings.HasPrefix(res.FirstRefusal.Error(), "lastseen: session s07: ") {
			t.Fatalf("first refusal = %v, want one naming s07", res.FirstRefusal)
		}
		equal(t, "left", tableIDs(t, db, "sessions", "id"), "live,s07")
		var named int
		for _, l := range logs.lines(t) {
			if l["id"] == "s07" && strings.Contains(fmt.Sprint(l["msg"]), "refused to delete") {
				named++
			}
		}
		equal(t, "log lines naming s07", named, 1)

		for run := 2; run <= 3; run++ {
			var more []lastseen.Session
			for i := 1; i <= 5; i++ {
				more = append(more, sess(fmt.Sprintf("r%d_%d", run, i), "2026-03-01T09:00:00Z"))
			}
			must(t, db.Create(&more).Error)
			res, err = p.PurgeExpiredSessions(ctx)
			must(t, err)
			equal(t, fmt.Sprintf("run %d deleted", run), res.Deleted, 5)
			equal(t, fmt.Sprintf("run %d refused", run), res.Refused, 1)
			equal(t, fmt.Sprintf("run %d left", run), tableIDs(t, db, "sessions", "id"), "live,s07")
		}
		equal(t, "Stats.PurgeRefused", p.Stats().PurgeRefused, 3)
		equal(t, "Stats.SessionsDeleted", p.Stats().SessionsDeleted, 34)
	})
}

// TestPurgeSystemicRefusalStops: on a database that refuses every delete
// (read-only, permission denied) the purge stops after its first batch with
// ErrSystemic, having sent three DELETE statements (the batch, one session
// alone, a second one alone), deleted nothing and refused nothing; once
// deletes are accepted the next run deletes all 25.
func TestPurgeSystemicRefusalStops(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, kind := range refusingKinds(h.dialect) {
			t.Run(kind.name, func(t *testing.T) {
				ctx := context.Background()
				var rows []lastseen.Session
				for i := 1; i <= 25; i++ {
					rows = append(rows, sess(fmt.Sprintf("s%02d", i), "2026-03-01T08:00:00Z"))
				}
				seedSessions(t, h.db, rows...)
				t.Cleanup(func() { h.db.Exec("DROP TABLE sessions") })
				db, allow := kind.setup(t, h, "sessions")
				stmts := logStatements(db)
				cfg := purgeConfig(h, 10)
				cfg.Buffer.Prefix = randomName("ls")
				p := usePlugin(t, db, cfg)

				res, err := p.PurgeExpiredSessions(ctx)
				if !errors.Is(err, lastseen.ErrSystemic) || !strings.HasPrefix(err.Error(), "lastseen: purge batch 1: ") {
					t.Fatalf("purge: %v, want ErrSystemic in batch 1", err)
				}
				equal(t, "DELETE statements", stmts.count("DELETE"), 3)
				equal(t, "deleted", res.Deleted, 0)
				equal(t, "refused", res.Refused, 0)
				equal(t, "stopped", res.Stopped, true)
				equal(t, "sessions left", len(strings.Split(tableIDs(t, h.db, "sessions", "id"), ",")), 25)

				allow()
				res, err = p.PurgeExpiredSessions(ctx)
				must(t, err)
				equal(t, "deleted once accepted", res.Deleted, 25)
			})
		}
	})
}
