package lastseen

import (
	"context"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Sessions that expire by inactivity. With Config.IdleTimeout > 0 a session
// is expired at t when its expiry is at or before t, or its last-active
// column (ActiveField) is at or before t - IdleTimeout; a NULL last-active
// column is never idle (the session then expires by its expiry alone). The
// Expired scope, ExpiredSessions, the purge and Session.Expired share the
// rule.

// checkIdle checks the idle settings: no negative timeout, and a purge
// batch whose delete fits the bind-parameter limit (one parameter per
// session and three cutoffs).
func checkIdle(c settings, d *dialect.Dialect) error {
	switch {
	case c.IdleTimeout < 0:
		return invalid("Sessions.IdleTimeout is %v, want 0 (off) or a positive duration", c.IdleTimeout)
	case c.IdleTimeout > 0 && c.PurgeBatchSize > d.MaxParams()-3:
		return invalid("Sessions.BatchSize %d exceeds the %s limit of %d sessions per delete with Sessions.IdleTimeout (%d bind parameters, 1 per session and 3 for the cutoffs)",
			c.PurgeBatchSize, d.Name(), d.MaxParams()-3, d.MaxParams())
	}
	return nil
}

// timeCol is a time column by name, with its encoding (nil: a timestamp).
type timeCol struct {
	name string
	enc  *timecol.Codec
}

// expiryRule is the WHERE condition of sessions expired at t: the expires
// column at or before t, or, with idle > 0, the active column at or before
// t - idle. Columns are qualified with the current table and compared as
// instants in their encodings (see compareTime).
func expiryRule(db *gorm.DB, expires, active timeCol, idle time.Duration, t time.Time) clause.Expr {
	abs := compareTime(db, expires.enc, clause.Column{Table: clause.CurrentTable, Name: expires.name}, "<=", t.UTC())
	if idle <= 0 || active.name == "" {
		return abs
	}
	idleExpr := compareTime(db, active.enc, clause.Column{Table: clause.CurrentTable, Name: active.name}, "<=", t.UTC().Add(-idle))
	return clause.Expr{SQL: "(? OR ?)", Vars: []any{abs, idleExpr}}
}

// expired is p's rule for its SessionModel at t.
func (p *Plugin) expired(db *gorm.DB, t time.Time) clause.Expr {
	s := p.sessions
	expires := timeCol{s.model.time.DBName, s.model.enc}
	if s.active == nil {
		return expiryRule(db, expires, timeCol{}, 0, t)
	}
	return expiryRule(db, expires, timeCol{s.active.DBName, s.activeEnc}, p.cfg.IdleTimeout, t)
}

// activityTracker returns the plugin on p's database that tracks the
// sessions' last-active column (p itself when its Model is the session
// model and Field the ActiveField), or nil: then the purge has no buffer to
// check and trusts the column.
func (p *Plugin) activityTracker() *Plugin {
	s := p.sessions
	if s.active == nil {
		return nil
	}
	for _, o := range pluginsOn(p.db) {
		if o.users.model.table == s.model.table && o.users.model.time.DBName == s.active.DBName {
			return o
		}
	}
	return nil
}

// busy reports, for each candidate of a purge batch, whether the tracker's
// buffer holds activity after since (the idle cutoff) that is not in the
// column yet: a pending or in-flight entry, or with Redis the in-process
// backlog (Buffer.Newest: one pipeline of HMGET of the pending and the
// in-flight hash of each shard holding candidates). When Redis cannot be
// read, every candidate counts as busy (the purge then deletes only
// sessions past their expiry) and the error is returned for the log.
func (tr *Plugin) busy(ctx context.Context, ids []any, since time.Time) ([]bool, error) {
	t := tr.tracker
	out := make([]bool, len(ids))
	uids := make([]string, 0, len(ids))
	idx := make([]int, 0, len(ids))
	for i, id := range ids {
		uid, err := t.ids.Normalize(id)
		if err != nil {
			continue // not an id the tracker could have buffered
		}
		uids = append(uids, uid)
		idx = append(idx, i)
	}
	if len(uids) == 0 {
		return out, nil
	}
	got, err := t.buf.Newest(ctx, uids, t.now(), false)
	if err != nil {
		for i := range out {
			out[i] = true
		}
		return out, err
	}
	for j, at := range got {
		out[idx[j]] = at.After(since)
	}
	return out, nil
}

// purgeCondition is the delete condition of one purge batch at cutoff: the
// batch's ids that are expired by p's rule, except those whose newer
// activity is still buffered (see busy), which go only when past their
// expiry:
//
//	(pk IN (free ids) AND <expired>) OR (pk IN (busy ids) AND expires <= cutoff)
func (p *Plugin) purgeCondition(ctx context.Context, db *gorm.DB, ids []any, cutoff time.Time) clause.Expression {
	pk := clause.Column{Table: clause.CurrentTable, Name: p.sessions.model.pk.DBName}
	expired := p.expired(db, cutoff)
	tr := p.activityTracker()
	if tr == nil {
		return clause.And(clause.IN{Column: pk, Values: ids}, expired)
	}
	isBusy, err := tr.busy(ctx, ids, cutoff.Add(-p.cfg.IdleTimeout))
	if err != nil {
		p.log.Warn("lastseen: purge: cannot read the activity buffer; idle sessions are kept this time", "err", err)
	}
	var free, held []any
	for i, id := range ids {
		if isBusy[i] {
			held = append(held, id)
		} else {
			free = append(free, id)
		}
	}
	abs := expiryRule(db, timeCol{p.sessions.model.time.DBName, p.sessions.model.enc}, timeCol{}, 0, cutoff)
	switch {
	case len(held) == 0:
		return clause.And(clause.IN{Column: pk, Values: free}, expired)
	case len(free) == 0:
		return clause.And(clause.IN{Column: pk, Values: held}, abs)
	}
	return clause.Or(
		clause.And(clause.IN{Column: pk, Values: free}, expired),
		clause.And(clause.IN{Column: pk, Values: held}, abs),
	)
}
