package tests

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// countStatements counts the statements on db (and every handle sharing its
// callbacks) whose SQL starts with one of the verbs, after they ran without
// error.
func countStatements(t testing.TB, db *gorm.DB, verbs ...string) *atomic.Int64 {
	var n atomic.Int64
	count := func(tx *gorm.DB) {
		if tx.Error != nil {
			return
		}
		for _, v := range verbs {
			if hasVerb(tx.Statement.SQL.String(), v) {
				n.Add(1)
			}
		}
	}
	name := randomName("test:count_")
	must(t, db.Callback().Raw().After("gorm:raw").Register(name+"_raw", count))
	must(t, db.Callback().Create().After("gorm:create").Register(name+"_create", count))
	return &n
}

// seedUsers creates users 1..n of the default model with a NULL last seen.
func seedUsers(t testing.TB, db *gorm.DB, n int) {
	t.Helper()
	must(t, db.AutoMigrate(&lastseen.User{}))
	users := make([]lastseen.User, n)
	for i := range users {
		users[i].ID = uint64(i + 1)
	}
	must(t, db.CreateInBatches(&users, 1000).Error)
}

// columnsByID reads table.col for every row, as RFC3339Nano UTC ("" for
// NULL), by the primary key's text.
func columnsByID(t testing.TB, db *gorm.DB, table, pk, col string) map[string]string {
	t.Helper()
	var rows []struct {
		ID string
		V  *time.Time
	}
	must(t, db.Table(table).Select(pk+" AS id, "+col+" AS v").Scan(&rows).Error)
	out := make(map[string]string, len(rows))
	for _, r := range rows {
		if r.V == nil {
			out[r.ID] = ""
		} else {
			out[r.ID] = r.V.UTC().Format(time.RFC3339Nano)
		}
	}
	return out
}

// TestFlushConcurrentTouchesLoseNothing: 50 goroutines touch overlapping
// users with times in no particular order while flushes run in a loop; at
// the end every user's column holds the newest timestamp that was recorded
// for it, and Redis holds nothing.
func TestFlushConcurrentTouchesLoseNothing(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		const users, writers, touches = 200, 50, 40
		ctx := context.Background()
		cfg := h.config()
		cfg.Throttle = time.Millisecond // markers expire all the time: many recorded touches per user
		cfg.Buffer.LocalCacheSize = -1
		cfg.Flush.BatchSize = 37
		p, db := h.plugin(cfg)
		seedUsers(t, db, users)
		base := mustTime("2026-03-01T09:00:00Z")

		type rec struct {
			id int
			at time.Time
		}
		recorded := make([][]rec, writers)
		// Every writer waits, at touches 10, 20 and 30, for one more flush
		// to complete: flushes and touches interleave, whatever the speeds.
		var tickMu sync.Mutex
		tick := make(chan struct{})
		nextFlush := func() chan struct{} {
			tickMu.Lock()
			defer tickMu.Unlock()
			return tick
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range writers {
			wg.Go(func() {
				<-start
				for i := range touches {
					if i > 0 && i%10 == 0 {
						<-nextFlush()
					}
					id := 1 + (g*7+i*13)%users
					at := base.Add(time.Duration((g*37+i*101)%3600)*time.Second + time.Duration(g*touches+i)*time.Millisecond)
					ok, err := p.TouchAt(ctx, id, at)
					if err != nil {
						t.Errorf("touch %d: %v", id, err)
						return
					}
					if ok {
						recorded[g] = append(recorded[g], rec{id, at})
					}
					if i%2 == 1 {
						h.markerTime(time.Millisecond)
					}
				}
			})
		}
		done := make(chan struct{})
		flushes := 0
		var flushErrs []error
		flusher := make(chan struct{})
		go func() {
			defer close(flusher)
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := p.Flush(ctx); err != nil {
					flushErrs = append(flushErrs, err)
				}
				flushes++
				tickMu.Lock()
				close(tick)
				tick = make(chan struct{})
				tickMu.Unlock()
				h.markerTime(time.Millisecond)
			}
		}()
		close(start)
		wg.Wait()
		close(done)
		<-flusher
		for _, err := range flushErrs {
			t.Errorf("concurrent flush: %v", err)
		}
		_, err := p.Flush(ctx)
		must(t, err)

		want := map[string]string{}
		newest := map[int]time.Time{}
		n, multi := 0, map[int]int{}
		for _, rs := range recorded {
			for _, r := range rs {
				n++
				multi[r.id]++
				if r.at.After(newest[r.id]) {
					newest[r.id] = r.at
				}
			}
		}
		for id := 1; id <= users; id++ {
			want[fmt.Sprint(id)] = ""
			if at, ok := newest[id]; ok {
				want[fmt.Sprint(id)] = at.Format(time.RFC3339Nano)
			}
		}
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		equal(t, "rows", len(got), users)
		wrong := 0
		for id, w := range want {
			if got[id] != w && wrong < 5 {
				t.Errorf("user %s: column %q, want %q (newest recorded)", id, got[id], w)
				wrong++
			}
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
		equal(t, "stats recorded", p.Stats().Recorded, int64(n))
		twice := 0
		for _, c := range multi {
			if c > 1 {
				twice++
			}
		}
		if twice == 0 || flushes < 3 {
			t.Errorf("the test did not exercise anything: %d users recorded twice or more, %d flushes", twice, flushes)
		}
		t.Logf("%d recorded touches of %d, %d users recorded twice or more, %d concurrent flushes", n, writers*touches, twice, flushes)
	})
}

// TestFlushFailedWriteKeepsEverything: while the database is down every
// flush fails and loses nothing, including touches made during the outage;
// after recovery one flush writes the exact values.
func TestFlushFailedWriteKeepsEverything(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		p, db := h.plugin(cfg)
		seedUsers(t, db, 25)
		want := map[string]string{}
		touch := func(from, to int) {
			for id := from; id <= to; id++ {
				at := mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Minute + time.Duration(id)*time.Millisecond)
				ok, err := p.TouchAt(ctx, id, at)
				must(t, err)
				equal(t, "recorded", ok, true)
				want[fmt.Sprint(id)] = at.Format(time.RFC3339Nano)
			}
		}
		touch(1, 20)
		down := failWrites(t, db)
		down(true)
		res, err := p.Flush(ctx)
		if err == nil || !strings.Contains(err.Error(), "injected: database unreachable") {
			t.Fatalf("flush with the database down: err = %v", err)
		}
		equal(t, "written while down", res.Written, 0)
		equal(t, "drained while down", res.Drained, 0)
		for _, k := range h.pendingKeys() {
			if !strings.HasSuffix(k, ":inflight") {
				t.Errorf("key %s left after a failed flush, want in-flight hashes only", k)
			}
		}

		touch(21, 25) // during the outage: into fresh pending hashes
		_, err = p.Flush(ctx)
		if err == nil {
			t.Fatal("second flush with the database down returned no error")
		}
		for id := 1; id <= 25; id++ {
			at, ok, err := p.Pending(ctx, id)
			must(t, err)
			equal(t, fmt.Sprintf("pending %d ok", id), ok, true)
			equal(t, fmt.Sprintf("pending %d", id), at.Format(time.RFC3339Nano), want[fmt.Sprint(id)])
		}
		down(false)
		for id, v := range columnsByID(t, db, "users", "id", "last_seen_at") {
			equal(t, "column while down "+id, v, "")
		}

		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after recovery", res.Written, 25)
		equal(t, "drained after recovery", res.Drained, 25)
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for id, w := range want {
			equal(t, "column "+id, got[id], w)
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
		equal(t, "stats flush errors", p.Stats().FlushErrors, 2)
	})
}

// TestFlushFailureMidShard: batches that committed before the database went
// away are acknowledged; exactly the rest stays in the in-flight hash.
func TestFlushFailureMidShard(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Flush.BatchSize = 5
		p, db := h.plugin(cfg)
		seedUsers(t, db, 20)
		var updates atomic.Int64
		var failing atomic.Bool
		failing.Store(true)
		must(t, db.Callback().Raw().Before("gorm:raw").Register("test:fail_after_two", func(tx *gorm.DB) {
			if !failing.Load() {
				return
			}
			if hasVerb(tx.Statement.SQL.String(), "UPDATE") && updates.Add(1) <= 2 {
				return
			}
			tx.AddError(errors.New("injected: database went away"))
		}))
		must(t, db.Callback().Row().Before("gorm:row").Register("test:fail_probe", func(tx *gorm.DB) {
			if failing.Load() && tx.Statement.SQL.String() == "SELECT 1" { // the health check (ping)
				tx.AddError(errors.New("injected: database went away"))
			}
		}))
		for id := 1; id <= 20; id++ {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		if err == nil {
			t.Fatal("flush: no error")
		}
		equal(t, "written before the failure", res.Written, 10)
		equal(t, "batches before the failure", res.Batches, 2)
		equal(t, "drained before the failure", res.Drained, 10)
		equal(t, "in-flight entries left", h.inFlightLen(p, 0), int64(10))
		written := 0
		for _, v := range columnsByID(t, db, "users", "id", "last_seen_at") {
			if v != "" {
				written++
			}
		}
		equal(t, "rows written", written, 10)

		failing.Store(false)
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written after recovery", res.Written, 10)
		equal(t, "batches after recovery", res.Batches, 2)
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for id := 1; id <= 20; id++ {
			equal(t, fmt.Sprint("column ", id), got[fmt.Sprint(id)],
				mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second).Format(time.RFC3339))
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	})
}

// TestFlushTwoInstancesConcurrently: two instances flushing the same shards
// at the same moment write every user exactly once between them.
func TestFlushTwoInstancesConcurrently(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "two instances share one Redis buffer")
		const users = 300
		ctx := context.Background()
		cfg := h.config()
		cfg.Flush.BatchSize = 7
		a, db := h.plugin(cfg)
		b, _ := h.plugin(cfg)
		seedUsers(t, db, users)
		for id := 1; id <= users; id++ {
			p := a
			if id%2 == 0 {
				p = b
			}
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second))
			must(t, err)
		}
		start := make(chan struct{})
		results := make([]lastseen.FlushResult, 2)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, p := range []*lastseen.Plugin{a, b} {
			wg.Go(func() {
				<-start
				results[i], errs[i] = p.Flush(ctx)
			})
		}
		close(start)
		wg.Wait()
		must(t, errors.Join(errs...))
		equal(t, "written by both", results[0].Written+results[1].Written, users)
		equal(t, "drained by both", results[0].Drained+results[1].Drained, users)
		equal(t, "stale by both", results[0].Stale+results[1].Stale, 0)
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for id := 1; id <= users; id++ {
			equal(t, fmt.Sprint("column ", id), got[fmt.Sprint(id)],
				mustTime("2026-03-01T09:00:00Z").Add(time.Duration(id)*time.Second).Format(time.RFC3339))
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
		for _, k := range h.keys() {
			if strings.HasSuffix(k, ":lock") {
				t.Errorf("lock %s left after both flushes", k)
			}
		}
		t.Logf("a: %+v; b: %+v", results[0], results[1])
	})
}

// TestFlushPagesWithHScan: one shard of 95 users with BatchSize 10 is read
// with HSCAN COUNT 10, never HGETALL, and written in 10 statements.
func TestFlushPagesWithHScan(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "counts HSCAN commands")
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Flush.BatchSize = 10
		p, db := h.plugin(cfg)
		seedUsers(t, db, 95)
		for id := 1; id <= 95; id++ {
			_, err := p.Touch(ctx, id)
			must(t, err)
		}
		updates := countStatements(t, db, "UPDATE")
		rec := recordCommands(h.r.Client)
		rec.reset()
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "batches", res.Batches, 10)
		equal(t, "written", res.Written, 95)
		equal(t, "drained", res.Drained, 95)
		equal(t, "UPDATE statements", updates.Load(), 10)
		equal(t, "HGETALL commands", len(rec.all("hgetall")), 0)
		// A page is a pipeline of HSCAN, one per bucket, over as many
		// buckets as hold about BatchSize entries: each in-flight hash the
		// swap made is scanned once, in bucket order, and no other (95 users
		// over 4,096 buckets: every hash is listpack-encoded and comes whole
		// in one reply, cursor 0).
		scans := rec.all("hscan")
		var scanned []string
		for _, args := range scans {
			scanned = append(scanned, fmt.Sprint(args[1]))
			equal(t, "HSCAN cursor", fmt.Sprint(args[2]), "0")
			equal(t, "HSCAN COUNT", fmt.Sprint(args[len(args)-2:]), "[count 10]")
		}
		held := map[int]bool{}
		for id := 1; id <= 95; id++ {
			held[bucketOf(p, strconv.Itoa(id))] = true
		}
		var want []string
		for b, key := range shardKeys(p, 0).AllInFlight() {
			if held[b] {
				want = append(want, key)
			}
		}
		equal(t, "HSCAN keys", strings.Join(scanned, " "), strings.Join(want, " "))
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	})
}

// mailUser is a users table with a required e-mail without default.
type mailUser struct {
	ID         uint64 `gorm:"primaryKey;autoIncrement:false"`
	Email      string `gorm:"not null;size:190"`
	LastSeenAt *time.Time
}

// TestFlushUpdateMode: one batch of existing, unknown and stale users gives
// exact counts, moves only older or NULL columns forward and creates no row.
func TestFlushUpdateMode(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Model = &mailUser{}
		p, db := h.plugin(cfg)
		must(t, db.Migrator().CreateTable(&mailUser{}))
		must(t, db.Create(&[]mailUser{
			{ID: 1, Email: "1@x.test"},
			{ID: 2, Email: "2@x.test", LastSeenAt: ptr(mustTime("2026-03-01T09:00:00Z"))},
			{ID: 3, Email: "3@x.test", LastSeenAt: ptr(mustTime("2026-03-01T11:00:00Z"))},
			{ID: 4, Email: "4@x.test", LastSeenAt: ptr(mustTime("2026-03-01T10:00:00Z"))},
		}).Error)
		for id := 1; id <= 6; id++ {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained", res.Drained, 6)
		equal(t, "written", res.Written, 2)
		equal(t, "unknown", res.Unknown, 2)
		equal(t, "stale", res.Stale, 2)
		equal(t, "batches", res.Batches, 1)
		got := columnsByID(t, db, "mail_users", "id", "last_seen_at")
		equal(t, "rows", len(got), 4)
		for id, w := range map[string]string{
			"1": "2026-03-01T10:00:00Z", "2": "2026-03-01T10:00:00Z", "3": "2026-03-01T11:00:00Z", "4": "2026-03-01T10:00:00Z",
		} {
			equal(t, "column "+id, got[id], w)
		}
		s := p.Stats()
		equal(t, "stats unknown", s.Unknown, 2)
		equal(t, "stats stale", s.Stale, 2)
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	})
}

// TestFlushUpsertMode: on a presence table an upsert creates rows for new
// users and moves existing ones forward only, with exact counts on every
// dialect (MySQL counts an updated row twice; the flush corrects for it).
func TestFlushUpsertMode(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Throttle = time.Minute
		cfg.Flush.Upsert = true
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&lastseen.User{}))
		must(t, db.Create(&[]lastseen.User{
			{ID: 1},
			{ID: 2, LastSeenAt: ptr(mustTime("2026-03-01T09:00:00Z"))},
			{ID: 3, LastSeenAt: ptr(mustTime("2026-03-01T11:00:00Z"))},
			{ID: 4, LastSeenAt: ptr(mustTime("2026-03-01T10:00:00Z"))},
		}).Error)
		for id := 1; id <= 6; id++ {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T10:00:00Z"))
			must(t, err)
		}
		inserts := countStatements(t, db, "INSERT")
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained", res.Drained, 6)
		equal(t, "written", res.Written, 4)
		equal(t, "stale", res.Stale, 2)
		equal(t, "unknown", res.Unknown, 0)
		equal(t, "batches", res.Batches, 1)
		equal(t, "INSERT statements", inserts.Load(), 1)
		want := map[string]string{
			"1": "2026-03-01T10:00:00Z", "2": "2026-03-01T10:00:00Z", "3": "2026-03-01T11:00:00Z",
			"4": "2026-03-01T10:00:00Z", "5": "2026-03-01T10:00:00Z", "6": "2026-03-01T10:00:00Z",
		}
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		equal(t, "rows", len(got), 6)
		for id, w := range want {
			equal(t, "column "+id, got[id], w)
		}

		h.expireThrottle(time.Minute)
		for id, at := range map[int]string{1: "2026-03-01T09:59:00Z", 5: "2026-03-01T10:01:00Z", 7: "2026-03-01T10:02:00Z"} {
			_, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "second written", res.Written, 2)
		equal(t, "second stale", res.Stale, 1)
		want["5"], want["7"] = "2026-03-01T10:01:00Z", "2026-03-01T10:02:00Z"
		got = columnsByID(t, db, "users", "id", "last_seen_at")
		equal(t, "rows after second flush", len(got), 7)
		for id, w := range want {
			equal(t, "second column "+id, got[id], w)
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	})
}

// TestFlushRejectsGarbage: entries whose id or timestamp cannot be read are
// counted as rejected and removed; the rest of the shard is written.
func TestFlushRejectsGarbage(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		h.needRedis(t, "writes garbage into the Redis hashes")
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		p, db := h.plugin(cfg)
		seedUsers(t, db, 6)
		for _, id := range []int{1, 3} {
			_, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:10:00Z"))
			must(t, err)
		}
		h.putPending(t, p,
			"abc", "1772357400000000", // not an unsigned integer id
			strings.Repeat("1", 129), "1772357400000000", // id too long
			"2", "xyz", // not a number
			"4", "99999999999999999", // far future
			"5", "0", // the epoch
			"6", "-5", // before 1970
		)
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "rejected", res.Rejected, 6)
		equal(t, "written", res.Written, 2)
		equal(t, "drained", res.Drained, 8)
		equal(t, "stats rejected", p.Stats().Rejected, 6)
		got := columnsByID(t, db, "users", "id", "last_seen_at")
		for id, w := range map[string]string{"1": "2026-03-01T09:10:00Z", "2": "", "3": "2026-03-01T09:10:00Z", "4": "", "5": "", "6": ""} {
			equal(t, "column "+id, got[id], w)
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")

		// A shard holding garbage only.
		h.putPending(t, p, "x", "1", "y", "2")
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "garbage-only rejected", res.Rejected, 2)
		equal(t, "garbage-only drained", res.Drained, 2)
		equal(t, "redis buffers left after garbage-only flush", strings.Join(h.pendingKeys(), " "), "")
	})
}

// TestFlushBatchSizeLimit: a BatchSize over the dialect's bind-parameter
// limit is refused at Initialize with a message naming the limit.
func TestFlushBatchSizeLimit(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		limit := map[string]int{"sqlite": 16383, "postgres": 32767, "mysql": 32767}[h.dialect]
		params := map[string]int{"sqlite": 32766, "postgres": 65535, "mysql": 65535}[h.dialect]
		for _, c := range []struct {
			size int
			want string
		}{
			{limit + 1, fmt.Sprintf("lastseen: invalid config: Flush.BatchSize %d exceeds the %s limit of %d users per statement (%d bind parameters, 2 per user)",
				limit+1, h.dialect, limit, params)},
			{-1, fmt.Sprintf("lastseen: invalid config: Flush.BatchSize is -1, want 1 to %d", limit)},
			{limit, ""},
		} {
			cfg := h.config()
			cfg.Flush.BatchSize = c.size
			p := lastseen.New(cfg)
			err := h.openDB().Use(p)
			if c.want == "" {
				must(t, err)
				must(t, p.Close(context.Background()))
				continue
			}
			equal(t, fmt.Sprint("BatchSize ", c.size), fmt.Sprint(err), c.want)
			equal(t, "errors.Is ErrInvalidConfig", errors.Is(err, lastseen.ErrInvalidConfig), true)
		}
	})
}

// seedPending writes id -> Unix microseconds entries straight into p's
// pending hashes (putPending).
func seedPending(t testing.TB, h *harness, p *lastseen.Plugin, ids []int, at time.Time) {
	t.Helper()
	pairs := make([]string, 0, 2*len(ids))
	for _, id := range ids {
		pairs = append(pairs, fmt.Sprint(id), fmt.Sprint(at.UnixMicro()))
	}
	h.putPending(t, p, pairs...)
}

// TestFlushStatementsPerBatch: 2500 users in one shard with BatchSize 1000
// take exactly 3 statements, in both write modes.
func TestFlushStatementsPerBatch(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for _, mode := range []bool{false, true} {
			t.Run(map[bool]string{false: "update", true: "upsert"}[mode], func(t *testing.T) {
				ctx := context.Background()
				cfg := h.config()
				cfg.Buffer.Shards = 1
				cfg.Flush.BatchSize = 1000
				cfg.Flush.Upsert = mode
				p, db := h.plugin(cfg)
				must(t, db.Migrator().DropTable(&lastseen.User{}))
				ids := make([]int, 2500)
				for i := range ids {
					ids[i] = i + 1
				}
				if !mode {
					seedUsers(t, db, 2500)
				} else {
					must(t, db.AutoMigrate(&lastseen.User{}))
				}
				seedPending(t, h, p, ids, mustTime("2026-03-01T09:00:00Z"))
				stmts := countStatements(t, db, "UPDATE", "INSERT")
				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, "statements", stmts.Load(), 3)
				equal(t, "batches", res.Batches, 3)
				equal(t, "written", res.Written, 2500)
				var n int64
				must(t, db.Model(&lastseen.User{}).Where("last_seen_at IS NOT NULL").Count(&n).Error)
				equal(t, "rows with a value", n, int64(2500))
			})
		}
	})
}

// TestFlushLargestBatch: a batch of the dialect's largest BatchSize is one
// statement the database accepts, in both write modes (on SQLite in Update
// mode only: both modes bind the same 32766 parameters, and the pure-Go
// SQLite takes about 30s per such statement under -race).
func TestFlushLargestBatch(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: writes 16383 to 32767 rows per dialect")
	}
	forEachDialect(t, func(t *testing.T, h *harness) {
		modes := []bool{false, true}
		if h.dialect == "sqlite" {
			modes = modes[:1]
		}
		for _, mode := range modes {
			t.Run(map[bool]string{false: "update", true: "upsert"}[mode], func(t *testing.T) {
				ctx := context.Background()
				cfg := h.config()
				cfg.Buffer.Shards = 1
				cfg.Flush.BatchSize = dialect.Lookup(h.dialect).MaxBatch()
				cfg.Flush.Upsert = mode
				p, db := h.plugin(cfg)
				must(t, db.Migrator().DropTable(&lastseen.User{}))
				ids := make([]int, cfg.Flush.BatchSize)
				for i := range ids {
					ids[i] = i + 1
				}
				if !mode {
					seedUsers(t, db, len(ids))
				} else {
					must(t, db.AutoMigrate(&lastseen.User{}))
				}
				seedPending(t, h, p, ids, mustTime("2026-03-01T09:00:00Z"))
				res, err := p.Flush(ctx)
				must(t, err)
				equal(t, "batches", res.Batches, 1)
				equal(t, "written", res.Written, len(ids))
			})
		}
	})
}

// TestFlushKeyOutOfRange: an id over the largest key the dialect stores for
// a uint64 key (PostgreSQL bigint, SQLite integer) is refused by Touch and,
// if it is in Redis anyway, rejected by the flush instead of failing every
// flush after it.
func TestFlushKeyOutOfRange(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		p, db := h.plugin(cfg)
		seedUsers(t, db, 1)
		_, err := p.Touch(ctx, "9223372036854775808")
		if h.dialect == "mysql" {
			must(t, err) // BIGINT UNSIGNED: a valid id of no existing user
		} else {
			equal(t, "touch", fmt.Sprint(err),
				`lastseen: invalid user id: string "9223372036854775808": over 9223372036854775807, the largest key the database stores`)
		}
		h.putPending(t, p, "18446744073709551615", "1772357400000000")
		_, err = p.Touch(ctx, 1)
		must(t, err)
		for i := range 2 {
			res, err := p.Flush(ctx)
			must(t, err)
			if i == 1 {
				equal(t, "second flush drained", res.Drained, 0)
				break
			}
			equal(t, "written", res.Written, 1)
			if h.dialect == "mysql" {
				equal(t, "unknown", res.Unknown, 2)
			} else {
				equal(t, "rejected", res.Rejected, 1)
			}
		}
		equal(t, "redis buffers left", strings.Join(h.pendingKeys(), " "), "")
	})
}

// deadlockError returns the dialect's deadlock error as its driver reports
// it.
func deadlockError(dialect string) error {
	switch dialect {
	case "postgres":
		return &pgconn.PgError{Code: "40P01", Message: "injected: deadlock detected"}
	case "mysql":
		return &mysqldriver.MySQLError{Number: 1213, Message: "injected: Deadlock found when trying to get lock"}
	}
	return errors.New("injected: database is locked (5) (SQLITE_BUSY)")
}

// TestFlushRetriesDeadlocks: a batch that hits a deadlock is retried up to
// MaxRetries times; other errors are not retried. (The database's health
// check fails along with the lasting errors, so that the count is the
// retries' alone, not the refused-batch handling's.)
func TestFlushRetriesDeadlocks(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Buffer.Shards = 1
		testenv.Seam(&cfg).MaxRetries = 2
		p, db := h.plugin(cfg)
		seedUsers(t, db, 1)
		var attempts, failFirst atomic.Int64
		var failWith atomic.Pointer[error]
		must(t, db.Callback().Raw().Before("gorm:raw").Register("test:deadlock", func(tx *gorm.DB) {
			switch sql := tx.Statement.SQL.String(); {
			case hasVerb(sql, "UPDATE"):
				if attempts.Add(1) <= failFirst.Load() {
					tx.AddError(*failWith.Load())
				}
			case sql == "SELECT 1" && attempts.Load() <= failFirst.Load():
				tx.AddError(errors.New("injected: health check fails too"))
			}
		}))
		must(t, db.Callback().Row().Before("gorm:row").Register("test:deadlock_probe", func(tx *gorm.DB) {
			if tx.Statement.SQL.String() == "SELECT 1" && attempts.Load() <= failFirst.Load() { // the health check (ping)
				tx.AddError(errors.New("injected: health check fails too"))
			}
		}))
		setFailure := func(fails int64, err error) {
			attempts.Store(0)
			failFirst.Store(fails)
			failWith.Store(&err)
		}
		touch := func(at string) {
			t.Helper()
			h.expireThrottle(10 * time.Minute)
			_, err := p.TouchAt(ctx, 1, mustTime(at))
			must(t, err)
		}

		touch("2026-03-01T09:31:00Z")
		setFailure(2, deadlockError(h.dialect))
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "attempts: 2 deadlocks, then success", attempts.Load(), 3)
		equal(t, "written after retries", res.Written, 1)
		equal(t, "column", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:31:00Z")

		touch("2026-03-01T09:41:00Z")
		setFailure(100, deadlockError(h.dialect))
		res, err = p.Flush(ctx)
		if err == nil || !strings.Contains(err.Error(), "injected: ") {
			t.Fatalf("flush with a lasting deadlock: %v", err)
		}
		equal(t, "attempts: 1 + MaxRetries", attempts.Load(), 3)
		equal(t, "written", res.Written, 0)

		setFailure(100, errors.New("injected: not retryable"))
		_, err = p.Flush(ctx)
		if err == nil || !strings.Contains(err.Error(), "injected: not retryable") {
			t.Fatalf("flush with a plain error: %v", err)
		}
		equal(t, "attempts for an error that is not a deadlock", attempts.Load(), 1)
		at, _, err := p.Pending(ctx, 1)
		must(t, err)
		equal(t, "kept in Redis", at.Format(time.RFC3339), "2026-03-01T09:41:00Z")

		setFailure(0, nil)
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "written once the errors are gone", res.Written, 1)
		equal(t, "column at the end", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "2026-03-01T09:41:00Z")
	})
}
