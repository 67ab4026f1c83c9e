package bench

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/glebarez/sqlite"
	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/cmd/lastseen/internal/runenv"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// format1Shards is the shard count of the baseline layout (the library's
// default).
const format1Shards = 16

// format1Workers is how many pipelines fill the baseline at the same time.
const format1Workers = 4

// format1Keys returns the baseline's keys of user uid, the layout of the
// library's buffer format 1, written out here so that the baseline stays
// what it is when the library's layout changes:
//
//	<prefix>:{N}:seen:<uid>  string "1", SET NX PX <throttle>
//	<prefix>:{N}:pending     hash: uid -> Unix microseconds
//
// N = FNV-1a 32 of the decimal id, modulo 16.
func format1Keys(prefix, uid string) (marker, pending string, shard int) {
	h := fnv.New32a()
	h.Write([]byte(uid))
	shard = int(h.Sum32() % format1Shards)
	tag := prefix + ":{" + strconv.Itoa(shard) + "}:"
	return tag + "seen:" + uid, tag + "pending", shard
}

// loadFormat1 measures the baseline: users 1..N written in format 1 with
// plain pipelined commands, each user one SET NX PX and one HSET, as the
// touch script of format 1 did.
func (c *Cmd) loadFormat1(ctx context.Context, m *memRedis, row *memoryRow) error {
	opt, err := runenv.RedisOptions(row.Addr)
	if err != nil {
		return fmt.Errorf("lastseen: bench: %w", errors.Unwrap(err))
	}
	opt.PoolSize = format1Workers
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	n := c.MemoryUsers
	at := time.Now().UTC().Add(-time.Second).UnixMicro()
	px := strconv.FormatInt(c.Throttle.Milliseconds(), 10)
	c.progress("memory: %s: writing %s users with %d pipelines", row.Name, fmtInt(int64(n)), format1Workers)
	if err := warm(ctx, rdb, format1Workers); err != nil {
		return err
	}
	var recorded atomic.Int64
	err = c.measure(ctx, m, row, func() error {
		return eachChunk(ctx, n, format1Workers, 500, func(ctx context.Context, from, to int) error {
			pipe := rdb.Pipeline()
			sets := make([]*redis.Cmd, 0, to-from+1)
			for id := from; id <= to; id++ {
				uid := strconv.Itoa(id)
				marker, pending, _ := format1Keys(row.Prefix, uid)
				sets = append(sets, pipe.Do(ctx, "SET", marker, "1", "NX", "PX", px))
				pipe.HSet(ctx, pending, uid, at)
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return fmt.Errorf("lastseen: bench: memory: format 1 fill: %w", err)
			}
			for _, s := range sets {
				if s.Err() == nil {
					recorded.Add(1)
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	row.Recorded = recorded.Load()
	return c.checkFormat1(ctx, m, row)
}

// checkFormat1 counts the baseline's pending entries (HLEN of its pending
// hashes) and checks them, the markers set and the keys under the prefix.
func (c *Cmd) checkFormat1(ctx context.Context, m *memRedis, row *memoryRow) error {
	n := c.MemoryUsers
	shards := map[string]bool{}
	for id := 1; id <= n; id++ {
		_, pending, _ := format1Keys(row.Prefix, strconv.Itoa(id))
		shards[pending] = true
	}
	for k := range shards {
		l, err := m.rdb.HLen(ctx, k).Result()
		if err != nil {
			return fmt.Errorf("lastseen: bench: memory: HLEN %s: %w", k, err)
		}
		row.Pending += l
	}
	var problems []string
	if row.Recorded != int64(n) || row.Pending != int64(n) {
		problems = append(problems, fmt.Sprintf("%d markers set and %d pending entries, want %d of each", row.Recorded, row.Pending, n))
	}
	if want := int64(n + len(shards)); row.PrefixKeys != want || row.Hashes != int64(len(shards)) {
		problems = append(problems, fmt.Sprintf("%d keys of which %d hashes under the prefix, want %d of which %d", row.PrefixKeys, row.Hashes, want, len(shards)))
	}
	problems = append(problems, c.keysDeltaProblem(row)...)
	row.Check = checkText(problems)
	return nil
}

// loadLibrary measures the library: a lastseen.Plugin on the measured
// Redis, users 1..N touched once each through Plugin.TouchAt from
// MemoryWorkers goroutines, the local cache off, the presence counters
// (Online, ActiveUsers) off or, with presence, in their default
// configuration; the database is an in-memory SQLite. With presence, after
// the figures and the checks, a Flush drains the entries into the presence
// HyperLogLogs (measurePresence).
func (c *Cmd) loadLibrary(ctx context.Context, m *memRedis, row *memoryRow, presence bool) (err error) {
	p, rdb, closeAll, err := c.openMemoryPlugin(row, presence)
	if err != nil {
		return err
	}
	defer func() {
		// Delete the keys first: Close's final flush then finds nothing
		// to write.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if derr := runenv.DeleteKeys(cctx, m.rdb, row.Prefix+":*"); derr != nil && err == nil {
			err = fmt.Errorf("lastseen: bench: memory: delete redis keys %s:*: %w", row.Prefix, derr)
		}
		if cerr := closeAll(cctx); cerr != nil && err == nil {
			err = cerr
		}
	}()

	n := c.MemoryUsers
	at := time.Now().UTC().Add(-time.Second).Truncate(time.Microsecond)
	c.progress("memory: %s: touching %s users from %d goroutines", row.Name, fmtInt(int64(n)), c.MemoryWorkers)
	if err := warm(ctx, rdb, c.MemoryWorkers); err != nil {
		return err
	}
	var recorded atomic.Int64
	err = c.measure(ctx, m, row, func() error {
		return eachChunk(ctx, n, c.MemoryWorkers, 100, func(ctx context.Context, from, to int) error {
			for id := from; id <= to; id++ {
				rec, err := p.TouchAt(ctx, uint64(id), at)
				if err != nil {
					return fmt.Errorf("lastseen: bench: memory: TouchAt(%d): %w", id, err)
				}
				if rec {
					recorded.Add(1)
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	row.Recorded = recorded.Load()
	if err := c.checkLibrary(ctx, p, row, at); err != nil || !presence {
		return err
	}
	return c.measurePresence(ctx, m, p, row, at)
}

// measurePresence flushes the row's entries, which writes the presence
// HyperLogLogs, and adds the MEMORY USAGE of every presence key under the
// row's prefix (keys.PresenceKeys) to the row's figures; it checks that the
// day's ActiveUsers count is within 2% of the users (HyperLogLog: 0.81%
// standard error).
func (c *Cmd) measurePresence(ctx context.Context, m *memRedis, p *lastseen.Plugin, row *memoryRow, at time.Time) error {
	c.progress("memory: %s: flushing %s users (the flush writes the presence HyperLogLogs)", row.Name, fmtInt(int64(c.MemoryUsers)))
	t0 := time.Now()
	if _, err := p.Flush(ctx); err != nil {
		return fmt.Errorf("lastseen: bench: memory: flush: %w", err)
	}
	row.FlushWall = time.Since(t0)
	pattern := keys.PresenceKeys(row.Prefix)
	seen := map[string]bool{}
	iter := m.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		if seen[k] {
			continue
		}
		seen[k] = true
		n, err := m.rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return fmt.Errorf("lastseen: bench: memory: MEMORY USAGE %s: %w", k, err)
		}
		row.PresenceKeys++
		row.PresenceBytes += n
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("lastseen: bench: memory: SCAN %s: %w", pattern, err)
	}
	row.BytesPerUser = float64(row.UsedDelta+row.PresenceBytes) / float64(c.MemoryUsers)
	n, err := p.ActiveUsers(ctx, at, at)
	if err != nil {
		return fmt.Errorf("lastseen: bench: memory: ActiveUsers: %w", err)
	}
	row.ActiveUsers = n
	if want := int64(c.MemoryUsers); row.PresenceKeys == 0 || n < want*98/100 || n > want*102/100 {
		problem := fmt.Sprintf("after the flush: %d presence keys, ActiveUsers %d, want within 2%% of %d", row.PresenceKeys, n, want)
		if row.Check == "ok" {
			row.Check = fmt.Sprint([]string{problem})
		} else {
			row.Check += " " + problem
		}
	}
	return nil
}

// openMemoryPlugin opens the library's row: a client of MemoryWorkers
// connections on the measured Redis, an in-memory SQLite users table and a
// plugin on them with the local cache, the scheduler and the purge off,
// and the presence counters off or (presence) at their defaults. closeAll
// closes the three.
func (c *Cmd) openMemoryPlugin(row *memoryRow, presence bool) (p *lastseen.Plugin, rdb *redis.Client, closeAll func(context.Context) error, err error) {
	opt, err := runenv.RedisOptions(row.Addr)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("lastseen: bench: %w", errors.Unwrap(err))
	}
	opt.ContextTimeoutEnabled = true // the plugin uses this client as it is
	opt.PoolSize = c.MemoryWorkers
	rdb = redis.NewClient(opt)
	db, err := gorm.Open(sqlite.Open("file:"+row.Prefix+"?mode=memory&cache=shared"), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		rdb.Close()
		return nil, nil, nil, fmt.Errorf("lastseen: bench: memory: open sqlite: %w", err)
	}
	closeDB := func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
		rdb.Close()
	}
	if err := db.AutoMigrate(&lastseen.User{}); err != nil {
		closeDB()
		return nil, nil, nil, fmt.Errorf("lastseen: bench: memory: create users: %w", err)
	}
	cfg := lastseen.Config{
		Redis:    rdb,
		Throttle: c.Throttle,
		Logger:   c.warnLogger(),
		Buffer:   lastseen.BufferConfig{Prefix: row.Prefix, LocalCacheSize: -1, TouchTimeout: 10 * time.Second},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
	}
	if !presence {
		cfg.Presence = lastseen.PresenceConfig{OnlineWindow: -1, ActiveUsersRetention: -1}
	}
	p = lastseen.New(cfg)
	if err := db.Use(p); err != nil {
		closeDB()
		return nil, nil, nil, fmt.Errorf("lastseen: bench: memory: db.Use: %w", err)
	}
	return p, rdb, func(ctx context.Context) error {
		defer closeDB()
		return p.Close(ctx)
	}, nil
}

// checkLibrary checks the library's row after the load: every touch
// recorded, Status (pending, in flight, backlog, oldest), a sample of
// Pending, and the keys under the prefix.
func (c *Cmd) checkLibrary(ctx context.Context, p *lastseen.Plugin, row *memoryRow, at time.Time) error {
	n := c.MemoryUsers
	st, err := p.Status(ctx)
	if err != nil {
		return fmt.Errorf("lastseen: bench: memory: %w", err)
	}
	row.Pending = st.Pending
	var problems []string
	if row.Recorded != int64(n) || st.Pending != int64(n) || st.InFlight != 0 || st.Backlog != 0 {
		problems = append(problems, fmt.Sprintf("%d touches recorded, Status: %d pending, %d in flight, %d in the backlog; want %d recorded and pending, nothing else",
			row.Recorded, st.Pending, st.InFlight, st.Backlog, n))
	}
	if !st.Oldest.Equal(at) {
		problems = append(problems, fmt.Sprintf("Status.Oldest = %v, want %v", st.Oldest, at))
	}
	for id := 1; id <= n; id += max(1, n/100) {
		got, ok, err := p.Pending(ctx, uint64(id))
		if err != nil {
			return fmt.Errorf("lastseen: bench: memory: Pending(%d): %w", id, err)
		}
		if !ok || !got.Equal(at) {
			problems = append(problems, fmt.Sprintf("Pending(%d) = %v, %v; want %v", id, got, ok, at))
			break
		}
	}
	problems = append(problems, c.keysDeltaProblem(row)...)
	row.Check = checkText(problems)
	return nil
}

// keysDeltaProblem compares the DBSIZE delta with the keys under the
// prefix on a private server, where nothing else writes.
func (c *Cmd) keysDeltaProblem(row *memoryRow) []string {
	if c.MemoryRedis == "" && row.KeysDelta != row.PrefixKeys {
		return []string{fmt.Sprintf("DBSIZE grew by %d but %d keys are under the prefix", row.KeysDelta, row.PrefixKeys)}
	}
	return nil
}

func checkText(problems []string) string {
	if len(problems) == 0 {
		return "ok"
	}
	return fmt.Sprint(problems)
}

// eachChunk calls fn for ids 1..n in chunks of up to size ids [from, to],
// from workers goroutines at the same time; the first error cancels the
// others and is returned.
func eachChunk(ctx context.Context, n, workers, size int, fn func(ctx context.Context, from, to int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for ctx.Err() == nil {
				to := int(next.Add(int64(size)))
				from := to - size + 1
				if from > n {
					return
				}
				if err := fn(ctx, from, min(to, n)); err != nil {
					cancel(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("lastseen: bench: memory: %w", context.Cause(ctx))
	}
	return nil
}

// warnLogger is the plugin's logger: warnings and errors on the progress
// writer.
func (c *Cmd) warnLogger() *slog.Logger {
	var w io.Writer = os.Stderr
	if c.log != nil {
		w = c.log
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelWarn}))
}
