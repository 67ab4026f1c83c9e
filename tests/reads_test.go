package tests

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// roundTrips is a go-redis hook that counts round trips: pipelines (one
// call of the client's pipeline hook, whatever a Cluster client does per
// node beneath it), single commands, and the commands inside pipelines.
type roundTrips struct {
	pipelines, singles, piped atomic.Int64
}

func countRoundTrips(c redis.UniversalClient) *roundTrips {
	rt := &roundTrips{}
	if c != nil { // nil: the in-process buffer, no round trips to count
		c.AddHook(rt)
	}
	return rt
}

func (rt *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (rt *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		rt.singles.Add(1)
		return next(ctx, cmd)
	}
}

func (rt *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		rt.pipelines.Add(1)
		rt.piped.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

func (rt *roundTrips) reset() { rt.pipelines.Store(0); rt.singles.Store(0); rt.piped.Store(0) }

func (rt *roundTrips) String() string {
	return fmt.Sprintf("%d pipelines of %d commands, %d single commands", rt.pipelines.Load(), rt.piped.Load(), rt.singles.Load())
}

// countSelects counts the SELECT statements run through GORM's Row and
// Query callbacks on db (Row, Rows, Find, First).
func countSelects(t testing.TB, db *gorm.DB) *atomic.Int64 {
	var n atomic.Int64
	count := func(tx *gorm.DB) {
		if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(tx.Statement.SQL.String())), "SELECT") {
			n.Add(1)
		}
	}
	name := randomName("test:selects_")
	must(t, db.Callback().Row().After("gorm:row").Register(name+"_row", count))
	must(t, db.Callback().Query().After("gorm:query").Register(name+"_query", count))
	return &n
}

// manyFixture sets up users 1..n for LastSeenMany: rows for ids up to
// n*9/10, each id in one state by id%6, and returns the expected answer per
// id (RFC 3339, "" for never seen). Times: column C = 08:00+id s, buffered
// B = 09:00+id s. Ids without a row answer B when buffered, else "".
//
//	0 column only            C
//	1 pending (touched)      B over an older column
//	2 in-flight (hash set)   B over a NULL column
//	3 backlog only           B over a NULL column
//	4 never seen             "" (NULL column, or no row)
//	5 pending older than the column: the column, 10:00+id s
func manyFixture(t testing.TB, p *lastseen.Plugin, db *gorm.DB, n int) map[int]string {
	t.Helper()
	ctx := context.Background()
	must(t, db.AutoMigrate(&lastseen.User{}))
	base, col, late := mustTime("2026-03-01T09:00:00Z"), mustTime("2026-03-01T08:00:00Z"), mustTime("2026-03-01T10:00:00Z")
	want := map[int]string{}
	var rows []lastseen.User
	for id := 1; id <= n; id++ {
		s := func(t0 time.Time) string { return t0.Add(time.Duration(id) * time.Second).Format(time.RFC3339) }
		u := lastseen.User{ID: uint64(id)}
		switch id % 6 {
		case 0:
			u.LastSeenAt, want[id] = ptr(col.Add(time.Duration(id)*time.Second)), s(col)
		case 1:
			u.LastSeenAt, want[id] = ptr(col.Add(time.Duration(id)*time.Second)), s(base)
		case 5:
			u.LastSeenAt, want[id] = ptr(late.Add(time.Duration(id)*time.Second)), s(late)
		case 2, 3:
			want[id] = s(base)
		}
		switch {
		case id <= n*9/10:
			rows = append(rows, u)
		case id%6 == 0: // no row: never seen
			want[id] = ""
		case id%6 == 5: // no row: the pending value
			want[id] = s(base)
		}
	}
	must(t, db.CreateInBatches(&rows, 500).Error)
	for id := 1; id <= n; id++ {
		at := base.Add(time.Duration(id) * time.Second)
		uid := fmt.Sprint(id)
		switch id % 6 {
		case 1, 5:
			_, err := p.TouchAt(ctx, id, at)
			must(t, err)
		case 2:
			putInFlight(t, p, uid, at)
		case 3:
			putBacklog(t, p, uid, at)
		}
	}
	return want
}

// TestLastSeenManyMixesEveryState: 2,000 ids in six states (column only,
// pending, in-flight, backlog only, never seen, pending older than the
// column; a tenth without a row) come back exactly, aligned with the ids,
// from one Redis pipeline (of one read-script EVALSHA per shard on a
// cluster, 16; per 1,000 ids on a single server, 2) and one SELECT; with
// the bind-parameter limit lowered to 500, four SELECTs give the same
// answer.
func TestLastSeenManyMixesEveryState(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		const n = 2000
		p, db := h.plugin(h.config())
		want := manyFixture(t, p, db, n)
		ids := make([]any, 0, n+2)
		for id := n; id >= 1; id-- { // reversed: the answer follows the ids' order
			ids = append(ids, uint64(id))
		}
		ids = append(ids, "7", int32(7)) // duplicates, other spellings
		rt, selects := countRoundTrips(h.r.Client), countSelects(t, db)
		reads := "1 pipelines of 2 commands, 0 single commands"
		if h.redis == "cluster" {
			reads = "1 pipelines of 16 commands, 0 single commands"
		}

		check := func(what string, got []time.Time) {
			t.Helper()
			equal(t, what+": answers", len(got), len(ids))
			bad := 0
			for i, at := range got {
				id := n - i
				if i >= n {
					id = 7
				}
				s := ""
				if !at.IsZero() {
					s = at.Format(time.RFC3339)
					equal(t, fmt.Sprintf("%s: user %d location", what, id), at.Location(), time.UTC)
				}
				if s != want[id] && bad < 5 {
					bad++
					t.Errorf("%s: user %d = %q, want %q", what, id, s, want[id])
				}
			}
		}
		got, err := p.LastSeenMany(ctx, ids) // the first may dial a connection: HELLO, CLIENT SETINFO
		must(t, err)
		check("first call", got)
		rt.reset()
		selects.Store(0)
		got, err = p.LastSeenMany(ctx, ids)
		must(t, err)
		check("one statement", got)
		if !h.memory() {
			equal(t, "redis round trips", rt.String(), reads)
		}
		equal(t, "select statements", selects.Load(), int64(1))

		internals(p).SetMaxParams(500)
		rt.reset()
		selects.Store(0)
		got, err = p.LastSeenMany(ctx, ids)
		must(t, err)
		check("chunks of 500", got)
		if !h.memory() {
			equal(t, "redis round trips, chunked", rt.String(), reads)
		}
		equal(t, "select statements, chunked", selects.Load(), int64(4))

		got, err = p.LastSeenMany(ctx, nil)
		must(t, err)
		equal(t, "answers for no ids", len(got), 0)
	})
}

// TestLastSeenManyRefusesInvalidIDs: the first invalid id fails the call
// with ErrInvalidUserID naming its index, before any I/O.
func TestLastSeenManyRefusesInvalidIDs(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	p, db := h.plugin(h.config())
	must(t, db.AutoMigrate(&lastseen.User{}))
	rt := countRoundTrips(h.r.Client)
	for _, c := range []struct {
		ids  []any
		want string
	}{
		{[]any{1, 2, "x"}, "(ids[2])"},
		{[]any{0}, "(ids[0])"},
		{[]any{1, -5, nil}, "(ids[1])"},
	} {
		_, err := p.LastSeenMany(context.Background(), c.ids)
		if !errors.Is(err, lastseen.ErrInvalidUserID) || !strings.HasSuffix(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "lastseen: ") {
			t.Errorf("LastSeenMany(%v) = %v, want ErrInvalidUserID ending in %q", c.ids, err, c.want)
		}
	}
	equal(t, "redis round trips", rt.String(), "0 pipelines of 0 commands, 0 single commands")
}

// TestLastSeenManyWithRedisDown: with Redis gone, LastSeenMany answers
// from the backlog and the column without an error: pending values are
// not seen, backlogged and column values are.
func TestLastSeenManyWithRedisDown(t *testing.T) {
	srv := startPrivateRedis(t)
	rdb := newPrivateClient(t, srv.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	cfg := h.config()
	cfg.Buffer.TouchTimeout = 50 * time.Millisecond
	p, db := h.plugin(cfg)
	ctx := context.Background()
	must(t, db.AutoMigrate(&lastseen.User{}))
	must(t, db.Create(&[]lastseen.User{{ID: 1, LastSeenAt: ptr(mustTime("2026-03-01T08:00:00Z"))}, {ID: 2}, {ID: 3}}).Error)
	_, err := p.TouchAt(ctx, 1, mustTime("2026-03-01T09:00:01Z")) // pending in Redis, lost with it
	must(t, err)
	srv.kill()
	if _, err := p.TouchAt(ctx, 2, mustTime("2026-03-01T09:00:02Z")); err == nil { // into the backlog
		t.Fatal("touch with Redis down: no error")
	}
	got, err := p.LastSeenMany(ctx, []any{1, 2, 3})
	must(t, err)
	equal(t, "user 1 (column)", got[0].Format(time.RFC3339), "2026-03-01T08:00:00Z")
	equal(t, "user 2 (backlog)", got[1].Format(time.RFC3339), "2026-03-01T09:00:02Z")
	equal(t, "user 3 (never seen)", got[2].IsZero(), true)
}

// TestReadsUnderPrepareStmt: with GORM's PrepareStmt (as GORM's docs
// recommend for speed), a statement whose prepare fails leaves an empty row
// behind; every read returns the error (here the canceled context) instead
// of panicking on it.
func TestReadsUnderPrepareStmt(t *testing.T) {
	for _, d := range servers.Dialects() {
		t.Run(d.Name, func(t *testing.T) {
			db := d.New(t).OpenWith(t, &gorm.Config{PrepareStmt: true, Logger: testenv.Quiet().Logger})
			must(t, db.AutoMigrate(&lastseen.User{}, &lastseen.Session{}))
			must(t, db.Create(&lastseen.User{ID: 1}).Error)
			p := testenv.Use(t, db, lastseen.Config{Logger: testenv.Discard,
				Flush: lastseen.FlushConfig{Schedule: "off"}, Sessions: lastseen.SessionConfig{Schedule: "off"}})
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, _, err := p.LastSeen(ctx, 1)
			equal(t, "LastSeen with a canceled context", errors.Is(err, context.Canceled), true)
			_, err = p.LastSeenMany(ctx, []any{1})
			equal(t, "LastSeenMany with a canceled context", errors.Is(err, context.Canceled), true)
			_, err = p.ExpiredSessions(ctx)
			equal(t, "ExpiredSessions with a canceled context", errors.Is(err, context.Canceled), true)
		})
	}
}
