package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin on machines without a zoneinfo database

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	mysqldriver "gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

type (
	berlinUser struct {
		ID   int64 `gorm:"primaryKey;autoIncrement:false"`
		Seen *time.Time
	}
	berlinSession struct {
		ID        string `gorm:"primaryKey;size:64"`
		ExpiresAt time.Time
	}
)

func (berlinUser) TableName() string    { return "naive_users" }
func (berlinSession) TableName() string { return "naive_sessions" }

// naiveDDL creates the tables with a timestamp without time zone where the
// dialect has one (PostgreSQL timestamp, MySQL DATETIME); SQLite's text
// carries its offset.
var naiveDDL = map[string][]string{
	"postgres": {"CREATE TABLE naive_users (id bigint PRIMARY KEY, seen timestamp(6))",
		"CREATE TABLE naive_sessions (id varchar(64) PRIMARY KEY, expires_at timestamp(6) NOT NULL)"},
	"mysql": {"CREATE TABLE naive_users (id bigint PRIMARY KEY, seen datetime(6))",
		"CREATE TABLE naive_sessions (id varchar(64) PRIMARY KEY, expires_at datetime(6) NOT NULL)"},
	"sqlite": {"CREATE TABLE naive_users (id integer PRIMARY KEY, seen datetime)",
		"CREATE TABLE naive_sessions (id varchar(64) PRIMARY KEY, expires_at datetime NOT NULL)"},
}

// TestNaiveColumnLocation: with ColumnLocation Europe/Berlin, a naive
// timestamp column (PostgreSQL timestamp, MySQL DATETIME) holds Berlin wall
// times: the flush writes 09:20:00.75Z as 10:20:00.75, the forward-only
// guard compares wall times in Berlin, SeenWithin, LastSeen, the Expired
// scope and the purge read them so, and a MySQL app reading with
// loc=Europe/Berlin sees the exact instant. On SQLite (no naive type) the
// text keeps its offset and reads the same instants.
func TestNaiveColumnLocation(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		for _, ddl := range naiveDDL[h.dialect] {
			must(t, h.db.Exec(ddl).Error)
		}
		seed := func(at string) string { // 2026-03-01 at UTC, as the column holds it
			if h.dialect == "sqlite" {
				return "2026-03-01 " + at + "+00:00"
			}
			return mustTime("2026-03-01T" + at + "Z").In(berlin).Format("2006-01-02 15:04:05")
		}
		must(t, h.db.Exec("INSERT INTO naive_users (id, seen) VALUES (1, ?), (2, NULL), (3, ?)", seed("09:00:00"), seed("09:10:00")).Error)
		must(t, h.db.Exec("INSERT INTO naive_sessions (id, expires_at) VALUES ('a', ?), ('b', ?)", seed("09:29:59"), seed("09:30:01")).Error)
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Model, cfg.Flush.ColumnLocation = &berlinUser{}, "Seen", &berlinSession{}, berlin
		p, db := h.plugin(cfg)
		equal(t, "naive", usersNaive(p), h.dialect != "sqlite")

		touches := map[int64]string{1: "2026-03-01T09:20:00.75Z", 2: "2026-03-01T09:25:00Z", 3: "2026-03-01T09:05:00Z"}
		for id, at := range touches {
			_, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "flush", fmt.Sprintf("written %d stale %d", res.Written, res.Stale), "written 2 stale 1")
		if wall := map[string]string{"postgres": "to_char(seen, 'YYYY-MM-DD HH24:MI:SS.US')",
			"mysql": "DATE_FORMAT(seen, '%Y-%m-%d %H:%i:%s.%f')"}[h.dialect]; wall != "" {
			var got []string
			must(t, db.Raw("SELECT "+wall+" FROM naive_users ORDER BY id").Scan(&got).Error)
			equal(t, "wall times", strings.Join(got, ", "),
				"2026-03-01 10:20:00.750000, 2026-03-01 10:25:00.000000, 2026-03-01 10:10:00.000000")
		}

		db.Config.NowFunc = func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
		var ids []int64
		must(t, db.Model(&berlinUser{}).Scopes(lastseen.SeenWithin(10*time.Minute)).Order("id").Pluck("id", &ids).Error)
		equal(t, "SeenWithin(10m)", fmt.Sprint(ids), "[1 2]")
		for id, want := range map[int64]string{1: "2026-03-01T09:20:00.75Z", 3: "2026-03-01T09:10:00Z"} {
			at, _, err := p.LastSeen(ctx, id)
			must(t, err)
			equal(t, fmt.Sprintf("LastSeen(%d)", id), at.Format(time.RFC3339Nano), want)
		}
		equal(t, "Expired", pluck(t, db.Model(&berlinSession{}).Scopes(lastseen.Expired), "id"), "a")
		h.clock.Set(mustTime("2026-03-01T09:30:00Z"))
		pr, err := p.PurgeExpiredSessions(ctx)
		must(t, err)
		equal(t, "purged", pr.Deleted, 1)

		if h.dialect == "mysql" { // the app's own handle, reading in Berlin
			dsn := h.db.Dialector.(*mysqldriver.Dialector).DSN + "&loc=Europe%2FBerlin"
			app, err := gorm.Open(mysqldriver.Open(dsn), quietGorm())
			must(t, err)
			t.Cleanup(func() { testenv.CloseDB(app) })
			var u berlinUser
			must(t, app.First(&u, 1).Error)
			equal(t, "app reads (loc=Europe/Berlin)", u.Seen.UTC().Format(time.RFC3339Nano), "2026-03-01T09:20:00.75Z")
		}
	})
}

// TestNaiveColumnFollowsNowFunc: with ColumnLocation nil and GORM's NowFunc
// in Europe/Berlin (an app run with TZ=Europe/Berlin), the flush writes a
// PostgreSQL naive timestamp as Berlin wall time, as pgx writes the app's
// own GORM times beside it, and reads it back as the same instant; MySQL's
// driver converts every value to the DSN's loc (UTC here), so its column
// keeps UTC wall times, as the app's own do. The buffer's manifest names
// the zone on PostgreSQL, for the operator tools.
func TestNaiveColumnFollowsNowFunc(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		for _, ddl := range naiveDDL[h.dialect] {
			must(t, h.db.Exec(ddl).Error)
		}
		db := h.openDB()
		db.Config.NowFunc = func() time.Time { return time.Now().In(berlin) }
		must(t, db.Create(&[]berlinUser{{ID: 1}, {ID: 2, Seen: ptr(mustTime("2026-03-01T09:00:00Z").In(berlin))}}).Error) // the app's own write
		cfg := h.config()
		cfg.Model, cfg.Field, cfg.Sessions.Model = &berlinUser{}, "Seen", &berlinSession{}
		p := lastseen.New(cfg)
		must(t, db.Use(p))
		t.Cleanup(func() { _ = p.Close(context.Background()) })
		_, err := p.TouchAt(ctx, int64(1), mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		_, err = p.Flush(ctx)
		must(t, err)
		// The operator tools flush as the app does: its manifest names the zone.
		loc, err := h.r.Client.HGet(ctx, h.prefix+":manifest", "location").Result()
		must(t, err)
		equal(t, "manifest location", loc, map[string]string{"postgres": "Europe/Berlin"}[h.dialect])
		if wall := map[string]string{"postgres": "to_char(seen, 'YYYY-MM-DD HH24:MI:SS')",
			"mysql": "DATE_FORMAT(seen, '%Y-%m-%d %H:%i:%s')"}[h.dialect]; wall != "" {
			var got []string
			must(t, db.Raw("SELECT "+wall+" FROM naive_users ORDER BY id").Scan(&got).Error)
			equal(t, "wall times (lastseen's, the app's)", strings.Join(got, ", "), map[string]string{
				"postgres": "2026-03-01 10:20:00, 2026-03-01 10:00:00", "mysql": "2026-03-01 09:20:00, 2026-03-01 09:00:00"}[h.dialect])
		}
		at, _, err := p.LastSeen(ctx, int64(1))
		must(t, err)
		equal(t, "LastSeen(1)", at.UTC().Format(time.RFC3339), "2026-03-01T09:20:00Z")
	})
}

// TestNaiveColumnDSTFallBack: a naive column holding Europe/Berlin wall
// times across the night of 2026-10-25, when 03:00 CEST goes back to 02:00
// CET (01:00Z) and the walls 02:00 to 02:59 come twice. PostgreSQL: the
// app's GORM NowFunc is in Berlin (an app run with TZ=Europe/Berlin);
// MariaDB: the app's DSN has loc=Europe/Berlin (its server has no time
// zone tables).
//   - User 1 seen at 02:50 CEST (00:50Z), then 20 minutes later at 02:10
//     CET (01:10Z). PostgreSQL compares instants (AT TIME ZONE, the stored
//     02:50 taken for its first pass): written, the column holds 02:10.
//     Before, the second touch was counted Stale and 02:50 stayed, read as
//     40 minutes in the future. MariaDB cannot convert: the entry is left
//     unwritten but counted Ambiguous (1 in the result and in Stats), not
//     Stale.
//   - User 2 seen at 02:10 CET (01:10Z), then a late touch of 02:55 CEST
//     (00:55Z, 15 minutes earlier in real time) arrives: both dialects write
//     it (02:10 may have been its first pass), the documented cost of
//     writing the later touch in the other order.
//   - User 1 at 03:05 CET (02:05Z), after the repeated hour: written on both.
func TestNaiveColumnDSTFallBack(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, testenv.Miniredis())
			ctx := context.Background()
			for _, ddl := range naiveDDL[h.dialect] {
				must(t, h.db.Exec(ddl).Error)
			}
			must(t, h.db.Exec("INSERT INTO naive_users (id, seen) VALUES (1, NULL), (2, NULL)").Error)
			var db *gorm.DB
			if h.dialect == "mysql" {
				var err error
				db, err = gorm.Open(mysqldriver.Open(h.db.Dialector.(*mysqldriver.Dialector).DSN+"&loc=Europe%2FBerlin"), quietGorm())
				must(t, err)
				t.Cleanup(func() { testenv.CloseDB(db) })
			} else {
				db = h.openDB()
				db.Config.NowFunc = func() time.Time { return time.Now().In(berlin) }
			}
			h.clock.Set(mustTime("2026-10-25T00:50:00Z"))
			cfg := h.config()
			cfg.Model, cfg.Field, cfg.Sessions.Model = &berlinUser{}, "Seen", &berlinSession{}
			p := lastseen.New(cfg)
			must(t, db.Use(p))
			t.Cleanup(func() { _ = p.Close(context.Background()) })
			walls := func() string {
				t.Helper()
				q := map[string]string{"postgres": "to_char(seen, 'HH24:MI')", "mysql": "DATE_FORMAT(seen, '%H:%i')"}[h.dialect]
				var got []string
				must(t, h.db.Raw("SELECT COALESCE("+q+", 'NULL') FROM naive_users ORDER BY id").Scan(&got).Error)
				return strings.Join(got, " ")
			}
			touch := func(id int64, at string) {
				t.Helper()
				ok, err := p.TouchAt(ctx, id, mustTime(at))
				must(t, err)
				equal(t, fmt.Sprintf("touch %d at %s recorded", id, at), ok, true)
			}
			flush := func(what string, want [4]int) {
				t.Helper()
				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, what+": written, stale, unknown, ambiguous", [4]int{res.Written, res.Stale, res.Unknown, res.Ambiguous}, want)
			}

			touch(1, "2026-10-25T00:50:00Z")
			flush("02:50 CEST", [4]int{1, 0, 0, 0})
			equal(t, "walls after 02:50 CEST", walls(), "02:50 NULL")

			h.expireThrottle(20 * time.Minute)
			touch(1, "2026-10-25T01:10:00Z")
			touch(2, "2026-10-25T01:10:00Z")
			if h.dialect == "postgres" {
				flush("02:10 CET", [4]int{2, 0, 0, 0})
				equal(t, "walls after 02:10 CET", walls(), "02:10 02:10")
			} else {
				flush("02:10 CET", [4]int{1, 0, 0, 1})
				equal(t, "walls after 02:10 CET", walls(), "02:50 02:10")
			}
			equal(t, "Stats.Ambiguous", p.Stats().Ambiguous, map[string]int64{"postgres": 0, "mysql": 1}[h.dialect])

			h.expireThrottle(10 * time.Minute)
			touch(2, "2026-10-25T00:55:00Z") // late: 15 minutes before its 01:10Z
			flush("a late 02:55 CEST", [4]int{1, 0, 0, 0})

			h.expireThrottle(45 * time.Minute)
			touch(1, "2026-10-25T02:05:00Z")
			flush("03:05 CET", [4]int{1, 0, 0, 0})
			equal(t, "walls at the end", walls(), "03:05 02:55")
			st := p.Stats()
			equal(t, "Stats written, stale", [2]int64{st.RowsWritten, st.Stale}, map[string][2]int64{"postgres": {5, 0}, "mysql": {4, 0}}[h.dialect])
		})
	}
}

// TestNaiveColumnCreatedAfterUse: the app registers the plugin before it
// creates its table (as apps that migrate after db.Use do), with GORM's
// NowFunc in Europe/Berlin, and writes its own 09:00Z into the naive
// PostgreSQL column (pgx: the wall time 10:00). LastSeen before any flush
// or purge reads 09:00Z: the read checks the table first, as the flush
// does, and learns that the column is naive. Before, the column was taken
// for timestamptz until the first flush or purge and LastSeen read 10:00Z,
// an hour late. (The flush and the purge check the table before they write
// or delete, so neither ever misfiled a value; the scopes, which run inside
// the app's own statements, learn it at the first flush or purge.)
func TestNaiveColumnCreatedAfterUse(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	h := newHarness(t, servers.Postgres(), testenv.Miniredis())
	ctx := context.Background()
	db := h.openDB()
	db.Config.NowFunc = func() time.Time { return time.Now().In(berlin) }
	cfg := h.config()
	cfg.Model, cfg.Field, cfg.Sessions.Model = &berlinUser{}, "Seen", &berlinSession{}
	p := lastseen.New(cfg)
	must(t, db.Use(p))
	t.Cleanup(func() { _ = p.Close(context.Background()) })
	for _, ddl := range naiveDDL["postgres"] {
		must(t, h.db.Exec(ddl).Error)
	}
	must(t, db.Create(&berlinUser{ID: 1, Seen: ptr(mustTime("2026-03-01T09:00:00Z").In(berlin))}).Error)
	var wall string
	must(t, h.db.Raw("SELECT to_char(seen, 'HH24:MI') FROM naive_users WHERE id = 1").Scan(&wall).Error)
	equal(t, "the app's wall time", wall, "10:00")
	at, ok, err := p.LastSeen(ctx, int64(1))
	must(t, err)
	equal(t, "LastSeen(1) before any flush", at.UTC().Format(time.RFC3339)+map[bool]string{true: " ok"}[ok], "2026-03-01T09:00:00Z ok")
	many, err := p.LastSeenMany(ctx, []any{int64(1)})
	must(t, err)
	equal(t, "LastSeenMany", many[0].UTC().Format(time.RFC3339), "2026-03-01T09:00:00Z")
}

// TestManifestNamesLocalZone: an app run with TZ=Europe/Berlin and GORM's
// default NowFunc (time.Local) writes a PostgreSQL naive timestamp as
// Berlin wall time; its buffer's manifest names that zone, so that an
// operator command run elsewhere (in UTC) flushes as the app does. Before,
// the manifest named no zone, and such a flush compared UTC wall times with
// Berlin ones: a touch an hour older than the column's Berlin wall time
// was counted Stale and lost. The app runs as a child process, since
// time.Local is fixed at a process's start.
func TestManifestNamesLocalZone(t *testing.T) {
	const envChild = "LASTSEEN_LOCAL_ZONE_CHILD"
	if prefix := os.Getenv(envChild); prefix != "" { // the app
		db, err := gorm.Open(postgres.Open(os.Getenv(testenv.EnvPostgres)), &gorm.Config{})
		must(t, err)
		rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(testenv.EnvRedis)})
		defer rdb.Close()
		p := lastseen.New(lastseen.Config{Redis: rdb, Buffer: lastseen.BufferConfig{Prefix: prefix},
			Flush: lastseen.FlushConfig{Schedule: "off"}, Sessions: lastseen.SessionConfig{Schedule: "off"}})
		must(t, db.Use(p))
		must(t, p.Close(context.Background()))
		return
	}
	dsn, addr := testenv.Need(t, testenv.EnvPostgres), testenv.Need(t, testenv.EnvRedis)
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	cases := []struct{ tz, want string }{{"Europe/Berlin", "Europe/Berlin"}, {":Asia/Tokyo", "Asia/Tokyo"}, {"UTC", ""}}
	if _, err := os.Stat("/usr/share/zoneinfo/America/New_York"); err == nil { // Go names such a local zone by its path
		cases = append(cases, struct{ tz, want string }{"/usr/share/zoneinfo/America/New_York", "America/New_York"})
	}
	for _, c := range cases {
		prefix := testenv.RandomName("localzone")
		t.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), rdb, prefix+"*") })
		cmd := exec.Command(os.Args[0], "-test.run=^TestManifestNamesLocalZone$", "-test.count=1")
		cmd.Env = append(os.Environ(), "TZ="+c.tz, envChild+"="+prefix, testenv.EnvPostgres+"="+dsn, testenv.EnvRedis+"="+addr)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("TZ=%s: the app: %v\n%s", c.tz, err, out)
		}
		loc, err := rdb.HGet(context.Background(), prefix+":manifest", "location").Result()
		must(t, err)
		equal(t, "manifest location with TZ="+c.tz, loc, c.want)
	}
}
