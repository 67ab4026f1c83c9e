package tests

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	mysqldrv "github.com/go-sql-driver/mysql"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
)

// plainSession is an app's session model on a handle without the plugin.
type plainSession struct {
	ID        string    `gorm:"primaryKey;size:64"`
	ExpiresAt time.Time `gorm:"not null"`
}

// sessionGrant has an expires_at column of its own, to join with sessions.
type sessionGrant struct {
	ID        uint      `gorm:"primaryKey"`
	SessionID string    `gorm:"size:64;not null"`
	ExpiresAt time.Time `gorm:"not null"`
}

// pluck runs q and returns the sorted ids, joined with ",".
func pluck(t testing.TB, q *gorm.DB, col string) string {
	t.Helper()
	var ids []string
	must(t, q.Pluck(col, &ids).Error)
	slices.Sort(ids)
	return strings.Join(ids, ",")
}

// TestExpiredScopeWithoutPlugin: the scopes work on a handle where the
// plugin is not registered, on the default column expires_at, against the
// handle's NowFunc; an expiry equal to now is expired.
func TestExpiredScopeWithoutPlugin(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		db := h.db
		now := mustTime("2026-03-01T12:00:00Z")
		db.Config.NowFunc = func() time.Time { return now.Local() }
		must(t, db.AutoMigrate(&plainSession{}))
		must(t, db.Create(&[]plainSession{
			{"a", mustTime("2026-03-01T11:59:59Z")}, {"b", now}, {"c", mustTime("2026-03-01T12:00:01Z")},
			{"d", mustTime("2026-02-01T00:00:00Z")},
		}).Error)
		m := db.Model(&plainSession{}).Session(&gorm.Session{}) // reusable: each query starts from here
		equal(t, "Expired", pluck(t, m.Scopes(lastseen.Expired), "id"), "a,b,d")
		equal(t, "ExpiredAt(now - 1s)", pluck(t, m.Scopes(lastseen.ExpiredAt(now.Add(-time.Second))), "id"), "a,d")
		equal(t, "ExpiredAt(now in -03:00)", pluck(t, m.Scopes(lastseen.ExpiredAt(now.In(time.FixedZone("-03:00", -3*3600)))), "id"), "a,b,d")
		equal(t, "ExpiredAt(2026-01-01)", pluck(t, m.Scopes(lastseen.ExpiredAt(mustTime("2026-01-01T00:00:00Z"))), "id"), "")
		db.Config.NowFunc = func() time.Time { return mustTime("2026-03-01T12:00:01Z") }
		equal(t, "Expired one second later", pluck(t, db.Model(&plainSession{}).Scopes(lastseen.Expired), "id"), "a,b,c,d")
	})
}

// TestExpiredScopeQualified: the scope qualifies the expiry column with the
// query's table, so a join with another table that has an expires_at
// column is neither ambiguous nor compared on the wrong table.
func TestExpiredScopeQualified(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		_, db := h.plugin(h.config())
		db.Config.NowFunc = h.clock.Now // 2026-03-01T09:30:00Z
		seedSessions(t, db, sess("a", "2026-03-01T09:00:00Z"), sess("b", "2026-03-01T10:00:00Z"), sess("c", "2026-03-01T09:10:00Z"))
		must(t, db.AutoMigrate(&sessionGrant{}))
		must(t, db.Create(&[]sessionGrant{ // each grant expires the other way round from its session
			{SessionID: "a", ExpiresAt: mustTime("2026-03-01T11:00:00Z")},
			{SessionID: "b", ExpiresAt: mustTime("2026-03-01T08:00:00Z")},
		}).Error)
		q := db.Model(&lastseen.Session{}).Joins("JOIN session_grants ON session_grants.session_id = sessions.id").Scopes(lastseen.Expired)
		equal(t, "expired sessions with a grant", pluck(t, q, "sessions.id"), "a")
		q = db.Model(&sessionGrant{}).Joins("JOIN sessions ON sessions.id = session_grants.session_id").Scopes(lastseen.Expired)
		equal(t, "expired grants", pluck(t, q, "session_grants.session_id"), "b")
	})
}

// The time-zone test runs in child processes started with TZ set, so the
// process's local zone is far from UTC from its first instruction, without
// changing time.Local under other tests.
const tzChildEnv = "LASTSEEN_TZ_CHILD"

var tzZones = map[string]int{ // zone: UTC offset on 2026-03-01, seconds
	"Pacific/Kiritimati": 14 * 3600,
	"America/Adak":       -10 * 3600,
}

// TestExpiredTimeZones: with the process time zone at +14:00 and at
// -10:00, rows expiring one second before, at and one second after the
// cutoff are told apart by the scopes, Session.Expired, ExpiredSessions and
// the purge, on PostgreSQL timestamptz and timestamp (which holds UTC, as
// ColumnLocation says),
// MySQL/MariaDB DATETIME under loc=UTC and loc=Local, and SQLite text
// written with any offset.
func TestExpiredTimeZones(t *testing.T) {
	if zone := os.Getenv(tzChildEnv); zone != "" {
		expiredTimeZonesChild(t, zone)
		return
	}
	for _, zone := range []string{"Pacific/Kiritimati", "America/Adak"} {
		for _, d := range servers.Dialects() {
			t.Run(zone+"/"+d.Name, func(t *testing.T) {
				switch d.Name {
				case "postgres":
					testenv.Need(t, testenv.EnvPostgres)
				case "mysql":
					testenv.Need(t, testenv.EnvMySQL)
				}
				cmd := exec.CommandContext(t.Context(), os.Args[0],
					"-test.run=^TestExpiredTimeZones$/^"+d.Name+"$", "-test.count=1", "-test.v")
				cmd.Env = append(os.Environ(), "TZ="+zone, tzChildEnv+"="+zone)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("child with TZ=%s: %v\n%s", zone, err, out)
				}
				if !bytes.Contains(out, []byte("--- PASS: TestExpiredTimeZones/"+d.Name+" (")) {
					t.Fatalf("child with TZ=%s did not run the %s checks:\n%s", zone, d.Name, out)
				}
			})
		}
	}
}

// naiveSession keeps its expiry in a PostgreSQL timestamp (without time
// zone) column, which holds UTC wall times (Flush.ColumnLocation UTC).
type naiveSession struct {
	ID        string    `gorm:"primaryKey;size:64"`
	UserID    uint64    `gorm:"not null"`
	ExpiresAt time.Time `gorm:"type:timestamp;index;not null"`
}

func (naiveSession) TableName() string { return "naive_sessions" }

// textSession keeps its expiry in a SQLite column declared TEXT, which
// the driver returns as text.
type textSession struct {
	ID        string    `gorm:"primaryKey;size:64"`
	UserID    uint64    `gorm:"not null"`
	ExpiresAt time.Time `gorm:"type:text;index;not null"`
}

func (textSession) TableName() string { return "text_sessions" }

// tzVariant is one way a dialect stores expiries.
type tzVariant struct {
	name  string
	model any
	table string
	// handle opens the database handle (nil: the harness's).
	handle func(t *testing.T, h *harness) *gorm.DB
	// locs are the locations rows a, b and c are written in.
	locs [3]*time.Location
	// write creates one row.
	write func(db *gorm.DB, id string, at time.Time) error
	// castSQL reads the column as the database holds it; want is what it
	// should hold for a time written in loc. Empty castSQL skips the check.
	castSQL string
	want    func(at time.Time, loc *time.Location) string
	// text are rows SQLite gets as literal text, id: text.
	text map[string]string
	// expired and live are the ids the cutoff splits the rows into;
	// earlier are those expiring one second before the cutoff.
	expired, live, earlier string
}

func expiredTimeZonesChild(t *testing.T, zone string) {
	cutoff := mustTime("2026-03-01T12:00:00Z")
	if _, off := cutoff.Local().Zone(); off != tzZones[zone] {
		t.Fatalf("TZ=%s: local offset is %ds, want %ds", zone, off, tzZones[zone])
	}
	minus3 := time.FixedZone("-03:00", -3*3600)
	mixed := [3]*time.Location{time.Local, time.UTC, minus3}
	writeSession := func(db *gorm.DB, id string, at time.Time) error {
		return db.Create(&lastseen.Session{ID: id, UserID: 1, ExpiresAt: at, CreatedAt: at}).Error
	}
	inZone := func(at time.Time, name string, off int) string {
		return at.In(time.FixedZone(name, off)).Format("2006-01-02 15:04:05-07:00")
	}
	variants := map[string][]tzVariant{
		"postgres": {
			{name: "timestamptz", model: &lastseen.Session{}, table: "sessions", locs: mixed, write: writeSession,
				expired: "a,b", live: "c", earlier: "a"},
			{name: "timestamp", model: &naiveSession{}, table: "naive_sessions",
				locs: [3]*time.Location{time.UTC, time.UTC, time.UTC}, // the app writes UTC, and says so (ColumnLocation)
				write: func(db *gorm.DB, id string, at time.Time) error {
					return db.Create(&naiveSession{ID: id, UserID: 1, ExpiresAt: at}).Error
				},
				castSQL: "CAST(expires_at AS text)",
				want:    func(at time.Time, _ *time.Location) string { return at.UTC().Format("2006-01-02 15:04:05") },
				expired: "a,b", live: "c", earlier: "a"},
		},
		"mysql": {
			{name: "loc=UTC", model: &lastseen.Session{}, table: "sessions", locs: mixed, write: writeSession,
				handle:  func(t *testing.T, h *harness) *gorm.DB { return mysqlHandle(t, h, time.UTC, "loc=UTC") },
				castSQL: "CAST(expires_at AS CHAR)",
				want:    func(at time.Time, _ *time.Location) string { return at.UTC().Format("2006-01-02 15:04:05.000") },
				expired: "a,b", live: "c", earlier: "a"},
			{name: "loc=Local", model: &lastseen.Session{}, table: "sessions", locs: mixed, write: writeSession,
				handle:  func(t *testing.T, h *harness) *gorm.DB { return mysqlHandle(t, h, time.Local, "loc=Local") },
				castSQL: "CAST(expires_at AS CHAR)",
				want:    func(at time.Time, _ *time.Location) string { return at.Local().Format("2006-01-02 15:04:05.000") },
				expired: "a,b", live: "c", earlier: "a"},
		},
		"sqlite": {
			{name: "text", model: &lastseen.Session{}, table: "sessions", locs: mixed, write: writeSession,
				castSQL: "CAST(expires_at AS TEXT)",
				want: func(at time.Time, loc *time.Location) string {
					return at.In(loc).Format("2006-01-02 15:04:05-07:00")
				},
				text: map[string]string{
					"d": inZone(cutoff.Add(-time.Second), "+05:45", 5*3600+45*60), // 2026-03-01 17:44:59+05:45
					"e": inZone(cutoff.Add(time.Second), "-09:30", -(9*3600 + 30*60)),
					"f": cutoff.Format("2006-01-02T15:04:05Z"),
					"g": cutoff.Add(time.Second).In(time.FixedZone("+14", 14*3600)).Format(time.RFC3339),
				},
				expired: "a,b,d,f", live: "c,e,g", earlier: "a,d"},
			{name: "TEXT column", model: &textSession{}, table: "text_sessions", locs: mixed,
				write: func(db *gorm.DB, id string, at time.Time) error {
					return db.Create(&textSession{ID: id, UserID: 1, ExpiresAt: at}).Error
				},
				castSQL: "expires_at",
				want: func(at time.Time, loc *time.Location) string {
					return at.In(loc).Format("2006-01-02 15:04:05-07:00")
				},
				text: map[string]string{
					"d": inZone(cutoff.Add(-time.Second), "+05:45", 5*3600+45*60),
					"e": inZone(cutoff.Add(time.Second), "-09:30", -(9*3600 + 30*60)),
				},
				expired: "a,b,d", live: "c,e", earlier: "a,d"},
		},
	}
	instants := map[string]time.Time{
		"a": cutoff.Add(-time.Second), "b": cutoff, "c": cutoff.Add(time.Second),
		"d": cutoff.Add(-time.Second), "e": cutoff.Add(time.Second), "f": cutoff, "g": cutoff.Add(time.Second),
	}

	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, v := range variants[h.dialect] {
			t.Run(v.name, func(t *testing.T) {
				ctx := context.Background()
				h.clock.Set(cutoff)
				cfg := purgeConfig(h, 2)
				cfg.Sessions.Model = v.model
				if v.name == "timestamp" {
					cfg.Flush.ColumnLocation = time.UTC
				}
				var p *lastseen.Plugin
				var db *gorm.DB
				if v.handle == nil {
					p, db = h.plugin(cfg)
				} else {
					db = v.handle(t, h)
					p = lastseen.New(cfg)
					must(t, db.Use(p))
					t.Cleanup(func() { p.Close(context.Background()) })
				}
				db.Config.NowFunc = func() time.Time { return cutoff.Local() }
				must(t, db.Migrator().DropTable(v.model))
				must(t, db.AutoMigrate(v.model))
				for i, id := range []string{"a", "b", "c"} {
					must(t, v.write(db, id, instants[id].In(v.locs[i])))
				}
				for id, text := range v.text {
					must(t, db.Table(v.table).Create(map[string]any{"id": id, "user_id": 1, "expires_at": text}).Error)
				}
				if v.castSQL != "" {
					for i, id := range []string{"a", "b", "c"} {
						var raw string
						must(t, db.Raw("SELECT "+v.castSQL+" FROM "+v.table+" WHERE id = ?", id).Scan(&raw).Error)
						equal(t, "stored "+id, raw, v.want(instants[id], v.locs[i]))
					}
				}

				// Read back: every row is the instant written, and
				// Session.Expired agrees with the database.
				rows, err := db.Table(v.table).Select("id, expires_at").Order("id").Rows()
				must(t, err)
				var expired []string
				for rows.Next() {
					var id string
					var at columnTime // SQLite returns a TEXT column as text
					must(t, rows.Scan(&id, &at))
					if !at.Time.Equal(instants[id]) {
						t.Errorf("row %s reads back as %s, want %s", id, at.Time.Format(time.RFC3339), instants[id].Format(time.RFC3339))
					}
					if (lastseen.Session{ExpiresAt: at.Time}).Expired(cutoff, 0) {
						expired = append(expired, id)
					}
				}
				must(t, rows.Err())
				must(t, rows.Close())
				equal(t, "Session.Expired", strings.Join(expired, ","), v.expired)

				m := db.Model(v.model).Session(&gorm.Session{})
				equal(t, "Expired scope", pluck(t, m.Scopes(lastseen.Expired), "id"), v.expired)
				equal(t, "ExpiredAt(cutoff in -03:00)", pluck(t, m.Scopes(lastseen.ExpiredAt(cutoff.In(minus3))), "id"), v.expired)
				equal(t, "ExpiredAt(cutoff - 1s)", pluck(t, m.Scopes(lastseen.ExpiredAt(cutoff.Add(-time.Second).Local())), "id"), v.earlier)
				equal(t, "ExpiredAt(cutoff - 2s)", pluck(t, m.Scopes(lastseen.ExpiredAt(cutoff.Add(-2*time.Second))), "id"), "")

				ec, err := p.ExpiredSessions(ctx)

				count, oldest := ec.Expired, ec.Oldest
				must(t, err)
				equal(t, "dry-run count", count, int64(len(strings.Split(v.expired, ","))))
				equal(t, "dry-run oldest", oldest.Format(time.RFC3339), "2026-03-01T11:59:59Z")

				res, err := p.PurgeExpiredSessions(ctx)
				must(t, err)
				equal(t, "purge cutoff", res.Cutoff.Format(time.RFC3339), "2026-03-01T12:00:00Z")
				equal(t, "purged", res.Deleted, len(strings.Split(v.expired, ",")))
				equal(t, "rows left", tableIDs(t, db, v.table, "id"), v.live)
			})
		}
	})
}

// mysqlHandle opens the harness's MySQL database with the DSN parameter
// param added ("loc=UTC" or "loc=Local"), which must select loc.
func mysqlHandle(t *testing.T, h *harness, loc *time.Location, param string) *gorm.DB {
	t.Helper()
	var name string
	must(t, h.db.Raw("SELECT DATABASE()").Scan(&name).Error)
	c, err := mysqldrv.ParseDSN(os.Getenv(testenv.EnvMySQL))
	must(t, err)
	c.DBName, c.ParseTime = name, true
	dsn := c.FormatDSN()
	if strings.Contains(dsn, "?") {
		dsn += "&" + param
	} else {
		dsn += "?" + param
	}
	if c, err = mysqldrv.ParseDSN(dsn); err != nil || c.Loc != loc {
		t.Fatalf("DSN %q: loc %v, err %v; want loc %v", dsn, c.Loc, err, loc)
	}
	db, err := gorm.Open(gormmysql.Open(dsn), quietGorm())
	must(t, err)
	t.Cleanup(func() { testenv.CloseDB(db) })
	return db
}

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
