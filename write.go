package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// batchResult counts one written batch.
type batchResult struct {
	written, unknown, stale, batches int
	ambiguous                        int      // of the rows left unwritten, those a repeated hour hides (countAmbiguous)
	uncomparable                     []string // fields of entries the guard could not compare
}

// refusal is an entry the database refused on its own, with its error.
type refusal struct {
	entry
	err error
}

// writeBatch writes one batch, sorted by primary key, in statements of
// the working batch size (batchSizer; Flush.BatchSize until a statement ran
// past the statement bound): writeChunks.
func (p *Plugin) writeBatch(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	sortBatch(batch) // index order, one lock order
	return p.writeChunks(ctx, batch)
}

// writeChunks writes a sorted batch a chunk of the working size at a time
// (writeChunk). It returns what committed, the refused entries, and the
// first error that stopped it; the chunks committed before that error stay
// committed, and their entries are written again, as no-ops, by the next
// flush.
func (p *Plugin) writeChunks(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	var res batchResult
	var refused []refusal
	for len(batch) > 0 {
		n := min(len(batch), p.sizer.size())
		br, rf, err := p.writeChunk(ctx, batch[:n])
		res.merge(br)
		if err != nil {
			return res, nil, err
		}
		refused = append(refused, rf...)
		batch = batch[n:]
	}
	return res, refused, nil
}

// writeChunk writes one statement's worth of entries. It retries deadlocks,
// serialization failures and errors of the connection or the server's
// state (Dialect.Transient: a killed backend, a failover) up to MaxRetries
// times; a transient error that outlasts them keeps the chunk in the
// buffer, never counted against any entry. A statement that ran
// past the statement bound is written in halves (splitTimedOut). When the
// chunk fails with an error the server reported (one with a kind,
// Dialect.ErrorKind), probeBatch decides whether no row can have caused it
// (systemic: the chunk stays in the buffer and ErrSystemic is returned) or
// rows were refused on their own. When the error has no kind and the
// database is reachable, it tries the whole chunk once more (the error may
// have been the connection's: killed, failed over; the pool has replaced
// it by then). Either way it then splits the chunk in halves until the
// refused entries stand alone, writes the rest, and returns the refused
// entries with a nil error; any other error (database unreachable, context
// ended) is returned, and then nothing of the chunk has committed.
func (p *Plugin) writeChunk(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	start := time.Now()
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		p.sizer.committed(len(batch), time.Since(start))
		return br, nil, nil
	}
	if ctx.Err() == nil && errors.Is(err, errStatementTimeout) {
		return p.splitTimedOut(ctx, batch, err)
	}
	// A deadlock or serialization failure that outlasted MaxRetries is
	// contention, not a refusal: the batch stays for the next flush.
	// An OnBatch failure is never split either (ErrOnBatch).
	if ctx.Err() != nil || errors.Is(err, errNoTable) || errors.Is(err, ErrOnBatch) || p.dialect.Retryable(err) {
		return batchResult{}, nil, err
	}
	if p.dialect.Transient(err) {
		return batchResult{}, nil, p.transientError(len(batch), err)
	}
	if kind := p.dialect.ErrorKind(err); kind != "" { // the server answered
		if p.dialect.Exhausted(kind) {
			return batchResult{}, nil, p.exhaustedError(kind, len(batch), err)
		}
		return p.probeBatch(ctx, batch, err, kind)
	}
	if !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	return p.isolateRefused(ctx, batch)
}

// splitTimedOut writes a batch whose statement ran past the statement
// bound (err) within the same flush, while its context lasts: the working
// size drops to at most half the batch (batchSizer.timedOut), and the
// halves are written in chunks of it, each split again if it too runs past
// the bound. A single entry that still does is refused like any entry the
// database refuses on its own: back in the buffer, toward MaxRefusals.
func (p *Plugin) splitTimedOut(ctx context.Context, batch []entry, err error) (batchResult, []refusal, error) {
	if len(batch) == 1 {
		return batchResult{}, []refusal{p.refused(batch[0], err)}, nil
	}
	size := p.sizer.timedOut(len(batch))
	p.limited.log(p.log, slog.LevelWarn, "lastseen: a flush statement ran past its time bound; writing smaller batches",
		"rows", len(batch), "batch_size", size, "bound", p.cfg.StatementTimeout)
	half := len(batch) / 2
	a, ra, err := p.writeChunks(ctx, batch[:half])
	if err != nil {
		return a, nil, err
	}
	b, rb, err := p.writeChunks(ctx, batch[half:])
	a.merge(b)
	if err != nil {
		return a, nil, err
	}
	return a, append(ra, rb...), nil
}

// serverGrace is how much longer than the statement bound the client
// waits for a statement the server bounds itself (Target.ServerBound), so
// that the server's own error ends it, rolled back, rather than the
// client's giving up while the server runs on.
const serverGrace = time.Second

// statement returns ctx bounded by StatementTimeout (plus serverGrace for
// the write of a target the server bounds itself; t may be nil), for one
// SQL statement of a flush (or the transaction of a write and OnBatch), and
// a check that wraps a statement's error with errStatementTimeout when
// that bound (not ctx) ended it, or the server stopped it at its own time
// bound (Dialect.TimedOut): such a batch is written in halves
// (splitTimedOut).
func (p *Plugin) statement(ctx context.Context, t *dialect.Target) (context.Context, context.CancelFunc, func(error) error) {
	limit := p.cfg.StatementTimeout
	if t != nil && t.ServerBound {
		limit += serverGrace
	}
	sctx, cancel := context.WithTimeoutCause(ctx, limit, errStatementTimeout)
	check := func(err error) error {
		switch {
		case err == nil || ctx.Err() != nil:
			return err
		case context.Cause(sctx) == errStatementTimeout:
			return fmt.Errorf("timed out after %v (%w): %w", p.cfg.StatementTimeout, errStatementTimeout, err)
		case p.dialect.TimedOut(err):
			return fmt.Errorf("stopped by the server at its time bound (%w): %w", errStatementTimeout, err)
		}
		return err
	}
	return sctx, cancel, check
}

// transientError is the error of a batch of n entries that met an error of
// the connection or the server's state (Dialect.Transient) after its
// retries: the entries stay buffered for the next flush, and none of them
// counts toward MaxRefusals.
func (p *Plugin) transientError(n int, err error) error {
	return fmt.Errorf("lastseen: the database connection or server failed%s: %w", p.keeps(fmt.Sprintf(" (%d entries kept for the next flush)", n)), err)
}

// isolateRefused writes a batch the reachable database failed once: whole,
// then, if refused again, in halves, recursively; one that runs past the
// statement bound is split by splitTimedOut.
func (p *Plugin) isolateRefused(ctx context.Context, batch []entry) (batchResult, []refusal, error) {
	if len(batch) == 0 {
		return batchResult{}, nil, nil
	}
	br, err := p.writeWithRetry(ctx, batch)
	if err == nil {
		return br, nil, nil
	}
	if ctx.Err() == nil && errors.Is(err, errStatementTimeout) {
		return p.splitTimedOut(ctx, batch, err)
	}
	if ctx.Err() != nil || errors.Is(err, errNoTable) || errors.Is(err, ErrOnBatch) {
		return batchResult{}, nil, err
	}
	if p.dialect.Transient(err) {
		return batchResult{}, nil, p.transientError(len(batch), err)
	}
	if p.dialect.ErrorKind(err) == "" && !p.databaseUp(ctx) {
		return batchResult{}, nil, err
	}
	if kind := p.dialect.ErrorKind(err); p.dialect.Exhausted(kind) {
		return batchResult{}, nil, p.exhaustedError(kind, len(batch), err)
	}
	if len(batch) == 1 {
		return batchResult{}, []refusal{p.refused(batch[0], err)}, nil
	}
	half := len(batch) / 2
	a, ra, err := p.isolateRefused(ctx, batch[:half])
	if err != nil {
		return a, nil, err
	}
	b, rb, err := p.isolateRefused(ctx, batch[half:])
	a.merge(b)
	if err != nil {
		return a, nil, err
	}
	return a, append(ra, rb...), nil
}

// refused logs one entry the database refused on its own.
func (p *Plugin) refused(e entry, err error) refusal {
	p.limited.log(p.log, slog.LevelError, "lastseen: database refused a pending entry"+p.keeps("; it goes back to pending"), "id", e.field, "err", err)
	return refusal{e, err}
}

func (a *batchResult) merge(b batchResult) {
	a.written += b.written
	a.unknown += b.unknown
	a.stale += b.stale
	a.batches += b.batches
	a.ambiguous += b.ambiguous
	a.uncomparable = append(a.uncomparable, b.uncomparable...)
}

// databaseUp tells a refused batch from an unreachable database with a
// SELECT 1 through the same GORM handle the writes use.
func (p *Plugin) databaseUp(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, min(5*time.Second, p.cfg.StatementTimeout))
	defer cancel()
	return p.db.WithContext(ctx).Exec("SELECT 1").Error == nil
}

// writeWithRetry writes the batch, retrying deadlocks, serialization
// failures and errors of the connection or the server's state
// (Dialect.Transient; the pool has replaced a broken connection by then)
// up to MaxRetries times (retry), with a warning per retry.
func (p *Plugin) writeWithRetry(ctx context.Context, batch []entry) (br batchResult, err error) {
	attempt := 0
	retryable := func(err error) bool {
		if !p.dialect.Retryable(err) && !p.dialect.Transient(err) {
			return false
		}
		attempt++
		p.log.Warn("lastseen: retrying batch", "attempt", attempt, "err", err)
		return true
	}
	_, err = retry(ctx, p.cfg.MaxRetries, retryable, func() error {
		br, err = p.writeOnce(ctx, batch)
		return err
	})
	return br, err
}

// writeOnce runs the batch's one statement, with Config.OnBatch in the same
// transaction when set (withHook), and counts the result. The column-type
// lookup, the write (with OnBatch) and the row count each get
// StatementTimeout.
func (p *Plugin) writeOnce(ctx context.Context, batch []entry) (batchResult, error) {
	tctx, cancel, check := p.statement(ctx, nil)
	t, err := p.writeTarget(tctx)
	cancel()
	if err != nil {
		return batchResult{}, check(err)
	}
	p.hooks.Writing(batchFields(batch))
	sctx, cancel, check := p.statement(ctx, t)
	defer cancel()
	db := p.db.WithContext(sctx)
	ids := make([]any, len(batch))
	ts := make([]time.Time, len(batch))
	for i, e := range batch {
		ids[i], ts[i] = e.id, e.at
	}
	br, err := p.writeStatement(ctx, db, t, batch, ids, ts, check)
	if err != nil || br.stale == 0 {
		return br, err
	}
	if n, err := p.countAmbiguous(db, t, batch); err != nil {
		p.limited.log(p.log, slog.LevelWarn, "lastseen: cannot look for entries in a repeated hour", "err", err)
	} else if n > 0 {
		br.ambiguous, br.stale = n, br.stale-n
		p.log.Warn("lastseen: entries in an hour a DST fall-back repeats were left unwritten: the column's wall time names two instants and the database cannot tell which",
			"ambiguous", n, "zone", p.users.zone.String())
	}
	// A row left unwritten may hold a value the guard cannot compare.
	if u, err := p.findUncomparable(db, t, ids); err == nil && len(u) > 0 {
		br.uncomparable, br.stale = u, br.stale-len(u)
	} else if err != nil {
		// The write committed; which rows were not comparable is unknown.
		p.limited.log(p.log, slog.LevelWarn, "lastseen: cannot look for uncomparable column values", "err", err)
	}
	return br, nil
}

// writeStatement runs the batch's statement (withHook) on db, bounded by
// StatementTimeout (check names a timeout), and splits the rows it did not
// write into Unknown and Stale with a count bounded the same way.
func (p *Plugin) writeStatement(ctx context.Context, db *gorm.DB, t *dialect.Target, batch []entry, ids []any, ts []time.Time, check func(error) error) (batchResult, error) {
	n := len(batch)
	if p.cfg.WriteMode == upsert {
		br, err := p.withHook(db, batch, func(tx *gorm.DB) (batchResult, error) { return p.upsert(tx, t, ids, ts) })
		return br, check(err)
	}
	br, err := p.withHook(db, batch, func(tx *gorm.DB) (batchResult, error) {
		written, err := p.dialect.Update(tx, t, ids, ts)
		return batchResult{written: written, batches: 1}, err
	})
	if err != nil {
		return batchResult{}, check(err)
	}
	if br.written < n {
		cctx, cancel, _ := p.statement(ctx, nil)
		defer cancel()
		existing, err := p.dialect.Count(p.db.WithContext(cctx), t, ids)
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

// batchFields returns the fields (ids in their stored text) of a batch.
func batchFields(batch []entry) []string {
	out := make([]string, len(batch))
	for i, e := range batch {
		out[i] = e.field
	}
	return out
}

// upsert writes the batch with the dialect's upsert (Flush.Upsert).
func (p *Plugin) upsert(db *gorm.DB, t *dialect.Target, ids []any, ts []time.Time) (batchResult, error) {
	written, err := p.dialect.Upsert(db, t, ids, ts)
	if err != nil {
		return batchResult{}, err
	}
	return batchResult{written: written, stale: len(ids) - written, batches: 1}, nil
}

// ping runs SELECT 1 as a query (GORM's row callbacks, not Exec's), so that
// an app counting its write statements does not count it. Scan, not Row:
// Row returns a nil *sql.Row when a callback failed the statement.
func ping(db *gorm.DB) error {
	var one int
	return db.Raw("SELECT 1").Scan(&one).Error
}

// writeBacklog writes the backlog of a buffer whose replay into Redis
// failed (buffer.Backlog: the Redis buffer's touches Redis did not take)
// straight to the table, so that presence reaches the database, and
// survives Close, while Redis is down: BatchSize entries per statement,
// with the flush's own write (writeBatch: forward-only, refused rows
// isolated).
// Entries not written (a batch that failed, refused rows, what comes after
// a failure) go back to the backlog for the next flush; an unreadable entry
// cannot occur (Touch normalized it). It returns the counts of what it
// wrote and the first error.
func (p *Plugin) writeBacklog(ctx context.Context, h buffer.Backlog) (FlushResult, error) {
	m := h.TakeBacklog()
	var res FlushResult
	if len(m) == 0 {
		return res, nil
	}
	now := p.now()
	all := make([]entry, 0, len(m))
	for uid, ts := range m {
		id, err := p.users.ids.Parse(uid)
		at, ok := buffer.ParseMicros(strconv.FormatInt(ts, 10), now)
		if err != nil || !ok {
			continue // never true for what Touch put there; dropped like an unreadable entry
		}
		all = append(all, entry{field: uid, value: strconv.FormatInt(ts, 10), id: id, at: at, bucket: -1})
	}
	for start := 0; start < len(all); start += p.cfg.BatchSize {
		batch := all[start:min(start+p.cfg.BatchSize, len(all))]
		br, refused, err := p.writeBatch(ctx, batch)
		res.add(br)
		if err != nil {
			h.ReturnBacklog(entriesMap(all[start:]))
			return res, fmt.Errorf("lastseen: write backlog to the database: %w", err)
		}
		written := len(batch) - len(refused)
		res.Drained += written
		if len(refused) > 0 {
			back := make(map[string]int64, len(refused))
			for _, r := range refused {
				back[r.field] = m[r.field]
			}
			h.ReturnBacklog(back)
			res.Failed += len(refused)
		}
	}
	return res, nil
}

func entriesMap(es []entry) map[string]int64 {
	m := make(map[string]int64, len(es))
	for _, e := range es {
		ts, _ := strconv.ParseInt(e.value, 10, 64)
		m[e.field] = ts
	}
	return m
}

// Seen is one entry of a batch as Flush.OnBatch receives it. The write
// only moved the column forward: a row already as new, or an id without a
// row, was left unchanged.
type Seen struct {
	ID any       // the primary key as the key field's Go type (int64, string, uuid.UUID, ...)
	At time.Time // the timestamp written (UTC, microseconds)
}

// SeenIDs returns the batch's ids as T, the key field's Go type, for a
// `WHERE id IN ?` in an OnBatch hook; it panics when T is another type.
//
//	ids := lastseen.SeenIDs[int64](batch)
func SeenIDs[T any](batch []Seen) []T {
	ids := make([]T, len(batch))
	for i, s := range batch {
		ids[i] = s.ID.(T)
	}
	return ids
}

// withHook runs write, the batch's one bulk statement, and, when
// Config.OnBatch is set, runs both in one transaction with the hook after
// the statement: the hook's statements commit or roll back with the batch's
// timestamps.
//
// The bulk statement is raw SQL (UPDATE ... FROM or JOIN, or INSERT ... ON
// CONFLICT with a map): GORM's model hooks (BeforeSave, BeforeUpdate,
// AfterUpdate, AfterSave, BeforeCreate, AfterCreate) do not run for it,
// autoUpdateTime fields (UpdatedAt) are not set, and the soft-delete filter
// does not apply (a soft-deleted row's column moves too). OnBatch is the
// place for what such hooks would do.
func (p *Plugin) withHook(db *gorm.DB, batch []entry, write func(tx *gorm.DB) (batchResult, error)) (batchResult, error) {
	hook := p.cfg.OnBatch
	if hook == nil {
		return write(db)
	}
	var br batchResult
	err := db.Transaction(func(tx *gorm.DB) error {
		var err error
		if br, err = write(tx); err != nil {
			return err
		}
		if err := runHook(hook, tx.Session(&gorm.Session{NewDB: true}), p.seen(batch)); err != nil {
			return fmt.Errorf("%w: %w", ErrOnBatch, err)
		}
		return nil
	})
	if err != nil {
		return batchResult{}, err
	}
	return br, nil
}

// seen converts a batch for OnBatch, each id to the primary key field's Go
// type where the codec's type differs only in width or name (int64 to int,
// uint64 to uint, string to a named string type).
func (p *Plugin) seen(batch []entry) []Seen {
	ft := p.users.model.pk.FieldType
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	out := make([]Seen, len(batch))
	for i, e := range batch {
		out[i] = Seen{ID: convertID(e.id, ft), At: e.at}
	}
	return out
}

func convertID(id any, to reflect.Type) any {
	v := reflect.ValueOf(id)
	if !v.IsValid() || v.Type() == to || kindClass(v.Kind()) == 0 || kindClass(v.Kind()) != kindClass(to.Kind()) {
		return id
	}
	return v.Convert(to).Interface()
}

// kindClass groups the kinds a key converts between without changing its
// value: 1 integers, 2 strings; 0 anything else.
func kindClass(k reflect.Kind) int {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return 1
	case reflect.String:
		return 2
	}
	return 0
}

// runHook calls the app's OnBatch hook, turning a panic into an error so
// that the batch rolls back and stays buffered: the hook runs on one of the
// flush's own goroutines, where the app cannot recover it.
func runHook(hook func(*gorm.DB, []Seen) error, tx *gorm.DB, batch []Seen) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return hook(tx, batch)
}

// countAmbiguous counts the entries of a batch that a DST fall-back left
// unwritten where the statement compared wall times (no Target.Zone, on a
// naive column whose location has DST): an entry in the second pass of a
// repeated hour (02:10 CET) whose row holds a wall time at or after its own
// that names an earlier instant too (02:50, which was CEST): later in real
// time, but not newer to the guard. It reads those entries' rows (a few,
// once a year) and compares in Go.
func (p *Plugin) countAmbiguous(db *gorm.DB, t *dialect.Target, batch []entry) (int, error) {
	loc := p.users.zone
	if loc == nil || t.Zone != "" || !t.Codec.Naive() {
		return 0, nil
	}
	second := map[string]entry{}
	var ids []any
	for _, e := range batch {
		if timecol.SecondPass(e.at, loc) {
			second[e.field] = e
			ids = append(ids, e.id)
		}
	}
	if len(ids) == 0 {
		return 0, nil
	}
	pk, col := clause.Column{Name: t.PK}, clause.Column{Name: t.Column}
	rows, err := db.Table("?", clause.Table{Name: t.Table}).Select("?, ?", pk, col).Where(clause.IN{Column: pk, Values: ids}).Rows()
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		id := reflect.New(p.users.ids.Type)
		var cur timecol.NullTime
		if err := rows.Scan(id.Interface(), &cur); err != nil {
			return 0, err
		}
		field, err := p.users.ids.Normalize(id.Elem().Interface())
		e, ok := second[field]
		if err != nil || !ok || !cur.Valid {
			continue
		}
		const wall = "2006-01-02 15:04:05.999999"
		if cur.Time.Format(wall) != e.at.In(loc).Format(wall) && timecol.Earliest(cur.Time, loc).Before(e.at) {
			n++
		}
	}
	return n, rows.Err()
}
