package tests

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// spacedUser lives in a table whose name needs quoting, with upper-case
// column names: every statement must quote them through GORM.
type spacedUser struct {
	UserID   int64      `gorm:"primaryKey;column:UserID;autoIncrement:false"`
	LastSeen *time.Time `gorm:"column:LastSeen"`
}

func (spacedUser) TableName() string { return "User Accounts" }

// TestQuotedTableName: flush (both write modes), the Unknown count and
// LastSeen work on a table named "User Accounts" with columns "UserID" and
// "LastSeen" (GORM would read a bare "User Accounts" as table User, alias
// Accounts).
func TestQuotedTableName(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, mode := range []bool{false, true} {
			t.Run(map[bool]string{false: "update", true: "upsert"}[mode], func(t *testing.T) {
				ctx := context.Background()
				h.prefix = randomName("ls")
				cfg := h.config()
				cfg.Model, cfg.Field, cfg.Flush.Upsert = &spacedUser{}, "LastSeen", mode
				p, db := h.plugin(cfg)
				must(t, db.Migrator().DropTable(&spacedUser{}))
				must(t, db.Migrator().CreateTable(&spacedUser{}))
				must(t, db.Create(&spacedUser{UserID: 1}).Error)
				for _, id := range []int64{1, 2} {
					_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
					must(t, err)
				}
				res, err := p.Flush(ctx)
				must(t, err)
				if !mode {
					equal(t, "written", res.Written, 1)
					equal(t, "unknown", res.Unknown, 1)
					equal(t, "stale", res.Stale, 0)
				} else {
					equal(t, "written", res.Written, 2)
				}
				at, ok, err := p.LastSeen(ctx, 1)
				must(t, err)
				equal(t, "last seen ok", ok, true)
				equal(t, "last seen", at.Format(time.RFC3339), "2026-03-01T10:00:00Z")
			})
		}
	})
}

// TestPostgresKeyCasts: on PostgreSQL the ids are not cast to the key
// column's width. An id longer than a varchar(8) key must not be truncated
// into another user's id, and an id too large for an integer key column
// matches no row instead of failing the statement.
func TestPostgresKeyCasts(t *testing.T) {
	type narrowString struct {
		ID         string `gorm:"primaryKey;size:8"`
		LastSeenAt *time.Time
	}
	type narrowInt struct {
		ID         int64 `gorm:"primaryKey;type:integer;autoIncrement:false"`
		LastSeenAt *time.Time
	}
	h := newHarness(t, servers.Postgres(), testenv.Miniredis())
	ctx := context.Background()
	at := mustTime("2026-03-01T10:00:00Z")

	cfg := h.config()
	cfg.Model = &narrowString{}
	p, db := h.plugin(cfg)
	must(t, db.Migrator().CreateTable(&narrowString{}))
	must(t, db.Create(&narrowString{ID: "aaaaaaaa"}).Error)
	_, err := p.TouchAt(ctx, strings.Repeat("a", 8)+"X", at)
	must(t, err)
	res, err := p.Flush(ctx)
	must(t, err)
	equal(t, "varchar: written", res.Written, 0)
	equal(t, "varchar: unknown", res.Unknown, 1)
	equal(t, "varchar: column of the 8-character user", lastSeenColumn(t, db, "narrow_strings", "id", "last_seen_at", "aaaaaaaa"), "")

	h.prefix = randomName("ls")
	cfg = h.config()
	cfg.Model = &narrowInt{}
	q, db2 := h.plugin(cfg)
	must(t, db2.Migrator().CreateTable(&narrowInt{}))
	must(t, db2.Create(&narrowInt{ID: 7}).Error)
	for _, id := range []int64{7, 3_000_000_000} {
		_, err := q.TouchAt(ctx, id, at)
		must(t, err)
	}
	res, err = q.Flush(ctx)
	must(t, err)
	equal(t, "integer: written", res.Written, 1)
	equal(t, "integer: unknown", res.Unknown, 1)
	equal(t, "integer: failed", res.Failed, 0)
	equal(t, "integer: user 7", lastSeenColumn(t, db2, "narrow_ints", "id", "last_seen_at", 7), "2026-03-01T10:00:00Z")
}

// TestStatementErrorKeepsBatch: an error no single row causes (here the
// last-seen column is missing from the table) fails the flush with the
// database's error and keeps every entry in Redis, instead of splitting the
// batch and refusing each entry alone; once the column exists, the next
// flush writes them.
func TestStatementErrorKeepsBatch(t *testing.T) {
	type Member struct {
		ID         int64 `gorm:"primaryKey;autoIncrement:false"`
		LastSeenAt *time.Time
	}
	type memberWithoutColumn struct {
		ID int64 `gorm:"primaryKey;autoIncrement:false"`
	}
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model = &Member{}
		p, db := h.plugin(cfg)
		must(t, db.Table("members").Migrator().CreateTable(&memberWithoutColumn{}))
		must(t, db.Exec("INSERT INTO members (id) VALUES (1), (2), (3)").Error)
		for id := 1; id <= 3; id++ {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		if err == nil {
			t.Fatal("flush into a table without the column returned no error")
		}
		equal(t, "refused entries", res.Failed, 0)
		equal(t, "written", res.Written, 0)
		for id := 1; id <= 3; id++ {
			at, ok, err := p.Pending(ctx, id)
			must(t, err)
			equal(t, "kept pending", ok, true)
			equal(t, "kept value", at.Format(time.RFC3339), "2026-03-01T10:00:00Z")
		}
		must(t, db.Migrator().AddColumn(&Member{}, "LastSeenAt"))
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after the fix", res.Written, 3)
		equal(t, "user 2", lastSeenColumn(t, db, "members", "id", "last_seen_at", 2), "2026-03-01T10:00:00Z")
	})
}

// TestLastSeenWhileRedisDown: with Redis unreachable LastSeen answers from
// the column (and the backlog) instead of failing.
func TestLastSeenWhileRedisDown(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	cfg := h.config()
	cfg.Buffer.TouchTimeout = 50 * time.Millisecond
	p, db := h.plugin(cfg)
	must(t, db.AutoMigrate(&lastseen.User{}))
	must(t, db.Create(&lastseen.User{ID: 5, LastSeenAt: ptr(mustTime("2026-03-01T08:00:00Z"))}).Error)
	must(t, db.Create(&lastseen.User{ID: 6, LastSeenAt: ptr(mustTime("2026-03-01T08:00:00Z"))}).Error)
	h.r.Mini.Close()
	if _, err := p.TouchAt(ctx, 6, mustTime("2026-03-01T09:00:00Z")); err == nil {
		t.Fatal("touch with Redis down returned no error")
	}
	for _, c := range []struct {
		id   int
		want string
	}{{5, "2026-03-01T08:00:00Z"}, {6, "2026-03-01T09:00:00Z"}} { // 6: from the backlog
		at, ok, err := p.LastSeen(ctx, c.id)
		must(t, err)
		equal(t, "ok", ok, true)
		equal(t, "last seen", at.Format(time.RFC3339), c.want)
	}
}
