package tests

import (
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/testseam"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// The helpers of the black-box tests, on the environment matrix of
// testenv (dialects, Redis kinds, clock, logs, key cleanup).

var (
	must       = testenv.Must
	mustTime   = testenv.MustTime
	randomName = testenv.RandomName
	quietGorm  = testenv.Quiet
)

func equal[T comparable](t testing.TB, what string, got, want T) {
	t.Helper()
	testenv.Equal(t, what, got, want)
}

// servers are the PostgreSQL and MySQL dialects with their GORM drivers.
var servers = testenv.Servers{PostgresDriver: postgres.Open, MySQLDriver: mysql.Open}

// memoryKind is no Redis at all: Config.Redis stays nil and the plugin
// buffers in process (memory.Buffer). The harness shows that buffer's state
// under the Redis key names (keys, pendingKeys), so that tests written
// against Redis check the same state; tests about Redis itself skip it
// (needRedis).
func memoryKind() testenv.RedisKind {
	return testenv.RedisKind{Name: "memory", Open: func(testing.TB) *testenv.Redis { return &testenv.Redis{} }}
}

// allBuffers is every buffer forEachEnv runs on: the Redis kinds and the
// in-process buffer.
func allBuffers() []testenv.RedisKind { return append(testenv.RedisKinds(), memoryKind()) }

// harness is one test environment: a database of one dialect, a Redis of
// one kind, a key prefix and a clock.
type harness struct {
	t       testing.TB
	dialect string
	redis   string
	openDB  func() *gorm.DB // a new handle to the harness's database, closed at cleanup
	db      *gorm.DB
	r       *testenv.Redis
	prefix  string
	clock   *testenv.Clock
	plugins []*lastseen.Plugin // made by plugin(), whose memory buffers keys() shows
}

func newHarness(t testing.TB, d testenv.Dialect, r testenv.RedisKind) *harness {
	return newHarnessWith(t, d, r, testenv.Quiet)
}

// newHarnessWith is newHarness whose handles open with the GORM config gc
// returns (a new one for each handle).
func newHarnessWith(t testing.TB, d testenv.Dialect, r testenv.RedisKind, gc func() *gorm.Config) *harness {
	h := &harness{t: t, dialect: d.Name, redis: r.Name, clock: testenv.ClockAt("2026-03-01T09:30:00Z")}
	h.r = r.Open(t)
	db := d.New(t)
	h.openDB = func() *gorm.DB { return db.OpenWith(t, gc()) }
	h.db = h.openDB()
	if h.r.Client != nil {
		h.prefix = testenv.KeyPrefix(t, h.r.Client)
	} else {
		h.prefix = randomName("ls")
	}
	return h
}

// memory reports whether the harness runs on the in-process buffer.
func (h *harness) memory() bool { return h.r.Client == nil }

// needRedis skips a test that is about Redis itself (its keys, commands,
// outages, or one buffer shared by several instances) on the in-process
// buffer.
func (h *harness) needRedis(t testing.TB, why string) {
	t.Helper()
	if h.memory() {
		t.Skipf("about Redis itself: %s", why)
	}
}

// forEachEnv runs fn for every dialect with miniredis, with a real Redis,
// with a Redis Cluster, and with no Redis (the in-process buffer).
func forEachEnv(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, r := range allBuffers() {
		for _, d := range servers.Dialects() {
			t.Run(d.Name+"/"+r.Name, func(t *testing.T) {
				fn(t, newHarness(t, d, r))
			})
		}
	}
}

// forEachDialect runs fn for every dialect with miniredis only: for tests
// about SQL, where the Redis kind does not matter.
func forEachDialect(t *testing.T, fn func(t *testing.T, h *harness)) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) { fn(t, newHarness(t, d, testenv.Miniredis())) })
	}
}

// harnessTouchTimeout bounds a touch in tests that do not test the bound: a
// minute, so that a touch waiting behind a flush's scripts on a loaded
// machine (miniredis under -race) is never sent to the backlog. Tests of
// the bound set their own.
const harnessTouchTimeout = time.Minute

// config returns a test Config: this harness's Redis, prefix and clock, no
// scheduler, logs discarded, and a test seam of its own.
func (h *harness) config() lastseen.Config {
	return lastseen.Config{
		Redis:    h.r.Client,
		Logger:   testenv.Discard,
		Buffer:   lastseen.BufferConfig{Prefix: h.prefix, TouchTimeout: harnessTouchTimeout},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Schedule: "off"},
		Test:     lastseen.TestConfig{Now: h.clock.Now, Seam: &testseam.Seam{}},
	}
}

// plugin registers a plugin with cfg on a new handle to the harness's
// database (each handle takes one plugin) and closes it at cleanup.
func (h *harness) plugin(cfg lastseen.Config) (*lastseen.Plugin, *gorm.DB) {
	h.t.Helper()
	db := h.openDB()
	p := testenv.Use(h.t, db, cfg)
	h.plugins = append(h.plugins, p)
	return p, db
}

// expireThrottle makes the throttle window pass: the clock moves by d (the
// buffer's windows are fixed periods of the plugin's clock; miniredis
// fast-forwards its expiring keys too).
func (h *harness) expireThrottle(d time.Duration) {
	h.t.Helper()
	h.clock.Add(d)
	if !h.memory() && h.r.Mini != nil {
		h.r.Mini.FastForward(d)
	}
}

// keys lists this harness's Redis keys, sorted, with the prefix cut off;
// on the in-process buffer, the keys Redis would hold for its state
// (memoryKeys).
func (h *harness) keys() []string {
	if h.memory() {
		return h.memoryKeys()
	}
	out, err := testenv.Keys(context.Background(), h.r.Client, h.prefix+":*")
	if err != nil {
		h.t.Fatalf("scan keys: %v", err)
	}
	for i, k := range out {
		out[i] = strings.TrimPrefix(k, h.prefix)
	}
	return h.logicalKeys(out)
}

// logicalKeys names Redis keys by what they hold, as memoryKeys names the
// in-process buffer's state: a bucket's pending or in-flight hash as its
// shard's (":{N}:pending:<b>" as ":{N}:pending"), and a throttle window's
// hash as one ":{N}:seen:<id>" per user it throttles (while the window is
// open on the harness's clock) and ":{N}:pending" when it holds an entry
// no flush moved yet; the shard's hash of windows is bookkeeping, left
// out. Sorted, without duplicates.
func (h *harness) logicalKeys(raw []string) []string {
	set := map[string]bool{}
	for _, k := range raw {
		parts := strings.Split(k, ":")
		switch {
		case len(parts) == 4 && (parts[2] == "pending" || parts[2] == "inflight"):
			set[strings.Join(parts[:3], ":")] = true
		case len(parts) == 3 && parts[2] == "windows":
		case len(parts) == 5 && parts[2] == "window":
			fields, err := h.r.Client.HGetAll(context.Background(), h.prefix+k).Result()
			if err != nil {
				h.t.Fatalf("window %s: %v", k, err)
			}
			end, _ := strconv.ParseInt(parts[4], 10, 64)
			open := h.clock.Now().UnixMilli() < end
			for f, v := range fields {
				if open {
					set[strings.Join(parts[:2], ":")+":seen:"+f] = true
				}
				if v != "" {
					set[strings.Join(parts[:2], ":")+":pending"] = true
				}
			}
		default:
			set[k] = true
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// pendingKeys lists the pending and in-flight hashes left in Redis.
func (h *harness) pendingKeys() []string {
	var out []string
	for _, k := range h.keys() {
		if strings.HasSuffix(k, ":pending") || strings.HasSuffix(k, ":inflight") { // logicalKeys
			out = append(out, k)
		}
	}
	return out
}

// lastSeenColumn reads the time column of one row as UTC, "" for NULL, or
// "missing" when the row does not exist.
func lastSeenColumn(t testing.TB, db *gorm.DB, table, pk, col string, id any) string {
	t.Helper()
	var rows []struct{ V *time.Time }
	err := db.Table(table).Select(col+" AS v").Where(pk+" = ?", id).Scan(&rows).Error
	if err != nil {
		t.Fatalf("read %s.%s: %v", table, col, err)
	}
	switch {
	case len(rows) == 0:
		return "missing"
	case rows[0].V == nil:
		return ""
	}
	return rows[0].V.UTC().Format(time.RFC3339Nano)
}

// boundPrefix is what MariaDB's bulk UPDATE of a flush carries in front of
// its verb: the statement's time bound, "SET STATEMENT max_statement_time
// = 20.000000 FOR ".
var boundPrefix = regexp.MustCompile(`(?i)^SET STATEMENT max_statement_time = [0-9.]+ FOR `)

// hasVerb reports whether sql starts with verb ("UPDATE", "INSERT"), in
// any case, after leading spaces and a MariaDB time bound (boundPrefix).
func hasVerb(sql, verb string) bool {
	s := boundPrefix.ReplaceAllString(strings.TrimSpace(sql), "")
	return strings.HasPrefix(strings.ToUpper(s), verb)
}
