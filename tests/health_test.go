package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

func indexNames(h lastseen.TableHealth) string {
	names := make([]string, len(h.Indexes))
	for i, x := range h.Indexes {
		names[i] = x.Name
	}
	return strings.Join(names, ",")
}

// TestTableHealthListsIndexesOnTheColumn: the default User table has no
// index on last_seen_at; an index on the column, alone or in a composite,
// is listed with the advice to drop it, and an index on other columns is
// not, on every dialect.
func TestTableHealthListsIndexesOnTheColumn(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		must(t, h.db.AutoMigrate(&lastseen.User{}))
		p, db := h.plugin(h.config())
		th, err := p.TableHealth(ctx)
		must(t, err)
		equal(t, "dialect", th.Dialect, h.dialect)
		equal(t, "table", th.Table+"."+th.Column, "users.last_seen_at")
		equal(t, "indexes of the default model", indexNames(th), "")
		equal(t, "advice of the default model", th.Advice[0], "ok: no index includes last_seen_at")

		must(t, db.Exec("CREATE INDEX idx_seen ON users (last_seen_at)").Error)
		must(t, db.Exec("CREATE INDEX idx_both ON users (id, last_seen_at)").Error)
		must(t, db.Exec("CREATE INDEX idx_other ON users (id)").Error)
		th, err = p.TableHealth(ctx)
		must(t, err)
		equal(t, "indexes", indexNames(th), "idx_both,idx_seen")
		want := "index idx_both, idx_seen includes last_seen_at: each row a flush writes also rewrites its entry there; " +
			"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)"
		if h.dialect == "postgres" {
			want = "index idx_both, idx_seen includes last_seen_at: every row a flush writes is a non-HOT update (0% HOT; measured: " +
				"0.74× the rate without the index); " +
				"drop it unless a frequent query needs it (who is online: Plugin.Online or an occasional SeenWithin scan)"
		}
		equal(t, "advice", th.Advice[0], want)
		equal(t, "HOT", th.HOT, h.dialect == "postgres")
	})
}

// TestTableHealthSessionModel: the default Session model has no index on
// last_active_at, so a plugin tracking the sessions' activity is advised
// nothing about indexes; on a table that has one (an earlier Session
// model declared it) the advice is to drop it and says that the idle rule
// does not need it, with the measured costs on PostgreSQL; on every dialect.
func TestTableHealthSessionModel(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		must(t, h.db.AutoMigrate(&lastseen.Session{}))
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.IdleTimeout = &lastseen.Session{}, "LastActiveAt", 30*time.Minute
		p, db := h.plugin(cfg)
		th, err := p.TableHealth(ctx)
		must(t, err)
		equal(t, "table", th.Table+"."+th.Column, "sessions.last_active_at")
		equal(t, "indexes of the default Session model", indexNames(th), "")
		want := []string{"ok: no index includes last_active_at"}
		if h.dialect == "postgres" {
			want = append(want, "fillfactor 100: consider ALTER TABLE sessions SET (fillfactor = 90) (applies to pages written afterwards; "+
				"VACUUM FULL rewrites all) so that updated rows find room on their page (measured: 74% HOT updates at fillfactor 90 against 57% at 100)")
		}
		equal(t, "advice of the default Session model", strings.Join(th.Advice, "\n"), strings.Join(want, "\n"))

		must(t, db.Exec("CREATE INDEX idx_sessions_last_active_at ON sessions (last_active_at)").Error)
		th, err = p.TableHealth(ctx)
		must(t, err)
		want[0] = "index idx_sessions_last_active_at includes last_active_at: each row a flush writes also rewrites its entry there; " +
			"drop it unless a frequent query needs it: the idle rule (Sessions.IdleTimeout) reads the column in primary-key order"
		if h.dialect == "postgres" {
			want[0] = "index idx_sessions_last_active_at includes last_active_at: every row a flush writes is a non-HOT update; " +
				"drop it unless a frequent query needs it: the idle rule (Sessions.IdleTimeout) does not (measured: the idle rule's purge " +
				"selected in 0.75s without it against 0.20s with it, while flushes ran at 0.45× the rate with it, 0% HOT against 94%)"
		}
		equal(t, "advice with the index", strings.Join(th.Advice, "\n"), strings.Join(want, "\n"))
	})
}

// TestTableHealthPostgresHOTShare: on PostgreSQL the HOT counters follow
// pg_stat_user_tables (updates of the indexed column are never HOT, of the
// unindexed one they are), expression and partial indexes on the column
// are listed, and the fillfactor comes from the table's reloptions.
func TestTableHealthPostgresHOTShare(t *testing.T) {
	h := newHarness(t, servers.Postgres(), testenv.Miniredis())
	ctx := context.Background()
	must(t, h.db.AutoMigrate(&lastseen.User{}))
	p, db := h.plugin(h.config())
	sqlDB, err := db.DB()
	must(t, err)
	sqlDB.SetMaxOpenConns(1) // one backend: its statistics are flushed below
	must(t, db.Exec("INSERT INTO users (id) VALUES (1), (2), (3), (4)").Error)
	update := func(ids string) {
		t.Helper()
		must(t, db.Exec("UPDATE users SET last_seen_at = now() WHERE id IN ("+ids+")").Error)
		must(t, db.Exec("SELECT pg_stat_force_next_flush()").Error)
	}
	must(t, db.Exec("CREATE INDEX idx_seen ON users (last_seen_at)").Error)
	update("1, 2")
	th, err := p.TableHealth(ctx)
	must(t, err)
	equal(t, "indexed: updates / HOT", fmt.Sprint(th.Updates, th.HOTUpdates, th.HOTShare()), "2 0 0")

	must(t, db.Exec("DROP INDEX idx_seen").Error)
	update("3, 4")
	th, err = p.TableHealth(ctx)
	must(t, err)
	equal(t, "unindexed: updates / HOT", fmt.Sprint(th.Updates, th.HOTUpdates, th.HOTShare()), "4 2 0.5")
	equal(t, "fillfactor default", th.FillFactor, 100)
	equal(t, "advice", strings.Join(th.Advice, "\n"),
		"ok: no index includes last_seen_at\nfillfactor 100: consider ALTER TABLE users SET (fillfactor = 90) (applies to pages written afterwards; VACUUM FULL rewrites all) "+
			"so that updated rows find room on their page (measured: 74% HOT updates at fillfactor 90 against 57% at 100)")

	must(t, db.Exec("ALTER TABLE users SET (fillfactor = 90)").Error)
	must(t, db.Exec("CREATE INDEX idx_expr ON users ((last_seen_at IS NULL))").Error)
	must(t, db.Exec("CREATE INDEX idx_part ON users (id) WHERE last_seen_at IS NOT NULL").Error)
	th, err = p.TableHealth(ctx)
	must(t, err)
	equal(t, "fillfactor", th.FillFactor, 90)
	equal(t, "expression and partial indexes", indexNames(th), "idx_expr,idx_part")
	equal(t, "partial index definition ends", strings.HasSuffix(th.Indexes[1].Definition, "users USING btree (id) WHERE (last_seen_at IS NOT NULL)"), true)
	equal(t, "advice count", len(th.Advice), 1)
}

// TestTableHealthBeforeUse: ErrNotInitialized before db.Use.
func TestTableHealthBeforeUse(t *testing.T) {
	_, err := lastseen.New(lastseen.Config{}).TableHealth(context.Background())
	equal(t, "err", err, lastseen.ErrNotInitialized)
}
