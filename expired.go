package lastseen

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ExpiredSessions reports what a purge started now would delete: the number
// of session rows (soft-deleted ones included) expired at the plugin's
// clock (expiry at or before it, or idle past IdleTimeout; a session whose
// newer activity is still buffered is counted, though the purge keeps it),
// and the earliest expiry column value among them in UTC (the zero time
// when count is 0). It reads only; the CLI's `purge --dry-run` and
// `status` print it. It returns ErrNotInitialized before db.Use and
// ErrClosed after Close.
func (p *Plugin) ExpiredSessions(ctx context.Context) (count int64, oldest time.Time, err error) {
	db, err := p.ready()
	if err != nil {
		return 0, time.Time{}, err
	}
	m := p.sessions.model
	expired := p.expired(db, p.now()) // idle.go
	q := func() *gorm.DB {
		return fresh(ctx, db).Unscoped().Model(reflect.New(m.typ).Interface()).Where(expired)
	}
	if err := q().Count(&count).Error; err != nil {
		return 0, time.Time{}, fmt.Errorf("lastseen: count expired sessions: %w", err)
	}
	if count == 0 {
		return 0, time.Time{}, nil
	}
	col := clause.Column{Table: clause.CurrentTable, Name: m.time.DBName}
	at := timecol.Scan{Codec: m.enc} // the column's encoding; SQLite may return text
	err = q().Select("?", col).Order(sortTime(db, m.enc, col)).Limit(1).Row().Scan(&at)
	switch {
	case errors.Is(err, sql.ErrNoRows): // purged between the two queries
		return count, time.Time{}, nil
	case err != nil:
		return count, time.Time{}, fmt.Errorf("lastseen: oldest expired session: %w", err)
	}
	return count, at.Time.UTC(), nil
}
