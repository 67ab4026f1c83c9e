package dialect

import (
	"sync"
	"testing"
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm/schema"
)

// uuidLike is a key type written by its String method.
type uuidLike [2]byte

func (u uuidLike) String() string { return "6ba7b810-9dad-11d1-80b4-00c04fd430c8" }

func TestPgIDs(t *testing.T) {
	for _, c := range []struct {
		ids  []any
		want string
	}{
		{nil, "{}"},
		{[]any{int64(1), int64(-7), int64(9223372036854775807)}, "{1,-7,9223372036854775807}"},
		{[]any{uint64(18446744073709551615)}, "{18446744073709551615}"},
		{[]any{"plain", "", "with space", "{x,y}", "NULL"}, `{"plain","","with space","{x,y}","NULL"}`},
		{[]any{`a"b`, `back\slash`, `\"`}, `{"a\"b","back\\slash","\\\""}`},
		{[]any{"ünï\x00code"}, "{\"ünï\x00code\"}"},
		{[]any{uuidLike{}}, `{"6ba7b810-9dad-11d1-80b4-00c04fd430c8"}`},
	} {
		if got := pgIDs(c.ids); got != c.want {
			t.Errorf("pgIDs(%q) = %s, want %s", c.ids, got, c.want)
		}
	}
}

func TestPgTimes(t *testing.T) {
	type row struct {
		ID     int64
		At     time.Time
		Millis int64 `lastseen:"unixmilli"`
		Secs   int64 `lastseen:"unix"`
	}
	s, err := schema.Parse(&row{}, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		t.Fatal(err)
	}
	codec := func(field string, naive timecol.Naive, loc *time.Location) *timecol.Codec {
		c, err := timecol.New(s, s.LookUpField(field), field, timecol.Auto, "Field", naive, loc)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	ts := []time.Time{
		time.Date(2026, 3, 1, 9, 30, 0, 123456789, time.UTC),
		time.Date(2026, 7, 1, 2, 0, 0, 0, time.FixedZone("+09", 9*3600)),
	}
	for _, c := range []struct {
		name  string
		codec *timecol.Codec
		want  string
	}{
		{"timestamptz", codec("At", postgres.Naive(), nil), `{"2026-03-01T09:30:00.123456Z","2026-06-30T17:00:00Z"}`},
		{"naive in Berlin", naiveCodec(t, codec("At", postgres.Naive(), berlin)), `{"2026-03-01T10:30:00.123456","2026-06-30T19:00:00"}`},
		{"unix milliseconds", codec("Millis", postgres.Naive(), nil), `{"1772357400123","1782838800000"}`},
		{"unix seconds", codec("Secs", postgres.Naive(), nil), `{"1772357400","1782838800"}`},
	} {
		if got := pgTimes(c.codec, ts); got != c.want {
			t.Errorf("%s: pgTimes = %s, want %s", c.name, got, c.want)
		}
	}
	if got := pgTimes(codec("At", postgres.Naive(), nil), nil); got != "{}" {
		t.Errorf("pgTimes of none = %s, want {}", got)
	}
}

// naiveCodec marks c's column naive, as the catalog check does.
func naiveCodec(t *testing.T, c *timecol.Codec) *timecol.Codec {
	t.Helper()
	c.SetClass(timecol.ClassNaive)
	return c
}
