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

// SeenWithin is a scope that keeps the rows seen in the last d: the
// last-seen column, qualified with the current table, is at or after
// NowFunc() - d. It uses the Field column of the lastseen plugin registered
// on db that tracks the statement's own table (db.Table, else the Model's
// or the destination's table; the least Name() when several track it), else
// "last_seen_at". Rows never seen (NULL) are left out.
// The value in the database lags the truth by up to the throttle window plus
// the flush interval; use Plugin.LastSeen for one user's freshest value.
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

// Expired is a scope that keeps the expired sessions: the expiry column,
// qualified with the current table, is at or before db's NowFunc() (an
// expiry equal to now counts as expired, as in Session.Expired). It uses
// the rule of the lastseen plugin registered on db whose SessionModel has
// the statement's own table (db.Table, else the Model's or the
// destination's table; the plugin that also tracks that table first, else
// the least Name()): its ExpiresField column and, with IdleTimeout, its
// idle rule (ActiveField at or before now - IdleTimeout; see idle.go). With
// no such plugin it uses "expires_at" alone. The comparison is by instant on every dialect:
// PostgreSQL timestamptz, timestamp (read as UTC), MySQL/MariaDB DATETIME
// under the connection's loc, SQLite text with any UTC offset. GORM's
// soft-delete filter applies as to any query; add Unscoped() to see
// soft-deleted rows too.
//
//	db.Scopes(lastseen.Expired).Find(&sessions)
//	db.Unscoped().Scopes(lastseen.Expired).Count(&n)
func Expired(db *gorm.DB) *gorm.DB {
	return ExpiredAt(db.NowFunc())(db)
}

// ExpiredAt is Expired with a fixed cutoff: it keeps the sessions expired
// at t by the same rule (expiry at or before t, or, with the plugin's
// IdleTimeout, last active at or before t - IdleTimeout; any location,
// compared as instants).
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
