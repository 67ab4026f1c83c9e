package tests_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"sort"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
)

// DeviceSession is an app's session model: lastseen's Session with the
// device it was opened on (from the User-Agent at sign-in).
type DeviceSession struct {
	ID           string    `gorm:"primaryKey;size:64"`
	UserID       int64     `gorm:"index;not null"`
	Device       string    `gorm:"size:128;not null"`
	ExpiresAt    time.Time `gorm:"index;not null"`
	CreatedAt    time.Time
	LastActiveAt *time.Time
}

// SessionRow is one line of a "your sessions" page.
type SessionRow struct {
	ID, Device string
	LastActive time.Time // the freshest: from the buffer when newer than the column
	Current    bool      // the session of this request
}

// sessionIdle is the sessions' idle timeout (Sessions.IdleTimeout).
const sessionIdle = 30 * 24 * time.Hour

// listSessions returns the user's live sessions, most recently active
// first: one SELECT of the rows, and one LastSeenMany (one Redis round
// trip and one SELECT) for their last activity, so that a session used a
// minute ago shows as such before the next flush, and one the table
// thinks idle but the buffer has seen is still listed.
func listSessions(ctx context.Context, db *gorm.DB, sessions *lastseen.Plugin, userID int64, current string, now time.Time) ([]SessionRow, error) {
	var rows []DeviceSession
	if err := db.Where("user_id = ? AND expires_at > ?", userID, now).Find(&rows).Error; err != nil {
		return nil, err
	}
	ids := make([]any, len(rows))
	for i, s := range rows {
		ids[i] = s.ID
	}
	active, err := sessions.LastSeenMany(ctx, ids)
	if err != nil {
		return nil, err
	}
	var out []SessionRow
	for i, s := range rows {
		last := active[i]
		if last.IsZero() {
			last = s.CreatedAt // never active since sign-in
		}
		if !now.Add(-sessionIdle).Before(last) {
			continue // idle: expired, the purge deletes it
		}
		out = append(out, SessionRow{ID: s.ID, Device: s.Device, LastActive: last, Current: s.ID == current})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].LastActive.After(out[j].LastActive) })
	return out, nil
}

// signOutOthers deletes the user's other sessions and returns how many.
// Activity of theirs still buffered is flushed into no row (counted as
// Unknown): it never brings a session back.
func signOutOthers(db *gorm.DB, userID int64, current string) (int64, error) {
	res := db.Where("user_id = ? AND id <> ?", userID, current).Delete(&DeviceSession{})
	return res.RowsAffected, res.Error
}

// The page users ask for most: their sessions with device and last
// activity, and "sign out the others".
func Example_sessionList() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	db.AutoMigrate(&DeviceSession{})
	at := func(t time.Time) *time.Time { return &t }
	db.Create([]DeviceSession{
		{ID: "s-laptop", UserID: 1, Device: "Firefox on Linux", ExpiresAt: now.AddDate(0, 1, 0), LastActiveAt: at(now.Add(-time.Hour))},
		{ID: "s-phone", UserID: 1, Device: "iPhone app", ExpiresAt: now.AddDate(0, 1, 0), LastActiveAt: at(now.AddDate(0, 0, -3))},
		{ID: "s-office", UserID: 1, Device: "Chrome on Windows", ExpiresAt: now.AddDate(0, 1, 0), LastActiveAt: at(now.AddDate(0, 0, -40))},
		{ID: "s-old", UserID: 1, Device: "Safari on macOS", ExpiresAt: now.Add(-time.Minute), LastActiveAt: at(now.Add(-2 * time.Minute))},
		{ID: "s-other", UserID: 2, Device: "Firefox on Linux", ExpiresAt: now.AddDate(0, 1, 0)},
	})
	sessions := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &DeviceSession{},
		Field:    "LastActiveAt",
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:sessions"},
		Flush:    lastseen.FlushConfig{Schedule: "off"},
		Sessions: lastseen.SessionConfig{Model: &DeviceSession{}, IdleTimeout: sessionIdle, Schedule: "off"},
		Test:     lastseen.TestConfig{Now: func() time.Time { return now }},
	})
	if err := db.Use(sessions); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	sessions.TouchAt(ctx, "s-phone", now.Add(-2*time.Minute)) // the phone, two minutes ago: not flushed yet
	sessions.Touch(ctx, "s-laptop")                           // this request

	show := func() {
		list, err := listSessions(ctx, db, sessions, 1, "s-laptop", now)
		if err != nil {
			log.Fatal(err)
		}
		for _, s := range list {
			mark := " "
			if s.Current {
				mark = "*"
			}
			fmt.Printf("%s %-18s active %s\n", mark, s.Device, s.LastActive.Format("2006-01-02 15:04"))
		}
	}
	show()
	n, _ := signOutOthers(db, 1, "s-laptop")
	fmt.Println("signed out", n, "other sessions")
	show()
	res, _ := sessions.Flush(ctx) // the phone's buffered activity finds no row
	fmt.Println("flush: written", res.Written, "unknown", res.Unknown)
	sessions.Close(ctx)
	// Output:
	// * Firefox on Linux   active 2026-03-01 10:00
	//   iPhone app         active 2026-03-01 09:58
	// signed out 3 other sessions
	// * Firefox on Linux   active 2026-03-01 10:00
	// flush: written 1 unknown 1
}
