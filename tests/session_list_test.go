package tests

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// deviceSession is a session model with the device it was opened on.
type deviceSession struct {
	ID           string    `gorm:"primaryKey;size:64"`
	UserID       int64     `gorm:"index;not null"`
	Device       string    `gorm:"size:128;not null"`
	ExpiresAt    time.Time `gorm:"index;not null"`
	CreatedAt    time.Time
	LastActiveAt *time.Time
}

func (deviceSession) TableName() string { return "device_sessions" }

// TestSessionList: the "your sessions" page of Example_sessionList on
// every dialect and buffer. A user's sessions not expired by ExpiresAt,
// with LastSeenMany's freshest activity (the buffer's when newer than the
// column, the column's otherwise), the idle one left out by that value;
// "sign out the others" deletes every other session of the user and no
// one else's, and the flush that follows finds no row for the buffered
// activity of a deleted session (Unknown), never bringing it back.
func TestSessionList(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		now := h.clock.Now() // 2026-03-01T09:30:00Z
		idle := 30 * 24 * time.Hour
		db0 := h.openDB()
		must(t, db0.AutoMigrate(&deviceSession{}))
		at := func(d time.Duration) *time.Time { v := now.Add(d); return &v }
		must(t, db0.Create([]deviceSession{
			{ID: "laptop", UserID: 1, Device: "Firefox on Linux", ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(-time.Hour)},
			{ID: "phone", UserID: 1, Device: "iPhone app", ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(-31 * 24 * time.Hour)},
			{ID: "office", UserID: 1, Device: "Chrome on Windows", ExpiresAt: now.Add(24 * time.Hour), LastActiveAt: at(-40 * 24 * time.Hour)},
			{ID: "old", UserID: 1, Device: "Safari on macOS", ExpiresAt: now.Add(-time.Minute)},
			{ID: "other", UserID: 2, Device: "Firefox on Linux", ExpiresAt: now.Add(24 * time.Hour)},
		}).Error)
		cfg := h.config()
		cfg.Model, cfg.Field = &deviceSession{}, "LastActiveAt"
		cfg.Sessions.Model, cfg.Sessions.IdleTimeout = &deviceSession{}, idle
		p, db := h.plugin(cfg)
		_, err := p.TouchAt(ctx, "phone", now.Add(-2*time.Minute)) // idle in the table, active in the buffer
		must(t, err)
		_, err = p.Touch(ctx, "laptop")
		must(t, err)

		list := func() string {
			t.Helper()
			var rows []deviceSession
			must(t, db.Where("user_id = ? AND expires_at > ?", 1, now).Order("id").Find(&rows).Error)
			ids := make([]any, len(rows))
			for i, s := range rows {
				ids[i] = s.ID
			}
			active, err := p.LastSeenMany(ctx, ids)
			must(t, err)
			var out []string
			for i, s := range rows {
				if !now.Add(-idle).Before(active[i]) {
					continue
				}
				out = append(out, fmt.Sprintf("%s (%s) %s", s.ID, s.Device, active[i].Format(time.RFC3339)))
			}
			return strings.Join(out, ", ")
		}
		equal(t, "sessions", list(), "laptop (Firefox on Linux) 2026-03-01T09:30:00Z, phone (iPhone app) 2026-03-01T09:28:00Z")

		res := db.Where("user_id = ? AND id <> ?", 1, "laptop").Delete(&deviceSession{})
		must(t, res.Error)
		equal(t, "signed out", res.RowsAffected, int64(3))
		equal(t, "sessions after", list(), "laptop (Firefox on Linux) 2026-03-01T09:30:00Z")
		var left []string
		must(t, db.Model(&deviceSession{}).Order("id").Pluck("id", &left).Error)
		equal(t, "rows left", fmt.Sprint(left), "[laptop other]")

		fr, err := p.Flush(ctx)
		must(t, err)
		equal(t, "flush", fmt.Sprintf("written=%d unknown=%d", fr.Written, fr.Unknown), "written=1 unknown=1")
		must(t, db.Model(&deviceSession{}).Order("id").Pluck("id", &left).Error)
		equal(t, "rows after the flush", fmt.Sprint(left), "[laptop other]")
		equal(t, "laptop's column", lastSeenColumn(t, db, "device_sessions", "id", "last_active_at", "laptop"), "2026-03-01T09:30:00Z")
	})
}
