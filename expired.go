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

// ExpiredSessions reads what a purge started now would delete: the number
// of expired session rows (soft-deleted included; also those with newer
// activity still buffered, which the purge keeps) and their earliest
// expiry (UTC; zero if none). Errors: ErrNotInitialized, ErrClosed, or the
// database's.
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
