package tests

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// describeSeen writes a batch as OnBatch got it, in id order (the batch
// is sorted by key): "<id> written over <previous>", "<id> kept
// <previous>" or "<id> unknown", times in RFC 3339 (UTC), "NULL" for a
// zero Previous.
func describeSeen(batch []lastseen.Seen) string {
	out := make([]string, len(batch))
	for i, s := range batch {
		prev := "NULL"
		if !s.Previous.IsZero() {
			prev = s.Previous.Format(time.RFC3339)
		}
		switch {
		case s.Written:
			out[i] = fmt.Sprintf("%v written %s over %s", s.ID, s.At.Format(time.RFC3339), prev)
		case !s.Previous.IsZero():
			out[i] = fmt.Sprintf("%v kept %s", s.ID, prev)
		default:
			out[i] = fmt.Sprintf("%v unknown", s.ID)
		}
	}
	return strings.Join(out, "; ")
}

// TestOnBatchPreviousValue: each entry OnBatch gets carries the value the
// column held before the write (NULL as zero), and whether it was written:
// a row already newer is kept (Previous its value), an id without a row
// is unknown. The counts are what the hook saw. A hook that fails rolls
// the batch back, so the retry sees the same previous values; a batch
// written again is kept, not written.
func TestOnBatchPreviousValue(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var got []string
		fail := true
		cfg := h.config()
		var mu sync.Mutex // batches of different shards run concurrently
		cfg.Flush.OnBatch = func(_ *gorm.DB, batch []lastseen.Seen) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, describeSeen(batch))
			if fail {
				return errors.New("not now")
			}
			return nil
		}
		p, db := h.plugin(cfg)
		seedUsers(t, db, 3)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 2).Update("last_seen_at", mustTime("2026-02-01T08:00:00Z")).Error)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 3).Update("last_seen_at", mustTime("2026-03-01T12:00:00Z")).Error)
		for _, id := range []int{1, 2, 3, 4} {
			_, err := p.Touch(ctx, id) // 09:30
			must(t, err)
		}
		want := "1 written 2026-03-01T09:30:00Z over NULL; 2 written 2026-03-01T09:30:00Z over 2026-02-01T08:00:00Z; " +
			"3 kept 2026-03-01T12:00:00Z; 4 unknown"
		// The users spread over shards: one batch per shard with entries.
		_, err := p.Flush(ctx)
		equal(t, "failing hook", errors.Is(err, lastseen.ErrOnBatch), true)
		equal(t, "rolled back", lastSeenColumn(t, db, "users", "id", "last_seen_at", 1), "")
		equal(t, "first try", sortedBatches(got), want)

		got, fail = nil, false
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "retry", sortedBatches(got), want)
		equal(t, "counts", fmt.Sprintf("written=%d stale=%d unknown=%d", res.Written, res.Stale, res.Unknown), "written=2 stale=1 unknown=1")
		equal(t, "columns", fmt.Sprint(columnsByID(t, db, "users", "id", "last_seen_at")),
			"map[1:2026-03-01T09:30:00Z 2:2026-03-01T09:30:00Z 3:2026-03-01T12:00:00Z]")

		// The same timestamps once more (as a batch written again): kept.
		got = nil
		h.expireThrottle(10 * time.Minute)
		_, err = p.TouchAt(ctx, 1, mustTime("2026-03-01T09:30:00Z"))
		must(t, err)
		_, err = p.TouchAt(ctx, 2, mustTime("2026-03-01T09:30:00Z"))
		must(t, err)
		res, err = p.Flush(ctx)
		must(t, err)
		equal(t, "again", sortedBatches(got), "1 kept 2026-03-01T09:30:00Z; 2 kept 2026-03-01T09:30:00Z")
		equal(t, "counts again", fmt.Sprintf("written=%d stale=%d", res.Written, res.Stale), "written=0 stale=2")
	})
}

// sortedBatches joins the batches' descriptions, entries sorted, so that
// the result does not depend on how users spread over shards.
func sortedBatches(batches []string) string {
	var all []string
	for _, b := range batches {
		all = append(all, strings.Split(b, "; ")...)
	}
	slices.Sort(all)
	return strings.Join(all, "; ")
}

// TestOnBatchPreviousValueUpsert: with Flush.Upsert an unknown id's row is
// created, written with no previous value; a newer row is kept.
func TestOnBatchPreviousValueUpsert(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var got []string
		cfg := h.config()
		cfg.Flush.Upsert = true
		var mu sync.Mutex
		cfg.Flush.OnBatch = func(_ *gorm.DB, batch []lastseen.Seen) error {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, describeSeen(batch))
			return nil
		}
		p, db := h.plugin(cfg)
		seedUsers(t, db, 2)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 1).Update("last_seen_at", mustTime("2026-02-01T08:00:00Z")).Error)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 2).Update("last_seen_at", mustTime("2026-03-01T12:00:00Z")).Error)
		for _, id := range []int{1, 2, 3} {
			_, err := p.Touch(ctx, id)
			must(t, err)
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "hook", sortedBatches(got), "1 written 2026-03-01T09:30:00Z over 2026-02-01T08:00:00Z; "+
			"2 kept 2026-03-01T12:00:00Z; 3 written 2026-03-01T09:30:00Z over NULL")
		equal(t, "counts", fmt.Sprintf("written=%d stale=%d unknown=%d", res.Written, res.Stale, res.Unknown), "written=2 stale=1 unknown=0")
		equal(t, "columns", fmt.Sprint(columnsByID(t, db, "users", "id", "last_seen_at")),
			"map[1:2026-03-01T09:30:00Z 2:2026-03-01T12:00:00Z 3:2026-03-01T09:30:00Z]")
	})
}

// visitMember and memberVisit are a daily-visits model as Discourse keeps
// it: one user_visits row per user per day (UTC) with a visit, and the
// user's count of such days.
type visitMember struct {
	ID          int64 `gorm:"primaryKey;autoIncrement:false"`
	LastSeenAt  *time.Time
	DaysVisited int `gorm:"not null;default:0"`
}

func (visitMember) TableName() string { return "members" }

type memberVisit struct {
	UserID    int64     `gorm:"primaryKey;autoIncrement:false"`
	VisitedAt time.Time `gorm:"primaryKey;type:date"`
}

func (memberVisit) TableName() string { return "user_visits" }

// recordMemberVisits is the daily-visits hook: a written entry whose
// previous value lies on an earlier day (or is NULL) is the day's first
// visit; it adds the day's row and counts the day, in the batch's
// transaction. failOnce fails the hook after its writes, once.
func recordMemberVisits(failOnce *atomic.Bool) func(tx *gorm.DB, batch []lastseen.Seen) error {
	return func(tx *gorm.DB, batch []lastseen.Seen) error {
		for _, s := range batch {
			day := s.At.Truncate(24 * time.Hour)
			if !s.Written || !s.Previous.Before(day) {
				continue // kept or unknown, or not the day's first visit
			}
			res := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&memberVisit{UserID: s.ID.(int64), VisitedAt: day})
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 1 {
				err := tx.Model(&visitMember{}).Where("id = ?", s.ID).UpdateColumn("days_visited", gorm.Expr("days_visited + 1")).Error
				if err != nil {
					return err
				}
			}
		}
		if failOnce.CompareAndSwap(true, false) { // batches of shards run concurrently
			return errors.New("fail after the writes")
		}
		return nil
	}
}

// TestDailyVisitsFromOnBatch: touches on several days, flushed as they
// come, leave exactly one user_visits row per user and day with a visit,
// and days_visited counts them; a hook failure after its writes rolls them
// back with the batch, so the retry adds each row once.
func TestDailyVisitsFromOnBatch(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var failOnce atomic.Bool
		cfg := h.config()
		cfg.Model, cfg.Sessions.Disabled = &visitMember{}, true
		cfg.Flush.OnBatch = recordMemberVisits(&failOnce)
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&visitMember{}, &memberVisit{}))
		must(t, db.Create([]visitMember{{ID: 1}, {ID: 2}, {ID: 3}}).Error)
		touch := func(at string, ids ...int64) {
			t.Helper()
			h.expireThrottle(mustTime(at).Sub(h.clock.Now()))
			for _, id := range ids {
				_, err := p.Touch(ctx, id)
				must(t, err)
			}
			_, err := p.Flush(ctx)
			for errors.Is(err, lastseen.ErrOnBatch) { // the failure injected once: the next flush retries
				_, err = p.Flush(ctx)
			}
			must(t, err)
		}
		touch("2026-03-01T09:40:00Z", 1, 2)
		touch("2026-03-01T15:00:00Z", 1) // a later visit the same day
		touch("2026-03-02T00:10:00Z", 1, 3)
		touch("2026-03-02T23:59:00Z", 3)
		failOnce.Store(true)
		touch("2026-03-04T08:00:00Z", 2, 3)

		var visits []memberVisit
		must(t, db.Order("user_id, visited_at").Find(&visits).Error)
		got := make([]string, len(visits))
		for i, v := range visits {
			got[i] = fmt.Sprintf("%d %s", v.UserID, v.VisitedAt.UTC().Format(time.DateOnly))
		}
		equal(t, "user_visits", strings.Join(got, ", "),
			"1 2026-03-01, 1 2026-03-02, 2 2026-03-01, 2 2026-03-04, 3 2026-03-02, 3 2026-03-04")
		var members []visitMember
		must(t, db.Order("id").Find(&members).Error)
		days := make([]string, len(members))
		for i, m := range members {
			days[i] = fmt.Sprintf("%d:%d %s", m.ID, m.DaysVisited, m.LastSeenAt.UTC().Format(time.RFC3339))
		}
		equal(t, "members", strings.Join(days, ", "), "1:2 2026-03-02T00:10:00Z, 2:2 2026-03-04T08:00:00Z, 3:2 2026-03-04T08:00:00Z")
	})
}

// TestReturnAfterAbsence: a hook that calls back for users back after 14
// days away (Mastodon regenerates their home feed) fires for exactly those
// written entries whose previous value is 14 days or more before the new
// one: not for a first visit (NULL), a shorter absence, or a batch written
// again.
func TestReturnAfterAbsence(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		var returned []string
		cfg := h.config()
		var mu sync.Mutex
		cfg.Flush.OnBatch = func(_ *gorm.DB, batch []lastseen.Seen) error {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range batch {
				if s.Written && !s.Previous.IsZero() && s.At.Sub(s.Previous) >= 14*24*time.Hour {
					returned = append(returned, fmt.Sprintf("%v away since %s", s.ID, s.Previous.Format(time.DateOnly)))
				}
			}
			return nil
		}
		p, db := h.plugin(cfg)
		seedUsers(t, db, 3)
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 1).Update("last_seen_at", mustTime("2026-02-15T09:30:00Z")).Error) // 14 days
		must(t, db.Model(&lastseen.User{}).Where("id = ?", 2).Update("last_seen_at", mustTime("2026-02-15T09:30:01Z")).Error) // 1s short
		for _, id := range []int{1, 2, 3} {
			_, err := p.Touch(ctx, id)
			must(t, err)
		}
		_, err := p.Flush(ctx)
		must(t, err)
		h.expireThrottle(time.Hour)
		_, err = p.TouchAt(ctx, 1, mustTime("2026-03-01T09:30:00Z")) // written again: kept
		must(t, err)
		_, err = p.Flush(ctx)
		must(t, err)
		slices.Sort(returned)
		equal(t, "returned", strings.Join(returned, "; "), "1 away since 2026-02-15")
	})
}

// TestOnBatchPreviousNaiveColumn: on a naive timestamp column (PostgreSQL
// timestamp, MySQL DATETIME) holding Berlin wall times, Previous is the
// instant of the wall time the column held (10:00 in Berlin: 09:00Z), read
// by PostgreSQL through the zone-aware UPDATE, and the forward-only guard
// still decides Written.
func TestOnBatchPreviousNaiveColumn(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	must(t, err)
	for _, d := range servers.ServerDialects() {
		t.Run(d.Name, func(t *testing.T) {
			h := newHarness(t, d, memoryKind())
			ctx := context.Background()
			for _, ddl := range naiveDDL[h.dialect] {
				must(t, h.db.Exec(ddl).Error)
			}
			must(t, h.db.Exec("INSERT INTO naive_users (id, seen) VALUES (1, '2026-03-01 10:00:00'), (2, '2026-03-01 11:00:00')").Error)
			var got []string
			cfg := h.config()
			cfg.Model, cfg.Field, cfg.Sessions.Model = &berlinUser{}, "Seen", &berlinSession{}
			cfg.Flush.ColumnLocation = berlin
			var mu sync.Mutex
			cfg.Flush.OnBatch = func(_ *gorm.DB, batch []lastseen.Seen) error {
				mu.Lock()
				defer mu.Unlock()
				got = append(got, describeSeen(batch))
				return nil
			}
			p, _ := h.plugin(cfg)
			for _, id := range []int64{1, 2} {
				_, err := p.Touch(ctx, id) // 09:30Z, 10:30 in Berlin
				must(t, err)
			}
			res, err := p.Flush(ctx)
			must(t, err)
			equal(t, "hook", sortedBatches(got), "1 written 2026-03-01T09:30:00Z over 2026-03-01T09:00:00Z; 2 kept 2026-03-01T10:00:00Z")
			equal(t, "counts", fmt.Sprintf("written=%d stale=%d", res.Written, res.Stale), "written=1 stale=1")
		})
	}
}
