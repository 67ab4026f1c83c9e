package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// overlayOther is a model that is not tracked but has the same shape.
type overlayOther struct {
	ID         uint64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
}

// overlayDevice is a tracked model with a string key and a non-pointer
// time field.
type overlayDevice struct {
	ID     string `gorm:"primaryKey;size:64"`
	SeenAt time.Time
}

func seenAt(u lastseen.User) string {
	if u.LastSeenAt == nil {
		return ""
	}
	return u.LastSeenAt.UTC().Format(time.RFC3339)
}

// overlayUsers seeds users 1..5 and overlay_others 1..5 with the same
// columns, then touches users 1, 3 and 4 at 09:30:0N; it returns the
// values a query with the overlay must give: 1 pending over an older
// column, 2 column only, 3 pending over NULL, 4 column newer than pending,
// 5 never seen.
func overlayUsers(t testing.TB, p *lastseen.Plugin, db *gorm.DB) []string {
	t.Helper()
	must(t, db.AutoMigrate(&lastseen.User{}, &overlayOther{}))
	nine, forty := ptr(mustTime("2026-03-01T09:00:00Z")), ptr(mustTime("2026-03-01T09:40:00Z"))
	cols := []*time.Time{nine, nine, nil, forty, nil}
	for i, c := range cols {
		must(t, db.Create(&lastseen.User{ID: uint64(i + 1), LastSeenAt: c}).Error)
		must(t, db.Create(&overlayOther{ID: uint64(i + 1), LastSeenAt: c}).Error)
	}
	for _, id := range []int{1, 3, 4} {
		_, err := p.TouchAt(context.Background(), id, mustTime(fmt.Sprintf("2026-03-01T09:30:0%dZ", id)))
		must(t, err)
	}
	return []string{"2026-03-01T09:30:01Z", "2026-03-01T09:00:00Z", "2026-03-01T09:30:03Z", "2026-03-01T09:40:00Z", ""}
}

// TestOverlayLoadsBufferedValues: with Overlay on, Find, First and Take on
// the tracked model (structs, slices of structs and of pointers) give the
// buffered value where it is newer than the column, in one Redis pipeline
// per query; an untracked model of the same shape, a query that does not
// select the column, and a plugin without Overlay keep the column's values.
func TestOverlayLoadsBufferedValues(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Presence.Overlay = true
		p, db := h.plugin(cfg)
		want := overlayUsers(t, p, db)

		var users []lastseen.User
		must(t, db.Order("id").Find(&users).Error)
		equal(t, "users found", len(users), 5)
		for i, u := range users {
			equal(t, fmt.Sprint("Find: user ", u.ID), seenAt(u), want[i])
		}
		rt := countRoundTrips(h.r.Client)
		var ptrs []*lastseen.User
		must(t, db.WithContext(ctx).Where("id IN ?", []int{3, 4, 5}).Order("id").Find(&ptrs).Error)
		for i, u := range ptrs {
			equal(t, fmt.Sprint("Find pointers: user ", u.ID), seenAt(*u), want[i+2])
		}
		if !h.memory() {
			equal(t, "round trips of one query", rt.pipelines.Load()+rt.singles.Load(), int64(1))
		}
		var one lastseen.User
		must(t, db.First(&one, 1).Error)
		equal(t, "First: user 1", seenAt(one), want[0])
		one = lastseen.User{}
		must(t, db.Take(&one, 3).Error)
		equal(t, "Take: user 3", seenAt(one), want[2])

		var idsOnly []lastseen.User
		must(t, db.Select("id").Order("id").Find(&idsOnly).Error)
		equal(t, "Select(id): user 1", seenAt(idsOnly[0]), "")
		var others []overlayOther
		must(t, db.Order("id").Find(&others).Error)
		for i, o := range others {
			equal(t, fmt.Sprint("other model ", o.ID), seenAt(lastseen.User{LastSeenAt: o.LastSeenAt}), []string{
				"2026-03-01T09:00:00Z", "2026-03-01T09:00:00Z", "", "2026-03-01T09:40:00Z", ""}[i])
		}

		plain := h.config()
		_, db2 := h.plugin(plain)
		var cols []lastseen.User
		must(t, db2.Order("id").Find(&cols).Error)
		equal(t, "without Overlay: user 1", seenAt(cols[0]), "2026-03-01T09:00:00Z")
		equal(t, "without Overlay: user 3", seenAt(cols[2]), "")
	})
}

// TestOverlayNonPointerTimeAndStringKey: a tracked model with a string key
// and a time.Time field gets the buffered value too.
func TestOverlayNonPointerTimeAndStringKey(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		cfg := h.config()
		cfg.Presence.Overlay, cfg.Model, cfg.Field = true, &overlayDevice{}, "SeenAt"
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&overlayDevice{}))
		must(t, db.Create(&[]overlayDevice{{ID: "a", SeenAt: mustTime("2026-03-01T09:00:00Z")}, {ID: "b", SeenAt: mustTime("2026-03-01T09:00:00Z")}}).Error)
		_, err := p.TouchAt(context.Background(), "b", mustTime("2026-03-01T09:30:00Z"))
		must(t, err)
		var got []overlayDevice
		must(t, db.Order("id").Find(&got).Error)
		equal(t, "device a", got[0].SeenAt.UTC().Format(time.RFC3339), "2026-03-01T09:00:00Z")
		equal(t, "device b", got[1].SeenAt.UTC().Format(time.RFC3339), "2026-03-01T09:30:00Z")
	})
}

// TestOverlayWithRedisDown: with Redis gone, a query returns the column's
// values with no error, raised by the in-process backlog only.
func TestOverlayWithRedisDown(t *testing.T) {
	srv := startPrivateRedis(t)
	rdb := newPrivateClient(t, srv.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	cfg := h.config()
	cfg.Presence.Overlay, cfg.Buffer.TouchTimeout = true, 50*time.Millisecond
	p, db := h.plugin(cfg)
	want := overlayUsers(t, p, db)
	srv.kill()
	if _, err := p.TouchAt(context.Background(), 5, mustTime("2026-03-01T09:30:05Z")); err == nil {
		t.Fatal("touch with Redis down: no error")
	}
	var users []lastseen.User
	must(t, db.Order("id").Find(&users).Error)
	want[0], want[2], want[4] = "2026-03-01T09:00:00Z", "", "2026-03-01T09:30:05Z" // column, column, backlog
	for i, u := range users {
		equal(t, fmt.Sprint("user ", u.ID), seenAt(u), want[i])
	}
}

// TestOverlayWithRedisBlackholed: with every byte to Redis dropped, each
// query returns the column's values with no error and never hangs (a query
// waits TouchTimeout at most for Redis; after 5 failures the breaker skips
// Redis altogether).
func TestOverlayWithRedisBlackholed(t *testing.T) {
	srv := startPrivateRedis(t)
	px := startFaultProxy(t, srv.Addr())
	rdb := newPrivateClient(t, px.Addr())
	h := newHarness(t, testenv.SQLite(), clientKind(rdb))
	cfg := h.config()
	cfg.Presence.Overlay, cfg.Buffer.TouchTimeout = true, requestBudget
	p, db := h.plugin(cfg)
	want := overlayUsers(t, p, db)
	px.SetDrop(true)
	t.Cleanup(func() { px.Restore() })            // before the plugin's Close, which flushes
	want[0], want[2] = "2026-03-01T09:00:00Z", "" // the column's values
	for q := 1; q <= 7; q++ {
		start := time.Now()
		var users []lastseen.User
		must(t, db.Order("id").Find(&users).Error)
		if took := time.Since(start); took >= hangLimit {
			t.Errorf("query %d took %v, want under %v (TouchTimeout %v): the budget was not honoured", q, took, hangLimit, requestBudget)
		}
		for i, u := range users {
			equal(t, fmt.Sprintf("query %d: user %d", q, u.ID), seenAt(u), want[i])
		}
	}
}

// hookMember is a tracked model whose AfterFind derives a field from the
// last-seen column, and hookPost belongs to one.
type hookMember struct {
	ID         uint64 `gorm:"primaryKey"`
	LastSeenAt *time.Time
	Seen       string `gorm:"-"` // set by AfterFind
}

func (m *hookMember) AfterFind(*gorm.DB) error {
	m.Seen = seenAt(lastseen.User{LastSeenAt: m.LastSeenAt})
	return nil
}

type hookPost struct {
	ID           uint64 `gorm:"primaryKey"`
	HookMemberID uint64
	HookMember   hookMember
}

// TestOverlayRunsBeforeAfterFindAndOnJoins: the overlay runs before the
// model's AfterFind (which sees the buffered value, as the loaded field
// does), and on rows loaded by Joins and by Preload as on a Find of the
// model itself.
func TestOverlayRunsBeforeAfterFindAndOnJoins(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Presence.Overlay, cfg.Model = true, &hookMember{}
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&hookMember{}, &hookPost{}))
		must(t, db.Create(&[]hookMember{{ID: 1, LastSeenAt: ptr(mustTime("2026-03-01T09:00:00Z"))}, {ID: 2}}).Error)
		must(t, db.Create(&[]hookPost{{ID: 10, HookMemberID: 1}, {ID: 11, HookMemberID: 2}}).Error)
		for id, at := range map[int]string{1: "2026-03-01T09:30:00Z", 2: "2026-03-01T09:31:00Z"} {
			_, err := p.TouchAt(ctx, id, mustTime(at))
			must(t, err)
		}
		var members []hookMember
		must(t, db.Order("id").Find(&members).Error)
		for _, m := range members {
			equal(t, fmt.Sprint("Find: member ", m.ID, " field and AfterFind"), seenAt(lastseen.User{LastSeenAt: m.LastSeenAt})+" "+m.Seen,
				map[uint64]string{1: "2026-03-01T09:30:00Z 2026-03-01T09:30:00Z", 2: "2026-03-01T09:31:00Z 2026-03-01T09:31:00Z"}[m.ID])
		}
		for _, how := range []string{"Joins", "Preload"} {
			var posts []hookPost
			q := db.Order("hook_posts.id")
			if how == "Joins" {
				q = q.Joins("HookMember")
			} else {
				q = q.Preload("HookMember")
			}
			must(t, q.Find(&posts).Error)
			equal(t, how+": posts", len(posts), 2)
			for _, post := range posts {
				equal(t, fmt.Sprint(how, ": post ", post.ID, "'s member"), seenAt(lastseen.User{LastSeenAt: post.HookMember.LastSeenAt}),
					map[uint64]string{10: "2026-03-01T09:30:00Z", 11: "2026-03-01T09:31:00Z"}[post.ID])
			}
		}
	})
}
