package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/lastseen/lastseen"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// demoCmd runs a realistic workload through the HTTP middleware and prints
// what it cost against writing last_seen_at on every request.
type demoCmd struct {
	connFlags `embed:""`

	Users      int           `default:"300" help:"Users in the demo table."`
	Requests   int           `default:"30000" help:"HTTP requests to send."`
	Duration   time.Duration `default:"25s" help:"Time the workload spans; requests are paced over it in real time unless --fast."`
	Throttle   time.Duration `default:"2s" help:"Throttle window."`
	FlushEvery time.Duration `default:"3s" help:"Flush interval: the scheduler runs \"@every <this>\" (whole seconds)."`
	Anonymous  float64       `default:"0.1" help:"Fraction of requests without a signed-in user."`
	Skew       float64       `default:"1.1" help:"Zipf exponent s (> 1): how much the busiest users dominate."`
	Seed       uint64        `default:"1" help:"Seed of the workload: the same seed sends the same requests."`
	Fast       bool          `help:"Do not pace: run the workload on the simulated clock as fast as it goes and flush every --flush-every of simulated time instead of the scheduler (in-process Redis only)."`
	Verbose    bool          `help:"Log every flush to stderr."`

	out  io.Writer     // default os.Stdout; tests set it
	work []demoRequest // tests set it instead of the generated workload
}

// demoUser is the demo's users table: an app-like row with a required
// column, so that the Update write mode's "existing rows only" shows.
type demoUser struct {
	ID         int64      `gorm:"primaryKey;autoIncrement:false"`
	Email      string     `gorm:"size:190;not null"`
	LastSeenAt *time.Time `gorm:"index"`
}

// demoRequest is one request of the workload: when, after the start, and
// from which user (0: anonymous).
type demoRequest struct {
	at   time.Duration
	user int64
}

// demoWorkload returns the requests, in time order: arrival times uniform
// over span (a Poisson process of that many requests), truncated to the
// millisecond; users drawn from a Zipf law of exponent skew over a random
// ranking of users 1..users, so the busiest users are not simply the
// lowest ids; a fraction anonymous of them anonymous. The same arguments
// give the same requests.
func demoWorkload(seed uint64, users, requests int, span time.Duration, anonymous, skew float64) []demoRequest {
	r := mrand.New(mrand.NewPCG(seed, 0x6c61737473656e)) // "lastseen"
	rank := r.Perm(users)
	zipf := mrand.NewZipf(r, skew, 1, uint64(users-1))
	at := make([]time.Duration, requests)
	for i := range at {
		at[i] = time.Duration(r.Int64N(int64(span))).Truncate(time.Millisecond)
	}
	slices.Sort(at)
	w := make([]demoRequest, requests)
	for i := range w {
		w[i].at = at[i]
		if r.Float64() >= anonymous {
			w[i].user = int64(rank[zipf.Uint64()]) + 1
		}
	}
	return w
}

// demoResult is what the demo measured and checked.
type demoResult struct {
	Prefix, Table     string
	Simulated         bool // the plugin ran on the simulated clock (in-process Redis)
	Requests          int
	Authenticated     int
	Distinct          int // distinct signed-in users
	Stats             lastseen.Stats
	RedisCalls        int64 // client calls (a pipeline is one)
	RedisCommands     int64
	TouchScripts      int64 // EVALSHA of the touch script: one per touch the local cache did not answer
	Writes            int64 // SQL statements the plugin ran that write (Exec, create, update, delete)
	Reads             int64 // SQL queries the plugin ran
	RowsSet           int64 // rows whose last_seen_at is set, counted in the table
	LastSeen          map[int64]time.Time
	Expected          map[int64]time.Time // simulated clock: each user's last recorded touch
	Mismatches        []int64             // users whose column is not what it should be
	Wall              time.Duration
	start             time.Time
	lastSent, lastGot map[int64]time.Time // real clock: around each user's last request
}

func (c *demoCmd) validate() error {
	switch {
	case c.Users < 1:
		return fmt.Errorf("lastseen: --users is %d, want at least 1", c.Users)
	case c.Requests < 1:
		return fmt.Errorf("lastseen: --requests is %d, want at least 1", c.Requests)
	case c.Duration < time.Millisecond:
		return fmt.Errorf("lastseen: --duration is %v, want at least 1ms", c.Duration)
	case c.Throttle < time.Millisecond:
		return fmt.Errorf("lastseen: --throttle is %v, want at least 1ms", c.Throttle)
	case c.FlushEvery <= 0 || (!c.Fast && c.FlushEvery%time.Second != 0):
		return fmt.Errorf("lastseen: --flush-every is %v, want whole seconds (cron @every)", c.FlushEvery)
	case c.Anonymous < 0 || c.Anonymous >= 1:
		return fmt.Errorf("lastseen: --anonymous is %v, want 0 <= x < 1", c.Anonymous)
	case c.Skew <= 1:
		return fmt.Errorf("lastseen: --skew is %v, want more than 1", c.Skew)
	case c.Fast && c.hasRedis():
		return errors.New("lastseen: --fast needs the in-process Redis: a real Redis expires throttle markers in real time")
	}
	return nil
}

func (c *demoCmd) Run() error {
	res, err := c.run(context.Background())
	if err != nil {
		return err
	}
	if len(res.Mismatches) > 0 || res.RowsSet != int64(res.Distinct) {
		return fmt.Errorf("lastseen: demo check failed: %d rows set for %d users seen, %d users with a wrong value",
			res.RowsSet, res.Distinct, len(res.Mismatches))
	}
	return nil
}

// demoClock is the plugin's clock on the simulated timeline: the driver
// sets it to each request's time before sending it.
type demoClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *demoClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *demoClock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}

// run sets up, drives the workload, checks the table and prints the
// summary.
func (c *demoCmd) run(ctx context.Context) (*demoResult, error) {
	if err := c.validate(); err != nil {
		return nil, err
	}
	out := writerOr(c.out)
	res := &demoResult{Prefix: randomHex("lastseen-demo-"), Table: randomHex("lastseen_demo_"), Simulated: !c.hasRedis()}

	// Redis: in-process unless given; every call counted by a hook.
	var rdb redis.UniversalClient
	var mr *miniredis.Miniredis
	redisName := "miniredis (in-process)"
	if res.Simulated {
		var err error
		if mr, err = miniredis.Run(); err != nil {
			return nil, fmt.Errorf("lastseen: start miniredis: %w", err)
		}
		defer mr.Close()
		rdb = redis.NewClient(&redis.Options{Addr: mr.Addr()})
	} else {
		var err error
		if rdb, err = c.openRedis(ctx); err != nil {
			return nil, err
		}
		redisName = c.redisName()
	}
	defer rdb.Close()
	if !res.Simulated {
		defer deleteKeys(context.WithoutCancel(ctx), rdb, res.Prefix+":*")
	}
	hook := &countHook{}
	rdb.AddHook(hook)

	// Database: a temporary SQLite file unless given; a table of our own.
	conn := c.connFlags
	if !conn.hasDB() {
		dir, err := os.MkdirTemp("", "lastseen-demo-")
		if err != nil {
			return nil, fmt.Errorf("lastseen: temp dir: %w", err)
		}
		defer os.RemoveAll(dir)
		conn.SQLite = filepath.Join(dir, "demo.db")
	}
	db, err := conn.openDB(ctx, tableNamer{tables: map[string]string{"demoUser": res.Table}})
	if err != nil {
		return nil, err
	}
	defer closeDB(db)
	if err := db.AutoMigrate(&demoUser{}); err != nil {
		return nil, fmt.Errorf("lastseen: create demo table: %w", err)
	}
	defer db.Migrator().DropTable(&demoUser{})
	rows := make([]demoUser, c.Users)
	for i := range rows {
		rows[i] = demoUser{ID: int64(i + 1), Email: fmt.Sprintf("user%d@example.test", i+1)}
	}
	if err := db.CreateInBatches(rows, 200).Error; err != nil {
		return nil, fmt.Errorf("lastseen: fill demo table: %w", err)
	}

	// The plugin, with every SQL statement it runs counted.
	var writes, reads atomic.Int64
	if err := countStatements(db, &writes, &reads); err != nil {
		return nil, err
	}
	res.start = time.Now().UTC().Truncate(time.Second)
	clock := &demoClock{t: res.start}
	now := time.Now
	if res.Simulated {
		now = clock.Now
	}
	logLevel := slog.LevelWarn
	if c.Verbose {
		logLevel = slog.LevelInfo
	}
	p := lastseen.New(lastseen.Config{
		Redis:            rdb,
		Prefix:           res.Prefix,
		Throttle:         c.Throttle,
		FlushSchedule:    "@every " + c.FlushEvery.String(),
		DisableScheduler: c.Fast,
		Model:            &demoUser{},
		// Generous, so that a loaded machine does not push touches into
		// the in-process backlog and the exact checks hold.
		TouchTimeout: time.Second,
		Logger:       slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})),
		Now:          now,
	})
	if err := db.Use(p); err != nil {
		return nil, err
	}
	closed := false
	defer func() {
		if !closed {
			p.Close(context.WithoutCancel(ctx))
		}
	}()

	// The app: an auth layer puts the user id in the context, the
	// middleware touches it, the handler answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("lastseen: listen: %w", err)
	}
	srv := &http.Server{Handler: authenticate(p.Middleware(userFromContext)(http.HandlerFunc(feed)))}
	go srv.Serve(ln)
	defer srv.Close()

	mode := "paced in real time, scheduler flushing"
	if c.Fast {
		mode = "simulated clock, not paced, flushed every " + c.FlushEvery.String() + " of simulated time"
	}
	clockName := "simulated (throttle markers expired with miniredis FastForward)"
	if !res.Simulated {
		clockName = "real"
	}
	fmt.Fprintf(out, "lastseen demo\n")
	fmt.Fprintf(out, "  workload    %d users (Zipf s=%v, seed %d), %d requests over %v, %.0f%% anonymous\n",
		c.Users, c.Skew, c.Seed, c.Requests, c.Duration, c.Anonymous*100)
	fmt.Fprintf(out, "  backend     %s, %s\n", conn.dbName(), redisName)
	fmt.Fprintf(out, "  plugin      throttle window %v, flush @every %v, clock %s\n", c.Throttle, c.FlushEvery, clockName)
	fmt.Fprintf(out, "  http        %s: net/http with lastseen.Middleware, one keep-alive client, %s\n", ln.Addr(), mode)

	// Drive the workload.
	work := c.work
	if work == nil {
		work = demoWorkload(c.Seed, c.Users, c.Requests, c.Duration, c.Anonymous, c.Skew)
	}
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/feed"
	res.Expected = map[int64]time.Time{}
	res.lastSent, res.lastGot = map[int64]time.Time{}, map[int64]time.Time{}
	simNow := res.start
	nextFlush := res.start.Add(c.FlushEvery)
	wallStart := time.Now()
	for _, rq := range work {
		at := res.start.Add(rq.at)
		if c.Fast {
			for !at.Before(nextFlush) {
				if _, err := p.Flush(ctx); err != nil {
					return nil, err
				}
				nextFlush = nextFlush.Add(c.FlushEvery)
			}
		} else if d := time.Until(wallStart.Add(rq.at)); d > 0 {
			time.Sleep(d) // pacing: the workload spans --duration of real time
		}
		if res.Simulated {
			clock.Set(at)
			mr.FastForward(at.Sub(simNow))
			simNow = at
		}
		sent := time.Now()
		if err := get(ctx, client, url, rq.user); err != nil {
			return nil, err
		}
		res.Requests++
		if rq.user == 0 {
			continue
		}
		res.Authenticated++
		res.lastSent[rq.user], res.lastGot[rq.user] = sent, time.Now()
		if last, ok := res.Expected[rq.user]; !ok || at.Sub(last) >= c.Throttle {
			res.Expected[rq.user] = at
		}
	}
	res.Distinct = len(res.lastSent)
	if err := p.Close(ctx); err != nil {
		return nil, err
	}
	closed = true
	res.Wall = time.Since(wallStart)
	res.Stats = p.Stats()
	res.RedisCalls, res.RedisCommands, res.TouchScripts = hook.calls.Load(), hook.commands.Load(), hook.touches.Load()
	res.Writes, res.Reads = writes.Load(), reads.Load()

	if err := c.check(ctx, db, res); err != nil {
		return nil, err
	}
	c.print(out, res)
	return res, nil
}

// check reads the table back and compares it with what the workload
// should have left: one row set per user seen, each at the user's last
// recorded touch (simulated clock), or within the throttle window and the
// touch timeout before the user's last request (real clock).
func (c *demoCmd) check(ctx context.Context, db *gorm.DB, res *demoResult) error {
	var users []demoUser
	if err := db.WithContext(ctx).Where(clause.Neq{Column: clause.Column{Name: "last_seen_at"}, Value: nil}).
		Order("id").Find(&users).Error; err != nil {
		return fmt.Errorf("lastseen: read demo table: %w", err)
	}
	res.RowsSet = int64(len(users))
	res.LastSeen = make(map[int64]time.Time, len(users))
	for _, u := range users {
		res.LastSeen[u.ID] = u.LastSeenAt.UTC()
	}
	for id, sent := range res.lastSent {
		got, ok := res.LastSeen[id]
		switch {
		case !ok:
		case res.Simulated:
			ok = got.Equal(res.Expected[id])
		default:
			// MySQL keeps milliseconds and rounds: allow 1ms either side.
			low := sent.Add(-c.Throttle - time.Second - time.Millisecond)
			high := res.lastGot[id].Add(time.Millisecond)
			ok = !got.Before(low) && !got.After(high)
		}
		if !ok {
			res.Mismatches = append(res.Mismatches, id)
		}
	}
	slices.Sort(res.Mismatches)
	if !res.Simulated {
		res.Expected = nil
	}
	return nil
}

func (c *demoCmd) print(out io.Writer, res *demoResult) {
	s := res.Stats
	ok := func(b bool) string {
		if b {
			return "ok"
		}
		return "FAILED"
	}
	fmt.Fprintf(out, "\nresults (%v wall)\n", res.Wall.Round(100*time.Millisecond))
	fmt.Fprintf(out, "  requests      %d: %d signed in, %d anonymous; %d distinct users\n",
		res.Requests, res.Authenticated, res.Requests-res.Authenticated, res.Distinct)
	fmt.Fprintf(out, "  touches       %d: %d recorded (opened a throttle window), %d throttled (%d answered by the in-process cache)\n",
		s.Touches, s.Recorded, s.Throttled, s.CacheHits)
	fmt.Fprintf(out, "  redis         %d calls, %d commands (%d touch scripts)\n", res.RedisCalls, res.RedisCommands, res.TouchScripts)
	fmt.Fprintf(out, "  flushes       %d (the last at Close): %d rows written in %d SQL statements (and %d queries)\n",
		s.Flushes, s.RowsWritten, res.Writes, res.Reads)
	fmt.Fprintf(out, "  table check   %d rows with last_seen_at set, %d distinct users seen: %s\n",
		res.RowsSet, res.Distinct, ok(res.RowsSet == int64(res.Distinct)))
	if res.Simulated {
		fmt.Fprintf(out, "  value check   every last_seen_at is the user's last recorded touch: %s", ok(len(res.Mismatches) == 0))
	} else {
		fmt.Fprintf(out, "  value check   every last_seen_at is within a throttle window of the user's last request: %s", ok(len(res.Mismatches) == 0))
	}
	if len(res.Mismatches) > 0 {
		fmt.Fprintf(out, " (%d users differ, first %d)", len(res.Mismatches), res.Mismatches[0])
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "\nrow writes for this workload\n")
	fmt.Fprintf(out, "  write per request   %d row writes in %d statements (UPDATE ... SET last_seen_at = now() per signed-in request)\n",
		res.Authenticated, res.Authenticated)
	fmt.Fprintf(out, "  lastseen            %d row writes in %d statements, plus %d Redis calls\n", s.RowsWritten, res.Writes, res.RedisCalls)
	fmt.Fprintf(out, "  ratio               %s fewer row writes, %s fewer statements\n",
		ratio(res.Authenticated, s.RowsWritten), ratio(res.Authenticated, res.Writes))
}

func ratio(a int, b int64) string {
	if b == 0 {
		return "∞x"
	}
	return strconv.FormatFloat(float64(a)/float64(b), 'f', 1, 64) + "x"
}

// get sends one request, signed in as user unless it is 0.
func get(ctx context.Context, client *http.Client, url string, user int64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("lastseen: demo request: %w", err)
	}
	if user != 0 {
		req.Header.Set("Authorization", "Bearer user-"+strconv.FormatInt(user, 10))
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("lastseen: demo request: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return fmt.Errorf("lastseen: demo response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("lastseen: demo response: %s", resp.Status)
	}
	return nil
}

type userKey struct{}

// authenticate stands for the app's auth layer: it puts the user id of a
// "Bearer user-<id>" token in the request context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer user-"); ok {
			if id, err := strconv.ParseInt(tok, 10, 64); err == nil && id > 0 {
				r = r.WithContext(context.WithValue(r.Context(), userKey{}, id))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// userFromContext is the middleware's user id function.
func userFromContext(r *http.Request) (any, bool) {
	id, ok := r.Context().Value(userKey{}).(int64)
	return id, ok
}

func feed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	if id, ok := userFromContext(r); ok {
		fmt.Fprintf(w, `{"user":%d,"items":[]}`, id)
		return
	}
	fmt.Fprint(w, `{"user":null,"items":[]}`)
}

// countHook counts the Redis client's calls and commands, and the touch
// script's EVALSHA calls (their first key is a throttle marker).
type countHook struct {
	calls, commands, touches atomic.Int64
}

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.calls.Add(1)
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.calls.Add(1)
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *countHook) count(cmd redis.Cmder) {
	h.commands.Add(1)
	if args := cmd.Args(); cmd.Name() == "evalsha" && len(args) > 3 {
		if key, _ := args[3].(string); strings.Contains(key, ":seen:") {
			h.touches.Add(1)
		}
	}
}

// countStatements counts the SQL statements run through db's callbacks:
// Exec, create, update and delete in writes, queries and rows in reads.
func countStatements(db *gorm.DB, writes, reads *atomic.Int64) error {
	write := func(*gorm.DB) { writes.Add(1) }
	read := func(*gorm.DB) { reads.Add(1) }
	cb := db.Callback()
	for _, err := range []error{
		cb.Query().After("gorm:query").Register("lastseen_demo:count", read),
		cb.Row().After("gorm:row").Register("lastseen_demo:count", read),
		cb.Raw().After("gorm:raw").Register("lastseen_demo:count", write),
		cb.Create().After("gorm:create").Register("lastseen_demo:count", write),
		cb.Update().After("gorm:update").Register("lastseen_demo:count", write),
		cb.Delete().After("gorm:delete").Register("lastseen_demo:count", write),
	} {
		if err != nil {
			return fmt.Errorf("lastseen: count statements: %w", err)
		}
	}
	return nil
}

// deleteKeys removes every key matching pattern, on every master of a
// cluster.
func deleteKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) error {
	del := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			if err := c.Del(ctx, iter.Val()).Err(); err != nil {
				return err
			}
		}
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error { return del(ctx, m) })
	}
	return del(ctx, rdb)
}

func randomHex(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}
