package tests

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Config mistakes: every one is refused by
// Initialize (db.Use), before any I/O, with an error wrapping
// ErrInvalidConfig whose text names the field, the value and what is
// wanted. The handles below only name a dialect: nothing connects.

// dialectOnly opens a handle of the dialect without connecting to any
// server.
func dialectOnly(t *testing.T, name string) *gorm.DB {
	t.Helper()
	var d gorm.Dialector
	switch name {
	case "sqlite":
		d = sqlite.Open(":memory:")
	case "postgres":
		d = postgres.New(postgres.Config{DSN: "host=127.0.0.1 port=1 user=nobody dbname=none sslmode=disable"})
	case "mysql":
		d = mysql.New(mysql.Config{DSN: "nobody@tcp(127.0.0.1:1)/none", SkipInitializeWithVersion: true})
	}
	db, err := gorm.Open(d, &gorm.Config{DisableAutomaticPing: true, Logger: quietGorm().Logger})
	if err != nil {
		t.Fatalf("open %s handle: %v", name, err)
	}
	t.Cleanup(func() { testenv.CloseDB(db) })
	return db
}

// renamedDialector is SQLite under another name: a dialect the plugin
// does not know.
type renamedDialector struct{ gorm.Dialector }

func (renamedDialector) Name() string { return "oracle" }

// Models with mistakes.
type (
	cfgCompositeUser struct {
		TenantID   int64 `gorm:"primaryKey"`
		UserID     int64 `gorm:"primaryKey"`
		LastSeenAt *time.Time
	}
	cfgNoKeyUser struct {
		Name       string
		LastSeenAt *time.Time
	}
	cfgFloatUser struct {
		ID         float64 `gorm:"primaryKey"`
		LastSeenAt *time.Time
	}
	cfgStringTimeUser struct {
		ID         int64
		LastSeenAt string
	}
	cfgIntUser struct {
		ID         int64
		LastSeenAt int64
	}
	cfgCompositeSession struct {
		Token     string `gorm:"primaryKey"`
		UserID    int64  `gorm:"primaryKey"`
		ExpiresAt time.Time
	}
	cfgStringExpirySession struct {
		ID        string
		ExpiresAt string
	}
)

// TestConfigMistakes is the table of every Config mistake and the exact
// error text users see, on each dialect (the limits differ).
// The messages Initialize gives for a time field of an unsupported type
// (coltype.go).
const (
	wantTimeField = "want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, " +
		"or an int64 of Unix seconds or milliseconds (a `lastseen` tag)"
	wantIntUnit = "an integer needs its unit: " +
		"tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`"
)

func TestConfigMistakes(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialed: validation fails first
	t.Cleanup(func() { rdb.Close() })
	limits := map[string]struct{ batch, params int }{
		"postgres": {32767, 65535},
		"mysql":    {32767, 65535},
		"sqlite":   {16383, 32766},
	}
	for _, dialect := range []string{"sqlite", "postgres", "mysql"} {
		lim := limits[dialect]
		cases := []struct {
			name   string
			change func(*lastseen.Config)
			want   string
		}{
			{"typed-nil Redis client", func(c *lastseen.Config) { c.Redis = (*redis.Client)(nil) },
				"Config.Redis is a nil *redis.Client: give a client, or leave Config.Redis unset for the in-process buffer"},
			{"typed-nil Redis cluster client", func(c *lastseen.Config) { c.Redis = (*redis.ClusterClient)(nil) },
				"Config.Redis is a nil *redis.ClusterClient: give a client, or leave Config.Redis unset for the in-process buffer"},
			{"Prefix with a brace", func(c *lastseen.Config) { c.Buffer.Prefix = "app{1}" },
				`Buffer.Prefix "app{1}" must not contain '{' or '}' (they are Redis Cluster hash tags)`},
			{"Prefix with a closing brace", func(c *lastseen.Config) { c.Buffer.Prefix = "app}" },
				`Buffer.Prefix "app}" must not contain '{' or '}' (they are Redis Cluster hash tags)`},
			{"negative Shards", func(c *lastseen.Config) { c.Buffer.Shards = -1 }, "Buffer.Shards is -1, want 1 to 1024"},
			{"too many Shards", func(c *lastseen.Config) { c.Buffer.Shards = 1025 }, "Buffer.Shards is 1025, want 1 to 1024"},
			{"Throttle under 1ms", func(c *lastseen.Config) { c.Throttle = 999 * time.Microsecond }, "Throttle is 999µs, want at least 1ms"},
			{"Throttle over 31 days", func(c *lastseen.Config) { c.Throttle = 745 * time.Hour }, "Throttle is 745h0m0s, want at most 744h0m0s (31 days)"},
			{"negative Throttle", func(c *lastseen.Config) { c.Throttle = -time.Minute }, "Throttle is -1m0s, want at least 1ms"},
			{"negative TouchTimeout", func(c *lastseen.Config) { c.Buffer.TouchTimeout = -time.Millisecond }, "Buffer.TouchTimeout is -1ms, want at least 1ms"},
			{"TouchTimeout of 1ns", func(c *lastseen.Config) { c.Buffer.TouchTimeout = 1 }, "Buffer.TouchTimeout is 1ns, want at least 1ms"},
			{"FlushSchedule without a spec", func(c *lastseen.Config) { c.Flush.Schedule = " ; " }, `Flush.Schedule " ; " has no cron spec`},
			{"FlushSchedule every 0s", func(c *lastseen.Config) { c.Flush.Schedule = "@every 0s" }, `Flush.Schedule "@every 0s": the interval must be at least 1s`},
			{"PurgeSchedule every -1m", func(c *lastseen.Config) { c.Sessions.Schedule = "@every 1h;@every -1m" }, `Sessions.Schedule "@every -1m": the interval must be at least 1s`},
			{"negative BacklogSize", func(c *lastseen.Config) { testenv.Seam(c).BacklogSize = -1 }, "BacklogSize is -1, want a positive number"},
			{"negative BreakerCooldown", func(c *lastseen.Config) { testenv.Seam(c).BreakerCooldown = -time.Second }, "BreakerCooldown is -1s, want a positive duration"},
			{"negative BatchSize", func(c *lastseen.Config) { c.Flush.BatchSize = -1 }, fmt.Sprintf("Flush.BatchSize is -1, want 1 to %d", lim.batch)},
			{"BatchSize one over the limit", func(c *lastseen.Config) { c.Flush.BatchSize = lim.batch + 1 },
				fmt.Sprintf("Flush.BatchSize %d exceeds the %s limit of %d users per statement (%d bind parameters, 2 per user)",
					lim.batch+1, dialect, lim.batch, lim.params)},
			{"huge BatchSize", func(c *lastseen.Config) { c.Flush.BatchSize = 1_000_000 },
				fmt.Sprintf("Flush.BatchSize 1000000 exceeds the %s limit of %d users per statement (%d bind parameters, 2 per user)",
					dialect, lim.batch, lim.params)},
			{"negative FlushConcurrency", func(c *lastseen.Config) { c.Flush.Concurrency = -1 }, "Flush.Concurrency is -1, want 1 to Buffer.Shards (16)"},
			{"FlushConcurrency over Shards", func(c *lastseen.Config) { c.Buffer.Shards, c.Flush.Concurrency = 2, 3 }, "Flush.Concurrency is 3, want 1 to Buffer.Shards (2)"},
			{"LockTTL under 1s", func(c *lastseen.Config) { testenv.Seam(c).LockTTL = 999 * time.Millisecond },
				"LockTTL is 999ms, want at least 1s: the lock is refreshed every third of it, and a shorter one leaves a refresh too little time for a few Redis round trips"},
			{"LockTTL of 10ms", func(c *lastseen.Config) { testenv.Seam(c).LockTTL = 10 * time.Millisecond },
				"LockTTL is 10ms, want at least 1s: the lock is refreshed every third of it, and a shorter one leaves a refresh too little time for a few Redis round trips"},
			{"negative PurgeBatchSize", func(c *lastseen.Config) { c.Sessions.BatchSize = -1 },
				fmt.Sprintf("Sessions.BatchSize is -1, want 1 to %d", lim.params-1)},
			{"PurgeBatchSize over the limit", func(c *lastseen.Config) { c.Sessions.BatchSize = lim.params },
				fmt.Sprintf("Sessions.BatchSize %d exceeds the %s limit of %d sessions per delete (%d bind parameters, 1 per session and 1 for the cutoff)",
					lim.params, dialect, lim.params-1, lim.params)},
			{"negative PurgeBatchTimeout", func(c *lastseen.Config) { testenv.Seam(c).PurgeBatchTimeout = -time.Second }, "PurgeBatchTimeout is -1s, want a positive duration"},
			{"negative StatementTimeout", func(c *lastseen.Config) { testenv.Seam(c).StatementTimeout = -time.Second }, "StatementTimeout is -1s, want a positive duration"},
			{"negative FlushTimeout", func(c *lastseen.Config) { c.Flush.Timeout = -time.Second }, "Flush.Timeout is -1s, want at least 100ms"},
			{"FlushTimeout of 1ns", func(c *lastseen.Config) { c.Flush.Timeout = 1 }, "Flush.Timeout is 1ns, want at least 100ms"},
			{"FlushSchedule a zone alone", func(c *lastseen.Config) { c.Flush.Schedule = "TZ=UTC" },
				`Flush.Schedule "TZ=UTC": a time zone without a schedule`},
			{"FlushSchedule every 100ms behind a zone", func(c *lastseen.Config) { c.Flush.Schedule = "TZ=UTC @every 100ms" },
				`Flush.Schedule "TZ=UTC @every 100ms": the interval must be at least 1s`},
			{"PurgeSchedule every -5m behind a zone", func(c *lastseen.Config) { c.Sessions.Schedule = "CRON_TZ=UTC @every -5m" },
				`Sessions.Schedule "CRON_TZ=UTC @every -5m": the interval must be at least 1s`},
			{"PurgeSchedule bad with sessions disabled", func(c *lastseen.Config) { c.Sessions.Schedule, c.Sessions.Disabled = "garbage", true },
				`Sessions.Schedule "garbage": expected exactly 5 fields, found 1: [garbage]`},
			{"negative PurgeTimeout", func(c *lastseen.Config) { testenv.Seam(c).PurgeTimeout = -time.Second }, "PurgeTimeout is -1s, want a positive duration"},
			{"FlushSchedule not a cron spec", func(c *lastseen.Config) { c.Flush.Schedule = "every minute" },
				`Flush.Schedule "every minute": expected exactly 5 fields, found 2: [every minute]`},
			{"FlushSchedule second spec bad", func(c *lastseen.Config) { c.Flush.Schedule = "@every 1m; 61 * * * *" },
				`Flush.Schedule "61 * * * *": end of range (61) above maximum (59): 61`},
			{"FlushSchedule bad descriptor", func(c *lastseen.Config) { c.Flush.Schedule = "@every soon" },
				`Flush.Schedule "@every soon": failed to parse duration @every soon: time: invalid duration "soon"`},
			{"PurgeSchedule six fields", func(c *lastseen.Config) { c.Sessions.Schedule = "0 0 3 * * *" },
				`Sessions.Schedule "0 0 3 * * *": expected exactly 5 fields, found 6: [0 0 3 * * *]`},
			{"Model not a struct", func(c *lastseen.Config) { c.Model = 42 }, "Model int: unsupported data type: 42"},
			{"composite primary key", func(c *lastseen.Config) { c.Model = &cfgCompositeUser{} },
				"Model cfgCompositeUser has 2 primary key fields [TenantID UserID], want exactly one"},
			{"no primary key", func(c *lastseen.Config) { c.Model = &cfgNoKeyUser{} },
				"Model cfgNoKeyUser has 0 primary key fields [], want exactly one"},
			{"float primary key", func(c *lastseen.Config) { c.Model = &cfgFloatUser{} },
				"Model cfgFloatUser: primary key ID is a float64; want an integer, a string or a sql.Scanner such as a UUID type"},
			{"unknown Field", func(c *lastseen.Config) { c.Field = "SeenAt" },
				`Field "SeenAt": User has no such field or column`},
			{"Field a string", func(c *lastseen.Config) { c.Model = &cfgStringTimeUser{} },
				`Field "LastSeenAt": cfgStringTimeUser.LastSeenAt is a string: ` + wantTimeField},
			{"Field an integer without its unit", func(c *lastseen.Config) { c.Model = &cfgIntUser{} },
				`Field "LastSeenAt": cfgIntUser.LastSeenAt is a int64: ` + wantIntUnit},
			{"Field the primary key", func(c *lastseen.Config) { c.Field = "id" },
				`Field "id": User.ID is a uint64: ` + wantIntUnit},
			{"composite session key", func(c *lastseen.Config) { c.Sessions.Model = &cfgCompositeSession{} },
				"Sessions.Model cfgCompositeSession has 2 primary key fields [Token UserID], want exactly one"},
			{"unknown ExpiresField", func(c *lastseen.Config) { c.Sessions.ExpiresField = "Expiry" },
				`Sessions.ExpiresField "Expiry": Session has no such field or column`},
			{"ExpiresField a string", func(c *lastseen.Config) { c.Sessions.Model = &cfgStringExpirySession{} },
				`Sessions.ExpiresField "ExpiresAt": cfgStringExpirySession.ExpiresAt is a string: ` + wantTimeField},
		}
		for _, tc := range cases {
			t.Run(dialect+"/"+tc.name, func(t *testing.T) {
				cfg := lastseen.Config{Redis: rdb, Logger: testenv.Discard}
				tc.change(&cfg)
				testenv.Seam(&cfg) // to read what a refused plugin started
				p := lastseen.New(cfg)
				err := dialectOnly(t, dialect).Use(p)
				if !errors.Is(err, lastseen.ErrInvalidConfig) {
					t.Fatalf("db.Use: %v, want ErrInvalidConfig", err)
				}
				equal(t, "error", err.Error(), "lastseen: invalid config: "+tc.want)
				if internals(p).Buffer != nil || internals(p).Scheduler != nil {
					t.Fatal("a refused plugin started its tracker or scheduler")
				}
			})
		}
	}
	t.Run("unsupported dialect", func(t *testing.T) {
		db, err := gorm.Open(renamedDialector{sqlite.Open(":memory:")}, quietGorm())
		must(t, err)
		t.Cleanup(func() { testenv.CloseDB(db) })
		err = db.Use(lastseen.New(lastseen.Config{Redis: rdb}))
		equal(t, "error", fmt.Sprint(err), `lastseen: invalid config: dialect "oracle" is not supported (want postgres, mysql or sqlite)`)
	})
}

// TestConfigLimitsAccepted: the largest accepted values of the limits
// above pass, and so does the zero Config but for Redis and Prefix
// (defaults). The database is unreachable too: with Prefix set, Initialize
// does not need its identity (the first flush reads it).
func TestConfigLimitsAccepted(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialerRetries: 1}) // refused at once
	t.Cleanup(func() { rdb.Close() })
	for dialect, batch := range map[string]int{"sqlite": 16383, "postgres": 32767, "mysql": 32767} {
		t.Run(dialect, func(t *testing.T) {
			for _, cfg := range []lastseen.Config{
				{Redis: rdb, Flush: lastseen.FlushConfig{Schedule: "off"}, Sessions: lastseen.SessionConfig{Schedule: "off"}},
				{Redis: rdb, Buffer: lastseen.BufferConfig{Shards: 1}, Flush: lastseen.FlushConfig{Schedule: "off"}, Sessions: lastseen.SessionConfig{Schedule: "off"}}, // the default FlushConcurrency follows
				{Redis: rdb, Throttle: time.Millisecond, Buffer: lastseen.BufferConfig{Shards: 1024}, Flush: lastseen.FlushConfig{BatchSize: batch, Schedule: "@every 1m; 0 3 * * *"}, Sessions: lastseen.SessionConfig{Schedule: "off"}, Test: lastseen.TestConfig{Seam: &testseam.Seam{LockTTL: time.Second}}},
			} {
				cfg.Logger = testenv.Discard
				cfg.Buffer.Prefix = "limits"
				testenv.Seam(&cfg) // StopTracker below
				p := lastseen.New(cfg)
				must(t, dialectOnly(t, dialect).Use(p))
				internals(p).StopTracker()
			}
		})
	}
}

// TestConfigRedisUnreachableAtStart: a Redis that is configured but not
// reachable is not a configuration mistake: Initialize logs it and
// succeeds, and touches go to the backlog.
func TestConfigRedisUnreachableAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	var logs testenv.Logs
	db := dialectOnly(t, "sqlite")
	p := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Logger:   slog.New(slog.NewTextHandler(&logs, nil)),
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Test:     lastseen.TestConfig{Seam: &testseam.Seam{}},
	})
	must(t, db.Use(p))
	t.Cleanup(func() { internals(p).StopTracker() })
	equal(t, "start-up warnings", logs.Count(`level=WARN msg="lastseen: redis unreachable at start; touches are kept in memory until it is back"`), 1)
	_, err = p.Touch(t.Context(), 1)
	if err == nil {
		t.Fatal("touch with Redis unreachable returned no error")
	}
	equal(t, "backlog", p.Stats().Backlog, 1)
}
