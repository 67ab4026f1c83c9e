package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// TestFlushFullDiskKeepsEverything: a database that is out of space (here
// SQLite's max_page_count, SQLITE_FULL) still accepts a write that touches
// no row, so the probe-and-witness rule alone would take its refusals for
// rows refused on their own and MaxRefusals would drop them. A full disk is
// systemic wherever a write meets it: nothing is refused, counted or
// dropped, everything stays in Redis, and once there is room the next flush
// writes every value exactly.
func TestFlushFullDiskKeepsEverything(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.Shards = 1
	cfg.Flush.BatchSize = 100
	testenv.Seam(&cfg).MaxRefusals = 1 // the first refusal of an entry would drop it
	db := h.openDB()
	stmts := logStatements(db) // before db.Use: the plugin's handle shares this logger
	p := usePlugin(t, db, cfg)
	const users = 2000
	seedUsers(t, db, users)
	sqlDB, err := db.DB()
	must(t, err)
	sqlDB.SetMaxOpenConns(1) // max_page_count is a setting of the connection
	var pages int
	must(t, db.Raw("PRAGMA page_count").Scan(&pages).Error)
	must(t, db.Exec(fmt.Sprintf("PRAGMA max_page_count = %d", pages)).Error)

	want := map[string]string{}
	for id := 1; id <= users; id++ {
		at := mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id) * time.Second)
		_, err := p.TouchAt(ctx, id, at)
		must(t, err)
		want[fmt.Sprint(id)] = at.Format(time.RFC3339Nano)
	}
	stmts.count() // forget the seeding
	for round := 1; round <= 2; round++ {
		res, err := p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrSystemic) || !strings.Contains(err.Error(), "error kind 13: the server is out of a resource") {
			t.Fatalf("flush %d: %v, want ErrSystemic naming SQLITE_FULL (13)", round, err)
		}
		equal(t, fmt.Sprintf("flush %d: written", round), res.Written, 0)
		equal(t, fmt.Sprintf("flush %d: failed", round), res.Failed, 0)
		equal(t, fmt.Sprintf("flush %d: dropped", round), res.Dropped, 0)
		equal(t, fmt.Sprintf("flush %d: write statements", round), stmts.count("UPDATE", "INSERT", "DELETE"), 1)
	}
	equal(t, "Stats.Dropped", p.Stats().Dropped, 0)
	for _, id := range []int{1, 1000, users} {
		equal(t, fmt.Sprintf("user %d still pending", id), pendingValue(t, p, id), want[fmt.Sprint(id)][:len("2026-03-01T09:00:00")]+"Z")
	}

	must(t, db.Exec("PRAGMA max_page_count = 1073741823").Error) // room again
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "written once there is room", res.Written, users)
	got := columnsByID(t, db, "users", "id", "last_seen_at")
	for id, w := range want {
		if got[id] != w {
			t.Fatalf("user %s: column %q, want %q", id, got[id], w)
		}
	}
	equal(t, "buffers left", len(h.pendingKeys()), 0)
}
