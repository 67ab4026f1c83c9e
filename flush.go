package lastseen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// userTarget is the resolved user model and what a flush needs to write it.
type userTarget struct {
	model *model
	ids   idCodec

	mu    sync.Mutex
	write *writeTarget // nil until the first flush resolved it
}

// FlushResult counts what one Flush did. Drained = Written + Unknown + Stale
// + Rejected + Failed.
type FlushResult struct {
	Drained  int           // entries taken from Redis (in-flight and pending)
	Written  int           // rows whose last-seen column moved forward (or were inserted, Upsert)
	Unknown  int           // ids with no row in the table, skipped (Update mode)
	Stale    int           // rows whose column was already as new or newer
	Rejected int           // entries with an id or timestamp that cannot be read, dropped
	Failed   int           // entries the database refused on their own, kept in Redis for the next flush
	Batches  int           // SQL statements that committed
	Shards   int           // shards that had work
	Skipped  int           // shards skipped because another instance was flushing them
	Duration time.Duration // wall time
}

func (r *FlushResult) merge(o FlushResult) {
	r.Drained += o.Drained
	r.Written += o.Written
	r.Unknown += o.Unknown
	r.Stale += o.Stale
	r.Rejected += o.Rejected
	r.Failed += o.Failed
	r.Batches += o.Batches
	r.Shards += o.Shards
	r.Skipped += o.Skipped
}

func (r *FlushResult) add(o batchResult) {
	r.Written += o.written
	r.Unknown += o.unknown
	r.Stale += o.stale
	r.Batches += o.batches
}

// swapScript turns the pending hash into the in-flight hash (RENAME keeps
// both in the shard's slot), if this flusher still holds the shard's lock
// and no in-flight hash is left from an earlier flush.
//
//	KEYS[1] lock, KEYS[2] pending hash, KEYS[3] in-flight hash
//	ARGV[1] lock token
//
// Returns -1 when the lock is lost, -2 when an in-flight hash exists, else
// the number of entries moved (0 when nothing was pending).
var swapScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('EXISTS', KEYS[3]) == 1 then return -2 end
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('RENAME', KEYS[2], KEYS[3])
return redis.call('HLEN', KEYS[3])
`)

// ackScript removes entries the database committed from the in-flight hash
// and refreshes the lock, if this flusher still holds it. With ARGV[3] = "1"
// it also UNLINKs the in-flight hash (the scan is complete).
//
//	KEYS[1] lock, KEYS[2] in-flight hash
//	ARGV[1] lock token, ARGV[2] lock TTL in ms, ARGV[3] "1" to unlink, ARGV[4..] fields
//
// Returns -1 when the lock is lost, else the number of fields removed.
var ackScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
local n = 0
for i = 4, #ARGV, 1000 do
  n = n + redis.call('HDEL', KEYS[2], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
if ARGV[3] == '1' then redis.call('UNLINK', KEYS[2]) end
return n
`)

// failScript moves entries the database refused on their own from the
// in-flight hash back into the pending hash (newest wins; a pending value a
// flush would refuse is replaced, as touchScript does), so that the
// in-flight hash can be cleared and the rest of the shard keeps flowing.
//
//	KEYS[1] lock, KEYS[2] in-flight hash, KEYS[3] pending hash
//	ARGV[1] lock token, ARGV[2] ceiling (see parseMicros),
//	ARGV[3..] field, value, field, value, ...
//
// Returns -1 when the lock is lost, else the number of entries moved.
var failScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local ceiling = tonumber(ARGV[2])
for i = 3, #ARGV, 2 do
  redis.call('HDEL', KEYS[2], ARGV[i])
  local cur = tonumber(redis.call('HGET', KEYS[3], ARGV[i]))
  if not cur or cur < tonumber(ARGV[i + 1]) or cur > ceiling then
    redis.call('HSET', KEYS[3], ARGV[i], ARGV[i + 1])
  end
end
return (#ARGV - 2) / 2
`)

var errLockLost = errors.New("lastseen: lost the shard lock to another flusher")

// ErrRefused is returned (wrapped, with the count and the first database
// error) by a flush in which the database refused some entries on their own,
// for example through a constraint or trigger. The rest of their batches was
// written; the refused entries went back to pending for the next flush.
var ErrRefused = errors.New("lastseen: database refused entries")

// Flush moves every pending timestamp into the users table. Shard by shard
// it takes the shard's lock (skipping shards another instance is flushing),
// first finishes an in-flight hash left by a failed flush, then swaps the
// pending hash to in-flight, streams it with HSCAN in pages of BatchSize,
// writes each batch in one statement and removes it from Redis only after
// the database committed it. Touches made meanwhile land in a new pending
// hash for the next flush. Timestamps only move forward; in Update mode no
// row is ever created.
//
// On a database error the batch stays in Redis for the next flush; when the
// database is reachable but refuses a batch, the batch is split until the
// refused entries are isolated, the rest is written and the refused entries
// go back to pending (counted in Failed). It returns the counts and every
// shard's error joined, each prefixed "lastseen: flush shard N:".
func (p *Plugin) Flush(ctx context.Context) (FlushResult, error) {
	_, done, err := p.startRun() // Close waits for this flush before its own
	if err != nil {
		return FlushResult{}, err
	}
	defer done()
	return p.flush(ctx)
}

func (p *Plugin) flush(ctx context.Context) (FlushResult, error) {
	start := time.Now()
	ctx, observed := p.observeFlush(ctx)
	res := FlushResult{}
	var errs []error
	if _, err := p.tracker.replayBacklog(ctx); err != nil {
		errs = append(errs, err)
	}
	active, err := p.activeShards(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("lastseen: flush: %w", err))
	}
	// Shards hold disjoint users, so concurrent shard flushes never touch
	// the same row and cannot deadlock one another.
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(p.cfg.FlushConcurrency)
	for _, n := range active {
		g.Go(func() error {
			var r FlushResult
			sctx, end := p.observeFlushShard(ctx, n)
			err := p.flushShard(sctx, n, &r)
			end(r, err)
			mu.Lock()
			defer mu.Unlock()
			res.merge(r)
			if err != nil {
				errs = append(errs, fmt.Errorf("lastseen: flush shard %d: %w", n, err))
			}
			return nil
		})
	}
	_ = g.Wait() // the goroutines report through errs
	res.Duration = time.Since(start)
	p.stats.flushes.Add(1)
	p.stats.drained.Add(int64(res.Drained))
	p.stats.written.Add(int64(res.Written))
	p.stats.unknown.Add(int64(res.Unknown))
	p.stats.stale.Add(int64(res.Stale))
	p.stats.rejected.Add(int64(res.Rejected))
	p.stats.flushSkipped.Add(int64(res.Skipped))
	p.stats.failed.Add(int64(res.Failed))
	err = errors.Join(errs...)
	if err != nil {
		p.stats.flushErrors.Add(1)
	} else {
		p.stats.lastFlush.Store(p.now().UnixNano())
	}
	observed(res, err)
	return res, err
}

// activeShards returns the shards with a pending or in-flight hash, asking
// Redis with one pipeline of EXISTS.
func (p *Plugin) activeShards(ctx context.Context) ([]int, error) {
	shards := p.tracker.shards
	cmds := make([]*redis.IntCmd, len(shards))
	_, err := p.cfg.Redis.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, k := range shards {
			cmds[i] = pipe.Exists(ctx, k.pending, k.inflight)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var active []int
	for i, c := range cmds {
		if c.Val() > 0 {
			active = append(active, i)
		}
	}
	return active, nil
}

func (p *Plugin) flushShard(ctx context.Context, n int, res *FlushResult) error {
	keys := p.tracker.shards[n]
	lock, err := p.locker.Obtain(ctx, keys.lock, p.cfg.LockTTL, nil)
	if errors.Is(err, redislock.ErrNotObtained) {
		res.Skipped++
		return nil
	}
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	defer lock.Release(context.WithoutCancel(ctx))
	res.Shards++
	for {
		moved, err := swapScript.Run(ctx, p.cfg.Redis, []string{keys.lock, keys.pending, keys.inflight}, lock.Token()).Int()
		if err != nil {
			return fmt.Errorf("swap: %w", err)
		}
		switch moved {
		case -1:
			return errLockLost
		case 0:
			return nil
		case -2: // an earlier flush left an in-flight hash: finish it first
			if err := p.drainInflight(ctx, n, lock.Token(), res); err != nil {
				return err
			}
		default:
			p.hooks.afterSwap(n)
			return p.drainInflight(ctx, n, lock.Token(), res)
		}
	}
}

// entry is one pending timestamp as stored in Redis and as bound for SQL.
type entry struct {
	field, value string
	id           any
	at           time.Time
}

// drainInflight streams the in-flight hash with HSCAN and writes it batch by
// batch; see Flush.
func (p *Plugin) drainInflight(ctx context.Context, n int, token string, res *FlushResult) error {
	keys := p.tracker.shards[n]
	batchNo := 0
	bs := p.cfg.BatchSize
	batch := make([]entry, 0, bs)
	seen := make(map[string]struct{}, bs)
	var rejected []string
	var failed int
	var firstRefusal error
	ttl := p.cfg.LockTTL.Milliseconds()
	now := p.now()

	ack := func(fields []string, final bool) error {
		args := make([]any, 0, len(fields)+3)
		args = append(args, token, ttl, map[bool]string{true: "1", false: "0"}[final])
		for _, f := range fields {
			args = append(args, f)
		}
		n, err := ackScript.Run(ctx, p.cfg.Redis, []string{keys.lock, keys.inflight}, args...).Int()
		if err != nil {
			return fmt.Errorf("ack: %w", err)
		}
		if n < 0 {
			return errLockLost
		}
		return nil
	}
	writeOut := func() error {
		if len(batch) == 0 {
			return nil
		}
		br, refused, err := p.writeBatch(ctx, batch)
		res.add(br)
		if err != nil {
			return err
		}
		batchNo++
		p.hooks.afterCommit(n, batchNo)
		fields := make([]string, 0, len(batch)+len(rejected))
		for _, e := range batch {
			fields = append(fields, e.field)
		}
		fields = append(fields, rejected...)
		if len(refused) > 0 {
			if err := p.requeue(ctx, keys, token, refused); err != nil {
				return err
			}
			res.Failed += len(refused)
			failed += len(refused)
			if firstRefusal == nil {
				firstRefusal = refused[0].err
			}
		}
		if err := ack(fields, false); err != nil {
			return err
		}
		p.hooks.afterAck(n, batchNo)
		res.Drained += len(batch) + len(rejected)
		res.Rejected += len(rejected)
		batch, rejected = batch[:0], rejected[:0]
		clear(seen)
		return nil
	}

	var cursor uint64
	for {
		kv, next, err := p.cfg.Redis.HScan(ctx, keys.inflight, cursor, "", int64(bs)).Result()
		if err != nil {
			return fmt.Errorf("hscan: %w", err)
		}
		for i := 0; i+1 < len(kv); i += 2 {
			field, value := kv[i], kv[i+1]
			if _, dup := seen[field]; dup {
				continue
			}
			seen[field] = struct{}{}
			id, errID := p.users.ids.parse(field)
			at, okTime := parseMicros(value, now)
			if errID != nil || !okTime {
				rejected = append(rejected, field)
				p.limited.log(p.log, slog.LevelWarn, "lastseen: dropping unreadable pending entry", "key", keys.inflight, "field", truncate(field), "value", truncate(value))
				continue
			}
			batch = append(batch, entry{field: field, value: value, id: id, at: at})
			if len(batch) == bs {
				if err := writeOut(); err != nil {
					return err
				}
			}
		}
		cursor = next
		if cursor == 0 {
			break
		}
	}
	if err := writeOut(); err != nil {
		return err
	}
	if len(rejected) > 0 { // only rejected entries were left
		res.Drained += len(rejected)
		res.Rejected += len(rejected)
	}
	p.hooks.beforeUnlink(n)
	if err := ack(rejected, true); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%w: %d entries, back in pending for the next flush: %v", ErrRefused, failed, firstRefusal)
	}
	return nil
}

// requeue moves refused entries back to pending; see failScript.
func (p *Plugin) requeue(ctx context.Context, keys shardKeys, token string, refused []refusal) error {
	args := make([]any, 0, 2+2*len(refused))
	args = append(args, token, ceiling(p.now()))
	for _, r := range refused {
		args = append(args, r.field, r.value)
	}
	n, err := failScript.Run(ctx, p.cfg.Redis, []string{keys.lock, keys.inflight, keys.pending}, args...).Int()
	if err != nil {
		return fmt.Errorf("requeue: %w", err)
	}
	if n < 0 {
		return errLockLost
	}
	return nil
}

// batchResult counts one written batch.
type batchResult struct {
	written, unknown, stale, batches int
}

// refusal is an entry the database refused on its own, with its error.
type refusal struct {
	entry
	err error
}

// writeBatch writes one batch. It retries deadlocks and serialization
// failures up to MaxRetries times. When the database is reachable but the
// batch failed, it tries the whole batch once more (the error may have been
// the connection's: killed, failed over; the pool has replaced it by then),
// then splits the batch in halves until the refused entries stand alone,
// writes the rest, and returns the refused entries with a nil error; any
// other error (database unreachable, context ended) is returned, and then
// nothing of the batch has committed.
func (p *Plugin) writeBatch(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		return br, nil, nil
	}
	if ctx.Err() != nil || p.statementError(err) || !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	return p.isolateRefused(ctx, batch)
}

// statementError reports an error no single entry can cause; see
// dialect.statementError.
func (p *Plugin) statementError(err error) bool {
	return errors.Is(err, errNoTable) || p.dialect.statementError(err)
}

// isolateRefused writes a batch the reachable database failed once: whole,
// then, if refused again, in halves, recursively.
func (p *Plugin) isolateRefused(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		return br, nil, nil
	}
	if ctx.Err() != nil || p.statementError(err) || !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	if len(batch) == 1 {
		p.limited.log(p.log, slog.LevelError, "lastseen: database refused a pending entry; it goes back to pending", "id", batch[0].field, "err", err)
		return batchResult{}, []refusal{{batch[0], err}}, nil
	}
	half := len(batch) / 2
	a, ra, err := p.isolateRefused(ctx, batch[:half])
	if err != nil {
		return a, nil, err
	}
	b, rb, err := p.isolateRefused(ctx, batch[half:])
	a.written += b.written
	a.unknown += b.unknown
	a.stale += b.stale
	a.batches += b.batches
	if err != nil {
		return a, nil, err
	}
	return a, append(ra, rb...), nil
}

// databaseUp tells a refused batch from an unreachable database with a
// SELECT 1 through the same GORM handle the writes use.
func (p *Plugin) databaseUp(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return p.db.WithContext(ctx).Exec("SELECT 1").Error == nil
}

func (p *Plugin) writeWithRetry(ctx context.Context, batch []entry) (batchResult, error) {
	for attempt := 0; ; attempt++ {
		br, err := p.writeOnce(ctx, batch)
		if err == nil || attempt >= p.cfg.MaxRetries || !p.dialect.retryable(err) {
			return br, err
		}
		p.log.Warn("lastseen: retrying batch", "attempt", attempt+1, "err", err)
		if err := backoff(ctx, attempt); err != nil {
			return br, err
		}
	}
}

// writeOnce runs the batch's one statement and counts the result.
func (p *Plugin) writeOnce(ctx context.Context, batch []entry) (batchResult, error) {
	t, err := p.writeTarget(ctx)
	if err != nil {
		return batchResult{}, err
	}
	db := p.db.WithContext(ctx)
	ids := make([]any, len(batch))
	ts := make([]time.Time, len(batch))
	for i, e := range batch {
		ids[i], ts[i] = e.id, e.at
	}
	n := len(batch)
	if p.cfg.WriteMode == Upsert {
		return p.upsert(db, t, ids, ts)
	}
	tx := db.Exec("?", p.dialect.update(t, ids, ts))
	if tx.Error != nil {
		return batchResult{}, tx.Error
	}
	br := batchResult{written: int(tx.RowsAffected), batches: 1}
	if br.written < n {
		existing, err := p.countExisting(db, t, ids)
		if err != nil {
			// The write committed; only the split of the rest is unknown.
			br.stale = n - br.written
			return br, nil
		}
		br.unknown = n - existing
		br.stale = existing - br.written
	}
	return br, nil
}

func (p *Plugin) countExisting(db *gorm.DB, t *writeTarget, ids []any) (int, error) {
	var existing int64
	if p.dialect.count != nil {
		err := db.Raw("?", p.dialect.count(t, ids)).Scan(&existing).Error
		return int(existing), err
	}
	err := db.Table("?", clause.Table{Name: t.table}).Where(clause.IN{Column: clause.Column{Name: t.pk}, Values: ids}).Count(&existing).Error
	return int(existing), err
}

func (p *Plugin) upsert(db *gorm.DB, t *writeTarget, ids []any, ts []time.Time) (batchResult, error) {
	n := len(ids)
	existing := 0
	if p.dialect.upsertDoubleCounts {
		var err error
		if existing, err = p.countExisting(db, t, ids); err != nil {
			return batchResult{}, err
		}
	}
	rows := make([]map[string]any, n)
	for i := range ids {
		rows[i] = map[string]any{t.pk: ids[i], t.col: ts[i]}
	}
	table := clause.Table{Name: t.table}
	tx := db.Table("?", table).Clauses(clause.Insert{Table: table}, p.dialect.onConflict(t)).Create(&rows)
	if tx.Error != nil {
		return batchResult{}, tx.Error
	}
	affected := int(tx.RowsAffected)
	written := affected
	if p.dialect.upsertDoubleCounts {
		// MySQL: 1 per inserted row, 2 per updated row, 0 per unchanged row.
		inserted := n - existing
		written = inserted + (affected-inserted)/2
	}
	return batchResult{written: written, stale: n - written, batches: 1}, nil
}

// writeTarget resolves table, columns and, on PostgreSQL, their SQL types,
// once the table exists.
func (p *Plugin) writeTarget(ctx context.Context) (*writeTarget, error) {
	u := p.users
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.write != nil {
		return u.write, nil
	}
	t := &writeTarget{table: u.model.table, pk: u.model.pk.DBName, col: u.model.time.DBName,
		intKey: u.ids.kind == idSigned || u.ids.kind == idUnsigned}
	if p.dialect.columnTypes != nil {
		if err := p.dialect.columnTypes(p.db.WithContext(ctx), t); err != nil {
			return nil, err
		}
	}
	u.write = t
	return t, nil
}

// LastSeen returns the freshest known time the user was seen: the newest of
// the pending and in-flight entries in Redis, the in-process backlog, and
// the database column. ok is false when none has a value. When Redis cannot
// be read within 5×TouchTimeout (100ms by default) it answers from the
// backlog and the column alone (best effort, as presence is) and logs a
// rate-limited warning. Errors: ErrInvalidUserID,
// ErrNotInitialized, or the database's error wrapped.
func (p *Plugin) LastSeen(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	if p.tracker == nil {
		return time.Time{}, false, ErrNotInitialized
	}
	rctx, cancel := context.WithTimeout(ctx, 5*p.cfg.TouchTimeout) // Redis is best effort here
	at, ok, err = p.Pending(rctx, userID)
	cancel()
	if errors.Is(err, ErrInvalidUserID) {
		return at, ok, err
	}
	if err != nil {
		p.tracker.warn.Do(func() { p.log.Warn("lastseen: redis unreadable; LastSeen answers from the database", "err", err) })
		uid, _ := p.users.ids.normalize(userID)
		if b, found := p.tracker.backlog.get(uid); found {
			at, ok = time.UnixMicro(b).UTC(), true
		}
	}
	uid, _ := p.users.ids.normalize(userID)
	id, _ := p.users.ids.parse(uid)
	m := p.users.model
	var col columnTime // dialect.go: SQLite may return text
	row := p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?", clause.Column{Name: m.time.DBName}).
		Where(clause.Eq{Column: clause.Column{Name: m.pk.DBName}, Value: id}).Limit(1).Row()
	switch err := row.Scan(&col); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return at, ok, fmt.Errorf("lastseen: last seen of user %s: %w", uid, err)
	case col.Valid && col.Time.After(at):
		at, ok = col.Time.UTC(), true
	}
	return at, ok, nil
}

// flushJob is the scheduled flush: one structured log line per run, at
// Debug when it found nothing to write.
func (p *Plugin) flushJob(ctx context.Context) {
	res, err := p.flush(ctx)
	attrs := []any{"drained", res.Drained, "written", res.Written, "unknown", res.Unknown, "stale", res.Stale,
		"rejected", res.Rejected, "failed", res.Failed, "batches", res.Batches, "shards", res.Shards,
		"skipped", res.Skipped, "duration", res.Duration}
	if err != nil {
		p.log.Error("lastseen: flush failed", append(attrs, "err", err)...)
		return
	}
	if res.Drained == 0 {
		p.log.Debug("lastseen: flush: nothing pending", attrs...)
		return
	}
	p.log.Info("lastseen: flush", attrs...)
}

// flushHooks are test hooks called at fixed points of a flush, to stop a
// flusher exactly there (crash tests kill the process at these points). The
// Plugin's hooks field is nil in production; every method is a no-op then.
type flushHooks struct {
	// AfterSwap: the shard's pending hash was just renamed to in-flight.
	AfterSwap func(shard int)
	// AfterCommit: batch number batch (from 1) of the shard committed in the
	// database; it is still in the in-flight hash.
	AfterCommit func(shard, batch int)
	// AfterAck: the batch was removed from the in-flight hash; the next
	// batch has not started.
	AfterAck func(shard, batch int)
	// BeforeUnlink: every batch is written and acknowledged; the final
	// acknowledgement, which unlinks the in-flight hash, comes next.
	BeforeUnlink func(shard int)
}

func (h *flushHooks) afterSwap(shard int) {
	if h != nil && h.AfterSwap != nil {
		h.AfterSwap(shard)
	}
}

func (h *flushHooks) afterCommit(shard, batch int) {
	if h != nil && h.AfterCommit != nil {
		h.AfterCommit(shard, batch)
	}
}

func (h *flushHooks) afterAck(shard, batch int) {
	if h != nil && h.AfterAck != nil {
		h.AfterAck(shard, batch)
	}
}

func (h *flushHooks) beforeUnlink(shard int) {
	if h != nil && h.BeforeUnlink != nil {
		h.BeforeUnlink(shard)
	}
}
