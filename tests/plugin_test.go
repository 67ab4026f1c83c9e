package tests

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// TestTouchFlushRoundTrip is the main path: touches are throttled per user,
// a flush writes the newest timestamp per user in one batch, and Redis is
// left empty.
func TestTouchFlushRoundTrip(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&lastseen.User{}))
		must(t, db.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 3}}).Error)

		for _, step := range []struct {
			id       any
			at       string
			recorded bool
		}{
			{uint64(1), "2026-03-01T10:00:00Z", true},
			{1, "2026-03-01T10:00:10Z", false},   // same user, inside the window, int type
			{"1", "2026-03-01T10:00:20Z", false}, // same user as a string: Redis marker answers
			{int64(2), "2026-03-01T10:00:30Z", true},
		} {
			got, err := p.TouchAt(ctx, step.id, mustTime(step.at))
			must(t, err)
			equal(t, "recorded "+step.at, got, step.recorded)
		}
		at, ok, err := p.Pending(ctx, 1)
		must(t, err)
		equal(t, "pending ok", ok, true)
		equal(t, "pending(1)", at.Format(time.RFC3339), "2026-03-01T10:00:00Z")

		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained", res.Drained, 2)
		equal(t, "written", res.Written, 2)
		equal(t, "unknown", res.Unknown, 0)
		equal(t, "batches", res.Batches, 2) // users 1 and 2 fall in different shards
		equal(t, "user 1", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T10:00:00Z")
		equal(t, "user 2", lastSeenColumn(t, db, "users", "id", "last_seen_at", 2), "2026-03-01T10:00:30Z")
		equal(t, "user 3", lastSeenColumn(t, db, "users", "id", "last_seen_at", 3), "")
		equal(t, "redis buffers left", len(h.pendingKeys()), 0)

		s := p.Stats()
		equal(t, "stats touches", s.Touches, 4)
		equal(t, "stats recorded", s.Recorded, 2)
		equal(t, "stats throttled", s.Throttled, 2)
		equal(t, "stats cache hits", s.CacheHits, 1) // the int 1; "1" is another local key
		equal(t, "stats rows written", s.RowsWritten, 2)
		equal(t, "stats flushes", s.Flushes, 1)

		last, ok, err := p.LastSeen(ctx, uint(2))
		must(t, err)
		equal(t, "last seen ok", ok, true)
		equal(t, "last seen(2)", last.Format(time.RFC3339), "2026-03-01T10:00:30Z")
	})
}

// TestRequiredColumnsAndDeletedUsers: a users
// table with required columns and no defaults, and a user deleted before the
// flush. The flush must not fail, must not create a row, and counts the
// deleted user as unknown.
func TestRequiredColumnsAndDeletedUsers(t *testing.T) {
	type Account struct {
		ID        int64     `gorm:"primaryKey"`
		Email     string    `gorm:"not null;uniqueIndex;size:190"`
		Name      string    `gorm:"not null"`
		CreatedAt time.Time `gorm:"not null"`
		SeenAt    *time.Time
	}
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model = &Account{}
		cfg.Field = "seen_at" // by column name
		p, db := h.plugin(cfg)
		must(t, db.Migrator().CreateTable(&Account{}))
		now := mustTime("2026-03-01T09:00:00Z")
		must(t, db.Create(&[]Account{
			{ID: 1, Email: "a@example.test", Name: "A", CreatedAt: now},
			{ID: 2, Email: "b@example.test", Name: "B", CreatedAt: now},
			{ID: 3, Email: "c@example.test", Name: "C", CreatedAt: now},
		}).Error)

		for id, at := range map[int]string{1: "2026-03-01T10:00:00Z", 2: "2026-03-01T10:00:05Z", 3: "2026-03-01T10:00:07Z"} {
			ok, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
			equal(t, "recorded", ok, true)
		}
		must(t, db.Exec("DELETE FROM accounts WHERE id = ?", 2).Error)

		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 2)
		equal(t, "unknown", res.Unknown, 1)
		var ids []int64
		must(t, db.Table("accounts").Order("id").Pluck("id", &ids).Error)
		equal(t, "rows", len(ids), 2)
		equal(t, "row ids", ids[0]*10+ids[1], 13)
		equal(t, "seen_at 1", lastSeenColumn(t, db, "accounts", "id", "seen_at", 1), "2026-03-01T10:00:00Z")
		equal(t, "seen_at 2", lastSeenColumn(t, db, "accounts", "id", "seen_at", 2), "missing")
		equal(t, "seen_at 3", lastSeenColumn(t, db, "accounts", "id", "seen_at", 3), "2026-03-01T10:00:07Z")
		for _, id := range []int{1, 2, 3} {
			_, ok, err := p.Pending(ctx, id)
			must(t, err)
			equal(t, "pending left", ok, false)
		}
		equal(t, "redis buffers left", len(h.pendingKeys()), 0)
	})
}

// failWrites makes every statement on db fail while on is set, as when the
// database is unreachable.
func failWrites(t testing.TB, db *gorm.DB) (set func(bool)) {
	var mu sync.Mutex
	on := false
	fail := func(tx *gorm.DB) {
		mu.Lock()
		defer mu.Unlock()
		if on {
			tx.AddError(errors.New("injected: database unreachable"))
		}
	}
	must(t, db.Callback().Raw().Before("gorm:raw").Register("test:fail_raw", fail))
	must(t, db.Callback().Create().Before("gorm:create").Register("test:fail_create", fail))
	// The SELECT 1 probe (ping) runs through the row callbacks; the
	// migrators' own row queries are left alone (they read a nil *sql.Row).
	must(t, db.Callback().Row().Before("gorm:row").Register("test:fail_probe", func(tx *gorm.DB) {
		if strings.TrimSpace(tx.Statement.SQL.String()) == "SELECT 1" {
			fail(tx)
		}
	}))
	return func(v bool) {
		mu.Lock()
		defer mu.Unlock()
		on = v
	}
}

// TestNewestWinsAcrossFlushes: a failed flush
// leaves its in-flight entry, newer and older touches arrive meanwhile, and
// the next flush writes the newest; the column never moves backwards.
func TestNewestWinsAcrossFlushes(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "two instances share one Redis buffer")
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Minute
		h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
		p, db := h.plugin(cfg)
		other, _ := h.plugin(cfg) // the delayed request's instance
		must(t, db.AutoMigrate(&lastseen.User{}))
		must(t, db.Create(&lastseen.User{ID: 7, LastSeenAt: ptr(mustTime("2026-03-01T09:00:00Z"))}).Error)
		column := func() string { return lastSeenColumn(t, db, "users", "id", "last_seen_at", 7) }

		ok, err := p.TouchAt(ctx, 7, mustTime("2026-03-01T10:00:00Z"))
		must(t, err)
		equal(t, "step 1 recorded", ok, true)

		down := failWrites(t, db)
		down(true)
		res, err := p.Flush(ctx)
		if err == nil {
			t.Fatal("step 2: flush with the database down returned no error")
		}
		equal(t, "step 2 written", res.Written, 0)
		equal(t, "step 2 column", column(), "2026-03-01T09:00:00Z")
		equal(t, "step 2 in-flight kept", len(h.pendingKeys()), 1)

		h.expireThrottle(5 * time.Minute)
		ok, err = p.TouchAt(ctx, 7, mustTime("2026-03-01T10:05:00Z"))
		must(t, err)
		equal(t, "step 3 recorded", ok, true)

		h.expireThrottle(time.Minute)
		ok, err = other.TouchAt(ctx, 7, mustTime("2026-03-01T09:58:00Z"))
		must(t, err)
		equal(t, "step 4 recorded", ok, true)
		at, _, err := p.Pending(ctx, 7)
		must(t, err)
		equal(t, "step 4 pending", at.Format(time.RFC3339), "2026-03-01T10:05:00Z")
		at, _, err = p.LastSeen(ctx, 7)
		must(t, err)
		equal(t, "step 4 last seen", at.Format(time.RFC3339), "2026-03-01T10:05:00Z")
		equal(t, "step 4 column", column(), "2026-03-01T09:00:00Z")

		down(false)
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "step 5 drained", res.Drained, 2) // the old in-flight entry, then the new pending one
		equal(t, "step 5 column", column(), "2026-03-01T10:05:00Z")
		equal(t, "step 5 redis left", len(h.pendingKeys()), 0)
		_, ok, err = p.Pending(ctx, 7)
		must(t, err)
		equal(t, "step 5 pending", ok, false)
	})
}

func ptr[T any](v T) *T { return &v }
