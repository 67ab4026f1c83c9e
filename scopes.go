package lastseen

import (
	"time"

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
// NowFunc() - d. It uses the plugin's configured column when the plugin is
// registered on db, else "last_seen_at". Rows never seen (NULL) are left out.
// The value in the database lags the truth by up to the throttle window plus
// the flush interval; use Plugin.LastSeen for one user's freshest value.
//
//	db.Scopes(lastseen.SeenWithin(5 * time.Minute)).Find(&users)
func SeenWithin(d time.Duration) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		col := defaultLastSeenColumn
		if p := pluginOf(db); p != nil {
			col = p.users.model.time.DBName
		}
		cutoff := db.NowFunc().UTC().Add(-d)
		return db.Where(compareTime(db, clause.Column{Table: clause.CurrentTable, Name: col}, ">=", cutoff))
	}
}

// Expired is a scope that keeps the expired sessions: the expiry column,
// qualified with the current table, is at or before db's NowFunc() (an
// expiry equal to now counts as expired, as in Session.Expired). It uses
// the plugin's configured ExpiresField column when the plugin is registered
// on db, else "expires_at". The comparison is by instant on every dialect:
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

// ExpiredAt is Expired with a fixed cutoff: it keeps the sessions whose
// expiry is at or before t (any location; compared as an instant).
//
//	db.Scopes(lastseen.ExpiredAt(cutoff)).Find(&sessions)
func ExpiredAt(t time.Time) func(*gorm.DB) *gorm.DB {
	return func(db *gorm.DB) *gorm.DB {
		col := defaultExpiresColumn
		if p := pluginOf(db); p != nil {
			col = p.sessions.model.time.DBName
		}
		return db.Where(expiredAt(db, col, t))
	}
}

func expiredAt(db *gorm.DB, col string, t time.Time) clause.Expr {
	return compareTime(db, clause.Column{Table: clause.CurrentTable, Name: col}, "<=", t.UTC())
}

// compareTime compares a time column with a time the way db's dialect
// needs; unknown dialects get a plain comparison.
func compareTime(db *gorm.DB, col clause.Column, op string, t time.Time) clause.Expr {
	if d, ok := dialects[db.Dialector.Name()]; ok {
		return d.compare(col, op, t)
	}
	return plainCompare(col, op, t)
}

// sortTime is the ORDER BY expression that sorts a time column by instant
// on db's dialect; unknown dialects sort the column itself.
func sortTime(db *gorm.DB, col clause.Column) clause.Expr {
	if d, ok := dialects[db.Dialector.Name()]; ok {
		return d.sortKey(col)
	}
	return plainKey(col)
}

// pluginOf returns the initialized lastseen plugin registered on db, if any.
func pluginOf(db *gorm.DB) *Plugin {
	if db.Config == nil || db.Config.Plugins == nil {
		return nil
	}
	p, ok := db.Config.Plugins["lastseen"].(*Plugin)
	if !ok || p.users == nil || p.sessions == nil {
		return nil
	}
	return p
}
