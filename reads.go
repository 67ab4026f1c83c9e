package lastseen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm/clause"
)

// Pending returns the user's timestamp not yet in the table: the newest
// of the buffer's pending and in-flight entries and the backlog; ok is
// false when there is none. Errors: ErrInvalidUserID, ErrNotInitialized,
// or Redis's error wrapped.
func (p *Plugin) Pending(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	at, ok, _, err = p.pending(ctx, userID)
	return at, ok, err
}

// pending is Pending that also returns, when the buffer failed, what the
// process itself holds (held: the backlog's timestamp).
func (p *Plugin) pending(ctx context.Context, userID any) (at time.Time, ok bool, held time.Time, err error) {
	t := p.tracker
	if t == nil {
		return time.Time{}, false, time.Time{}, ErrNotInitialized
	}
	uid, err := t.ids.Normalize(userID)
	if err != nil {
		return time.Time{}, false, time.Time{}, err
	}
	got, err := t.buf.Newest(ctx, []string{uid}, t.now(), false)
	if err != nil {
		return time.Time{}, false, got[0], fmt.Errorf("lastseen: pending user %s: %w", uid, err)
	}
	return got[0], !got[0].IsZero(), got[0], nil
}

// LastSeen returns the freshest time the user was seen: the newest of the
// buffered entries and the column; ok is false when none has a value. When
// Redis does not answer within 5×Buffer.TouchTimeout (100ms by default) it
// answers from the backlog and the column and logs a warning. Errors:
// ErrInvalidUserID, ErrNotInitialized, or the database's error wrapped.
func (p *Plugin) LastSeen(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	if p.tracker == nil {
		return time.Time{}, false, ErrNotInitialized
	}
	rctx, cancel := context.WithTimeout(ctx, 5*p.cfg.TouchTimeout) // Redis is best effort here
	at, ok, held, err := p.pending(rctx, userID)
	cancel()
	if errors.Is(err, ErrInvalidUserID) {
		return at, ok, err
	}
	if err != nil {
		p.tracker.warn.Do(func() { p.log.Warn("lastseen: redis unreadable; LastSeen answers from the database", "err", err) })
		at, ok = held, !held.IsZero()
	}
	uid, _ := p.users.ids.Normalize(userID)
	id, _ := p.users.ids.Parse(uid)
	m := p.users.model
	col := timecol.Scan{Codec: m.enc} // the column's encoding; SQLite may return text
	pk := clause.Column{Name: m.pk.DBName}
	q := p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?", clause.Column{Name: m.time.DBName}).
		Where(clause.Eq{Column: pk, Value: id})
	if exact, ok := p.dialect.ExactIn(pk, []any{id}); ok && p.users.ids.Kind == idcodec.String {
		q = q.Where(exact) // the row of exactly this id, not one its collation folds onto
	}
	row := q.Limit(1).Row()
	switch err := row.Scan(&col); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return at, ok, fmt.Errorf("lastseen: last seen of user %s: %w", uid, err)
	case col.Valid && col.Time.After(at):
		at, ok = col.Time.UTC(), true
	}
	return at, ok, nil
}
