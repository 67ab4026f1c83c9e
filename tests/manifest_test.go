package tests

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// textKeyUser is a users table keyed by text: same table, other key type.
type textKeyUser struct {
	ID         string `gorm:"primaryKey;size:64"`
	LastSeenAt *time.Time
}

func (textKeyUser) TableName() string { return "users" }

// twoTimesUser is a users table with a second time column.
type twoTimesUser struct {
	ID          uint64 `gorm:"primaryKey"`
	LastSeenAt  *time.Time
	LastLoginAt *time.Time
}

func (twoTimesUser) TableName() string { return "users" }

// tryUse registers a plugin with cfg on db and returns db.Use's error,
// closing the plugin at cleanup when it was accepted.
func tryUse(t *testing.T, db *gorm.DB, cfg lastseen.Config) error {
	t.Helper()
	p := lastseen.New(cfg)
	err := db.Use(p)
	if err == nil {
		t.Cleanup(func() { p.Close(context.Background()) })
	}
	return err
}

// TestManifestShardsDisagree: an instance with Shards 16 on a buffer
// created with Shards 8 (a rolling deploy that changes Shards) is refused
// with an error naming both values and the way out, so no touch lands in a
// shard nobody flushes: the first instance's 1,000 timestamps all reach
// the table. Before the manifest, 735 of 1,000 were stranded.
func TestManifestShardsDisagree(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		seedUsers(t, h.db, 1000)
		cfg := h.config()
		cfg.Buffer.Shards = 8
		a, db := h.plugin(cfg)
		for id := 1; id <= 1000; id++ {
			_, err := a.TouchAt(ctx, id, mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second))
			must(t, err)
		}

		cfg.Buffer.Shards = 16
		err := tryUse(t, h.openDB(), cfg)
		equal(t, "errors.Is lastseen.ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
		equal(t, "error", fmt.Sprint(err), fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was created with Buffer.Shards 8, `+
			`this instance has Buffer.Shards 16: set Buffer.Shards: 8, or flush the buffer empty with Buffer.Shards 8 and delete the key %s:manifest`, h.prefix, h.prefix))

		cfg.Buffer.Shards = 8 // the way out: the same Shards
		_ = tryUse(t, h.openDB(), cfg)
		res, err := a.Flush(ctx)
		must(t, err)
		equal(t, "written", res.Written, 1000)
		st, err := a.Status(ctx)
		must(t, err)
		equal(t, "pending after the flush", st.Pending+st.InFlight, 0)
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for _, id := range []int{1, 500, 1000} {
			equal(t, fmt.Sprint("user ", id), got[fmt.Sprint(id)],
				mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second).Format(time.RFC3339))
		}
	})
}

// TestManifestTargetDisagrees: on one Prefix, an instance tracking another
// table, column or key type than the buffer was created for is refused,
// each with an error naming both values and the way out; one with the same
// target is accepted (a deliberate shared buffer).
func TestManifestTargetDisagrees(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		_ = tryUse(t, h.openDB(), h.config()) // creates the manifest: users.last_seen_at, integer key
		way := fmt.Sprintf(`: set another Buffer.Prefix (or leave Buffer.Prefix empty to derive one from the database and table), `+
			`or flush the buffer empty with the old setting and delete the key %s:manifest`, h.prefix)
		for _, c := range []struct {
			name  string
			edit  func(*lastseen.Config)
			label string
		}{
			{"table", func(c *lastseen.Config) { c.Model = &signedUser{} }, `table "users", this instance has table "signed_users"`},
			{"column", func(c *lastseen.Config) { c.Model, c.Field = &twoTimesUser{}, "LastLoginAt" },
				`column "last_seen_at", this instance has column "last_login_at"`},
			{"key type", func(c *lastseen.Config) { c.Model = &textKeyUser{} }, `key type "integer", this instance has key type "text"`},
		} {
			cfg := h.config()
			c.edit(&cfg)
			err := tryUse(t, h.openDB(), cfg)
			equal(t, c.name+": errors.Is lastseen.ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
			equal(t, c.name+": error", fmt.Sprint(err),
				fmt.Sprintf("lastseen: invalid config: the buffer at prefix %q was created for %s%s", h.prefix, c.label, way))
		}
		cfg := h.config()
		cfg.Model, cfg.Field = &twoTimesUser{}, "last_seen_at" // same table, column and key type
		must(t, tryUse(t, h.openDB(), cfg))
		m, err := h.r.Client.HGetAll(context.Background(), h.prefix+":manifest").Result()
		must(t, err)
		equal(t, "manifest database", regexp.MustCompile(`^/.*/test\.db$`).MatchString(m["database"]), true)
		delete(m, "database")
		equal(t, "manifest", fmt.Sprint(m), "map[active_column: active_encoding: batch:1000 column:last_seen_at dialect:sqlite encoding:time "+
			"expires_column:expires_at expires_encoding:time format:3 id_column:id idle_timeout:0s key:integer key_kind:unsigned location: "+
			"model:lastseen.User on_batch:false rules: server:sqlite sessions_batch:1000 sessions_id_column:id "+
			"sessions_key:text sessions_table:sessions shards:16 table:users throttle:5m0s upsert:false]")
	})
}

// TestManifestDialectDisagrees: a PostgreSQL instance on the Prefix of a
// SQLite buffer is refused.
func TestManifestDialectDisagrees(t *testing.T) {
	for _, r := range []testenv.RedisKind{testenv.RedisServer(), testenv.RedisCluster()} {
		t.Run(r.Name, func(t *testing.T) {
			h := newHarness(t, testenv.SQLite(), r)
			_ = tryUse(t, h.openDB(), h.config())
			pg := servers.Postgres().New(t).Open(t)
			err := tryUse(t, pg, h.config())
			equal(t, "error", fmt.Sprint(err), fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was created for dialect "sqlite", `+
				`this instance has dialect "postgres": set another Buffer.Prefix (or leave Buffer.Prefix empty to derive one from the database and table), `+
				`or flush the buffer empty with the old setting and delete the key %s:manifest`, h.prefix, h.prefix))
		})
	}
}

// TestManifestFormatDisagrees: an instance on the Prefix of a buffer that
// a version of an earlier buffer format wrote (1: a key per throttle
// marker, one pending hash per shard; 2: sliding windows in marker hashes)
// is refused with an error naming both formats and the way out, and
// touches nothing.
func TestManifestFormatDisagrees(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		_ = tryUse(t, h.openDB(), h.config())
		for _, old := range []string{"1", "2"} {
			must(t, h.r.Client.HSet(ctx, h.prefix+":manifest", "format", old).Err())
			err := tryUse(t, h.openDB(), h.config())
			equal(t, "errors.Is lastseen.ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
			equal(t, "error", fmt.Sprint(err), fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was written by a lastseen `+
				`version of buffer format %s, this version writes format 3: flush it empty with the version that wrote it (lastseen flush), `+
				`delete the key %s:manifest, then start this version; or set another Buffer.Prefix`, h.prefix, old, h.prefix))
			equal(t, "redis keys", strings.Join(h.keys(), " "), ":manifest")
		}
	})
}

// TestManifestCheckedByFirstFlush: an instance that started while Redis was
// down could not check the manifest; its first flush does, and refuses to
// write into a buffer of another layout.
func TestManifestCheckedByFirstFlush(t *testing.T) {
	srv := startPrivateRedis(t)
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, srv.Addr())))
	seedUsers(t, h.db, 10)
	srv.kill()
	cfg := h.config()
	cfg.Buffer.Shards = 16
	late := lastseen.New(cfg)
	must(t, h.openDB().Use(late)) // Redis unreachable: logged, not an error
	t.Cleanup(func() { late.Close(context.Background()) })
	srv.restart()
	waitForRedis(t, h.r.Client)

	cfg.Buffer.Shards = 8
	_ = tryUse(t, h.openDB(), cfg) // creates the manifest with Shards 8
	_, err := late.Flush(context.Background())
	equal(t, "errors.Is lastseen.ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
	equal(t, "error", fmt.Sprint(err), fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was created with Buffer.Shards 8, `+
		`this instance has Buffer.Shards 16: set Buffer.Shards: 8, or flush the buffer empty with Buffer.Shards 8 and delete the key %s:manifest`, h.prefix, h.prefix))
	equal(t, "flush errors", late.Stats().FlushErrors, 1)
}

var derivedPrefix = regexp.MustCompile(`^lastseen:users:[0-9a-f]{8}$`)

// TestDefaultPrefixPerTarget: two apps that leave Prefix empty, on one
// Redis, with a users table each in two databases of one dialect (two
// SQLite files, two PostgreSQL schemas, two MySQL databases), get two
// prefixes "lastseen:users:<8 hex>"; each app's flush writes its own
// timestamps into its own table only; a restart derives the same prefix.
// The in-process buffer derives the same names (it has no manifest).
func TestDefaultPrefixPerTarget(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		other := dialectByName(h.dialect).New(t)
		openOther := func() *gorm.DB { return other.Open(t) }
		apps := []struct {
			db   *gorm.DB
			p    *lastseen.Plugin
			at   string
			open func() *gorm.DB
		}{{db: h.db, at: "2026-03-01T09:00:00Z", open: h.openDB}, {db: openOther(), at: "2026-03-01T09:10:00Z", open: openOther}}
		prefixes := map[string]bool{}
		for i := range apps {
			a := &apps[i]
			seedUsers(t, a.db, 3)
			cfg := h.config()
			cfg.Buffer.Prefix = ""
			a.p = usePlugin(t, a.open(), cfg)
			prefix := a.p.Config().Buffer.Prefix
			if !h.memory() {
				t.Cleanup(func() { _ = testenv.DeleteKeys(context.Background(), h.r.Client, prefix+":*") })
			}
			if !derivedPrefix.MatchString(prefix) {
				t.Fatalf("app %d prefix %q does not match %s", i, prefix, derivedPrefix)
			}
			prefixes[prefix] = true
			for id := 1; id <= 3; id++ {
				_, err := a.p.TouchAt(ctx, id, mustTime(a.at))
				must(t, err)
			}
		}
		equal(t, "distinct prefixes", len(prefixes), 2)
		for i, a := range apps {
			res, err := a.p.Flush(ctx)
			must(t, err)
			equal(t, fmt.Sprint("app ", i, " written"), res.Written, 3)
			equal(t, fmt.Sprint("app ", i, " drained"), res.Drained, 3)
			got := columnsByID(t, a.db, "users", "id", "last_seen_at")
			for id := 1; id <= 3; id++ {
				equal(t, fmt.Sprint("app ", i, " user ", id), got[fmt.Sprint(id)], a.at)
			}
		}
		cfg := h.config()
		cfg.Buffer.Prefix = ""
		again := usePlugin(t, h.openDB(), cfg)
		equal(t, "prefix after a restart", again.Config().Buffer.Prefix, apps[0].p.Config().Buffer.Prefix)
	})
}

// TestDefaultPrefixSQLiteFile: the SQLite identity is the main file's
// absolute path, and the prefix is the documented hash of it; two files on
// one explicit Prefix are refused.
func TestDefaultPrefixSQLiteFile(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	cfg := h.config()
	cfg.Buffer.Prefix = ""
	p := usePlugin(t, h.openDB(), cfg)
	var file string
	must(t, h.db.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&file).Error)
	equal(t, "absolute path", filepath.IsAbs(file), true)
	sum := sha256.Sum256([]byte("sqlite\x00sqlite\x00" + file + "\x00users\x00last_seen_at"))
	equal(t, "prefix, by hand", p.Config().Buffer.Prefix, "lastseen:users:"+hex.EncodeToString(sum[:4]))

	// Another file with the same explicit Prefix: refused, the database named.
	other := testenv.SQLite().New(t).Open(t)
	cfg.Buffer.Prefix = h.prefix
	_ = tryUse(t, h.openDB(), cfg)
	err := tryUse(t, other, cfg)
	var otherFile string
	must(t, other.Raw("SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&otherFile).Error)
	equal(t, "error", fmt.Sprint(err), fmt.Sprintf(`lastseen: invalid config: the buffer at prefix %q was created for database %q, `+
		`this instance has database %q: set another Buffer.Prefix (or leave Buffer.Prefix empty to derive one from the database and table), `+
		`or flush the buffer empty with the old setting and delete the key %s:manifest`, h.prefix, file, otherFile, h.prefix))
}

// dialectByName returns the opener of one dialect.
func dialectByName(name string) testenv.Dialect {
	for _, d := range servers.Dialects() {
		if d.Name == name {
			return d
		}
	}
	panic("no dialect " + name)
}

// TestManifestRecreatedAfterDataLoss: Redis loses its data (FLUSHALL here;
// a restart without persistence alike). The next flush recreates the
// manifest with this instance's layout, so an instance of another Shards
// started afterwards is still refused; an instance whose Throttle differs
// is logged once, however many flushes follow.
func TestManifestRecreatedAfterDataLoss(t *testing.T) {
	rs := startPrivateRedis(t)
	h := newHarness(t, testenv.SQLite(), clientKind(newPrivateClient(t, rs.Addr())))
	ctx := context.Background()
	seedUsers(t, h.db, 2)
	cfg := h.config()
	cfg.Buffer.Shards = 8
	var logs testenv.Logs
	cfg.Logger = testenv.TextLogger(&logs)
	a, db := h.plugin(cfg)
	must(t, h.r.Client.FlushAll(ctx).Err())
	equal(t, "manifest after FLUSHALL", h.r.Client.Exists(ctx, h.prefix+":manifest").Val(), int64(0))

	_, err := a.TouchAt(ctx, 1, mustTime("2026-03-01T09:10:00Z"))
	must(t, err)
	res, err := a.Flush(ctx)
	must(t, err)
	equal(t, "written", res.Written, 1)
	equal(t, "manifest's shards after the flush", h.r.Client.HGet(ctx, h.prefix+":manifest", "shards").Val(), "8")

	other := cfg
	other.Buffer.Shards = 16
	other.Logger = testenv.Discard
	err = tryUse(t, h.openDB(), other)
	equal(t, "another Shards refused", errors.Is(err, lastseen.ErrInvalidConfig), true)

	slow := cfg
	slow.Throttle = 2 * time.Minute
	b := testenv.Use(t, h.openDB(), slow)
	for range 3 {
		_, err := b.Flush(ctx)
		must(t, err)
	}
	equal(t, "Throttle mismatch logged", logs.Count("the buffer was created with another Throttle"), 1)
	equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:10:00Z")
}

// TestManifestSettingsFollowTheLastStart: the manifest's settings (the
// rules operator tools act by) are those of the instance started last: an
// instance that agrees with them writes nothing (the hash's fields keep
// their values and none is added), one with another Sessions.IdleTimeout
// and Flush.BatchSize rewrites those fields and keeps the layout.
func TestManifestSettingsFollowTheLastStart(t *testing.T) {
	forEachRedis(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		key := h.prefix + ":manifest"
		_ = tryUse(t, h.openDB(), h.config())
		first, err := h.r.Client.HGetAll(ctx, key).Result()
		must(t, err)
		must(t, h.r.Client.HSet(ctx, key, "marker", "kept").Err()) // a field no instance writes
		_ = tryUse(t, h.openDB(), h.config())
		again, err := h.r.Client.HGetAll(ctx, key).Result()
		must(t, err)
		delete(again, "marker")
		equal(t, "manifest after an agreeing start", fmt.Sprint(again), fmt.Sprint(first))

		cfg := h.config()
		cfg.Model, cfg.Field = &lastseen.Session{}, "LastActiveAt"
		cfg.Sessions.IdleTimeout = 30 * time.Minute
		cfg.Flush.BatchSize = 500
		err = tryUse(t, h.openDB(), cfg) // another table: refused, and nothing is written
		equal(t, "another table refused", errors.Is(err, lastseen.ErrInvalidConfig), true)
		refused, err := h.r.Client.HGetAll(ctx, key).Result()
		must(t, err)
		delete(refused, "marker")
		equal(t, "manifest after a refused start", fmt.Sprint(refused), fmt.Sprint(first))
		cfg.Model, cfg.Field = nil, ""
		must(t, tryUse(t, h.openDB(), cfg))
		got, err := h.r.Client.HGetAll(ctx, key).Result()
		must(t, err)
		for _, f := range []string{"batch", "idle_timeout", "active_column", "active_encoding", "table", "column", "shards", "marker"} {
			equal(t, "field "+f, got[f], map[string]string{"batch": "500", "idle_timeout": "30m0s", "active_column": "last_active_at",
				"active_encoding": "time", "table": "users", "column": "last_seen_at", "shards": "16", "marker": "kept"}[f])
		}

		// A worker without sessions on the same buffer leaves the session rule of the instances that purge.
		cfg.Sessions = lastseen.SessionConfig{Disabled: true}
		cfg.Flush.BatchSize = 0
		must(t, tryUse(t, h.openDB(), cfg))
		got, err = h.r.Client.HGetAll(ctx, key).Result()
		must(t, err)
		equal(t, "after a worker: batch, idle_timeout, sessions_table", got["batch"]+" "+got["idle_timeout"]+" "+got["sessions_table"], "1000 30m0s sessions")
	})
}
