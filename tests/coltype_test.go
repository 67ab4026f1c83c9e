package tests

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/lastseen/lastseen/tests/testenv"
	"gorm.io/gorm"
)

// Tracked models, one per column type (coltype.go).
type (
	msUser struct { // int64 epoch milliseconds, by the lastseen tag
		ID   int64  `gorm:"primaryKey;autoIncrement:false"`
		Seen *int64 `lastseen:"unixmilli"`
	}
	secUser struct { // int64 epoch seconds, by Config.FieldEncoding
		ID   int64 `gorm:"primaryKey;autoIncrement:false"`
		Seen *int64
	}
	nullTimeUser struct {
		ID   int64 `gorm:"primaryKey;autoIncrement:false"`
		Seen sql.NullTime
	}
	stampUser struct { // a named type over time.Time
		ID   int64 `gorm:"primaryKey;autoIncrement:false"`
		Seen *stampTime
	}
	// customUser is the real app's shape: a CustomTime stored as INTEGER
	// epoch milliseconds through its Valuer and Scanner.
	customUser struct {
		ID             int64 `gorm:"primaryKey;autoIncrement:false"`
		LastLoggedInAt *customTime
	}
	stampTime  time.Time
	customTime time.Time
)

func (msUser) TableName() string       { return "ms_users" }
func (secUser) TableName() string      { return "sec_users" }
func (nullTimeUser) TableName() string { return "nulltime_users" }
func (stampUser) TableName() string    { return "stamp_users" }
func (customUser) TableName() string   { return "custom_users" }

// Value implements driver.Valuer: Unix milliseconds.
func (c customTime) Value() (driver.Value, error) { return time.Time(c).UnixMilli(), nil }

// Scan implements sql.Scanner: Unix milliseconds, or a time.
func (c *customTime) Scan(v any) error {
	switch x := v.(type) {
	case int64:
		*c = customTime(time.UnixMilli(x).UTC())
	case time.Time:
		*c = customTime(x)
	default:
		return fmt.Errorf("customTime: cannot scan %T", v)
	}
	return nil
}

// columnKind is one tracked column type in the tests.
type columnKind struct {
	name    string
	model   any
	table   string
	col     string
	cfg     func(c *lastseen.Config)
	enc     timecol.Encoding // what the column stores
	inWhole bool             // the column holds whole seconds
}

func columnKinds() []columnKind {
	none := func(*lastseen.Config) {}
	return []columnKind{
		{"epoch ms", &msUser{}, "ms_users", "seen", none, timecol.UnixMillis, false},
		{"epoch seconds", &secUser{}, "sec_users", "seen", func(c *lastseen.Config) { testenv.Seam(c).FieldEncoding = int(timecol.UnixSeconds) }, timecol.UnixSeconds, true},
		{"sql.NullTime", &nullTimeUser{}, "nulltime_users", "seen", none, timecol.Time, false},
		{"named time type", &stampUser{}, "stamp_users", "seen", none, timecol.Time, false},
		{"CustomTime over integer ms", &customUser{}, "custom_users", "last_logged_in_at", none, timecol.UnixMillis, false},
	}
}

// stored is at as the kind's column holds it: a decimal count or, for a
// timestamp, the instant in RFC 3339 (UTC).
func (k columnKind) stored(at time.Time) string {
	switch k.enc {
	case timecol.UnixMillis:
		return strconv.FormatInt(at.UnixMilli(), 10)
	case timecol.UnixSeconds:
		return strconv.FormatInt(at.Unix(), 10)
	}
	return at.UTC().Format(time.RFC3339Nano)
}

// seedValue is at as a bound value for the kind's column.
func (k columnKind) seedValue(at time.Time) any {
	switch k.enc {
	case timecol.UnixMillis:
		return at.UnixMilli()
	case timecol.UnixSeconds:
		return at.Unix()
	}
	return at.UTC()
}

// read returns the kind's column of row id as stored(), "" for NULL.
func (k columnKind) read(t testing.TB, db *gorm.DB, id int64) string {
	t.Helper()
	if k.enc == timecol.Time {
		return lastSeenColumn(t, db, k.table, "id", k.col, id)
	}
	var rows []struct{ V *int64 }
	must(t, db.Table(k.table).Select(k.col+" AS v").Where("id = ?", id).Scan(&rows).Error)
	if len(rows) == 0 || rows[0].V == nil {
		return ""
	}
	return strconv.FormatInt(*rows[0].V, 10)
}

// TestColumnTypesFlushForwardOnly: for every supported column type, on every
// dialect, a flush writes the newer touches in the column's own encoding
// (milliseconds, seconds truncated, timestamps), leaves an older touch
// Stale and the column as it was, counts an unknown id Unknown, and the
// SeenWithin scope, LastSeen and LastSeenMany read the column exactly,
// rounding the scope's cutoff to the column's unit.
func TestColumnTypesFlushForwardOnly(t *testing.T) {
	for _, k := range columnKinds() {
		t.Run(k.name, func(t *testing.T) {
			forEachDialect(t, func(t *testing.T, h *harness) { checkColumnKind(t, h, k, false) })
		})
	}
	for _, k := range columnKinds()[:2] { // Unix time in Upsert mode: the unknown id is inserted
		t.Run(k.name+"/upsert", func(t *testing.T) {
			forEachDialect(t, func(t *testing.T, h *harness) { checkColumnKind(t, h, k, true) })
		})
	}
}

func checkColumnKind(t *testing.T, h *harness, k columnKind, upsert bool) {
	ctx := context.Background()
	must(t, h.db.AutoMigrate(k.model))
	t1, t3 := mustTime("2026-03-01T09:00:00.250Z"), mustTime("2026-03-01T09:10:00.250Z")
	must(t, h.db.Table(k.table).Create([]map[string]any{
		{"id": int64(1), k.col: k.seedValue(t1)},
		{"id": int64(2), k.col: nil},
		{"id": int64(3), k.col: k.seedValue(t3)},
	}).Error)
	cfg := h.config()
	cfg.Model, cfg.Field = k.model, k.col
	k.cfg(&cfg)
	cfg.Flush.Upsert = upsert
	p, db := h.plugin(cfg)
	equal(t, "encoding", usersEncoding(p), k.enc)

	touch1, touch2 := mustTime("2026-03-01T09:20:00.750Z"), mustTime("2026-03-01T09:25:00.500Z")
	for id, at := range map[int64]time.Time{1: touch1, 2: touch2, 3: mustTime("2026-03-01T09:05:00Z"), 4: mustTime("2026-03-01T09:29:00Z")} {
		if _, err := p.TouchAt(ctx, id, at); err != nil {
			t.Fatalf("touch %d: %v", id, err)
		}
	}
	res, err := p.Flush(ctx)
	must(t, err)
	got := fmt.Sprintf("written %d stale %d unknown %d uncomparable %d", res.Written, res.Stale, res.Unknown, res.Uncomparable)
	want := "written 2 stale 1 unknown 1 uncomparable 0"
	if upsert {
		want = "written 3 stale 1 unknown 0 uncomparable 0"
		equal(t, "row 4 (inserted)", k.read(t, db, 4), k.stored(mustTime("2026-03-01T09:29:00Z")))
	}
	equal(t, "flush", got, want)
	trunc := func(at time.Time) time.Time {
		if k.inWhole {
			return at.Truncate(time.Second)
		}
		return at
	}
	equal(t, "row 1 (newer touch)", k.read(t, db, 1), k.stored(touch1))
	equal(t, "row 2 (was NULL)", k.read(t, db, 2), k.stored(touch2))
	equal(t, "row 3 (older touch: unchanged)", k.read(t, db, 3), k.stored(t3))

	// Cutoff 09:20:00.5: row 1 is 09:20:00.750, or 09:20:00 in whole seconds.
	db.Config.NowFunc = func() time.Time { return mustTime("2026-03-01T09:30:00Z") }
	var ids []int64
	must(t, db.Table(k.table).Scopes(lastseen.SeenWithin(9*time.Minute+59*time.Second+500*time.Millisecond)).Order("id").Pluck("id", &ids).Error)
	want = "[1 2]"
	if k.inWhole {
		want = "[2]"
	}
	if upsert {
		want = strings.TrimSuffix(want, "]") + " 4]"
	}
	equal(t, "SeenWithin(9m59.5s)", fmt.Sprint(ids), want)

	at, ok, err := p.LastSeen(ctx, int64(1))
	must(t, err)
	equal(t, "LastSeen(1)", fmt.Sprint(ok, at.UTC().Format(time.RFC3339Nano)), fmt.Sprint(true, trunc(touch1).Format(time.RFC3339Nano)))
	many, err := p.LastSeenMany(ctx, []any{int64(3), int64(2)})
	must(t, err)
	equal(t, "LastSeenMany(3, 2)", fmt.Sprint(many[0].Format(time.RFC3339Nano), " ", many[1].Format(time.RFC3339Nano)),
		fmt.Sprint(trunc(t3).Format(time.RFC3339Nano), " ", trunc(touch2).Format(time.RFC3339Nano)))
}

// TestColumnTypeMismatchRefused: a field whose Go type stores one encoding
// and a column declared for another is refused at Initialize, the error
// naming the Config field, the Go type and the column type; the CustomTime
// over INTEGER milliseconds forced to EncodingTime is the real app's case.
func TestColumnTypeMismatchRefused(t *testing.T) {
	colType := map[string]string{"sqlite": "INTEGER", "postgres": "INT8", "mysql": "BIGINT"}
	forEachDialect(t, func(t *testing.T, h *harness) {
		must(t, h.db.AutoMigrate(&customUser{}))
		cfg := h.config()
		cfg.Model, cfg.Field, testenv.Seam(&cfg).FieldEncoding = &customUser{}, "LastLoggedInAt", int(timecol.Time)
		err := h.openDB().Use(lastseen.New(cfg))
		if !errors.Is(err, lastseen.ErrInvalidConfig) {
			t.Fatalf("db.Use = %v, want ErrInvalidConfig", err)
		}
		equal(t, "error", err.Error(), `lastseen: invalid config: Config.Field "LastLoggedInAt": customUser.LastLoggedInAt is a *tests.customTime stored as time (configured), but column custom_users.last_logged_in_at is `+
			colType[h.dialect]+", which holds integers")
	})
}

// TestColumnTypeMismatchFoundByFlush: a table created after db.Use is
// checked by the first flush with work: ErrSchema naming both types, the
// touch kept in Redis.
func TestColumnTypeMismatchFoundByFlush(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		cfg := h.config()
		cfg.Model, cfg.Field = &nullTimeUser{}, "Seen"
		p, db := h.plugin(cfg)
		must(t, db.Exec("CREATE TABLE nulltime_users (id bigint PRIMARY KEY, seen bigint)").Error)
		must(t, db.Exec("INSERT INTO nulltime_users (id) VALUES (1)").Error)
		_, err := p.TouchAt(ctx, int64(1), mustTime("2026-03-01T09:20:00Z"))
		must(t, err)
		_, err = p.Flush(ctx)
		if !errors.Is(err, lastseen.ErrSchema) {
			t.Fatalf("flush = %v, want ErrSchema", err)
		}
		equal(t, "error", err.Error(), `lastseen: schema does not fit the config: flush: Config.Field "Seen": nullTimeUser.Seen is a sql.NullTime stored as time (Value() returns a time.Time), but column nulltime_users.seen is `+
			map[string]string{"sqlite": "BIGINT", "postgres": "INT8", "mysql": "BIGINT"}[h.dialect]+", which holds integers")
		pending, ok, err := p.Pending(ctx, int64(1))
		must(t, err)
		equal(t, "still pending", fmt.Sprintf("%v %s", ok, pending.Format(time.RFC3339)), "true 2026-03-01T09:20:00Z")
	})
}
