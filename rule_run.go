package lastseen

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// RunRule runs the inactivity rule name of p's Config.Rules now, as the
// scheduler does: it acts on the rows inactive at the run's start, in
// batches of Rule.BatchSize in primary-key order, each in its own
// transaction that checks the rule again, leaves out the rows whose newer
// activity is still buffered, and deletes the rest or hands them to
// Rule.Action. In the PurgeResult, Deleted counts the rows deleted or
// handed to the Action, Batches the transactions committed (a batch whose
// every row is held back by buffered activity opens none), Kept the rows
// held back. One instance runs a rule at a time (ErrLocked).
// A row the database refuses on its own is skipped (Refused); ErrSystemic,
// the Action's error and other errors, prefixed `lastseen: rule "name"
// batch N:`, stop the run, as do ctx (ctx.Err()) and Close (ErrClosed),
// between batches. An unknown name is an error naming p's rules.
func (p *Plugin) RunRule(ctx context.Context, name string) (PurgeResult, error) {
	db, done, err := p.startRun()
	if err != nil {
		return PurgeResult{}, err
	}
	defer done()
	r, err := p.rule(name)
	if err != nil {
		return PurgeResult{}, err
	}
	ctx, observed := p.observeRule(ctx, name)
	sw := p.ruleSweep(r)
	if err := p.checkTable(ctx, fmt.Sprintf("rule %q", name), r.check(), &r.schemaOK); err != nil {
		res := PurgeResult{Stopped: true}
		sw.counted(res, err)
		observed(res, err)
		return res, err
	}
	res, err := p.purgeLocked(ctx, db, sw)
	if schemaMayBeGone(err) { // the next run checks the table again
		r.schemaOK.Store(false)
	}
	observed(res, err)
	return res, err
}

// ruleSweep is rule r as a sweep (purgeLocked runs it).
func (p *Plugin) ruleSweep(r *ruleTarget) *sweep {
	name := r.cfg.Name
	return &sweep{
		rule: name, what: fmt.Sprintf("rule %q", name), noun: "row", model: r.model, size: r.cfg.BatchSize,
		lock: func(ctx context.Context) (buffer.Lease, error) { return p.tracker.buf.LockRule(ctx, name) },
		lost: r.lost, cond: r.inactive,
		prepare: func(ctx context.Context, db *gorm.DB, ids []any, cutoff time.Time) (func(tx *gorm.DB) (int, error), int) {
			free := p.idle(ctx, r, ids, cutoff)
			if len(free) == 0 {
				return nil, len(ids)
			}
			cond := r.inactive(db, cutoff)
			return func(tx *gorm.DB) (int, error) { return r.apply(ctx, tx, cond, free) }, len(ids) - len(free)
		},
		observeBatch: func(ctx context.Context, batch int) (context.Context, func(int, error)) {
			return p.observeRuleBatch(ctx, name, batch)
		},
		counted: func(res PurgeResult, err error) {
			p.stats.ruleRuns.Add(1)
			p.stats.ruleRows.Add(int64(res.Deleted))
			n := &r.n
			n.runs.Add(1)
			n.rows.Add(int64(res.Deleted))
			n.batches.Add(int64(res.Batches))
			n.kept.Add(int64(res.Kept))
			n.refused.Add(int64(res.Refused))
			if err != nil {
				p.stats.ruleErrors.Add(1)
				n.errors.Add(1)
			} else {
				n.lastRun.Store(p.now().UnixNano())
			}
		},
		skipped: func() {
			p.stats.ruleSkipped.Add(1)
			r.n.skipped.Add(1)
		},
	}
}

// idle returns those of ids (a batch of rule r's candidates at cutoff)
// whose newer activity is not in the buffer of the plugin tracking r's
// activity column (busy): all of them when no plugin on p's database
// tracks it, none when its buffer cannot be read (logged).
func (p *Plugin) idle(ctx context.Context, r *ruleTarget, ids []any, cutoff time.Time) []any {
	tr := trackerOfColumn(p.db, r.model.table, r.model.time.DBName)
	if tr == nil {
		return ids
	}
	isBusy, err := tr.busy(ctx, ids, cutoff.UTC().Add(-r.cfg.After))
	if err != nil {
		p.log.Warn("lastseen: rule: cannot read the activity buffer; this batch acts on no row", "rule", r.cfg.Name, "err", err)
	}
	free := make([]any, 0, len(ids))
	for i, id := range ids {
		if !isBusy[i] {
			free = append(free, id)
		}
	}
	return free
}

// apply acts, in tx, on those of ids that cond (the rule at the run's
// cutoff) still selects: deletes them, or locks them (FOR UPDATE), hands
// them to the Action and checks that none is still inactive. It returns
// the rows acted on.
func (r *ruleTarget) apply(ctx context.Context, tx *gorm.DB, cond clause.Expression, ids []any) (int, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	pk := clause.Column{Table: clause.CurrentTable, Name: r.model.pk.DBName}
	if r.cfg.Action == nil {
		res := tx.Session(&gorm.Session{SkipHooks: true}).Where(clause.IN{Column: pk, Values: ids}).Where(cond).Delete(r.newRow())
		return int(res.RowsAffected), res.Error
	}
	dest := reflect.New(reflect.SliceOf(r.model.typ))
	err := tx.Model(r.newRow()).Select("?", pk).Where(clause.IN{Column: pk, Values: ids}).Where(cond).
		Clauses(clause.Locking{Strength: clause.LockingStrengthUpdate}).Order(clause.OrderByColumn{Column: pk}).
		Find(dest.Interface()).Error
	if err != nil {
		return 0, fmt.Errorf("check the rows again: %w", err)
	}
	still := keysOf(ctx, r.model, dest)
	if len(still) == 0 {
		return 0, nil
	}
	if err := r.cfg.Action(tx, still); err != nil {
		return 0, fmt.Errorf("Action: %w", err)
	}
	left := reflect.New(reflect.SliceOf(r.model.typ))
	err = tx.Model(r.newRow()).Select("?", pk).Where(clause.IN{Column: pk, Values: still}).Where(cond).
		Order(clause.OrderByColumn{Column: pk}).Limit(1).Find(left.Interface()).Error
	if err != nil {
		return 0, fmt.Errorf("check the rows after the Action: %w", err)
	}
	if ids := keysOf(ctx, r.model, left); len(ids) > 0 {
		return 0, fmt.Errorf("%w (id %v): the next run would hand it to the Action again; make the Action delete its rows or change a column %s.Where excludes",
			errActionLeft, ids[0], r.opt)
	}
	return len(still), nil
}

// DryRunRule counts what RunRule(ctx, name) started now would act on, with
// the run's own checks, acting on nothing: in the ExpiredCount, Expired
// counts the inactive rows it would act on, Kept those inactive in the
// table whose newer activity is still buffered (read in batches of
// Rule.BatchSize, as the run does), Oldest the earliest last activity
// among both (the creation time of a row never seen). Errors:
// ErrNotInitialized, ErrClosed, an unknown name, or the database's.
func (p *Plugin) DryRunRule(ctx context.Context, name string) (ExpiredCount, error) {
	db, err := p.ready()
	if err != nil {
		return ExpiredCount{}, err
	}
	r, err := p.rule(name)
	if err != nil {
		return ExpiredCount{}, err
	}
	res := ExpiredCount{Cutoff: p.now().UTC()}
	cond := r.inactive(db, res.Cutoff)
	q := func() *gorm.DB { return fresh(ctx, db).Model(r.newRow()).Where(cond) }
	var all int64
	if err := q().Count(&all).Error; err != nil {
		return ExpiredCount{}, fmt.Errorf("lastseen: rule %q: count the inactive rows: %w", name, err)
	}
	if all == 0 {
		return res, nil
	}
	pk := clause.Column{Table: clause.CurrentTable, Name: r.model.pk.DBName}
	err = eachBatch(ctx, q().Select("?", pk), r.model, r.cfg.BatchSize, func(ids []any) error {
		res.Expired += int64(len(p.idle(ctx, r, ids, res.Cutoff)))
		return nil
	})
	if err != nil {
		return ExpiredCount{}, fmt.Errorf("lastseen: rule %q: read the buffer for the inactive rows: %w", name, err)
	}
	res.Kept = all - res.Expired
	if res.Oldest, err = r.oldest(db, q); err != nil {
		return ExpiredCount{}, fmt.Errorf("lastseen: rule %q: the oldest activity: %w", name, err)
	}
	return res, nil
}

// eachBatch calls fn with the primary keys q (a select of the key of m)
// finds, size at a time in key order.
func eachBatch(ctx context.Context, q *gorm.DB, m *model, size int, fn func(ids []any) error) error {
	dest := reflect.New(reflect.SliceOf(m.typ))
	return q.FindInBatches(dest.Interface(), size, func(_ *gorm.DB, _ int) error {
		return fn(keysOf(ctx, m, dest))
	}).Error
}

// oldest is the earliest activity among the rows q selects: their activity
// column, or the creation column of rows never seen (UTC; zero if none).
func (r *ruleTarget) oldest(db *gorm.DB, q func() *gorm.DB) (time.Time, error) {
	act := clause.Column{Table: clause.CurrentTable, Name: r.model.time.DBName}
	oldest, err := earliest(db, q().Where(clause.Expr{SQL: "? IS NOT NULL", Vars: []any{act}}), act, r.model.enc)
	if err != nil || r.created == nil {
		return oldest, err
	}
	created := clause.Column{Table: clause.CurrentTable, Name: r.created.Field().DBName}
	first, err := earliest(db, q().Where(clause.Expr{SQL: "? IS NULL", Vars: []any{act}}), created, r.created)
	if oldest.IsZero() || !first.IsZero() && first.Before(oldest) {
		oldest = first
	}
	return oldest, err
}

// earliest is the earliest instant of time column col (encoding enc)
// among the rows q selects (UTC; zero if none).
func earliest(db *gorm.DB, q *gorm.DB, col clause.Column, enc *timecol.Codec) (time.Time, error) {
	at := timecol.Scan{Codec: enc} // the column's encoding; SQLite may return text
	err := scanOne(q.Select("?", col).Order(sortTime(db, enc, col)).Limit(1), &at)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return time.Time{}, nil
	case err != nil:
		return time.Time{}, err
	}
	return at.Time.UTC(), nil
}

// Inactive is a scope that keeps the rows the inactivity rule name (of a
// plugin on db) finds inactive at db's NowFunc(): last activity at or
// before now − After, or never seen and created at or before it, and the
// rule's Where. It reads the table alone: a row inactive in the table
// whose newer activity is still buffered is kept here, though RunRule
// leaves it (DryRunRule counts it in Kept). Soft-deleted rows are left out
// unless Unscoped. An unknown name, or a statement on another table than
// the rule's, is an error of the statement.
//
//	db.Scopes(lastseen.Inactive("revoke-unused-tokens")).Find(&tokens)
func Inactive(name string) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		var r *ruleTarget
		for _, p := range pluginsOn(db) {
			if r = p.ruleNamed(name); r != nil {
				break
			}
		}
		if r == nil {
			_ = db.AddError(fmt.Errorf("lastseen: Inactive: no rule %q in the Config.Rules of a plugin on this *gorm.DB", name))
			return db
		}
		if t := statementTable(db); t != "" && t != r.model.table {
			_ = db.AddError(fmt.Errorf("lastseen: Inactive: rule %q is on table %s, the statement on %s", name, r.model.table, t))
			return db
		}
		return db.Where(r.inactive(db, db.NowFunc()))
	}
}

// check is the rule's table as the config names it, for checkTable.
func (r *ruleTarget) check() tableCheck {
	codecs := []optCodec{{r.opt + ".Field", r.cfg.Field, r.model.enc}}
	if r.created != nil {
		codecs = append(codecs, optCodec{r.opt + ".CreatedField", cmp.Or(r.cfg.CreatedField, r.created.Field().Name), r.created})
	}
	return tableCheck{model: r.model, modelOpt: r.opt + ".Model", modelVal: r.cfg.Model, fieldOpt: r.opt + ".Field",
		fieldName: r.cfg.Field, codecs: codecs, extra: codecs[1:]}
}

// ruleJob is the scheduled run of rule r: it skips the tick when another
// instance holds the rule's lock, and logs one structured line per run, at
// Debug when it acted on nothing or was skipped.
func (p *Plugin) ruleJob(r *ruleTarget) func(context.Context) {
	return func(ctx context.Context) {
		res, err := p.RunRule(ctx, r.cfg.Name)
		p.logRun("lastseen: rule", "lastseen: rule: nothing inactive", &r.schemaLog, res, err,
			"rule", r.cfg.Name, "rule_table", r.model.table, "acted", res.Deleted)
	}
}
