package tests

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// bareUser is a users table without the last-seen column.
type bareUser struct{ ID uint64 }

func (bareUser) TableName() string { return "users" }

// bareSession is a sessions table without the expiry column.
type bareSession struct{ ID string }

func (bareSession) TableName() string { return "sessions" }

const (
	usersMissing    = "table users does not exist: create it (AutoMigrate) or fix Config.Model (*lastseen.User); touches stay buffered until it exists"
	sessionsMissing = "table sessions does not exist: create it, or set Config.Sessions.Disabled for an app without a sessions table (Config.Sessions.Model *lastseen.Session)"
)

// TestSchemaColumnMissingFailsInitialize: a table that exists without the
// configured column fails db.Use with ErrInvalidConfig naming the Config
// field; the sessions table is not checked with Sessions.Disabled.
func TestSchemaColumnMissingFailsInitialize(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		must(t, h.db.AutoMigrate(&bareUser{}))
		err := h.openDB().Use(lastseen.New(h.config()))
		equal(t, "users without last_seen_at", fmt.Sprint(err), `lastseen: invalid config: Config.Field "LastSeenAt": table users has no column last_seen_at`)
		equal(t, "is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)

		must(t, h.db.Migrator().DropTable("users"))
		must(t, h.db.AutoMigrate(&lastseen.User{}, &bareSession{}))
		err = h.openDB().Use(lastseen.New(h.config()))
		equal(t, "sessions without expires_at", fmt.Sprint(err), `lastseen: invalid config: Config.Sessions.ExpiresField "ExpiresAt": table sessions has no column expires_at`)

		cfg := h.config()
		cfg.Sessions.Disabled = true
		p := lastseen.New(cfg)
		must(t, h.openDB().Use(p))
		must(t, p.Close(context.Background()))
	})
}

// TestSchemaMissingTablesWarnAtInitialize: tables that do not exist yet
// (an app that AutoMigrates after db.Use) are one warning each, not an
// error; the sessions table is left out with Sessions.Disabled.
func TestSchemaMissingTablesWarnAtInitialize(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, disablePurge := range []bool{false, true} {
			var logs testenv.Logs
			cfg := h.config()
			cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			cfg.Sessions.Disabled = disablePurge
			p := lastseen.New(cfg)
			must(t, h.openDB().Use(p))
			t.Cleanup(func() { p.Close(context.Background()) })
			name := fmt.Sprint("Sessions.Disabled ", disablePurge, ": ")
			equal(t, name+"users warnings", logs.Count(`level=WARN msg="lastseen: `+usersMissing+`"`), 1)
			want := 1
			if disablePurge {
				want = 0
			}
			equal(t, name+"sessions warnings", logs.Count(`level=WARN msg="lastseen: `+sessionsMissing+`"`), want)
			equal(t, name+"log lines", logs.Count("\n"), 1+want)
		}
	})
}

// TestSchemaMissingTableAtFlushAndPurge: with the tables still missing, a
// flush with something to write and a purge fail with ErrSchema naming the
// Config field, and the touch stays buffered; the scheduled flush logs one
// ERROR per SchemaLogInterval, not one per tick, and so does its check of
// the purge's table; once the tables exist the same jobs write and purge.
func TestSchemaMissingTableAtFlushAndPurge(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var logs testenv.Logs
		cfg := h.config()
		cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		p, db := h.plugin(cfg)
		_, err := p.Touch(ctx, 7)
		must(t, err)

		_, err = p.Flush(ctx)
		equal(t, "flush error", fmt.Sprint(err), "lastseen: schema does not fit the config: flush: "+usersMissing)
		equal(t, "is ErrSchema", errors.Is(err, lastseen.ErrSchema), true)
		_, pending, err := p.Pending(ctx, 7)
		must(t, err)
		equal(t, "still pending", pending, true)
		res, err := p.PurgeExpiredSessions(ctx)
		equal(t, "purge error", fmt.Sprint(err), "lastseen: schema does not fit the config: purge: "+sessionsMissing)
		equal(t, "purge stopped", res.Stopped, true)

		for range 6 { // 09:30 to 09:35, one tick a minute
			flushJob(p, ctx)
			h.clock.Add(time.Minute)
		}
		equal(t, "flush ERROR lines over 6 ticks", logs.Count(`level=ERROR msg="lastseen: flush failed"`), 2)
		equal(t, "purge ERROR lines over 6 ticks", logs.Count(`level=ERROR msg="lastseen: purge will fail"`), 2)
		equal(t, "lines with repeats=4", logs.Count("repeats=4"), 2)
		equal(t, "lines with repeats=0", logs.Count("repeats=0"), 2)

		seedUsers(t, db, 7)
		seedSessions(t, db, sess("old", "2026-03-01T09:00:00Z"))
		flushJob(p, ctx)
		equal(t, "flush INFO lines", logs.Count(`level=INFO msg="lastseen: flush" `), 1)
		equal(t, "lines with drained=1 written=1", logs.Count(`drained=1 written=1 unknown=0 stale=0`), 1)
		equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 7), "2026-03-01T09:30:00Z")
		res, err = p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "sessions deleted", res.Deleted, 1)
		equal(t, "ERROR lines in all", logs.Count("level=ERROR"), 4)
		s := p.Stats()
		equal(t, "flush errors", s.FlushErrors, 7)
		equal(t, "purges", s.Purges, 2)
		equal(t, "purge errors", s.PurgeErrors, 1)

		// A table dropped while the plugin runs: the write's statement error
		// first, then the flush checks the table again and names it.
		must(t, db.Migrator().DropTable(&lastseen.User{}))
		h.expireThrottle(10 * time.Minute)
		_, err = p.Touch(ctx, 7)
		must(t, err)
		_, err = p.Flush(ctx)
		equal(t, "flush after drop is ErrSchema", errors.Is(err, lastseen.ErrSchema), false)
		_, err = p.Flush(ctx)
		equal(t, "next flush", fmt.Sprint(err), "lastseen: schema does not fit the config: flush: "+usersMissing)
	})
}
