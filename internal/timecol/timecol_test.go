package timecol

import (
	"database/sql"
	"fmt"
	"sync"
	"testing"
	"time"
	_ "time/tzdata" // Europe/Berlin on machines without a zoneinfo database

	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

type row struct {
	ID       int64
	At       time.Time
	Ptr      *time.Time
	Null     sql.NullTime
	Millis   int64  `lastseen:"unixmilli"`
	Secs     int64  `lastseen:"unix"`
	Auto     int64  `gorm:"autoUpdateTime:milli"`
	AutoSecs int64  `gorm:"autoUpdateTime"`
	Nano     int64  `gorm:"autoUpdateTime:nano"`
	Bare     int64  // an integer without a unit
	BadTag   int64  `lastseen:"ms"`
	Name     string // not a time
	Small    int32  `lastseen:"unix"`
}

func parse(t *testing.T) *schema.Schema {
	t.Helper()
	s, err := schema.Parse(&row{}, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func codec(t *testing.T, field string, naive Naive, loc *time.Location) *Codec {
	t.Helper()
	s := parse(t)
	c, err := New(s, s.LookUpField(field), field, Auto, "Field", naive, loc)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestEncodingString(t *testing.T) {
	for e, want := range map[Encoding]string{Auto: "auto", Time: "time", UnixSeconds: "unix", UnixMillis: "unixmilli", 7: "Encoding(7)", -1: "Encoding(-1)"} {
		if got := e.String(); got != want {
			t.Errorf("Encoding(%d).String() = %q, want %q", int(e), got, want)
		}
	}
}

func TestFieldEncoding(t *testing.T) {
	s := parse(t)
	for _, c := range []struct {
		field      string
		configured Encoding
		enc        Encoding
		how, err   string
	}{
		{"At", Auto, Time, "time.Time", ""},
		{"Ptr", Auto, Time, "time.Time", ""},
		{"Null", Auto, Time, "Value() returns a time.Time", ""},
		{"Millis", Auto, UnixMillis, "configured", ""},
		{"Secs", Auto, UnixSeconds, "configured", ""},
		{"Auto", Auto, UnixMillis, "GORM tag autoUpdateTime:milli", ""},
		{"AutoSecs", Auto, UnixSeconds, "GORM tag autoUpdateTime", ""},
		{"Bare", UnixSeconds, UnixSeconds, "configured", ""},
		{"Bare", Auto, 0, "", "an integer needs its unit: tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`"},
		{"Nano", Auto, 0, "", "GORM's autoUpdateTime:nano is not supported: an integer needs its unit: tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`"},
		{"BadTag", Auto, 0, "", "tag lastseen:\"ms\", want \"time\", \"unix\" or \"unixmilli\""},
		{"At", UnixMillis, 0, "", "cannot hold encoding unixmilli; want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, or an int64 of Unix seconds or milliseconds (a `lastseen` tag)"},
		{"Small", Auto, 0, "", "cannot hold encoding unix; want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, or an int64 of Unix seconds or milliseconds (a `lastseen` tag)"},
	} {
		enc, how, err := FieldEncoding(s.LookUpField(c.field), c.configured)
		if errText(err) != c.err || enc != c.enc || how != c.how {
			t.Errorf("FieldEncoding(%s, %v) = %v, %q, %v; want %v, %q, %s", c.field, c.configured, enc, how, err, c.enc, c.how, c.err)
		}
	}
	if _, err := New(s, s.LookUpField("At"), "At", 9, "Field", Naive{}, nil); fmt.Sprint(err) !=
		`Field "At": encoding Encoding(9) is not EncodingAuto, EncodingTime, EncodingUnixSeconds or EncodingUnixMillis` {
		t.Errorf("New with encoding 9: %v", err)
	}
	if _, err := New(s, s.LookUpField("Name"), "Name", Auto, "Field", Naive{}, nil); fmt.Sprint(err) !=
		`Field "Name": row.Name is a string: want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, or an int64 of Unix seconds or milliseconds (a `+"`lastseen`"+` tag)` {
		t.Errorf("New of a string field: %v", err)
	}
}

// errText is err's text, "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestNullTime(t *testing.T) {
	at := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		v    any
		want string // RFC 3339 in UTC, "NULL" or the error
	}{
		{nil, "NULL"},
		{at, "2026-03-01T09:30:00Z"},
		{"2026-03-01 18:30:00+09:00", "2026-03-01T09:30:00Z"},
		{"2026-03-01T09:30:00Z", "2026-03-01T09:30:00Z"},
		{[]byte("2026-03-01 09:30:00.123456"), "2026-03-01T09:30:00.123456Z"},
		{"2026-03-01T09:30", "2026-03-01T09:30:00Z"},
		{"2026-03-01", "2026-03-01T00:00:00Z"},
		{"yesterday", `lastseen: cannot read "yesterday" as a time`},
		{"0123456789012345678901234567890123456789-and-more", `lastseen: cannot read "0123456789012345678901234567890123456789..." as a time`},
		{int64(5), "lastseen: cannot read a int64 as a time"},
	} {
		var nt NullTime
		got := "NULL"
		if err := nt.Scan(c.v); err != nil {
			got = err.Error()
		} else if nt.Valid {
			got = nt.Time.UTC().Format(time.RFC3339Nano)
		}
		if got != c.want {
			t.Errorf("Scan(%v) = %s, want %s", c.v, got, c.want)
		}
	}
}

func TestCodecValues(t *testing.T) {
	at := time.Date(2026, 3, 1, 9, 30, 15, 500_000_000, time.FixedZone("+09", 9*3600))
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	cast := func(wall string) clause.Expr { return clause.Expr{SQL: "CAST(? AS timestamp)", Vars: []any{wall}} }
	zoned := codec(t, "At", Naive{Cast: cast}, berlin)
	naive := codec(t, "At", Naive{Cast: cast, Default: true}, berlin)
	secs, millis := codec(t, "Secs", Naive{}, nil), codec(t, "Millis", Naive{}, nil)

	if got := fmt.Sprint(zoned.Value(at)); got != "2026-03-01 00:30:15.5 +0000 UTC" {
		t.Errorf("zoned Value = %s", got)
	}
	if got := fmt.Sprint(naive.Value(at)); got != "{CAST(? AS timestamp) [2026-03-01 01:30:15.5] false}" {
		t.Errorf("naive Value = %s", got)
	}
	naive.SetClass(ClassZoned) // the catalog says otherwise
	if naive.Naive() || fmt.Sprint(naive.Value(at)) != "2026-03-01 00:30:15.5 +0000 UTC" {
		t.Errorf("after SetClass(ClassZoned): naive %v, Value %v", naive.Naive(), naive.Value(at))
	}
	naive.SetClass(ClassNaive)
	for _, c := range []struct {
		c    *Codec
		want string
	}{
		{zoned, "2026-03-01T00:30:15.5Z"}, {naive, "2026-03-01T01:30:15.5"}, {secs, "1772325015"}, {millis, "1772325015500"},
	} {
		if got := string(c.c.AppendText([]byte("x"), at)); got != "x"+c.want {
			t.Errorf("%v AppendText = %s, want x%s", c.c.Encoding(), got, c.want)
		}
	}
	// Bound rounds so that whole units compare exactly with a fraction.
	for op, want := range map[string]int64{">=": 1772325016, "<": 1772325016, "<=": 1772325015, ">": 1772325015} {
		if got := secs.Bound(at, op); got != want {
			t.Errorf("Bound(%s) = %v, want %d", op, got, want)
		}
	}
	if got := secs.Bound(at.Truncate(time.Second), ">="); got != int64(1772325015) {
		t.Errorf("Bound of a whole second = %v", got)
	}
	if got, ok := millis.Value(at).(int64); !ok || got != 1772325015500 {
		t.Errorf("millis Value = %v", millis.Value(at))
	}
}

func TestCodecDecode(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	cast := func(wall string) clause.Expr { return clause.Expr{SQL: wall} }
	naive := codec(t, "At", Naive{Cast: cast, Default: true}, berlin)
	zoned := codec(t, "At", Naive{}, nil)
	secs := codec(t, "Secs", Naive{}, nil)
	wall := time.Date(2026, 3, 1, 10, 30, 0, 0, time.UTC) // as a driver returns a naive column
	for _, c := range []struct {
		c    *Codec
		v    any
		want string
	}{
		{naive, wall, "2026-03-01T09:30:00Z"},
		{zoned, wall, "2026-03-01T10:30:00Z"},
		{zoned, "2026-03-01 19:30:00+09:00", "2026-03-01T10:30:00Z"},
		{zoned, nil, "NULL"},
		{secs, int64(1772325000), "2026-03-01T00:30:00Z"},
		{secs, []byte(" 1772325000 "), "2026-03-01T00:30:00Z"},
		{secs, "12.5", `lastseen: cannot read "12.5" as unix`},
		{secs, 1.5, "lastseen: cannot read a float64 as unix"},
		{secs, nil, "NULL"},
	} {
		got := "NULL"
		at, valid, err := c.c.Decode(c.v)
		switch {
		case err != nil:
			got = err.Error()
		case valid:
			got = at.Format(time.RFC3339Nano)
		}
		if got != c.want {
			t.Errorf("%v Decode(%v) = %s, want %s", c.c.Encoding(), c.v, got, c.want)
		}
	}
	s := Scan{Codec: secs}
	if err := s.Scan(int64(1772325000)); err != nil || !s.Valid || s.Time.Unix() != 1772325000 {
		t.Errorf("Scan = %v %v %v", s.Time, s.Valid, err)
	}
}

func TestCodecGo(t *testing.T) {
	at := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	tc, ms := codec(t, "At", Naive{}, nil), codec(t, "Millis", Naive{}, nil)
	for _, c := range []struct {
		c     *Codec
		v     any
		want  time.Time
		valid bool
	}{
		{tc, at, at, true},
		{tc, &at, at, true},
		{tc, (*time.Time)(nil), time.Time{}, false},
		{tc, time.Time{}, time.Time{}, false},
		{tc, sql.NullTime{Time: at, Valid: true}, at, true},
		{tc, sql.NullTime{}, time.Time{}, false},
		{ms, at.UnixMilli(), at, true},
		{ms, uint64(at.UnixMilli()), at, true},
		{ms, int64(0), time.UnixMilli(0).UTC(), false},
		{tc, "text", time.Time{}, false},
	} {
		got, valid := c.c.FromGo(c.v)
		if !got.Equal(c.want) || valid != c.valid {
			t.Errorf("%v FromGo(%v) = %v %v, want %v %v", c.c.Encoding(), c.v, got, valid, c.want, c.valid)
		}
	}
	if got, ok := ms.ToGo(at).(int64); !ok || got != at.UnixMilli() {
		t.Errorf("millis ToGo = %v", ms.ToGo(at))
	}
	p, ok := tc.ToGo(at.In(time.FixedZone("+09", 9*3600))).(*time.Time)
	if !ok || !p.Equal(at) || p.Location() != time.UTC {
		t.Errorf("time ToGo = %v", tc.ToGo(at))
	}
}

func TestFits(t *testing.T) {
	tc, secs := codec(t, "At", Naive{}, nil), codec(t, "Secs", Naive{}, nil)
	for k, want := range map[Class][3]any{
		ClassAny:     {true, true, "any value"},
		ClassZoned:   {true, false, "timestamps with a time zone"},
		ClassNaive:   {true, false, "timestamps without a time zone"},
		ClassText:    {true, false, "timestamps as text"},
		ClassInteger: {false, true, "integers"},
		ClassOther:   {false, false, "neither timestamps nor integers"},
	} {
		got := [3]any{tc.Fits(k), secs.Fits(k), k.String()}
		if got != want {
			t.Errorf("class %d: fits time, fits unix, String = %v, want %v", int(k), got, want)
		}
	}
	if got := secs.Describe(); got != "a int64 stored as unix (configured)" {
		t.Errorf("Describe = %q", got)
	}
}

// TestDSTFallBack: on the night Europe/Berlin goes back from 03:00 CEST to
// 02:00 CET (2026-10-25 01:00Z), 02:10 CET (01:10Z) is a second pass of
// 02:10 (00:10Z was the first); 02:10 CEST and 03:10 CET are not. The
// earliest instant of the wall time 02:50 is 00:50Z; of 03:10, 02:10Z; of
// 10:00 on a summer day, 08:00Z. UTC has no transition.
func TestDSTFallBack(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for s, want := range map[string]bool{"2026-10-25T01:10:00Z": true, "2026-10-25T01:59:59Z": true, "2026-10-25T00:10:00Z": false,
		"2026-10-25T02:10:00Z": false, "2026-07-01T08:00:00Z": false} {
		if got := SecondPass(at(s), berlin); got != want {
			t.Errorf("SecondPass(%s) = %v, want %v", s, got, want)
		}
	}
	wall := func(s string) time.Time { v, _ := time.Parse("2006-01-02 15:04", s); return v }
	for w, want := range map[string]string{"2026-10-25 02:50": "2026-10-25T00:50:00Z", "2026-10-25 02:00": "2026-10-25T00:00:00Z",
		"2026-10-25 03:10": "2026-10-25T02:10:00Z", "2026-07-01 10:00": "2026-07-01T08:00:00Z", "2026-10-25 01:59": "2026-10-24T23:59:00Z"} {
		if got := Earliest(wall(w), berlin).UTC().Format(time.RFC3339); got != want {
			t.Errorf("Earliest(%s) = %s, want %s", w, got, want)
		}
	}
	now := at("2026-03-01T09:30:00Z")
	if !HasDST(berlin, now) || HasDST(time.UTC, now) || HasDST(nil, now) {
		t.Errorf("HasDST: Berlin %v, UTC %v", HasDST(berlin, now), HasDST(time.UTC, now))
	}
	if name, ok := ZoneName(berlin, now); name != "Europe/Berlin" || !ok {
		t.Errorf("ZoneName(Berlin) = %q, %v", name, ok)
	}
	if _, ok := ZoneName(time.FixedZone("X", 3600), now); ok {
		t.Error("ZoneName of an unnamed fixed zone")
	}
	t.Setenv("TZ", "Europe/Berlin")
	local := time.FixedZone("Local", 3600) // a stand-in named as time.Local is: its offsets are not Berlin's in summer
	if _, ok := ZoneName(local, now); ok {
		t.Error("ZoneName accepted a Local whose offsets are not TZ's")
	}
	t.Setenv("TZ", ":/usr/share/zoneinfo/Europe/Berlin")
	if got := localName(); got != "Europe/Berlin" {
		t.Errorf("localName with a TZ path = %q", got)
	}
}
