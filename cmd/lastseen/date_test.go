package main

import (
	"context"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// dayUser keeps GitLab's last_activity_on: a DATE column.
type dayUser struct {
	ID             int64      `gorm:"primaryKey;autoIncrement:false"`
	LastActivityOn *time.Time `gorm:"type:date"`
}

// TestCLIFlushDateColumn: the CLI flushes a DATE column as the app does,
// writing the day (the manifest's encoding is "time"; the catalog says
// the column is a date, and the manifest's Throttle is the day's).
func TestCLIFlushDateColumn(t *testing.T) {
	forEachDB(t, func(t *testing.T, d *testenv.DB) {
		clock := testenv.ClockAt("2026-03-01T23:30:00Z")
		mr, rdb := testRedis(t)
		app := d.Open(t)
		must(t, app.AutoMigrate(&dayUser{}))
		must(t, app.Create(&[]dayUser{{ID: 1}}).Error)
		cfg := appConfig(rdb, "days", clock.Now)
		cfg.Throttle = 0 // a DATE column's own: 25h
		cfg.Model, cfg.Field, cfg.Sessions.Disabled = &dayUser{}, "LastActivityOn", true
		p := lastseen.New(cfg)
		must(t, app.Use(p))
		equal(t, "app's throttle", p.Config().Throttle, 25*time.Hour)
		_, err := p.Touch(context.Background(), int64(1))
		must(t, err)
		flags := append([]string{"--redis", mr.Addr()}, d.Flags()...)
		out, err := runCLI(t, clock.Now, append([]string{"flush"}, flags...)...)
		must(t, err)
		equal(t, "flush: written line", lines(out)[1], "written   1")
		var u dayUser
		must(t, app.First(&u, 1).Error)
		equal(t, "last_activity_on", u.LastActivityOn.Format(time.DateOnly), "2026-03-01")
	})
}
