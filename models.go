package lastseen

import "time"

// User is the default Model: a presence table of its own, table "users".
// Apps normally pass their own user model in Config.Model instead.
type User struct {
	ID         uint64     `gorm:"primaryKey"` // the user's id, as given to Touch
	LastSeenAt *time.Time `gorm:"index"`      // last seen, UTC; NULL until the first flush
}

// Session is the default SessionModel, table "sessions": one row per login
// session, keyed by the session token's id (up to 64 bytes).
type Session struct {
	ID        string    `gorm:"primaryKey;size:64"` // the session token's id, at most 64 bytes
	UserID    uint64    `gorm:"index;not null"`     // the user the session belongs to
	ExpiresAt time.Time `gorm:"index;not null"`     // the session is expired at and after this instant
	CreatedAt time.Time // set by GORM on create
}

// Expired reports whether the session has expired at now: an expiry equal
// to now counts as expired, as in the Expired scope.
func (s Session) Expired(now time.Time) bool { return !now.Before(s.ExpiresAt) }
