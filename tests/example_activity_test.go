package tests_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// ForumUser is a forum's user with Discourse's count of days visited.
type ForumUser struct {
	ID          int64 `gorm:"primaryKey"`
	LastSeenAt  *time.Time
	DaysVisited int `gorm:"not null;default:0"`
}

// UserVisit is one day (UTC) on which a member visited, as Discourse's
// user_visits.
type UserVisit struct {
	UserID    int64     `gorm:"primaryKey;autoIncrement:false"`
	VisitedAt time.Time `gorm:"primaryKey;type:date"`
}

// recordVisits is the members' OnBatch: an entry the write moved from an
// earlier day (or from NULL) is the member's first visit of At's day. It
// adds the day's row and counts the day in the batch's transaction, so
// both commit with the timestamps, once: a batch written again is not
// Written.
func recordVisits(tx *gorm.DB, batch []lastseen.Seen) error {
	for _, s := range batch {
		day := s.At.Truncate(24 * time.Hour) // the UTC day
		if !s.Written || !s.Previous.Before(day) {
			continue // no row, already as new, or a later visit the same day
		}
		res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&UserVisit{UserID: s.ID.(int64), VisitedAt: day})
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 1 {
			err := tx.Model(&ForumUser{}).Where("id = ?", s.ID).UpdateColumn("days_visited", gorm.Expr("days_visited + 1")).Error
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// A daily-visits table kept from Flush.OnBatch: one row per member per
// day with a visit, and the count of such days, from each entry's
// previous value.
func Example_dailyVisits() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 1, 9, 40, 0, 0, time.UTC)
	db.AutoMigrate(&ForumUser{}, &UserVisit{})
	db.Create([]ForumUser{{ID: 1}, {ID: 2}})
	members := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &ForumUser{},
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:members"},
		Flush:    lastseen.FlushConfig{OnBatch: recordVisits, Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: func() time.Time { return now }},
	})
	if err := db.Use(members); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	visit := func(at string, ids ...int64) { // requests at a time, then a flush
		now, _ = time.Parse(time.RFC3339, at)
		for _, id := range ids {
			members.Touch(ctx, id)
		}
		members.Flush(ctx)
	}
	visit("2026-03-01T09:40:00Z", 1, 2)
	visit("2026-03-01T15:00:00Z", 1) // the same day again
	visit("2026-03-02T00:10:00Z", 1)
	visit("2026-03-04T08:00:00Z", 2)

	var visits []UserVisit
	db.Order("user_id, visited_at").Find(&visits)
	for _, v := range visits {
		fmt.Println("visit", v.UserID, v.VisitedAt.UTC().Format(time.DateOnly))
	}
	var ms []ForumUser
	db.Order("id").Find(&ms)
	for _, m := range ms {
		fmt.Println("member", m.ID, "days visited", m.DaysVisited)
	}
	members.Close(ctx)
	// Output:
	// visit 1 2026-03-01
	// visit 1 2026-03-02
	// visit 2 2026-03-01
	// visit 2 2026-03-04
	// member 1 days visited 2
	// member 2 days visited 2
}

// WelcomeBack is a job for the app's worker: rebuild the home feed of a
// user back after 14 days away (Mastodon does), queued in the batch's
// transaction.
type WelcomeBack struct {
	ID        int64 `gorm:"primaryKey"`
	UserID    int64
	AwaySince time.Time
}

// queueWelcomeBacks is an OnBatch that queues a WelcomeBack for each
// member the write moved forward by 14 days or more: not a first visit
// (Previous zero), and once, as a batch written again is not Written.
func queueWelcomeBacks(tx *gorm.DB, batch []lastseen.Seen) error {
	for _, s := range batch {
		if s.Written && !s.Previous.IsZero() && s.At.Sub(s.Previous) >= 14*24*time.Hour {
			if err := tx.Create(&WelcomeBack{UserID: s.ID.(int64), AwaySince: s.Previous}).Error; err != nil {
				return err
			}
		}
	}
	return nil
}

// A "returned after 14 days away" callback: a job queued in the flush's
// transaction for each member whose previous value was 14 days old or
// more.
func Example_returnAfterAbsence() {
	db, rdb, done := exampleEnv()
	defer done()
	now := time.Date(2026, 3, 16, 9, 0, 0, 0, time.UTC)
	at := func(s string) *time.Time { t, _ := time.Parse(time.RFC3339, s); return &t }
	db.AutoMigrate(&ForumUser{}, &WelcomeBack{})
	db.Create([]ForumUser{
		{ID: 1, LastSeenAt: at("2026-03-01T08:00:00Z")}, // 15 days away
		{ID: 2, LastSeenAt: at("2026-03-10T08:00:00Z")}, // 6 days
		{ID: 3}, // never seen
	})
	members := lastseen.New(lastseen.Config{
		Redis:    rdb,
		Model:    &ForumUser{},
		Logger:   slog.New(slog.DiscardHandler),
		Buffer:   lastseen.BufferConfig{Prefix: "app:members"},
		Flush:    lastseen.FlushConfig{OnBatch: queueWelcomeBacks, Schedule: "off"},
		Sessions: lastseen.SessionConfig{Disabled: true},
		Test:     lastseen.TestConfig{Now: func() time.Time { return now }},
	})
	if err := db.Use(members); err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []int64{1, 2, 3} {
		members.Touch(ctx, id)
	}
	res, _ := members.Flush(ctx)
	fmt.Println("written", res.Written)
	var jobs []WelcomeBack
	db.Find(&jobs)
	for _, j := range jobs {
		fmt.Println("welcome back", j.UserID, "away since", j.AwaySince.UTC().Format(time.DateOnly))
	}
	members.Close(ctx)
	// Output:
	// written 3
	// welcome back 1 away since 2026-03-01
}
