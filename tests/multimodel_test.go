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
// Name, so several plugins register on one handle; a second model in the
// same Prefix is refused.
func TestSeveralModelsRegister(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	db := h.openDB()
	cfg := func(prefix string, model any, field string) lastseen.Config {
		c := h.config()
		c.Buffer.Prefix, c.Model, c.Field = h.prefix+":"+prefix, model, field
		return c
	}
	users := lastseen.New(cfg("users", &lastseen.User{}, ""))
	devices := lastseen.New(cfg("devices", &trackedDevice{}, "last_ping"))
	sessions := lastseen.New(cfg("sessions", &lastseen.Session{}, "LastActiveAt"))
	equal(t, "Name before db.Use", users.Name(), fmt.Sprintf("lastseen:github.com/lastseen/lastseen.User.LastSeenAt#%p", users))
	for _, p := range []*lastseen.Plugin{users, devices, sessions} {
		must(t, db.Use(p))
		t.Cleanup(func() { p.Close(context.Background()) })
	}
	equal(t, "users Name", users.Name(), "lastseen:github.com/lastseen/lastseen.User.LastSeenAt")
	equal(t, "devices Name (Field by column)", devices.Name(), "lastseen:github.com/lastseen/lastseen/tests.trackedDevice.LastPing")
	equal(t, "sessions Name", sessions.Name(), "lastseen:github.com/lastseen/lastseen.Session.LastActiveAt")
	equal(t, "plugins on the handle", pluginsOn(db), 3)

	sharing := lastseen.New(cfg("devices", &lastseen.Session{}, "ExpiresAt"))
	err := db.Use(sharing)
	equal(t, "same Prefix, another model", fmt.Sprint(err),
		`lastseen: invalid config: Buffer.Prefix "`+h.prefix+`:devices" is already the buffer of lastseen:github.com/lastseen/lastseen/tests.trackedDevice.LastPing on this *gorm.DB: give each tracked model its own Buffer.Prefix`)
	equal(t, "is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
}

// TestSecondPluginForColumnRefused: a second plugin for a tracked column
// is refused by db.Use with one error, whichever way either spells Field,
// wrapping gorm.ErrRegistered and naming the model, the field and the
// plugin registered; the same plugin registered twice on one handle is
// refused too. Nothing of the refused plugin is registered.
func TestSecondPluginForColumnRefused(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	const want = "lastseen: registered: model github.com/lastseen/lastseen.User field LastSeenAt (column users.last_seen_at) is already tracked by " +
		"the plugin lastseen:github.com/lastseen/lastseen.User.LastSeenAt on this *gorm.DB: register one plugin per tracked column"
	for _, first := range []string{"LastSeenAt", "last_seen_at"} {
		for _, second := range []string{"LastSeenAt", "last_seen_at"} {
			db := h.openDB()
			c := h.config()
			c.Field = first
			p := testenv.Use(t, db, c)
			c = h.config()
			c.Field, c.Buffer.Prefix = second, h.prefix+":second"
			err := db.Use(lastseen.New(c))
			what := first + " then " + second
			equal(t, what, fmt.Sprint(err), want)
			equal(t, what+": is gorm.ErrRegistered", errors.Is(err, gorm.ErrRegistered), true)
			equal(t, what+": plugins on the handle", pluginsOn(db), 1)

			err = db.Use(p)
			equal(t, what+": the first again", fmt.Sprint(err),
				"lastseen: registered: the plugin lastseen:github.com/lastseen/lastseen.User.LastSeenAt is already registered on this *gorm.DB: call db.Use once")
			equal(t, what+": again is gorm.ErrRegistered", errors.Is(err, gorm.ErrRegistered), true)
			equal(t, what+": plugins after the first again", pluginsOn(db), 1)
		}
	}
}

// TestFieldByColumnSameIdentity: Field by column name ("last_seen_at") is
// the same plugin as by Go field name: the same Name and the same derived
// Buffer.Prefix, with Redis and without.
func TestFieldByColumnSameIdentity(t *testing.T) {
	for _, r := range []testenv.RedisKind{testenv.Miniredis(), memoryKind()} {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			var names, prefixes []string
			for _, field := range []string{"LastSeenAt", "last_seen_at"} {
				c := h.config()
				c.Field, c.Buffer.Prefix = field, ""
				p := testenv.Use(t, h.openDB(), c)
				names = append(names, p.Name())
				prefixes = append(prefixes, p.Config().Buffer.Prefix)
				if !h.memory() {
					t.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), h.r.Client, p.Config().Buffer.Prefix+":*") })
				}
			}
			equal(t, "Name by field", names[0], "lastseen:github.com/lastseen/lastseen.User.LastSeenAt")
			equal(t, "Name by column", names[1], names[0])
			equal(t, "prefix derived", derivedPrefix.MatchString(prefixes[0]), true)
			equal(t, "prefix by column", prefixes[1], prefixes[0])
		})
	}
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
