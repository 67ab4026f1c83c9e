package tests

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// trackedDevice is a third tracked model.
type trackedDevice struct {
	ID       string     `gorm:"primaryKey;size:64"`
	LastPing *time.Time `gorm:"column:last_ping"`
}

func (trackedDevice) TableName() string { return "devices" }

// TestSeveralModelsRegister: each tracked model and field has its own
// Name, so several plugins register on one handle; the same model and
// field twice is GORM's ErrRegistered; a second model in the same Prefix is
// refused.
func TestSeveralModelsRegister(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	db := h.openDB()
	cfg := func(prefix string, model any, field string) lastseen.Config {
		c := h.config()
		c.Buffer.Prefix, c.Model, c.Field = h.prefix+":"+prefix, model, field
		return c
	}
	users := lastseen.New(cfg("users", &lastseen.User{}, ""))
	devices := lastseen.New(cfg("devices", &trackedDevice{}, "LastPing"))
	sessions := lastseen.New(cfg("sessions", &lastseen.Session{}, "LastActiveAt"))
	equal(t, "users Name", users.Name(), "lastseen:github.com/lastseen/lastseen.User.LastSeenAt")
	equal(t, "devices Name", devices.Name(), "lastseen:github.com/lastseen/lastseen/tests.trackedDevice.LastPing")
	equal(t, "sessions Name", sessions.Name(), "lastseen:github.com/lastseen/lastseen.Session.LastActiveAt")
	for _, p := range []*lastseen.Plugin{users, devices, sessions} {
		must(t, db.Use(p))
		t.Cleanup(func() { p.Close(context.Background()) })
	}
	equal(t, "plugins on the handle", pluginsOn(db), 3)

	again := lastseen.New(cfg("users2", &lastseen.User{}, "LastSeenAt"))
	equal(t, "same model and field again", errors.Is(db.Use(again), gorm.ErrRegistered), true)
	byColumn := lastseen.New(cfg("users3", &lastseen.User{}, "last_seen_at"))
	err := db.Use(byColumn)
	equal(t, "same column by its column name", fmt.Sprint(err),
		"registered: lastseen: column users.last_seen_at is already tracked by lastseen:github.com/lastseen/lastseen.User.LastSeenAt on this *gorm.DB")
	equal(t, "is gorm.ErrRegistered", errors.Is(err, gorm.ErrRegistered), true)

	sharing := lastseen.New(cfg("devices", &lastseen.Session{}, "ExpiresAt"))
	err = db.Use(sharing)
	equal(t, "same Prefix, another model", fmt.Sprint(err),
		`lastseen: invalid config: Buffer.Prefix "`+h.prefix+`:devices" is already the buffer of lastseen:github.com/lastseen/lastseen/tests.trackedDevice.LastPing on this *gorm.DB: give each tracked model its own Buffer.Prefix`)
	equal(t, "is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
}

// TestScopesResolveOwnModel: on a handle with several plugins, SeenWithin
// uses the Field of the plugin that tracks the statement's table (by
// Model, destination or db.Table), and a table no plugin tracks gets the
// default column; each plugin's buffer and flush stay with its own table.
func TestScopesResolveOwnModel(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		db := h.openDB()
		must(t, db.AutoMigrate(&appAccount{}, &trackedDevice{}, &lastseen.User{}))
		ac := h.config()
		ac.Buffer.Prefix, ac.Model, ac.Field = h.prefix+":accounts", &appAccount{}, "Seen"
		dc := h.config()
		dc.Buffer.Prefix, dc.Model, dc.Field = h.prefix+":devices", &trackedDevice{}, "LastPing"
		accounts, devices := lastseen.New(ac), lastseen.New(dc)
		must(t, db.Use(accounts))
		must(t, db.Use(devices))
		t.Cleanup(func() { accounts.Close(ctx); devices.Close(ctx) })

		must(t, db.Create(&[]appAccount{{ID: 1, Email: "1"}, {ID: 2, Email: "2"}}).Error)
		must(t, db.Create(&[]trackedDevice{{ID: "d1"}, {ID: "d2"}}).Error)
		must(t, db.Create(&[]lastseen.User{{ID: 1, LastSeenAt: ptr(mustTime("2026-03-01T09:29:00Z"))}, {ID: 2}}).Error)
		_, err := accounts.Touch(ctx, int64(1))
		must(t, err)
		_, err = devices.Touch(ctx, "d2")
		must(t, err)
		ra, err := accounts.Flush(ctx)
		must(t, err)
		rd, err := devices.Flush(ctx)
		must(t, err)
		equal(t, "accounts written", ra.Written, 1)
		equal(t, "devices written", rd.Written, 1)

		db.Config.NowFunc = h.clock.Now // 09:30
		within := lastseen.SeenWithin(5 * time.Minute)
		var accountIDs []int64
		must(t, db.Model(&appAccount{}).Scopes(within).Order("id").Pluck("id", &accountIDs).Error)
		equal(t, "accounts by Model", fmt.Sprint(accountIDs), "[1]")
		var devs []trackedDevice
		must(t, db.Scopes(within).Order("id").Find(&devs).Error)
		equal(t, "devices by destination", len(devs) == 1 && devs[0].ID == "d2", true)
		var ids []string
		must(t, db.Table("devices").Scopes(within).Order("id").Pluck("id", &ids).Error)
		equal(t, "devices by db.Table", fmt.Sprint(ids), "[d2]")
		var users []lastseen.User
		must(t, db.Scopes(within).Order("id").Find(&users).Error)
		equal(t, "untracked users on last_seen_at", len(users) == 1 && users[0].ID == 1, true)
	})
}

// TestScheduledPurgeOnePluginPerSessionTable: of several plugins with the
// same session table, the scheduled purge runs in the one that tracks the
// sessions, else in the least Name; Sessions.Disabled and a Sessions.Schedule
// of "off" take a plugin out.
func TestScheduledPurgeOnePluginPerSessionTable(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	cfg := func(prefix string, model any, field string, disable bool) lastseen.Config {
		c := h.config()
		c.Buffer.Prefix, c.Model, c.Field, c.Sessions.Disabled = h.prefix+":"+prefix, model, field, disable
		c.Sessions.Schedule = "" // scheduled (the default), the scheduler's flush stays off
		return c
	}
	register := func(cs ...lastseen.Config) []*lastseen.Plugin {
		db := h.openDB()
		var ps []*lastseen.Plugin
		for _, c := range cs {
			p := lastseen.New(c)
			must(t, db.Use(p))
			t.Cleanup(func() { p.Close(context.Background()) })
			ps = append(ps, p)
		}
		return ps
	}
	schedules := func(ps []*lastseen.Plugin) string {
		out := ""
		for _, p := range ps {
			out += fmt.Sprint(internals(p).SchedulesPurge()) + " "
		}
		return out
	}
	ps := register(cfg("u", &lastseen.User{}, "", false), cfg("s", &lastseen.Session{}, "LastActiveAt", false), cfg("d", &trackedDevice{}, "LastPing", false))
	equal(t, "users, sessions, devices", schedules(ps), "false true false ")
	ps = register(cfg("u", &lastseen.User{}, "", false), cfg("s", &lastseen.Session{}, "LastActiveAt", true), cfg("d", &trackedDevice{}, "LastPing", false))
	equal(t, "sessions with Sessions.Disabled: least Name (User < trackedDevice)", schedules(ps), "true false false ")
	ps = register(cfg("d", &trackedDevice{}, "LastPing", false), cfg("u", &lastseen.User{}, "", true))
	equal(t, "users with Sessions.Disabled", schedules(ps), "true false ")
	ps = register(cfg("u", &lastseen.User{}, "", false))
	equal(t, "one plugin", schedules(ps), "true ")
	off := cfg("s", &lastseen.Session{}, "LastActiveAt", false)
	off.Sessions.Schedule = "off"
	ps = register(off, cfg("u", &lastseen.User{}, "", false))
	equal(t, "sessions with Sessions.Schedule off: the users plugin purges", schedules(ps), "false true ")
}
