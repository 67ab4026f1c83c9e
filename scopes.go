package lastseen

import (
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Default column names the scopes use on a *gorm.DB where the plugin is not
// registered.
const (
	defaultLastSeenColumn = "last_seen_at"
	defaultExpiresColumn  = "expires_at"
)

// SeenWithin is a scope that keeps the rows seen (not NULL) at or after
// NowFunc() - d, by the Field of the plugin on db tracking the statement's
// table (the least Name of several), else "last_seen_at". A DATE column
// compares days: the rows whose date is on or after the day of
// NowFunc() - d in the column's location. The table lags by up to
// Throttle plus the flush interval; Plugin.LastSeen does not.
//
//	db.Scopes(lastseen.SeenWithin(5 * time.Minute)).Find(&users)
func SeenWithin(d time.Duration) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		col, enc := defaultLastSeenColumn, (*timecol.Codec)(nil)
		if p := trackerOf(db, statementTable(db)); p != nil { // registry.go
			col, enc = p.users.model.time.DBName, p.users.model.enc
		}
		cutoff := db.NowFunc().UTC().Add(-d)
		return db.Where(compareTime(db, enc, clause.Column{Table: clause.CurrentTable, Name: col}, ">=", cutoff))
	}
}

// Expired is a scope that keeps the sessions expired at db's NowFunc():
// expiry at or before now or, with Sessions.IdleTimeout, last activity at
// or before now - IdleTimeout, by the columns of the plugin on db whose
// Sessions.Model has the statement's table, else "expires_at". Times
// compare as instants; add Unscoped() for soft-deleted rows.
//
//	db.Scopes(lastseen.Expired).Find(&sessions)
func Expired(db *gorm.DB) *gorm.DB {
	return ExpiredAt(db.NowFunc())(db)
}

// ExpiredAt is Expired with the cutoff t instead of now.
//
//	db.Scopes(lastseen.ExpiredAt(cutoff)).Find(&sessions)
func ExpiredAt(t time.Time) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		if ps := sessionPluginsOf(db, statementTable(db)); len(ps) > 0 { // registry.go
			return db.Where(ps[0].expired(db, t))
		}
		return db.Where(expiryRule(db, timeCol{name: defaultExpiresColumn}, timeCol{}, 0, t))
	}
}

// compareTime compares a time column in encoding c (nil: a timestamp) with
// t the way db's dialect needs (Dialect.Compare), t bound in the column's
// encoding, rounded for an integer one (Codec.Bound); unknown dialects
// get a plain comparison.
func compareTime(db *gorm.DB, c *timecol.Codec, col clause.Column, op string, t time.Time) clause.Expr {
	enc, v := timecol.Time, any(t.UTC())
	if c != nil {
		enc, v = c.Encoding(), c.Bound(t, op)
	}
	return dialect.Lookup(db.Dialector.Name()).Compare(enc, col, op, v)
}

// sortTime is the ORDER BY expression that sorts a time column in
// encoding c by instant on db's dialect; unknown dialects sort the column
// itself.
func sortTime(db *gorm.DB, c *timecol.Codec, col clause.Column) clause.OrderBy {
	key := dialect.Lookup(db.Dialector.Name()).Key(c.Encoding(), col)
	return clause.OrderBy{Expression: clause.Expr{SQL: "?", Vars: []any{key}}}
}
