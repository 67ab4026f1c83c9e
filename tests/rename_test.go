package tests

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// Renames: an app that changes a user's primary key (a username key
// renamed in settings) calls Plugin.Rename, and the timestamp buffered
// under the old key reaches the row under the new one.

// renameRow changes a member's key in the database, as the app does.
func renameRow(t testing.TB, db *gorm.DB, from, to string) {
	t.Helper()
	must(t, db.Exec("UPDATE members SET id = ? WHERE id = ?", to, from).Error)
}

// memberColumn is a member's last_seen_at as UTC text ("" for NULL,
// "missing" without a row).
func memberColumn(t testing.TB, db *gorm.DB, id string) string {
	t.Helper()
	return lastSeenColumn(t, db, "members", "id", "last_seen_at", id)
}

// renameSetup opens a plugin on Member (string keys) with one shard, and
// members alice, bob and erin.
func renameSetup(t *testing.T, h *harness) (*lastseen.Plugin, *gorm.DB) {
	t.Helper()
	cfg := h.config()
	cfg.Model, cfg.Buffer.Shards = &Member{}, 1
	p, db := h.plugin(cfg)
	must(t, db.AutoMigrate(&Member{}))
	must(t, db.Create(&[]Member{{ID: "alice"}, {ID: "bob"}, {ID: "erin"}}).Error)
	return p, db
}

// TestRenameMovesBufferedActivity, on every dialect and buffer: alice is
// touched at 09:20, renamed to alicia (the app renames her row too): the
// flush writes 09:20 to alicia's row; alice's own entry stays and finds no
// row (Unknown). bob (09:10) renamed to
// carol, who has a newer pending touch of her own (09:25; the app had
// deleted that user): carol keeps 09:25, newest wins. Renaming an id to
// itself or one with nothing buffered does nothing; an invalid id is
// refused naming it, and nothing moves. Without Rename, erin's row renamed
// to erika: the flush counts erin's touch Unknown and erika stays NULL.
// The flush: drained 5, written 2 (alicia, carol), unknown 3 (alice, bob,
// erin).
func TestRenameMovesBufferedActivity(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		p, db := renameSetup(t, h)
		touch := func(id, at string) {
			t.Helper()
			ok, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
			equal(t, "touch "+id+" recorded", ok, true)
		}
		touch("alice", "2026-03-01T09:20:00Z")
		touch("bob", "2026-03-01T09:10:00Z")
		touch("carol", "2026-03-01T09:25:00Z")
		touch("erin", "2026-03-01T09:05:00Z")

		must(t, p.Rename(ctx, "alice", "alicia"))
		renameRow(t, db, "alice", "alicia")
		must(t, p.Rename(ctx, "bob", "carol"))
		renameRow(t, db, "bob", "carol")
		must(t, p.Rename(ctx, "carol", "carol")) // itself
		must(t, p.Rename(ctx, "zoe", "zora"))    // nothing buffered
		err := p.Rename(ctx, "erin", "")
		if !errors.Is(err, lastseen.ErrInvalidUserID) {
			t.Fatalf("rename to an empty id: %v, want ErrInvalidUserID", err)
		}
		equal(t, "error", err.Error(), "lastseen: rename: newID: lastseen: invalid user id: empty string")
		err = p.Rename(ctx, 3.5, "erin")
		if !errors.Is(err, lastseen.ErrInvalidUserID) || !strings.HasPrefix(err.Error(), "lastseen: rename: oldID: ") {
			t.Fatalf("rename from a float id: %v, want ErrInvalidUserID naming oldID", err)
		}
		for id, want := range map[string]string{"alice": "2026-03-01T09:20:00Z", "alicia": "2026-03-01T09:20:00Z", "bob": "2026-03-01T09:10:00Z",
			"carol": "2026-03-01T09:25:00Z", "erin": "2026-03-01T09:05:00Z", "zoe": "", "zora": ""} {
			equal(t, "pending "+id, pendingOf(t, p, id), want)
		}
		renameRow(t, db, "erin", "erika") // without Rename

		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained, written, unknown, stale", [4]int{res.Drained, res.Written, res.Unknown, res.Stale}, [4]int{5, 2, 3, 0})
		for id, want := range map[string]string{"alicia": "2026-03-01T09:20:00Z", "carol": "2026-03-01T09:25:00Z",
			"erika": "", "alice": "missing", "bob": "missing", "erin": "missing"} {
			equal(t, "column "+id, memberColumn(t, db, id), want)
		}
		equal(t, "buffers left", len(h.pendingKeys()), 0)
	})
}

// pendingOf is a string-keyed user's buffered timestamp, "" for none.
func pendingOf(t testing.TB, p *lastseen.Plugin, id string) string {
	t.Helper()
	at, ok, err := p.Pending(context.Background(), id)
	must(t, err)
	if !ok {
		return ""
	}
	return at.Format(time.RFC3339)
}

// TestRenameRacingAFlush, on every buffer: a flush stopped by its hooks
// while the app renames alice to alicia (Rename, then the row).
//   - Between the swap and the write (AfterSwap), or after the flush read
//     alice's entry, before its statement (BeforeWrite): the flush writes
//     alice's key, which no longer has a row (Unknown 1), and bob and erin;
//     the next flush writes alicia's copy.
//
// Either way alicia's row ends with alice's timestamp and nothing is left.
func TestRenameRacingAFlush(t *testing.T) {
	for _, point := range []string{"AfterSwap", "BeforeWrite"} {
		t.Run(point, func(t *testing.T) {
			for _, r := range allBuffers() {
				t.Run(r.Name, func(t *testing.T) {
					h := newHarness(t, testenv.SQLite(), r)
					ctx := context.Background()
					p, db := renameSetup(t, h)
					for id, at := range map[string]string{"alice": "2026-03-01T09:20:00Z", "bob": "2026-03-01T09:21:00Z", "erin": "2026-03-01T09:22:00Z"} {
						_, err := p.TouchAt(ctx, id, mustTime(at))
						must(t, err)
					}
					renamed := 0
					rename := func() {
						renamed++
						if err := p.Rename(ctx, "alice", "alicia"); err != nil {
							t.Errorf("rename during the flush: %v", err)
						}
						renameRow(t, db, "alice", "alicia")
					}
					hooks := &flushHooks{}
					if point == "AfterSwap" {
						hooks.AfterSwap = func(int) { rename() }
					} else {
						hooks.BeforeWrite = func(fields []string) {
							if renamed == 0 && slices.Contains(fields, "alice") {
								rename()
							}
						}
					}
					setHooks(p, hooks)
					res, err := p.Flush(ctx)
					must(t, err)
					setHooks(p, nil)
					equal(t, "renamed during the flush", renamed, 1)
					equal(t, "flush 1: drained, written, unknown", [3]int{res.Drained, res.Written, res.Unknown}, [3]int{3, 2, 1})
					equal(t, "alicia pending after flush 1", pendingOf(t, p, "alicia"), "2026-03-01T09:20:00Z")
					equal(t, "alice pending after flush 1", pendingOf(t, p, "alice"), "")
					res, err = p.Flush(ctx)
					must(t, err)
					equal(t, "flush 2: drained, written, unknown", [3]int{res.Drained, res.Written, res.Unknown}, [3]int{1, 1, 0})
					for id, want := range map[string]string{"alicia": "2026-03-01T09:20:00Z", "bob": "2026-03-01T09:21:00Z",
						"erin": "2026-03-01T09:22:00Z", "alice": "missing"} {
						equal(t, "column "+id, memberColumn(t, db, id), want)
					}
					equal(t, "buffers left", len(h.pendingKeys()), 0)
				})
			}
		})
	}
}

// TestRenameMovesTheBacklog: with Redis, a touch kept in the in-process
// backlog (Redis did not answer) is copied too: alicia gets alice's backlog
// entry, alice keeps hers, and the next flush replays both and writes
// alicia's (alice's finds no row: Unknown).
func TestRenameMovesTheBacklog(t *testing.T) {
	for _, r := range testenv.RedisKinds() {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			ctx := context.Background()
			p, db := renameSetup(t, h)
			at := mustTime("2026-03-01T09:20:00Z")
			must(t, buf(p).PutBacklog(ctx, "alice", at))
			must(t, p.Rename(ctx, "alice", "alicia"))
			_, inOld := buf(p).Backlog("alice")
			ts, inNew := buf(p).Backlog("alicia")
			equal(t, "backlog: alice, alicia", [2]bool{inOld, inNew}, [2]bool{true, true})
			equal(t, "alicia's backlog entry", time.UnixMicro(ts).UTC(), at)
			renameRow(t, db, "alice", "alicia")
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "written, unknown", [2]int{res.Written, res.Unknown}, [2]int{1, 1})
			equal(t, "column alicia", memberColumn(t, db, "alicia"), "2026-03-01T09:20:00Z")
		})
	}
}

// TestRenameSurvivesAFlushBeforeTheRowIsRenamed, on every buffer: the app
// calls Rename(alice, alicia) before its own UPDATE of the key commits,
// and a flush runs between the two (any instance's scheduled flush may).
// The flush finds no row alicia yet and writes alice's row instead, which
// the app's UPDATE then carries to alicia: the row ends at 09:20. The
// flush after the UPDATE has nothing of value left: the copy under alicia
// is not newer, the one under alice has no row. Before, Rename moved the
// timestamp away from alice: the flush between counted alicia Unknown
// (drained 1, written 0), and alicia's row stayed NULL: the touch was lost.
func TestRenameSurvivesAFlushBeforeTheRowIsRenamed(t *testing.T) {
	for _, r := range allBuffers() {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			ctx := context.Background()
			p, db := renameSetup(t, h)
			_, err := p.TouchAt(ctx, "alice", mustTime("2026-03-01T09:20:00Z"))
			must(t, err)
			must(t, p.Rename(ctx, "alice", "alicia"))
			res, err := p.Flush(ctx) // before the app's UPDATE
			must(t, err)
			equal(t, "flush 1: drained, written, unknown", [3]int{res.Drained, res.Written, res.Unknown}, [3]int{2, 1, 1})
			equal(t, "column alice after flush 1", memberColumn(t, db, "alice"), "2026-03-01T09:20:00Z")
			renameRow(t, db, "alice", "alicia")
			res, err = p.Flush(ctx)
			must(t, err)
			equal(t, "flush 2: drained", res.Drained, 0)
			equal(t, "column alicia", memberColumn(t, db, "alicia"), "2026-03-01T09:20:00Z")
			equal(t, "column alice", memberColumn(t, db, "alice"), "missing")
			equal(t, "buffers left", len(h.pendingKeys()), 0)
		})
	}
}
