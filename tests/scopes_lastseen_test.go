package tests

import (
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

type appNote struct {
	ID        int64 `gorm:"primaryKey"`
	AccountID int64
	Seen      *time.Time `gorm:"column:seen"`
}

func (appNote) TableName() string { return "app_notes" }

// TestSeenWithin: the scope keeps rows whose last-seen column is at or after
// NowFunc() - d, on the configured column of an app model, on every dialect,
// exactly at the boundary, whatever the zone of NowFunc and of the stored
// values.
func TestSeenWithin(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		cfg := h.config()
		cfg.Model = &appAccount{}
		cfg.Field = "Seen"
		_, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&appAccount{}, &appNote{}))
		jst := time.FixedZone("JST", 9*3600)
		at := func(s string) *time.Time { return ptr(mustTime(s)) }
		must(t, db.Create(&[]appAccount{
			{ID: 1, Email: "1", Seen: at("2026-03-01T11:55:00Z")},     // the cutoff itself
			{ID: 2, Email: "2", Seen: at("2026-03-01T11:54:59.999Z")}, // 1ms before
			{ID: 3, Email: "3", Seen: at("2026-03-01T11:59:00Z")},
			{ID: 4, Email: "4"}, // never seen
			{ID: 5, Email: "5", Seen: at("2026-03-01T12:01:00Z")},                         // ahead of now
			{ID: 6, Email: "6", Seen: at("2026-03-01T11:55:00.001Z")},                     // 1ms after
			{ID: 7, Email: "7", Seen: ptr(time.Date(2026, 3, 1, 20, 54, 59, 999e6, jst))}, // 11:54:59.999Z
			{ID: 8, Email: "8", Seen: ptr(time.Date(2026, 3, 1, 20, 55, 0, 0, jst))},      // 11:55:00Z
		}).Error)
		must(t, db.Create(&[]appNote{
			{ID: 1, AccountID: 1, Seen: at("2026-03-01T00:00:00Z")},
			{ID: 2, AccountID: 2, Seen: at("2026-03-01T12:00:00Z")},
		}).Error)
		ids := func(q *gorm.DB) string {
			t.Helper()
			var out []int64
			must(t, q.Order("app_accounts.id").Pluck("app_accounts.id", &out).Error)
			return fmt.Sprint(out)
		}

		for _, now := range []time.Time{mustTime("2026-03-01T12:00:00Z"), time.Date(2026, 3, 1, 21, 0, 0, 0, jst)} {
			db.Config.NowFunc = func() time.Time { return now }
			name := now.Format(time.RFC3339)
			equal(t, name+" SeenWithin(5m)", ids(db.Model(&appAccount{}).Scopes(lastseen.SeenWithin(5*time.Minute))), "[1 3 5 6 8]")
			equal(t, name+" SeenWithin(0)", ids(db.Model(&appAccount{}).Scopes(lastseen.SeenWithin(0))), "[5]")
			equal(t, name+" SeenWithin(24h)", ids(db.Model(&appAccount{}).Scopes(lastseen.SeenWithin(24*time.Hour))), "[1 2 3 5 6 7 8]")
			equal(t, name+" SeenWithin(5m) joined with a table that has the same column",
				ids(db.Model(&appAccount{}).Joins("JOIN app_notes ON app_notes.account_id = app_accounts.id").Scopes(lastseen.SeenWithin(5*time.Minute))), "[1]")
		}

		// Without the plugin, the scope uses last_seen_at.
		plain := h.openDB()
		plain.Config.NowFunc = func() time.Time { return mustTime("2026-03-01T12:00:00Z") }
		must(t, plain.AutoMigrate(&lastseen.User{}))
		must(t, plain.Create(&[]lastseen.User{
			{ID: 1, LastSeenAt: at("2026-03-01T11:00:00Z")},
			{ID: 2, LastSeenAt: at("2026-03-01T11:59:59Z")},
			{ID: 3},
		}).Error)
		var users []lastseen.User
		must(t, plain.Scopes(lastseen.SeenWithin(time.Minute)).Order("id").Find(&users).Error)
		equal(t, "default column rows", len(users), 1)
		if len(users) == 1 {
			equal(t, "default column row", users[0].ID, uint64(2))
		}
	})
}
