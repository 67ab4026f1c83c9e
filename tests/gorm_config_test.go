package tests

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// TestGormConfigs runs one scenario under GORM configurations apps use, on
// every dialect: migrate users and sessions, touch and flush, read the
// values back (GORM, LastSeen, LastSeenMany, SeenWithin), count and purge
// expired sessions (by expiry, idle, and idle in the column but active in
// the buffer), Status before and after the flush, and Overlay's buffered
// value in a Find. Every variant gives the same values; only the names of
// tables and columns follow the variant's naming (NoLowerCase: "Users",
// "LastSeenAt", which the plugin's catalog reads must find too).
//
// The clock is 09:30:00Z; the sessions plugin tracks
// Session.LastActiveAt with IdleTimeout 30m (idle cutoff 09:00:00Z):
//
//	exp   expires 09:10, active 09:20        expired
//	idle  expires 12:00, active 08:00        idle
//	kept  expires 12:00, active 08:00        idle in the column; touched at 09:15 (buffered): kept
//	live  expires 12:00, active 09:10        live
func TestGormConfigs(t *testing.T) {
	prefixed := schema.NamingStrategy{TablePrefix: "app_", SingularTable: true}
	for _, v := range []struct {
		name            string
		gorm            func(now func() time.Time) *gorm.Config // a new config for each handle; now is the test clock
		users, sessions string                                  // the tables the variant's naming gives
	}{
		{"PrepareStmt", func(func() time.Time) *gorm.Config { return &gorm.Config{PrepareStmt: true} }, "users", "sessions"},
		{"SkipDefaultTransaction", func(func() time.Time) *gorm.Config { return &gorm.Config{SkipDefaultTransaction: true} }, "users", "sessions"},
		{"NamingStrategy", func(func() time.Time) *gorm.Config { return &gorm.Config{NamingStrategy: prefixed} }, "app_user", "app_session"},
		{"all three", func(func() time.Time) *gorm.Config {
			return &gorm.Config{PrepareStmt: true, SkipDefaultTransaction: true, NamingStrategy: prefixed}
		}, "app_user", "app_session"},
		{"QueryFields", func(func() time.Time) *gorm.Config { return &gorm.Config{QueryFields: true} }, "users", "sessions"},
		{"NoLowerCase", func(func() time.Time) *gorm.Config {
			return &gorm.Config{NamingStrategy: schema.NamingStrategy{NoLowerCase: true}}
		}, "Users", "Sessions"},
		{"TranslateError", func(func() time.Time) *gorm.Config { return &gorm.Config{TranslateError: true} }, "users", "sessions"},
		{"NowFunc in UTC", func(now func() time.Time) *gorm.Config {
			return &gorm.Config{NowFunc: func() time.Time { return now().UTC() }}
		}, "users", "sessions"},
	} {
		t.Run(v.name, func(t *testing.T) {
			for _, d := range servers.Dialects() {
				t.Run(d.Name, func(t *testing.T) {
					var h *harness
					h = newHarnessWith(t, d, testenv.Miniredis(), func() *gorm.Config {
						c := v.gorm(func() time.Time { return h.clock.Now() }) // h once set
						c.Logger = testenv.Quiet().Logger
						return c
					})
					gormConfigScenario(t, h, v.name == "NowFunc in UTC", v.users, v.sessions)
				})
			}
		})
	}
}

// gormConfigScenario is TestGormConfigs' scenario on h. With gormClock the
// plugins take their clock from GORM's NowFunc (Test.Now unset); otherwise
// the scopes' NowFunc is set to the harness's clock.
func gormConfigScenario(t *testing.T, h *harness, gormClock bool, usersTable, sessionsTable string) {
	ctx := context.Background()
	db := h.openDB()
	must(t, db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	stmts := logStatements(db) // before db.Use: the plugins keep the handle's logger
	uc, sc := h.config(), h.config()
	uc.Buffer.Prefix, uc.Presence.Overlay = h.prefix+":users", true
	sc.Buffer.Prefix = h.prefix + ":sessions"
	sc.Model, sc.Field, sc.Sessions.IdleTimeout = &lastseen.Session{}, "LastActiveAt", 30*time.Minute
	if gormClock {
		uc.Test.Now, sc.Test.Now = nil, nil
	} else {
		db.Config.NowFunc = h.clock.Now
	}
	users, sessions := lastseen.New(uc), lastseen.New(sc)
	must(t, db.Use(users))
	must(t, db.Use(sessions))
	t.Cleanup(func() { sessions.Close(context.Background()); users.Close(context.Background()) })
	target, err := users.Target()
	must(t, err)
	equal(t, "users target", target.Table+" "+target.SessionTable, usersTable+" "+sessionsTable)
	th, err := users.TableHealth(ctx) // reads the catalog
	must(t, err)
	equal(t, "TableHealth", fmt.Sprintf("%s indexes=%d", th.Table, len(th.Indexes)), usersTable+" indexes=0")
	target, err = sessions.Target()
	must(t, err)
	equal(t, "sessions target", target.Table+" "+target.SessionTable, sessionsTable+" "+sessionsTable)

	at := func(s string) *time.Time { return ptr(mustTime(s)) }
	later := mustTime("2026-03-01T12:00:00Z")
	must(t, db.Create(&[]lastseen.User{{ID: 1}, {ID: 2}, {ID: 3}}).Error)
	must(t, db.Create(&[]lastseen.Session{
		{ID: "exp", UserID: 1, ExpiresAt: mustTime("2026-03-01T09:10:00Z"), LastActiveAt: at("2026-03-01T09:20:00Z")},
		{ID: "idle", UserID: 2, ExpiresAt: later, LastActiveAt: at("2026-03-01T08:00:00Z")},
		{ID: "kept", UserID: 2, ExpiresAt: later, LastActiveAt: at("2026-03-01T08:00:00Z")},
		{ID: "live", UserID: 3, ExpiresAt: later, LastActiveAt: at("2026-03-01T09:10:00Z")},
	}).Error)
	equal(t, "sessions' created_at (GORM's clock)", columnOf(t, db, &lastseen.Session{}, "CreatedAt", "live"), "2026-03-01T09:30:00Z")

	gormConfigUsers(t, db, users)
	gormConfigSessions(t, db, stmts, sessions, users, sessionsTable)
}

// gormConfigUsers touches users 1 and 2, flushes, and reads them back.
func gormConfigUsers(t *testing.T, db *gorm.DB, users *lastseen.Plugin) {
	ctx := context.Background()
	for id, at := range map[int]string{1: "2026-03-01T09:00:00Z", 2: "2026-03-01T09:20:00Z"} {
		recorded, err := users.TouchAt(ctx, id, mustTime(at))
		must(t, err)
		equal(t, fmt.Sprintf("user %d recorded", id), recorded, true)
	}
	st, err := users.Status(ctx)
	must(t, err)
	equal(t, "status before the flush", fmt.Sprintf("pending=%d oldest=%s", st.Pending, st.Oldest.Format(time.RFC3339)), "pending=2 oldest=2026-03-01T09:00:00Z")
	res, err := users.Flush(ctx)
	must(t, err)
	equal(t, "flush", fmt.Sprintf("drained=%d written=%d", res.Drained, res.Written), "drained=2 written=2")
	st, err = users.Status(ctx)
	must(t, err)
	equal(t, "status after the flush", fmt.Sprintf("pending=%d in-flight=%d oldest-zero=%v", st.Pending, st.InFlight, st.Oldest.IsZero()), "pending=0 in-flight=0 oldest-zero=true")

	equal(t, "user 1's column", columnOf(t, db, &lastseen.User{}, "LastSeenAt", 1), "2026-03-01T09:00:00Z")
	equal(t, "user 2's column", columnOf(t, db, &lastseen.User{}, "LastSeenAt", 2), "2026-03-01T09:20:00Z")
	equal(t, "user 3's column", columnOf(t, db, &lastseen.User{}, "LastSeenAt", 3), "")
	equal(t, "users by GORM", userValues(t, db.Order(byKey)), "1=2026-03-01T09:00:00Z 2=2026-03-01T09:20:00Z 3=")

	got, ok, err := users.LastSeen(ctx, 2)
	must(t, err)
	equal(t, "LastSeen(2)", fmt.Sprintf("%v %s", ok, got.UTC().Format(time.RFC3339)), "true 2026-03-01T09:20:00Z")
	_, ok, err = users.LastSeen(ctx, 3)
	must(t, err)
	equal(t, "LastSeen(3) ok", ok, false)
	many, err := users.LastSeenMany(ctx, []any{3, 1, 2})
	must(t, err)
	equal(t, "LastSeenMany", fmt.Sprintf("%v %s %s", many[0].IsZero(), many[1].Format(time.RFC3339), many[2].Format(time.RFC3339)), "true 2026-03-01T09:00:00Z 2026-03-01T09:20:00Z")

	equal(t, "SeenWithin 15m", userValues(t, db.Scopes(lastseen.SeenWithin(15*time.Minute)).Order(byKey)), "2=2026-03-01T09:20:00Z")
	equal(t, "SeenWithin 30m", userValues(t, db.Scopes(lastseen.SeenWithin(30*time.Minute)).Order(byKey)), "1=2026-03-01T09:00:00Z 2=2026-03-01T09:20:00Z")

	// Overlay: user 3's buffered value in a Find and a First, not in the column.
	_, err = users.TouchAt(ctx, 3, mustTime("2026-03-01T09:25:00Z"))
	must(t, err)
	equal(t, "Find with Overlay", userValues(t, db.Order(byKey)), "1=2026-03-01T09:00:00Z 2=2026-03-01T09:20:00Z 3=2026-03-01T09:25:00Z")
	var u lastseen.User
	must(t, db.First(&u, 3).Error)
	equal(t, "First with Overlay", u.LastSeenAt != nil && u.LastSeenAt.UTC().Format(time.RFC3339) == "2026-03-01T09:25:00Z", true)
	equal(t, "user 3's column before the flush", columnOf(t, db, &lastseen.User{}, "LastSeenAt", 3), "")
}

// gormConfigSessions counts, purges and flushes the scenario's sessions.
func gormConfigSessions(t *testing.T, db *gorm.DB, stmts *statementLog, sessions, users *lastseen.Plugin, table string) {
	ctx := context.Background()
	_, err := sessions.TouchAt(ctx, "kept", mustTime("2026-03-01T09:15:00Z"))
	must(t, err)
	st, err := sessions.Status(ctx)
	must(t, err)
	equal(t, "sessions' status before the flush", st.Pending, 1)

	equal(t, "Expired", sessionKeys(t, db.Model(&lastseen.Session{}).Scopes(lastseen.Expired)), "exp,idle,kept")
	equal(t, "Expired on db.Table", sessionKeys(t, db.Table(table).Scopes(lastseen.Expired)), "exp,idle,kept")
	ec, err := sessions.ExpiredSessions(ctx)
	must(t, err)
	equal(t, "ExpiredSessions", expiredCount(ec), "expired=2 kept=1 oldest=2026-03-01T09:10:00Z cutoff=2026-03-01T09:30:00Z")
	ec, err = users.ExpiredSessions(ctx) // the users plugin: expiry alone
	must(t, err)
	equal(t, "users plugin's ExpiredSessions", expiredCount(ec), "expired=1 kept=0 oldest=2026-03-01T09:10:00Z cutoff=2026-03-01T09:30:00Z")

	res, err := sessions.PurgeExpiredSessions(ctx)
	must(t, err)
	equal(t, "purge", fmt.Sprintf("deleted=%d batches=%d cutoff=%s", res.Deleted, res.Batches, res.Cutoff.Format(time.RFC3339)), "deleted=2 batches=1 cutoff=2026-03-01T09:30:00Z")
	equal(t, "left after the purge", sessionKeys(t, db.Model(&lastseen.Session{})), "kept,live")

	stmts.count() // forget the statements so far
	fr, err := sessions.Flush(ctx)
	must(t, err)
	equal(t, "sessions' flush", fmt.Sprintf("drained=%d written=%d", fr.Drained, fr.Written), "drained=1 written=1")
	if db.Dialector.Name() == "mysql" { // the string key is cast to its column's collation, read from the catalog
		stmts.mu.Lock()
		casts := 0
		for _, s := range stmts.sql {
			if hasVerb(s, "UPDATE") && strings.Contains(s, "CAST('kept' AS CHAR CHARACTER SET ") && strings.Contains(s, ") COLLATE ") {
				casts++
			}
		}
		stmts.mu.Unlock()
		equal(t, "flush UPDATEs cast to the key's collation", casts, 1)
	}
	st, err = sessions.Status(ctx)
	must(t, err)
	equal(t, "sessions' status after the flush", st.Pending, 0)
	equal(t, "kept's last_active_at", columnOf(t, db, &lastseen.Session{}, "LastActiveAt", "kept"), "2026-03-01T09:15:00Z")
	equal(t, "Expired after the flush", sessionKeys(t, db.Model(&lastseen.Session{}).Scopes(lastseen.Expired)), "")
}

// userValues loads the users of q as "id=last_seen_at" (UTC; empty for
// NULL), in q's order.
func userValues(t *testing.T, q *gorm.DB) string {
	t.Helper()
	var rows []lastseen.User
	must(t, q.Find(&rows).Error)
	out := make([]string, len(rows))
	for i, u := range rows {
		v := ""
		if u.LastSeenAt != nil {
			v = u.LastSeenAt.UTC().Format(time.RFC3339)
		}
		out[i] = fmt.Sprintf("%d=%s", u.ID, v)
	}
	return strings.Join(out, " ")
}

func expiredCount(ec lastseen.ExpiredCount) string {
	return fmt.Sprintf("expired=%d kept=%d oldest=%s cutoff=%s", ec.Expired, ec.Kept, ec.Oldest.Format(time.RFC3339), ec.Cutoff.Format(time.RFC3339))
}

// columnOf reads the time column of model's field (by its Go name, in
// db's naming) of the row with primary key id, as lastSeenColumn does.
func columnOf(t *testing.T, db *gorm.DB, model any, field string, id any) string {
	t.Helper()
	stmt := &gorm.Statement{DB: db}
	must(t, stmt.Parse(model))
	pk := clause.Column{Name: stmt.Schema.PrioritizedPrimaryField.DBName}
	var vs []sql.NullTime
	must(t, db.Model(model).Where("? = ?", pk, id).Pluck(stmt.Schema.LookUpField(field).DBName, &vs).Error)
	switch {
	case len(vs) == 0:
		return "missing"
	case !vs[0].Valid:
		return ""
	}
	return vs[0].Time.UTC().Format(time.RFC3339Nano)
}

// sessionKeys loads the sessions of q and returns their ids, sorted and
// joined by ",".
func sessionKeys(t *testing.T, q *gorm.DB) string {
	t.Helper()
	var rows []lastseen.Session
	must(t, q.Order(byKey).Find(&rows).Error)
	ids := make([]string, len(rows))
	for i, s := range rows {
		ids[i] = s.ID
	}
	return strings.Join(ids, ",")
}

// byKey orders by the primary key, whatever its column is named.
var byKey = clause.OrderByColumn{Column: clause.Column{Table: clause.CurrentTable, Name: clause.PrimaryKey}}

// TestPrepareStmtCacheKeepsNoFlushStatement, on every dialect with
// gorm.Config{PrepareStmt: true}: 30 flushes of 1 to 30 users each (every
// batch a new size, so a new statement text where the dialect lists the
// values) leave no statement of the plugin in GORM's prepared-statement
// cache: it holds exactly what it held after the app's own Create. Before
// (33 statements added on SQLite, 35 on MariaDB, 9 on PostgreSQL), on
// MariaDB every batch size was prepared and kept (GORM keeps them 24h and
// without a size limit by default), on each connection that ran it: the
// server's Prepared_stmt_count grew by 65 over 60 such flushes, toward
// max_prepared_stmt_count (16,382 by default), past which the server
// refuses every prepare, the app's own queries included.
func TestPrepareStmtCacheKeepsNoFlushStatement(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarnessWith(t, d, testenv.Miniredis(), func() *gorm.Config {
				c := &gorm.Config{PrepareStmt: true}
				c.Logger = testenv.Quiet().Logger
				return c
			})
			ctx := context.Background()
			cfg := h.config()
			cfg.Buffer.Shards = 1
			p, db := h.plugin(cfg)
			must(t, db.AutoMigrate(&lastseen.User{}))
			users := make([]lastseen.User, 465) // 1 + 2 + ... + 30
			for i := range users {
				users[i].ID = uint64(i + 1)
			}
			must(t, db.Create(&users).Error)
			ps, ok := db.ConnPool.(*gorm.PreparedStmtDB)
			if !ok {
				t.Fatalf("PrepareStmt: the handle's pool is %T", db.ConnPool)
			}
			cached := map[string]bool{}
			for _, q := range ps.Stmts.Keys() {
				cached[q] = true
			}
			next := 0
			for k := 1; k <= 30; k++ {
				for range k {
					next++
					_, err := p.TouchAt(ctx, next, h.clock.Now())
					must(t, err)
				}
				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, fmt.Sprint("flush ", k, ": written"), res.Written, k)
			}
			var added []string
			for _, q := range ps.Stmts.Keys() {
				if !cached[q] {
					added = append(added, q)
				}
			}
			equal(t, "statements the flushes added to the cache", strings.Join(added, "\n"), "")
			var n int64
			must(t, db.Model(&lastseen.User{}).Where("last_seen_at IS NOT NULL").Count(&n).Error)
			equal(t, "users written", n, 465)
		})
	}
}
