package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// dateUser is GitLab's users.last_activity_on: a DATE column written at
// most once a day.
type dateUser struct {
	ID             int64      `gorm:"primaryKey;autoIncrement:false"`
	LastActivityOn *time.Time `gorm:"type:date"`
}

func (dateUser) TableName() string { return "date_users" }

// dateColumn reads date_users.last_activity_on of id as the date the
// driver returns ("2006-01-02"), "" for NULL; on SQLite also the stored
// value's type and text.
func dateColumn(t *testing.T, h *harness, db *gorm.DB, id int64) string {
	t.Helper()
	var u dateUser
	must(t, db.Session(&gorm.Session{NewDB: true}).Table("date_users").Where("id = ?", id).Take(&u).Error)
	got := ""
	if u.LastActivityOn != nil {
		got = u.LastActivityOn.Format(time.DateOnly)
	}
	if h.dialect == "sqlite" {
		var raw string
		must(t, db.Raw("SELECT coalesce(typeof(last_activity_on) || ' ' || last_activity_on, 'null') FROM date_users WHERE id = ?", id).Scan(&raw).Error)
		got += " (" + raw + ")"
	}
	return got
}

// TestDateColumn: a DATE column (GitLab's last_activity_on) in the
// column's location (here New York) is written as the day, at most once
// per user per day: the touch that opens a window opens it until the next
// midnight there, so later touches that day are throttled, and the first
// after midnight is recorded. It only moves forward (a late touch of an
// earlier day changes nothing), LastSeen and the overlay give the day
// (from the buffer before the flush, from the column after), TouchKnown
// knows today's date, and SeenWithin compares dates.
func TestDateColumn(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	must(t, err)
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &dateUser{}, "LastActivityOn", true
		cfg.Flush.ColumnLocation = ny
		cfg.Presence.Overlay = true
		db0 := h.openDB()
		must(t, db0.AutoMigrate(&dateUser{}))
		must(t, db0.Create([]dateUser{{ID: 1}, {ID: 2}}).Error)
		p, db := h.plugin(cfg)
		c := p.Config()
		equal(t, "throttle and online window", fmt.Sprint(c.Throttle, " ", c.Presence.OnlineWindow), "25h0m0s -1ns")

		touch := func(at string, id int64) bool {
			t.Helper()
			h.clock.Set(mustTime(at)) // no marker expired: the window must end by itself
			rec, err := p.Touch(ctx, id)
			must(t, err)
			return rec
		}
		flush := func() lastseen.FlushResult {
			t.Helper()
			res, err := p.Flush(ctx)
			must(t, err)
			return res
		}
		lastSeen := func(id int64) string {
			t.Helper()
			at, ok, err := p.LastSeen(ctx, id)
			must(t, err)
			if !ok {
				return "never"
			}
			return at.Format(time.RFC3339)
		}

		// 1 March in New York (09:30Z is 04:30 there).
		equal(t, "first touch", touch("2026-03-01T09:30:00Z", 1), true)
		equal(t, "LastSeen from the buffer", lastSeen(1), "2026-03-01T05:00:00Z") // midnight in New York
		var loaded dateUser
		must(t, db.First(&loaded, 1).Error)
		equal(t, "overlay", loaded.LastActivityOn.Format(time.RFC3339), "2026-03-01T00:00:00Z")
		equal(t, "flush", flush().Written, 1)
		equal(t, "column", dateColumn(t, h, db, 1), map[bool]string{true: "2026-03-01 (text 2026-03-01)", false: "2026-03-01"}[h.dialect == "sqlite"])
		equal(t, "LastSeen from the column", lastSeen(1), "2026-03-01T05:00:00Z")
		equal(t, "later that day", touch("2026-03-01T20:00:00Z", 1), false)
		equal(t, "just before midnight in New York", touch("2026-03-02T04:59:59Z", 1), false)
		equal(t, "nothing pending", pendingAt(t, p, int64(1)), "none")
		known := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC) // the column as loaded
		before := p.Stats().Known
		rec, err := p.TouchKnown(ctx, int64(1), known)
		must(t, err)
		equal(t, "TouchKnown with today's date", fmt.Sprint(rec, " ", p.Stats().Known-before), "false 1")

		// 2 March in New York: the window ended at midnight there.
		equal(t, "just after midnight", touch("2026-03-02T05:00:01Z", 1), true)
		equal(t, "user 2", touch("2026-03-02T05:00:02Z", 2), true)
		res := flush()
		equal(t, "second day written", fmt.Sprintf("written=%d stale=%d", res.Written, res.Stale), "written=2 stale=0")
		equal(t, "column on the second day", dateColumn(t, h, db, 1)[:10], "2026-03-02")

		// Forward only: on 3 March, once user 2's window ended, a late
		// touch of 27 February is recorded and left stale by the flush.
		h.clock.Set(mustTime("2026-03-03T12:00:00Z"))
		rec, err = p.TouchAt(ctx, int64(2), mustTime("2026-02-27T12:00:00Z"))
		must(t, err)
		equal(t, "late touch recorded", rec, true)
		res = flush()
		equal(t, "late touch", fmt.Sprintf("written=%d stale=%d", res.Written, res.Stale), "written=0 stale=1")
		equal(t, "column kept", dateColumn(t, h, db, 2)[:10], "2026-03-02")

		// SeenWithin compares days: at 10:00 on 3 March in New York, the
		// cutoff 24h back falls on 2 March, which both users' dates reach.
		db.Config.NowFunc = func() time.Time { return mustTime("2026-03-03T15:00:00Z") }
		must(t, db.Model(&dateUser{}).Where("id = ?", 2).Update("last_activity_on", "2026-03-01").Error)
		var ids []int64
		must(t, db.Model(&dateUser{}).Scopes(lastseen.SeenWithin(24*time.Hour)).Order("id").Pluck("id", &ids).Error)
		equal(t, "seen within 24h", fmt.Sprint(ids), "[1]")
		must(t, db.Model(&dateUser{}).Scopes(lastseen.SeenWithin(48*time.Hour)).Order("id").Pluck("id", &ids).Error)
		equal(t, "seen within 48h", fmt.Sprint(ids), "[1 2]")
	})
}

// TestDateColumnThrottle: a Throttle shorter than a day on a DATE column
// is refused at db.Use, naming the column; 25h or more is taken as given,
// and Online stays on when its window was set.
func TestDateColumnThrottle(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		db := h.openDB()
		must(t, db.AutoMigrate(&dateUser{}))
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &dateUser{}, "LastActivityOn", true
		cfg.Throttle = 5 * time.Minute
		err := db.Use(lastseen.New(cfg))
		equal(t, "refused", errors.Is(err, lastseen.ErrInvalidConfig), true)
		equal(t, "error", fmt.Sprint(err), "lastseen: invalid config: Throttle is 5m0s, but date_users.last_activity_on is a DATE column, "+
			"written at most once per user per day (each throttle window lasts until the next midnight in its location): leave Throttle unset, or at least 25h0m0s")

		cfg.Throttle, cfg.Presence.OnlineWindow = 48*time.Hour, 72*time.Hour
		p, _ := h.plugin(cfg)
		c := p.Config()
		equal(t, "kept", fmt.Sprint(c.Throttle, " ", c.Presence.OnlineWindow), "48h0m0s 72h0m0s")
	})
}
