package lastseen

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm/clause"
)

// LastSeenMany is LastSeen for a list page: out[i] is ids[i]'s (UTC; zero
// if never seen), for one Redis round trip and one SELECT per 65,535 ids
// (32,766 on SQLite). Errors: ErrInvalidUserID wrapped with the index
// of the first invalid id ("ids[3]"), ErrNotInitialized, or the database's
// error wrapped.
func (p *Plugin) LastSeenMany(ctx context.Context, ids []any) ([]time.Time, error) {
	t := p.tracker
	if t == nil {
		return nil, ErrNotInitialized
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
	if err := p.columns(ctx, distinct, latest); err != nil {
		return nil, err
	}
	out := make([]time.Time, len(ids))
	for i, uid := range uids {
		out[i] = latest[uid]
	}
	return out, nil
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
// the backlog), also when the read failed, with the error. guard bounds the
// read as a touch is (the overlay on the query path).
func (t *tracker) buffered(ctx context.Context, uids []string, guard bool) (map[string]time.Time, error) {
	latest := make(map[string]time.Time, len(uids))
	if len(uids) == 0 {
		return latest, nil
	}
	got, err := t.buf.Newest(ctx, uids, t.now(), guard)
	for i, at := range got {
		if !at.IsZero() {
			latest[uids[i]] = at
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
		rows, err := p.db.WithContext(ctx).Table("?", clause.Table{Name: m.table}).Select("?, ?", pk, col).
			Where(clause.IN{Column: pk, Values: vals}).Rows()
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
