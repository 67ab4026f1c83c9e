package tests

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/utils/tests"
)

// App models of every kind the plugin supports: custom TableName, custom column,
// embedded gorm.Model, integer, string and UUID primary keys, time.Time and
// *time.Time last-seen fields.

type appAccount struct {
	ID    int64      `gorm:"primaryKey"`
	Email string     `gorm:"not null;size:190"`
	Seen  *time.Time `gorm:"column:seen"`
}

func (appAccount) TableName() string { return "app_accounts" }

type appMember struct {
	gorm.Model
	Name       string `gorm:"not null"`
	LastSeenAt *time.Time
}

type intPKUser struct {
	ID         int       `gorm:"primaryKey"`
	LastSeenAt time.Time `gorm:"not null"`
}

type int32PKUser struct {
	ID         int32     `gorm:"primaryKey"`
	LastActive time.Time `gorm:"column:last_active"`
}

type uintPKUser struct {
	ID         uint `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

type handleUser struct {
	Handle     string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

type collatedUser struct {
	ID         string `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

func (collatedUser) TableName() string { return "collated_users" }

type uuidPKUser struct {
	ID       uuid.UUID `gorm:"primaryKey"`
	LastSeen *time.Time
}

func (uuidPKUser) TableName() string { return "uuid_pk_users" }

type plainTSUser struct {
	ID     uint64 `gorm:"primaryKey"`
	SeenAt *time.Time
}

func (plainTSUser) TableName() string { return "plain_ts_users" }

// modelCase is one app model: how its table is made and seeded, and the ids
// to touch.
type modelCase struct {
	name           string
	model          any
	field          string // Field
	table, pk, col string
	ddl            map[string]string // CREATE TABLE per dialect; nil: AutoMigrate
	seed           string            // INSERT of the existing row, its id bound as ?
	existing       any               // the existing user's id, as the app passes it
	unknown        any               // an id with no row
	msOnMySQL      bool              // the MySQL column keeps milliseconds (GORM's datetime(3))
	initial        string            // the column's value after seeding, RFC3339Nano; "" for NULL
}

var u1 = uuid.MustParse("0b5d6f3c-8a8e-4f4e-9b1c-2f6f5d9a7e01")

var modelCases = []modelCase{
	{
		name: "custom table and column", model: &appAccount{}, field: "Seen",
		table: "app_accounts", pk: "id", col: "seen",
		seed: "INSERT INTO app_accounts (id, email) VALUES (?, 'a@x.test')", existing: 1, unknown: int64(2),
		msOnMySQL: true,
	},
	{
		name: "embedded gorm.Model", model: &appMember{}, field: "LastSeenAt",
		table: "app_members", pk: "id", col: "last_seen_at",
		seed: "INSERT INTO app_members (id, name) VALUES (?, 'M')", existing: uint(1), unknown: uint(2),
		msOnMySQL: true,
	},
	{
		name: "int key, time.Time NOT NULL", model: &intPKUser{}, field: "last_seen_at",
		table: "int_pk_users", pk: "id", col: "last_seen_at",
		ddl: map[string]string{
			"postgres": "CREATE TABLE int_pk_users (id integer PRIMARY KEY, last_seen_at timestamptz NOT NULL DEFAULT '0001-01-01 00:00:00+00')",
			"mysql":    "CREATE TABLE int_pk_users (id int PRIMARY KEY, last_seen_at DATETIME(6) NOT NULL DEFAULT '1000-01-01 00:00:00')",
			"sqlite":   "CREATE TABLE int_pk_users (id integer PRIMARY KEY, last_seen_at datetime NOT NULL DEFAULT '0001-01-01 00:00:00+00:00')",
		},
		seed: "INSERT INTO int_pk_users (id) VALUES (?)", existing: 1, unknown: 2,
		initial: "0001-01-01T00:00:00Z",
	},
	{
		name: "int32 key, time.Time from GORM's zero", model: &int32PKUser{}, field: "LastActive",
		table: "int32_pk_users", pk: "id", col: "last_active",
		seed: "", existing: int32(1), unknown: int32(2), msOnMySQL: true,
		initial: "0001-01-01T00:00:00Z",
	},
	{
		name: "uint key", model: &uintPKUser{}, field: "LastSeenAt",
		table: "uint_pk_users", pk: "id", col: "last_seen_at",
		seed: "INSERT INTO uint_pk_users (id) VALUES (?)", existing: uint64(1), unknown: uint32(2), msOnMySQL: true,
	},
	{
		name: "default User, uint64 key", model: &lastseen.User{}, field: "LastSeenAt",
		table: "users", pk: "id", col: "last_seen_at",
		seed: "INSERT INTO users (id) VALUES (?)", existing: uint64(1), unknown: 2, msOnMySQL: true,
	},
	{
		name: "string key", model: &handleUser{}, field: "LastSeenAt",
		table: "handle_users", pk: "handle", col: "last_seen_at",
		seed: "INSERT INTO handle_users (handle) VALUES (?)", existing: "alice", unknown: "bob", msOnMySQL: true,
	},
	{
		name: "string key, collation other than the connection's", model: &collatedUser{}, field: "LastSeenAt",
		table: "collated_users", pk: "id", col: "last_seen_at",
		ddl: map[string]string{
			"postgres": `CREATE TABLE collated_users (id varchar(64) COLLATE "C" PRIMARY KEY, last_seen_at timestamptz)`,
			"mysql":    "CREATE TABLE collated_users (id VARCHAR(64) CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci PRIMARY KEY, last_seen_at DATETIME(6) NULL)",
			"sqlite":   "CREATE TABLE collated_users (id text COLLATE NOCASE PRIMARY KEY, last_seen_at datetime)",
		},
		seed: "INSERT INTO collated_users (id) VALUES (?)", existing: "Zoë", unknown: "zoe-2",
	},
	{
		name: "UUID key", model: &uuidPKUser{}, field: "LastSeen",
		table: "uuid_pk_users", pk: "id", col: "last_seen",
		ddl: map[string]string{
			"postgres": "CREATE TABLE uuid_pk_users (id uuid PRIMARY KEY, last_seen timestamptz)",
			"mysql":    "CREATE TABLE uuid_pk_users (id CHAR(36) PRIMARY KEY, last_seen DATETIME(6) NULL)",
			"sqlite":   "CREATE TABLE uuid_pk_users (id text PRIMARY KEY, last_seen datetime)",
		},
		seed: "INSERT INTO uuid_pk_users (id) VALUES (?)", existing: u1, unknown: uuid.MustParse("0b5d6f3c-8a8e-4f4e-9b1c-2f6f5d9a7e02"),
	},
	{
		name: "timestamp without time zone / TIMESTAMP / TIMESTAMPTZ text", model: &plainTSUser{}, field: "SeenAt",
		table: "plain_ts_users", pk: "id", col: "seen_at",
		ddl: map[string]string{
			"postgres": "CREATE TABLE plain_ts_users (id bigint PRIMARY KEY, seen_at timestamp)",
			"mysql":    "CREATE TABLE plain_ts_users (id BIGINT UNSIGNED PRIMARY KEY, seen_at TIMESTAMP(6) NULL)",
			"sqlite":   "CREATE TABLE plain_ts_users (id integer PRIMARY KEY, seen_at TIMESTAMPTZ)",
		},
		seed: "INSERT INTO plain_ts_users (id) VALUES (?)", existing: 1, unknown: 2,
	},
}

// readColumn reads one row's time column as RFC3339Nano UTC, "" for NULL,
// "missing" for no row, whatever the driver returns for the column type
// (SQLite gives text for a column not declared DATETIME or TIMESTAMP).
func readColumn(t testing.TB, db *gorm.DB, table, pk, col string, id any) string {
	t.Helper()
	rows, err := db.Table(table).Select(col).Where(pk+" = ?", id).Rows()
	must(t, err)
	defer rows.Close()
	if !rows.Next() {
		must(t, rows.Err())
		return "missing"
	}
	var v any
	must(t, rows.Scan(&v))
	switch v := v.(type) {
	case nil:
		return ""
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case []byte, string:
		s := fmt.Sprint(v)
		if b, ok := v.([]byte); ok {
			s = string(b)
		}
		for _, layout := range []string{"2006-01-02 15:04:05.999999999-07:00", time.RFC3339Nano, "2006-01-02 15:04:05.999999999"} {
			if ts, err := time.Parse(layout, s); err == nil {
				return ts.UTC().Format(time.RFC3339Nano)
			}
		}
		t.Fatalf("%s.%s: cannot read %q as a time", table, col, s)
	}
	t.Fatalf("%s.%s: unexpected %T", table, col, v)
	return ""
}

// TestAppModels runs every app model on every dialect: touch, flush, exact
// column value, LastSeen, unknown ids, and the newer-only guard.
func TestAppModels(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for i, c := range modelCases {
			t.Run(c.name, func(t *testing.T) {
				ctx := context.Background()
				cfg := h.config()
				cfg.Buffer.Prefix = fmt.Sprintf("%s:m%d", h.prefix, i) // markers of one case do not throttle the next
				cfg.Model = c.model
				cfg.Field = c.field
				cfg.Throttle = time.Minute
				cfg.Buffer.Shards = 1
				p, db := h.plugin(cfg)
				if ddl := c.ddl[h.dialect]; ddl != "" {
					must(t, db.Exec(ddl).Error)
				} else {
					must(t, db.AutoMigrate(c.model))
				}
				if c.seed != "" {
					must(t, db.Exec(c.seed, c.existing).Error)
				} else { // through GORM, with the zero time.Time
					must(t, db.Create(&int32PKUser{ID: 1}).Error)
				}
				prec := time.Microsecond
				if h.dialect == "mysql" && c.msOnMySQL {
					prec = time.Millisecond
				}
				column := func() string { return readColumn(t, db, c.table, c.pk, c.col, c.existing) }
				initial := c.initial
				if h.dialect == "mysql" && initial != "" && c.seed != "" {
					initial = "1000-01-01T00:00:00Z" // MySQL's DATETIME starts at year 1000
				}
				equal(t, "column after seeding", column(), initial)
				last, ok, err := p.LastSeen(ctx, c.existing)
				must(t, err)
				if initial == "" || initial == "0001-01-01T00:00:00Z" {
					equal(t, "LastSeen before any touch ok", ok, false)
				} else {
					equal(t, "LastSeen before any touch", last.Format(time.RFC3339Nano), initial)
				}

				t1 := mustTime("2026-03-01T10:00:00.123456Z")
				for _, id := range []any{c.existing, c.unknown} {
					ok, err := p.TouchAt(ctx, id, t1)
					must(t, err)
					equal(t, fmt.Sprintf("touch %v recorded", id), ok, true)
				}
				last, ok, err = p.LastSeen(ctx, c.existing)
				must(t, err)
				equal(t, "LastSeen before the flush", last.Format(time.RFC3339Nano), t1.Format(time.RFC3339Nano))

				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, "drained", res.Drained, 2)
				equal(t, "written", res.Written, 1)
				equal(t, "unknown", res.Unknown, 1)
				equal(t, "rejected", res.Rejected, 0)
				want := t1.Truncate(prec).Format(time.RFC3339Nano)
				equal(t, "column", column(), want)
				equal(t, "unknown row", readColumn(t, db, c.table, c.pk, c.col, c.unknown), "missing")
				last, ok, err = p.LastSeen(ctx, c.existing)
				must(t, err)
				equal(t, "LastSeen ok", ok, true)
				equal(t, "LastSeen", last.Format(time.RFC3339Nano), want)
				_, ok, err = p.LastSeen(ctx, c.unknown)
				must(t, err)
				equal(t, "LastSeen of the unknown user ok", ok, false)

				h.expireThrottle(time.Minute)
				_, err = p.TouchAt(ctx, c.existing, mustTime("2026-03-01T09:59:00Z"))
				must(t, err)
				res, err = p.Flush(ctx)
				must(t, err)
				equal(t, "older: written", res.Written, 0)
				equal(t, "older: stale", res.Stale, 1)
				equal(t, "column after an older touch", column(), want)

				h.expireThrottle(time.Minute)
				_, err = p.TouchAt(ctx, c.existing, mustTime("2026-03-01T10:01:00.5Z"))
				must(t, err)
				res, err = p.Flush(ctx)
				must(t, err)
				equal(t, "newer: written", res.Written, 1)
				equal(t, "column after a newer touch", column(), "2026-03-01T10:01:00.5Z")
				equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
			})
		}
	})
}

type compositeUser struct {
	TenantID   int64 `gorm:"primaryKey"`
	UserID     int64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

type noKeyUser struct {
	Name       string
	LastSeenAt *time.Time
}

type floatUser struct {
	ID         float64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

type stringTimeUser struct {
	ID         uint64 `gorm:"primaryKey"`
	LastSeenAt string
}

// TestInitializeValidation: every configuration problem Initialize can see
// is an error wrapping ErrInvalidConfig that names it.
func TestInitializeValidation(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	for _, c := range []struct {
		name string
		edit func(*lastseen.Config)
		want string
	}{
		{"typed nil redis", func(c *lastseen.Config) { c.Redis = (*redis.Client)(nil) },
			"lastseen: invalid config: Config.Redis is a nil *redis.Client: give a client, or leave Config.Redis unset for the in-process buffer"},
		{"prefix with a hash tag", func(c *lastseen.Config) { c.Buffer.Prefix = "app{1}" },
			`lastseen: invalid config: Buffer.Prefix "app{1}" must not contain '{' or '}' (they are Redis Cluster hash tags)`},
		{"too many shards", func(c *lastseen.Config) { c.Buffer.Shards = 1025 }, "lastseen: invalid config: Buffer.Shards is 1025, want 1 to 1024"},
		{"throttle under 1ms", func(c *lastseen.Config) { c.Throttle = 500 * time.Microsecond }, "lastseen: invalid config: Throttle is 500µs, want at least 1ms"},
		{"model not a struct", func(c *lastseen.Config) { c.Model = 42 }, "lastseen: invalid config: Model int: unsupported data type: 42"},
		{"composite key", func(c *lastseen.Config) { c.Model = &compositeUser{} },
			"lastseen: invalid config: Model compositeUser has 2 primary key fields [TenantID UserID], want exactly one"},
		{"no key", func(c *lastseen.Config) { c.Model = &noKeyUser{} },
			"lastseen: invalid config: Model noKeyUser has 0 primary key fields [], want exactly one"},
		{"float key", func(c *lastseen.Config) { c.Model = &floatUser{} },
			"lastseen: invalid config: Model floatUser: primary key ID is a float64; want an integer, a string or a sql.Scanner such as a UUID type"},
		{"missing field", func(c *lastseen.Config) { c.Field = "SeenAt" },
			`lastseen: invalid config: Field "SeenAt": User has no such field or column`},
		{"not a time", func(c *lastseen.Config) { c.Model = &stringTimeUser{} },
			`lastseen: invalid config: Field "LastSeenAt": stringTimeUser.LastSeenAt is a string: ` + wantTimeField},
		{"not a time, by column", func(c *lastseen.Config) { c.Field = "id" },
			`lastseen: invalid config: Field "id": User.ID is a uint64: ` + wantIntUnit},
	} {
		cfg := h.config()
		c.edit(&cfg)
		err := h.openDB().Use(lastseen.New(cfg))
		equal(t, c.name, fmt.Sprint(err), c.want)
		equal(t, c.name+": errors.Is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
	}

	dummy, err := gorm.Open(tests.DummyDialector{}, quietGorm())
	must(t, err)
	err = dummy.Use(lastseen.New(h.config()))
	equal(t, "unsupported dialect", fmt.Sprint(err), `lastseen: invalid config: dialect "dummy" is not supported (want postgres, mysql or sqlite)`)

	// The last-seen field by Go name or by column name, pointer or not.
	for _, c := range []struct {
		model any
		field string
	}{{&lastseen.User{}, "LastSeenAt"}, {&lastseen.User{}, "last_seen_at"}, {&appAccount{}, "seen"}, {&intPKUser{}, "LastSeenAt"}} {
		cfg := h.config()
		cfg.Model, cfg.Field = c.model, c.field
		cfg.Buffer.Prefix = fmt.Sprintf("%s:%T", h.prefix, c.model) // a buffer per table: the manifest names it
		p := lastseen.New(cfg)
		must(t, h.openDB().Use(p))
		must(t, p.Close(context.Background()))
	}
}

// TestNewDefaults: New fills in the documented defaults and does no I/O.
func TestNewDefaults(t *testing.T) {
	p := lastseen.New(lastseen.Config{})
	c := p.Config()
	// Name ends in "#" and this plugin's token until db.Use accepts it.
	equal(t, "Name", p.Name(), fmt.Sprintf("lastseen:github.com/lastseen/lastseen.User.LastSeenAt#%p", p))
	equal(t, "Prefix", c.Buffer.Prefix, "") // derived at Initialize (TestDefaultPrefixPerTarget)
	equal(t, "Shards", c.Buffer.Shards, 16)
	equal(t, "Throttle", c.Throttle, 5*time.Minute)
	equal(t, "BatchSize", c.Flush.BatchSize, 1000)
	equal(t, "Upsert", c.Flush.Upsert, false)
	equal(t, "Model", fmt.Sprintf("%T", c.Model), "*lastseen.User")
	equal(t, "Field", c.Field, "LastSeenAt")
	equal(t, "FlushSchedule", c.Flush.Schedule, "@every 1m")
	equal(t, "PurgeSchedule", c.Sessions.Schedule, "@every 1h")
	equal(t, "Logger set", c.Logger != nil, true)
	equal(t, "Now set", c.Test.Now != nil, true)
}

// TestNotInitialized: before db.Use every method says so, and Close is a
// no-op.
func TestNotInitialized(t *testing.T) {
	ctx := context.Background()
	p := lastseen.New(lastseen.Config{})
	_, err := p.Touch(ctx, 1)
	equal(t, "Touch", err, lastseen.ErrNotInitialized)
	_, err = p.TouchAt(ctx, 1, time.Now())
	equal(t, "TouchAt", err, lastseen.ErrNotInitialized)
	_, _, err = p.Pending(ctx, 1)
	equal(t, "Pending", err, lastseen.ErrNotInitialized)
	_, _, err = p.LastSeen(ctx, 1)
	equal(t, "LastSeen", err, lastseen.ErrNotInitialized)
	_, err = p.Flush(ctx)
	equal(t, "Flush", err, lastseen.ErrNotInitialized)
	equal(t, "Close", p.Close(ctx), nil)
	equal(t, "Stats", p.Stats(), lastseen.Stats{})
}

// TestUserModel: the default model is table users with a uint64 key and an
// nullable last_seen_at without an index (HOT-friendly), on every dialect.
func TestUserModel(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		must(t, h.db.AutoMigrate(&lastseen.User{}))
		equal(t, "table", h.db.Migrator().HasTable("users"), true)
		equal(t, "index on last_seen_at", h.db.Migrator().HasIndex(&lastseen.User{}, "idx_users_last_seen_at"), false)
		big := uint64(math.MaxUint64) // BIGINT UNSIGNED
		if h.dialect != "mysql" {
			big = math.MaxInt64 // signed 64-bit: the plugin refuses larger ids there
		}
		must(t, h.db.Create(&lastseen.User{ID: big}).Error)
		var u lastseen.User
		must(t, h.db.First(&u, "id = ?", big).Error)
		equal(t, "largest id", u.ID, big)
		equal(t, "last seen NULL", u.LastSeenAt == nil, true)
	})
}

// refusedCalls runs every method of p that returns an error, and each
// middleware on one request (its warning logged into logs), and returns
// each error's text by method.
func refusedCalls(t *testing.T, p *lastseen.Plugin, logs *testenv.Logs) map[string]string {
	ctx, now := context.Background(), time.Now()
	got := map[string]string{}
	add := func(name string, err error) {
		got[name] = fmt.Sprint(err)
		equal(t, name+": is ErrNotInitialized", errors.Is(err, lastseen.ErrNotInitialized), true)
	}
	_, err := p.Touch(ctx, 1)
	add("Touch", err)
	_, err = p.TouchAt(ctx, 1, now)
	add("TouchAt", err)
	_, err = p.TouchKnown(ctx, 1, now)
	add("TouchKnown", err)
	_, _, err = p.Pending(ctx, 1)
	add("Pending", err)
	_, _, err = p.LastSeen(ctx, 1)
	add("LastSeen", err)
	_, err = p.LastSeenMany(ctx, []any{1})
	add("LastSeenMany", err)
	_, err = p.Flush(ctx)
	add("Flush", err)
	_, err = p.PurgeExpiredSessions(ctx)
	add("PurgeExpiredSessions", err)
	_, err = p.ExpiredSessions(ctx)
	add("ExpiredSessions", err)
	_, err = p.Status(ctx)
	add("Status", err)
	_, err = p.SampleBuffer(ctx, 1)
	add("SampleBuffer", err)
	_, err = p.Online(ctx, 10*time.Minute)
	add("Online", err)
	_, err = p.ActiveUsers(ctx, now, now)
	add("ActiveUsers", err)
	_, err = p.TableHealth(ctx)
	add("TableHealth", err)
	_, err = p.Target()
	add("Target", err)
	add("Close", p.Close(ctx))
	withUser := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { lastseen.SetUser(r.Context(), 1) })
	for _, h := range []http.Handler{p.Middleware(userFromHeader)(withUser), p.DeferredMiddleware()(withUser)} {
		serve(t, h, "1")
	}
	got["middleware logs"] = regexp.MustCompile(`(?m)^time=\S+ `).ReplaceAllString(logs.Take(), "")
	return got
}

// TestRefusedPluginAnswersRefusal: every method of a plugin db.Use refused
// returns that refusal ("db.Use refused this plugin: " and db.Use's error,
// wrapping it and ErrNotInitialized), not "call db.Use first", and each
// middleware logs it; a later db.Use that succeeds ends it.
func TestRefusedPluginAnswersRefusal(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	must(t, h.db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
	db := h.openDB()
	testenv.Use(t, db, h.config())
	for _, c := range []struct {
		name  string
		field string
		use   *gorm.DB
		want  string
	}{
		{"a second plugin for the column", "last_seen_at", db, "lastseen: db.Use refused this plugin: lastseen: registered: model github.com/lastseen/lastseen.User " +
			"field LastSeenAt (column users.last_seen_at) is already tracked by the plugin lastseen:github.com/lastseen/lastseen.User.LastSeenAt on this *gorm.DB: " +
			"register one plugin per tracked column"},
		{"an invalid config", "Nope", h.openDB(), `lastseen: db.Use refused this plugin: lastseen: invalid config: Field "Nope": User has no such field or column`},
	} {
		var logs testenv.Logs
		cfg := h.config()
		cfg.Field, cfg.Buffer.Prefix, cfg.Logger = c.field, h.prefix+":refused", testenv.TextLogger(&logs)
		p := lastseen.New(cfg)
		useErr := c.use.Use(p)
		equal(t, c.name+": db.Use", "lastseen: db.Use refused this plugin: "+fmt.Sprint(useErr), c.want)
		got := refusedCalls(t, p, &logs)
		for _, m := range []string{"Touch", "TouchAt", "TouchKnown", "Pending", "LastSeen", "LastSeenMany", "Flush", "PurgeExpiredSessions",
			"ExpiredSessions", "Status", "SampleBuffer", "Online", "ActiveUsers", "TableHealth", "Target", "Close"} {
			equal(t, c.name+": "+m, got[m], c.want)
		}
		tracks := map[string]string{"last_seen_at": "LastSeenAt", "Nope": "Nope"}[c.field] // a Field by column resolves to the Go name
		line := func(msg string) string {
			return fmt.Sprintf("level=WARN msg=%q plugin=lastseen tracks=github.com/lastseen/lastseen.User.%s err=%q", msg, tracks, c.want)
		}
		equal(t, c.name+": middleware logs", got["middleware logs"], line("lastseen: middleware touch failed")+"\n"+line("lastseen: deferred middleware touch failed")+"\n")
	}

	// A refusal ends with the db.Use that succeeds: here on a handle of its own.
	cfg := h.config()
	cfg.Field, cfg.Buffer.Prefix = "last_seen_at", h.prefix+":later"
	p := lastseen.New(cfg)
	equal(t, "refused", errors.Is(db.Use(p), gorm.ErrRegistered), true)
	must(t, h.openDB().Use(p))
	t.Cleanup(func() { p.Close(context.Background()) })
	_, err := p.Touch(context.Background(), 1)
	equal(t, "touch after the db.Use that succeeded", err, nil)
}
