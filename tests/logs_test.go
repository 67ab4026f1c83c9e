package tests

import (
	"context"
	"strings"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestFlushJobLogLines: a scheduled flush that finds nothing logs one Debug
// line, a flush that wrote rows one Info line with its counts; both carry
// the plugin, the tracked table and the Redis prefix.
func TestFlushJobLogLines(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	var out testenv.Logs
	cfg := h.config()
	cfg.Buffer.Shards = 2
	cfg.Logger = testenv.JSONLogger(&out)
	must(t, h.db.AutoMigrate(&lastseen.User{}, &lastseen.Session{})) // tables made after db.Use would be one warning each
	p, db := h.plugin(cfg)
	seedUsers(t, db, 2)
	equal(t, "lines from db.Use", out.Take(), "")

	flushJob(p, ctx)
	common := `"plugin":"lastseen:github.com/lastseen/lastseen.User.LastSeenAt","table":"users","prefix":"` + h.prefix + `",`
	equal(t, "empty flush", out.Take(), `{"level":"DEBUG","msg":"lastseen: flush: nothing pending",`+common+
		`"drained":0,"written":0,"unknown":0,"stale":0,"rejected":0,"failed":0,"batches":0,"shards":0,"skipped":0}`+"\n")

	for _, id := range []int{1, 2, 3} { // 3 is not in the table
		_, err := p.Touch(ctx, id)
		must(t, err)
	}
	flushJob(p, ctx)
	equal(t, "real flush", out.Take(), `{"level":"INFO","msg":"lastseen: flush",`+common+
		`"drained":3,"written":2,"unknown":1,"stale":0,"rejected":0,"failed":0,"batches":2,"shards":2,"skipped":0}`+"\n")
}

// TestPurgeJobLogLines: a purge that deletes nothing logs one Debug line, a
// real one an Info line with its counts, both with the tracked table,
// prefix and the sessions table.
func TestPurgeJobLogLines(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	var out testenv.Logs
	cfg := purgeConfig(h, 1000)
	cfg.Logger = testenv.JSONLogger(&out)
	must(t, h.db.AutoMigrate(&lastseen.User{}, &lastseen.Session{})) // tables made after db.Use would be one warning each
	p, db := h.plugin(cfg)
	seedSessions(t, db, sess("z", "2026-03-02T00:00:00Z"))
	equal(t, "lines from db.Use", out.Take(), "")

	purgeJob(p, ctx)
	common := `"plugin":"lastseen:github.com/lastseen/lastseen.User.LastSeenAt","table":"users","prefix":"` + h.prefix + `","session_table":"sessions",`
	equal(t, "empty purge", out.Take(), `{"level":"DEBUG","msg":"lastseen: purge: nothing expired",`+common+
		`"deleted":0,"batches":0,"retries":0,"cutoff":"2026-03-01T09:30:00Z","stopped":false}`+"\n")

	must(t, db.Create(&lastseen.Session{ID: "a", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:00:00Z")}).Error)
	purgeJob(p, ctx)
	got := out.Take()
	equal(t, "real purge", got, `{"level":"INFO","msg":"lastseen: purge",`+common+
		`"deleted":1,"batches":1,"retries":0,"cutoff":"2026-03-01T09:30:00Z","stopped":false}`+"\n")
	equal(t, "lines", strings.Count(got, "\n"), 1)
}
