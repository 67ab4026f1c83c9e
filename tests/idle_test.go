package tests

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// idleSessions seeds the sessions of the idle tests. The clock is
// 09:30:00Z and IdleTimeout 30m, so the idle cutoff is 09:00:00Z:
//
//	a  expires 12:00, active 09:00:00      idle (the boundary)
//	b  expires 12:00, active 09:00:00.001  live
//	c  expires 09:30 (now), active 09:29   expired (the boundary)
//	d  expires 12:00, never active (NULL)  live: NULL is never idle
//	e  expires 12:00, active 08:00         idle in the column; touched at 09:20 (buffered)
//	f  expires 09:00, never active         expired
//	g  expires 09:29, active 08:00         expired; touched at 09:25 (buffered)
//	h  expires 12:00, active 08:00         idle; touched at 08:59, still idle
func idleSessions() []lastseen.Session {
	at := func(s string) *time.Time { return ptr(mustTime(s)) }
	later := mustTime("2026-03-01T12:00:00Z")
	return []lastseen.Session{
		{ID: "a", UserID: 1, ExpiresAt: later, LastActiveAt: at("2026-03-01T09:00:00Z")},
		{ID: "b", UserID: 1, ExpiresAt: later, LastActiveAt: at("2026-03-01T09:00:00.001Z")},
		{ID: "c", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:30:00Z"), LastActiveAt: at("2026-03-01T09:29:00Z")},
		{ID: "d", UserID: 1, ExpiresAt: later},
		{ID: "e", UserID: 1, ExpiresAt: later, LastActiveAt: at("2026-03-01T08:00:00Z")},
		{ID: "f", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:00:00Z")},
		{ID: "g", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:29:00Z"), LastActiveAt: at("2026-03-01T08:00:00Z")},
		{ID: "h", UserID: 1, ExpiresAt: later, LastActiveAt: at("2026-03-01T08:00:00Z")},
	}
}

// idleSetup registers, on one handle, a users plugin (default
// SessionModel, no IdleTimeout) and a sessions plugin that tracks
// Session.LastActiveAt with IdleTimeout 30m, and seeds idleSessions.
func idleSetup(t *testing.T, h *harness) (sessions, users *lastseen.Plugin, db *gorm.DB) {
	t.Helper()
	db = h.openDB()
	must(t, db.AutoMigrate(&lastseen.Session{}, &lastseen.User{}))
	must(t, db.Create(idleSessions()).Error)
	uc := h.config()
	uc.Buffer.Prefix = h.prefix + ":users"
	sc := h.config()
	sc.Buffer.Prefix = h.prefix + ":sessions"
	sc.Model, sc.Field, sc.Sessions.IdleTimeout = &lastseen.Session{}, "LastActiveAt", 30*time.Minute
	users, sessions = lastseen.New(uc), lastseen.New(sc)
	must(t, db.Use(users))
	must(t, db.Use(sessions))
	t.Cleanup(func() { sessions.Close(context.Background()); users.Close(context.Background()) })
	db.Config.NowFunc = h.clock.Now
	return sessions, users, db
}

func sessionIDs(t *testing.T, q *gorm.DB) string {
	t.Helper()
	var ids []string
	must(t, q.Pluck("id", &ids).Error)
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// TestIdleSessionsExpired: with IdleTimeout the Expired scope (resolved to
// the sessions plugin, not the users plugin that shares the session
// table), ExpiredSessions and Session.Expired agree: expired at the expiry
// or idle for IdleTimeout, both boundaries included, NULL never idle.
func TestIdleSessionsExpired(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		sessions, _, db := idleSetup(t, h)
		equal(t, "Expired", sessionIDs(t, db.Model(&lastseen.Session{}).Scopes(lastseen.Expired)), "a,c,e,f,g,h")
		equal(t, "Expired on db.Table", sessionIDs(t, db.Table("sessions").Scopes(lastseen.Expired)), "a,c,e,f,g,h")
		equal(t, "ExpiredAt 09:00:00", sessionIDs(t, db.Model(&lastseen.Session{}).Scopes(lastseen.ExpiredAt(mustTime("2026-03-01T09:00:00Z")))), "e,f,g,h")

		var rows []lastseen.Session
		must(t, db.Order("id").Find(&rows).Error)
		var byMethod []string
		for _, s := range rows {
			if s.Expired(h.clock.Now(), 30*time.Minute) {
				byMethod = append(byMethod, s.ID)
			}
		}
		equal(t, "Session.Expired", strings.Join(byMethod, ","), "a,c,e,f,g,h")

		ec, err := sessions.ExpiredSessions(context.Background())
		must(t, err)
		equal(t, "ExpiredSessions", fmt.Sprintf("%d kept %d %s", ec.Expired, ec.Kept, ec.Oldest.Format(time.RFC3339)), "6 kept 0 2026-03-01T09:00:00Z")

		// Without the plugins, the scope is the expiry alone.
		plain := h.openDB()
		plain.Config.NowFunc = h.clock.Now
		equal(t, "Expired without plugins", sessionIDs(t, plain.Model(&lastseen.Session{}).Scopes(lastseen.Expired)), "c,f,g")
	})
}

// TestIdlePurgeKeepsBufferedActivity: the purge deletes by the idle rule,
// but keeps a session idle in the column whose newer activity is still
// buffered in Redis (e), unless it is past its expiry (g) or the buffered
// activity is itself idle (h); after the sessions' flush, e is live.
func TestIdlePurgeKeepsBufferedActivity(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		sessions, users, db := idleSetup(t, h)
		for id, at := range map[string]string{"e": "2026-03-01T09:20:00Z", "g": "2026-03-01T09:25:00Z", "h": "2026-03-01T08:59:00Z"} {
			_, err := sessions.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		ec, err := sessions.ExpiredSessions(ctx) // the purge's own checks: e is kept
		must(t, err)
		equal(t, "ExpiredSessions before the purge", fmt.Sprintf("expired=%d kept=%d", ec.Expired, ec.Kept), "expired=5 kept=1")
		res, err := sessions.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "purge", fmt.Sprintf("deleted=%d batches=%d", res.Deleted, res.Batches), "deleted=5 batches=1")
		equal(t, "left", sessionIDs(t, db.Model(&lastseen.Session{})), "b,d,e")
		equal(t, "e still pending", pendingAt(t, sessions, "e"), "2026-03-01T09:20:00Z")

		_, err = sessions.Flush(ctx)
		must(t, err)
		equal(t, "e's last_active_at", lastSeenColumn(t, db, "sessions", "id", "last_active_at", "e"), "2026-03-01T09:20:00Z")
		equal(t, "Expired after the flush", sessionIDs(t, db.Model(&lastseen.Session{}).Scopes(lastseen.Expired)), "")

		// The users plugin shares the session table without an idle rule.
		must(t, db.Create(&lastseen.Session{ID: "i", UserID: 1, ExpiresAt: mustTime("2026-03-01T12:00:00Z"), LastActiveAt: ptr(mustTime("2026-03-01T08:00:00Z"))}).Error)
		res, err = users.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "users plugin purge (expiry alone)", res.Deleted, 0)
		res, err = sessions.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "sessions plugin purge", res.Deleted, 1)
	})
}

// TestIdleConfig: IdleTimeout checks its settings at db.Use.
func TestIdleConfig(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	for _, c := range []struct {
		name string
		set  func(*lastseen.Config)
		want string
	}{
		{"negative", func(c *lastseen.Config) { c.Sessions.IdleTimeout = -time.Second },
			"lastseen: invalid config: Sessions.IdleTimeout is -1s, want 0 (off) or a positive duration"},
		{"no such field", func(c *lastseen.Config) { c.Sessions.IdleTimeout, c.Sessions.ActiveField = time.Hour, "Touched" },
			`lastseen: invalid config: Sessions.ActiveField "Touched": Session has no such field or column`},
		{"not a time", func(c *lastseen.Config) { c.Sessions.IdleTimeout, c.Sessions.ActiveField = time.Hour, "UserID" },
			`lastseen: invalid config: Sessions.ActiveField "UserID": Session.UserID is a uint64: ` + wantIntUnit},
		{"batch over the limit", func(c *lastseen.Config) { c.Sessions.IdleTimeout, c.Sessions.BatchSize = time.Hour, 32764 },
			"lastseen: invalid config: Sessions.BatchSize 32764 exceeds the sqlite limit of 32763 sessions per delete with Sessions.IdleTimeout (32766 bind parameters, 1 per session and 3 for the cutoffs)"},
	} {
		cfg := h.config()
		c.set(&cfg)
		equal(t, c.name, fmt.Sprint(h.openDB().Use(lastseen.New(cfg))), c.want)
	}
	cfg := h.config()
	cfg.Sessions.ActiveField = "Touched" // read only with IdleTimeout
	p, _ := h.plugin(cfg)
	equal(t, "ActiveField ignored without IdleTimeout", !internals(p).TracksActive, true)
}
