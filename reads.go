package lastseen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm/clause"
)

// Pending returns the user's timestamp that is not yet in the database: the
// newer of the pending and the in-flight entry. ok is false when there is
// none. Errors: ErrInvalidUserID, or Redis's error wrapped.
func (p *Plugin) Pending(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	t := p.tracker
	if t == nil {
		return time.Time{}, false, ErrNotInitialized
	}
	uid, err := t.ids.normalize(userID)
	if err != nil {
		return time.Time{}, false, err
	}
	keys := t.shard(uid)
	var pending, inflight *redis.StringCmd
	err = t.redis(ctx, func(ctx context.Context, rdb *redisClient) error {
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			pending = pipe.HGet(ctx, keys.pending, uid)
			inflight = pipe.HGet(ctx, keys.inflight, uid)
			return nil
		})
		return err
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return time.Time{}, false, fmt.Errorf("lastseen: pending user %s: %w", uid, err)
	}
	now := t.now()
	for _, cmd := range []*redis.StringCmd{pending, inflight} {
		if v, err := cmd.Result(); err == nil {
			if ts, valid := parseMicros(v, now); valid && ts.After(at) {
				at, ok = ts, true
			}
		}
	}
	if b, found := t.backlog.get(uid); found {
		if ts := time.UnixMicro(b).UTC(); ts.After(at) {
			at, ok = ts, true
		}
	}
	return at, ok, nil
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
	pk := clause.Column{Name: m.pk.DBName}
	q := p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?", clause.Column{Name: m.time.DBName}).
		Where(clause.Eq{Column: pk, Value: id})
	if k := p.users.ids.kind; k != idSigned && k != idUnsigned && p.dialect.exactIn != nil {
		q = q.Where(p.dialect.exactIn(pk, []any{id})) // the row of exactly this id, not one its collation folds onto
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
