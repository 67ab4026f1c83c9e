package tests

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
	"gorm.io/gorm/schema"
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

// mixPost belongs to a lastseen.User, for Joins.
type mixPost struct {
	ID     uint64 `gorm:"primaryKey"`
	UserID uint64
	User   lastseen.User
}

// TestOverlayMixedRows: a 300-row Find over every shard (ids from
// 1,000,001) gives each row exactly its value: the buffered one where it is
// newer than the column, the column's where the buffered one is older or
// there is none, NULL where neither has one, in one Redis round trip; a
// Joins query whose 600 rows name each user twice gives both copies the
// same; a string key of multi-byte ids is read as exactly.
func TestOverlayMixedRows(t *testing.T) {
	forEachEnv(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Presence.Overlay = true
		p, db := h.plugin(cfg)
		must(t, db.AutoMigrate(&lastseen.User{}, &mixPost{}))
		nine, quarterTo := mustTime("2026-03-01T09:00:00Z"), mustTime("2026-03-01T09:45:00Z")
		users := make([]lastseen.User, 300)
		want := map[uint64]string{}
		var touched []int
		for i := range users {
			users[i].ID = uint64(1_000_001 + i)
			seen := mustTime("2026-03-01T09:10:00Z").Add(time.Duration(i) * time.Second)
			switch i % 4 {
			case 0: // buffered, newer than the column
				users[i].LastSeenAt, want[users[i].ID] = &nine, seen.Format(time.RFC3339)
				touched = append(touched, i)
			case 1: // buffered, older than the column
				users[i].LastSeenAt, want[users[i].ID] = &quarterTo, quarterTo.Format(time.RFC3339)
				touched = append(touched, i)
			case 2: // nothing buffered
				users[i].LastSeenAt, want[users[i].ID] = &nine, nine.Format(time.RFC3339)
			case 3: // NULL column, buffered for every other one
				want[users[i].ID] = ""
				if i%8 == 3 {
					want[users[i].ID] = seen.Format(time.RFC3339)
					touched = append(touched, i)
				}
			}
		}
		must(t, db.CreateInBatches(users, 100).Error)
		for _, i := range touched {
			_, err := p.TouchAt(ctx, users[i].ID, mustTime("2026-03-01T09:10:00Z").Add(time.Duration(i)*time.Second))
			must(t, err)
		}
		for q := range 2 { // the first loads the read script
			rt := countRoundTrips(h.r.Client)
			var got []lastseen.User
			must(t, db.Order("id").Find(&got).Error)
			if q == 1 && !h.memory() {
				equal(t, "round trips of the Find", rt.pipelines.Load()+rt.singles.Load(), int64(1))
			}
			equal(t, "users found", len(got), 300)
			for _, u := range got {
				equal(t, fmt.Sprint("Find: user ", u.ID), seenAt(u), want[u.ID])
			}
		}

		posts := make([]mixPost, 600)
		for j := range posts {
			posts[j] = mixPost{ID: uint64(j + 1), UserID: uint64(1_000_001 + j%300)}
		}
		must(t, db.Omit("User").CreateInBatches(posts, 200).Error)
		var joined []mixPost
		must(t, db.Joins("User").Order("mix_posts.id").Find(&joined).Error)
		equal(t, "posts found", len(joined), 600)
		for _, post := range joined {
			equal(t, fmt.Sprint("Joins: post ", post.ID, "'s user ", post.UserID), seenAt(post.User), want[post.UserID])
		}

		dcfg := h.config()
		dcfg.Presence.Overlay, dcfg.Model, dcfg.Field, dcfg.Buffer.Prefix = true, &overlayDevice{}, "SeenAt", h.prefix+":d"
		dp, ddb := h.plugin(dcfg)
		must(t, ddb.AutoMigrate(&overlayDevice{}))
		devices := make([]overlayDevice, 40)
		wantDevice := map[string]string{}
		for i := range devices {
			devices[i] = overlayDevice{ID: fmt.Sprintf("appareil-é%02d", i), SeenAt: nine}
			wantDevice[devices[i].ID] = nine.Format(time.RFC3339)
		}
		must(t, ddb.Create(&devices).Error)
		for i := 0; i < len(devices); i += 3 {
			seen := mustTime("2026-03-01T09:20:00Z").Add(time.Duration(i) * time.Second)
			_, err := dp.TouchAt(ctx, devices[i].ID, seen)
			must(t, err)
			wantDevice[devices[i].ID] = seen.Format(time.RFC3339)
		}
		var gotDevices []overlayDevice
		must(t, ddb.Order("id").Find(&gotDevices).Error)
		equal(t, "devices found", len(gotDevices), 40)
		for _, d := range gotDevices {
			equal(t, "device "+d.ID, d.SeenAt.UTC().Format(time.RFC3339), wantDevice[d.ID])
		}
	})
}

// TestOverlayEveryKeyType: on every app model (embedded gorm.Model, int,
// int32, uint, uint64, string, collated string and UUID keys; time.Time and
// *time.Time fields, by Go or column name), a Find of two rows gives the
// touched one the buffered value and leaves the other's column value.
func TestOverlayEveryKeyType(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for i, c := range modelCases {
			t.Run(c.name, func(t *testing.T) {
				cfg := h.config()
				cfg.Buffer.Prefix = fmt.Sprintf("%s:k%d", h.prefix, i)
				cfg.Model, cfg.Field, cfg.Presence.Overlay = c.model, c.field, true
				p, db := h.plugin(cfg)
				if ddl := c.ddl[h.dialect]; ddl != "" {
					must(t, db.Exec(ddl).Error)
				} else {
					must(t, db.AutoMigrate(c.model))
				}
				for _, id := range []any{c.existing, c.unknown} {
					if c.seed != "" {
						must(t, db.Exec(c.seed, id).Error)
					} else { // through GORM, with the zero time.Time
						must(t, db.Create(&int32PKUser{ID: id.(int32)}).Error)
					}
				}
				initial := readColumn(t, db, c.table, c.pk, c.col, c.unknown)
				seen := mustTime("2026-03-01T09:20:00.123456Z")
				_, err := p.TouchAt(context.Background(), c.existing, seen)
				must(t, err)
				s, err := schema.Parse(c.model, &sync.Map{}, db.NamingStrategy)
				must(t, err)
				field := s.LookUpField(c.field)
				rows := reflect.New(reflect.SliceOf(s.ModelType))
				must(t, db.Model(c.model).Order(c.pk).Find(rows.Interface()).Error)
				equal(t, "rows found", rows.Elem().Len(), 2)
				got := map[string]string{}
				for j := range rows.Elem().Len() {
					row := rows.Elem().Index(j)
					id, _ := s.PrioritizedPrimaryField.ValueOf(context.Background(), row)
					v, _ := field.ValueOf(context.Background(), row)
					got[fmt.Sprint(id)] = loadedTime(v)
				}
				equal(t, "touched row", got[fmt.Sprint(c.existing)], seen.Format(time.RFC3339Nano))
				equal(t, "untouched row", got[fmt.Sprint(c.unknown)], initial)
			})
		}
	})
}

// loadedTime formats a loaded time field's value as readColumn does.
func loadedTime(v any) string {
	switch v := v.(type) {
	case *time.Time:
		if v == nil {
			return ""
		}
		return v.UTC().Format(time.RFC3339Nano)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	}
	return fmt.Sprintf("unexpected %T", v)
}

// OverlayBase holds the key of the models below.
type OverlayBase struct {
	ID uint64 `gorm:"primaryKey"`
}

// overlayEmbedded is a tracked model whose key is behind an embedded
// pointer (GORM allocates it when it loads a row).
type overlayEmbedded struct {
	*OverlayBase
	LastSeenAt *time.Time
}

// overlayInner is a tracked model whose key is in a struct embedded by
// value after another field (not at the start of the row).
type overlayInner struct {
	Name string
	OverlayBase
	LastSeenAt *time.Time
}

// TestOverlayKeyShapes: models whose key is a field of a struct embedded
// by pointer, or by value after another field, get the buffered values on
// Find (structs and pointers) and First, on every dialect.
func TestOverlayKeyShapes(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		for i, c := range []struct {
			name  string
			model any
			row   func(id uint64, at *time.Time) any
			seen  func(rv reflect.Value) (uint64, *time.Time)
		}{
			{"embedded pointer", &overlayEmbedded{},
				func(id uint64, at *time.Time) any {
					return &overlayEmbedded{OverlayBase: &OverlayBase{ID: id}, LastSeenAt: at}
				},
				func(rv reflect.Value) (uint64, *time.Time) {
					r := rv.Interface().(overlayEmbedded)
					return r.ID, r.LastSeenAt
				}},
			{"embedded value after a field", &overlayInner{},
				func(id uint64, at *time.Time) any {
					return &overlayInner{Name: "n", OverlayBase: OverlayBase{ID: id}, LastSeenAt: at}
				},
				func(rv reflect.Value) (uint64, *time.Time) {
					r := rv.Interface().(overlayInner)
					return r.ID, r.LastSeenAt
				}},
		} {
			t.Run(c.name, func(t *testing.T) {
				cfg := h.config()
				cfg.Presence.Overlay, cfg.Model, cfg.Buffer.Prefix = true, c.model, fmt.Sprintf("%s:s%d", h.prefix, i)
				p, db := h.plugin(cfg)
				must(t, db.AutoMigrate(c.model))
				nine := mustTime("2026-03-01T09:00:00Z")
				for id := uint64(1_000_001); id <= 1_000_003; id++ {
					must(t, db.Create(c.row(id, &nine)).Error)
				}
				_, err := p.TouchAt(context.Background(), uint64(1_000_002), mustTime("2026-03-01T09:20:00Z"))
				must(t, err)
				want := map[uint64]string{1_000_001: "2026-03-01T09:00:00Z", 1_000_002: "2026-03-01T09:20:00Z", 1_000_003: "2026-03-01T09:00:00Z"}
				typ := reflect.TypeOf(c.model).Elem()
				for _, shape := range []reflect.Type{reflect.SliceOf(typ), reflect.SliceOf(reflect.PointerTo(typ))} {
					rows := reflect.New(shape)
					must(t, db.Model(c.model).Order("id").Find(rows.Interface()).Error)
					equal(t, shape.String()+": rows", rows.Elem().Len(), 3)
					for j := range rows.Elem().Len() {
						id, at := c.seen(reflect.Indirect(rows.Elem().Index(j)))
						equal(t, fmt.Sprint(shape, ": ", id), seenAt(lastseen.User{LastSeenAt: at}), want[id])
					}
				}
				one := reflect.New(typ)
				must(t, db.First(one.Interface(), "id = ?", 1_000_002).Error)
				id, at := c.seen(one.Elem())
				equal(t, fmt.Sprint("First: ", id), seenAt(lastseen.User{LastSeenAt: at}), want[1_000_002])
			})
		}
	})
}
