package lastseen

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
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
		return time.Time{}, false, time.Time{}, p.notReady()
	}
	uid, err := t.ids.Normalize(userID)
	if err != nil {
		return time.Time{}, false, time.Time{}, err
	}
	got := make([]time.Time, 1)
	if err = t.buf.Newest(ctx, []string{uid}, got, t.now(), false); err != nil {
		return time.Time{}, false, got[0], fmt.Errorf("lastseen: pending user %s: %w", uid, err)
	}
	return got[0], !got[0].IsZero(), got[0], nil
}

// LastSeen returns the freshest time the user was seen: the newest of the
// buffered entries and the column, as the column holds it (on a DATE
// column the start of the day in the column's location, UTC by default);
// ok is false when none has a value. When
// Redis does not answer within 5×Buffer.TouchTimeout (100ms by default) it
// answers from the backlog and the column and logs a warning. Errors:
// ErrInvalidUserID, ErrNotInitialized, or the database's error wrapped.
func (p *Plugin) LastSeen(ctx context.Context, userID any) (at time.Time, ok bool, err error) {
	if p.tracker == nil {
		return time.Time{}, false, p.notReady()
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
	at = p.users.model.enc.Day(at) // a DATE column's value: the day
	uid, _ := p.users.ids.Normalize(userID)
	id, _ := p.users.ids.Parse(uid)
	p.learnUsersTable(ctx)
	m := p.users.model
	col := timecol.Scan{Codec: m.enc} // the column's encoding; SQLite may return text
	pk := clause.Column{Name: m.pk.DBName}
	q := p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?", clause.Column{Name: m.time.DBName}).
		Where(clause.Eq{Column: pk, Value: id})
	if exact, ok := p.dialect.ExactIn(pk, []any{id}); ok && p.users.ids.Kind == idcodec.String {
		q = q.Where(exact) // the row of exactly this id, not one its collation folds onto
	}
	switch err := scanOne(q.Limit(1), &col); {
	case errors.Is(err, sql.ErrNoRows):
	case err != nil:
		return at, ok, fmt.Errorf("lastseen: last seen of user %s: %w", uid, err)
	case col.Valid && col.Time.After(at):
		at, ok = col.Time.UTC(), true
	}
	return at, ok, nil
}

// LastSeenMany is LastSeen for a list page: out[i] is ids[i]'s (UTC; zero
// if never seen), for one Redis round trip and one SELECT per 65,535 ids
// (32,766 on SQLite). Errors: ErrInvalidUserID wrapped with the index
// of the first invalid id ("ids[3]"), ErrNotInitialized, or the database's
// error wrapped.
func (p *Plugin) LastSeenMany(ctx context.Context, ids []any) ([]time.Time, error) {
	t := p.tracker
	if t == nil {
		return nil, p.notReady()
	}
	uids := make([]string, len(ids))
	var distinct []string
	seen := make(map[string]bool, len(ids))
	for i, id := range ids {
		uid, err := t.ids.Normalize(id)
		if err != nil {
			return nil, fmt.Errorf("%w (ids[%d])", err, i)
		}
		uids[i] = uid
		if !seen[uid] {
			seen[uid] = true
			distinct = append(distinct, uid)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 5*p.cfg.TouchTimeout) // Redis is best effort here
	latest, err := t.buffered(rctx, distinct, false)
	cancel()
	if err != nil {
		t.warn.Do(func() { p.log.Warn("lastseen: redis unreadable; LastSeenMany answers from the database", "err", err) })
	}
	p.learnUsersTable(ctx)
	if err := p.columns(ctx, distinct, latest); err != nil {
		return nil, err
	}
	out := make([]time.Time, len(ids))
	for i, uid := range uids {
		out[i] = latest[uid]
	}
	return out, nil
}

// learnUsersTable checks the users table, as a flush does before its first
// write, while it was not found at db.Use or since (an app that migrates
// after db.Use): the catalog then says whether the column is a naive
// timestamp, which the read decodes as a wall time. Without it, a naive
// PostgreSQL column created after db.Use would be read as UTC until the
// first flush or purge, off by its zone's offset. A failed check leaves
// the read as it was (its error is the read's own, if any).
func (p *Plugin) learnUsersTable(ctx context.Context) {
	if !p.schema.usersOK.Load() {
		_ = p.checkTable(ctx, "read", p.usersCheck(), &p.schema.usersOK)
	}
}

// raise keeps at for uid in m when it is newer than what m has.
func raise(m map[string]time.Time, uid string, at time.Time) {
	if at.After(m[uid]) {
		m[uid] = at
	}
}

// buffered returns the newest buffered timestamp of each of uids
// (distinct, canonical) that has one (Buffer.Newest: with Redis one
// pipeline, HMGET of both hashes of each shard holding some of them, and
// the backlog), as the column will hold it (its day on a DATE column),
// also when the read failed, with the error. guard bounds the read as a
// touch is (the overlay on the query path).
func (t *tracker) buffered(ctx context.Context, uids []string, guard bool) (map[string]time.Time, error) {
	latest := make(map[string]time.Time, len(uids))
	if len(uids) == 0 {
		return latest, nil
	}
	got := make([]time.Time, len(uids))
	err := t.buf.Newest(ctx, uids, got, t.now(), guard)
	for i, at := range got {
		if !at.IsZero() {
			latest[uids[i]] = t.col.Day(at)
		}
	}
	return latest, err
}

// columns raises latest to the last-seen column of the rows of uids: one
// SELECT pk, column ... WHERE pk IN (...) per chunk of the dialect's
// bind-parameter limit.
func (p *Plugin) columns(ctx context.Context, uids []string, latest map[string]time.Time) error {
	m, codec := p.users.model, p.users.ids
	pk, col := clause.Column{Name: m.pk.DBName}, clause.Column{Name: m.time.DBName}
	for start := 0; start < len(uids); start += p.dialect.MaxParams() {
		part := uids[start:min(start+p.dialect.MaxParams(), len(uids))]
		vals := make([]any, len(part))
		for i, uid := range part {
			vals[i], _ = codec.Parse(uid) // canonical text: parses
		}
		rows, err := queryRows(p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?, ?", pk, col).
			Where(clause.IN{Column: pk, Values: vals}))
		if err != nil {
			return fmt.Errorf("lastseen: last seen of %d users: %w", len(uids), err)
		}
		err = scanColumns(rows, codec, m.enc, latest)
		if err != nil {
			return fmt.Errorf("lastseen: last seen of %d users: %w", len(uids), err)
		}
	}
	return nil
}

// rowScanner is the part of *sql.Rows that scanColumns reads.
type rowScanner interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
	Close() error
}

// scanColumns reads (primary key, column) rows, the key into a value of its
// own Go type, written back as its canonical text, the column through its
// encoding.
func scanColumns(rows rowScanner, codec idcodec.Codec, enc *timecol.Codec, latest map[string]time.Time) error {
	defer rows.Close()
	for rows.Next() {
		id := reflect.New(codec.Type)
		c := timecol.Scan{Codec: enc} // the column's encoding; SQLite may return text
		if err := rows.Scan(id.Interface(), &c); err != nil {
			return err
		}
		uid, err := codec.Normalize(id.Elem().Interface())
		if err == nil && c.Valid {
			raise(latest, uid, c.Time.UTC())
		}
	}
	return rows.Err()
}

// queryRows runs q's query for its rows. GORM's prepared-statement mode
// (PrepareStmt) can hand back no rows and no error when preparing failed
// (a canceled context, a closed pool): that is an error here, never a nil
// *sql.Rows to scan.
func queryRows(q *gorm.DB) (*sql.Rows, error) {
	rows, err := q.Rows()
	if err == nil && rows == nil {
		err = errors.New("the database returned no result")
		if ctx := q.Statement.Context; ctx != nil && ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	if err != nil {
		if rows != nil {
			rows.Close()
		}
		return nil, err
	}
	return rows, nil
}

// scanOne scans the first row of q's query into dest; sql.ErrNoRows when
// there is none (as *sql.Row.Scan), without the *sql.Row that GORM's
// prepared-statement mode may leave empty.
func scanOne(q *gorm.DB, dest any) error {
	rows, err := queryRows(q)
	if err != nil {
		return err
	}
	defer rows.Close()
	if !rows.Next() {
		return cmp.Or(rows.Err(), sql.ErrNoRows)
	}
	if err := rows.Scan(dest); err != nil {
		return err
	}
	return rows.Close()
}
