package idcodec

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"sync"
	"testing"

	"gorm.io/gorm/schema"
)

// newCodec is the codec of model's primary key.
func newCodec(t testing.TB, model any) Codec {
	t.Helper()
	s, err := schema.Parse(model, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(s.PrimaryFields[0])
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestNormalize(t *testing.T) {
	type intUser struct {
		ID int32 `gorm:"primaryKey"`
	}
	type uintUser struct {
		ID uint64 `gorm:"primaryKey"`
	}
	type stringUser struct {
		ID string `gorm:"primaryKey"`
	}
	ints, uints, strs := newCodec(t, &intUser{}), newCodec(t, &uintUser{}), newCodec(t, &stringUser{})
	uints.Max = math.MaxInt64
	strs.MaxLen = 8
	strs.BadText = func(s string) string {
		if strings.Contains(s, "\x00") {
			return "contains a NUL byte"
		}
		return ""
	}
	for _, c := range []struct {
		name  string
		codec Codec
		id    any
		want  string // the canonical text, or the error
	}{
		{"int", ints, 42, "42"},
		{"int text", ints, "007", "7"},
		{"int8", ints, int8(-5), "-5"},
		{"float", ints, 42.0, "42"},
		{"float32", ints, float32(7), "7"},
		{"json integer", ints, json.Number("42"), "42"},
		{"json exponent", ints, json.Number("4.2e1"), "42"},
		{"zero", ints, 0, "lastseen: invalid user id: int is zero, which GORM treats as no primary key"},
		{"beyond int32", ints, int64(1) << 40, `lastseen: invalid user id: int64 "1099511627776": not a 32-bit integer`},
		{"fraction", ints, 42.5, "lastseen: invalid user id: float64 42.5 is not a whole number"},
		{"NaN", ints, math.NaN(), "lastseen: invalid user id: float64 NaN"},
		{"beyond 2^53", ints, float64(1<<53 + 2), "lastseen: invalid user id: float64 9.007199254740994e+15 is beyond 2^53, where a float64 does not hold every integer exactly"},
		{"json text", ints, json.Number("x"), `lastseen: invalid user id: json.Number "x" is not a number`},
		{"nil", ints, nil, "lastseen: invalid user id: nil"},
		{"unsupported", ints, []int{1}, "lastseen: invalid user id: unsupported type []int (want an integer, a string or a fmt.Stringer)"},
		{"negative unsigned", uints, -1, "lastseen: invalid user id: int -1 is negative but the primary key is unsigned"},
		{"unsigned plus", uints, "+7", "7"},
		{"unsigned max", uints, uint64(math.MaxInt64), "9223372036854775807"},
		{"unsigned over max", uints, uint64(math.MaxInt64) + 1, `lastseen: invalid user id: uint64 "9223372036854775808": over 9223372036854775807, the largest key the database stores`},
		{"string", strs, "Bob ", "Bob "},
		{"string number", strs, 42, "42"},
		{"string float", strs, 4.0, "lastseen: invalid user id: float64 for a string primary key (a number is accepted for an integer key only)"},
		{"string json", strs, json.Number("4.0"), "4.0"},
		{"empty", strs, "", "lastseen: invalid user id: empty string"},
		{"too long", strs, "123456789", "lastseen: invalid user id: string of 9 bytes (at most 8)"},
		{"bad text", strs, "a\x00b", `lastseen: invalid user id: string "a\x00b": contains a NUL byte`},
	} {
		got, err := c.codec.Normalize(c.id)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: error %v does not wrap ErrInvalid", c.name, err)
			}
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s: Normalize(%#v) = %s, want %s", c.name, c.id, got, c.want)
		}
	}
}

// TestNormalizeSpaces: an integer key's text with white space around it
// is refused, naming it; a string key keeps the spaces.
func TestNormalizeSpaces(t *testing.T) {
	type intUser struct {
		ID int32 `gorm:"primaryKey"`
	}
	type uintUser struct {
		ID uint64 `gorm:"primaryKey"`
	}
	type stringUser struct {
		ID string `gorm:"primaryKey"`
	}
	ints, uints, strs := newCodec(t, &intUser{}), newCodec(t, &uintUser{}), newCodec(t, &stringUser{})
	for _, c := range []struct {
		codec Codec
		id    any
		want  string // the canonical text, or the error
	}{
		{ints, " 3", `lastseen: invalid user id: string " 3": leading or trailing spaces are not allowed for an integer key`},
		{ints, "3 ", `lastseen: invalid user id: string "3 ": leading or trailing spaces are not allowed for an integer key`},
		{ints, "3\n", `lastseen: invalid user id: string "3\n": leading or trailing spaces are not allowed for an integer key`},
		{ints, "\t3", `lastseen: invalid user id: string "\t3": leading or trailing spaces are not allowed for an integer key`},
		{ints, json.Number(" 3"), `lastseen: invalid user id: json.Number " 3": leading or trailing spaces are not allowed for an integer key`},
		{uints, "+7 ", `lastseen: invalid user id: string "+7 ": leading or trailing spaces are not allowed for an integer key`},
		{strs, " 3\n", " 3\n"},
	} {
		got, err := c.codec.Normalize(c.id)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%#v: error %v does not wrap ErrInvalid", c.id, err)
			}
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("Normalize(%#v) = %s, want %s", c.id, got, c.want)
		}
	}
}

func TestParse(t *testing.T) {
	type intUser struct {
		ID int64 `gorm:"primaryKey"`
	}
	type stringUser struct {
		ID string `gorm:"primaryKey"`
	}
	ints, strs := newCodec(t, &intUser{}), newCodec(t, &stringUser{})
	if v, err := ints.Parse("42"); v != int64(42) || err != nil {
		t.Errorf("Parse(42) = %#v, %v", v, err)
	}
	if v, err := strs.Parse("Bob"); v != "Bob" || err != nil {
		t.Errorf(`Parse("Bob") = %#v, %v`, v, err)
	}
	for _, c := range []struct {
		codec   Codec
		s, want string
	}{
		{ints, "", "length 0, want 1 to 128 bytes"},
		{ints, strings.Repeat("1", 129), "length 129, want 1 to 128 bytes"},
		{ints, "4x", "not a 64-bit integer"},
		{ints, "4 ", "leading or trailing spaces are not allowed for an integer key"},
	} {
		if _, err := c.codec.Parse(c.s); err == nil || err.Error() != c.want || errors.Is(err, ErrInvalid) {
			t.Errorf("Parse(%q) error %v, want %q", c.s, err, c.want)
		}
	}
	if !ints.Integer() || strs.Integer() || ints.Kind != Signed || strs.Kind != String {
		t.Errorf("kinds: %v %v", ints.Kind, strs.Kind)
	}
}

func TestNewRefusesKeyType(t *testing.T) {
	type floatUser struct {
		ID float64 `gorm:"primaryKey"`
	}
	s, err := schema.Parse(&floatUser{}, &sync.Map{}, schema.NamingStrategy{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = New(s.PrimaryFields[0])
	if want := "primary key ID is a float64; want an integer, a string or a sql.Scanner such as a UUID type"; err == nil || err.Error() != want {
		t.Errorf("New = %v, want %s", err, want)
	}
}

// TestAppendKey: AppendKey gives Normalize's text and verdict for a key
// value of the key's own type, appended after what dst holds, and
// allocates nothing for integer and string keys.
func TestAppendKey(t *testing.T) {
	type userID int64
	type signedUser struct {
		ID userID `gorm:"primaryKey"`
	}
	type uintUser struct {
		ID uint32 `gorm:"primaryKey"`
	}
	type stringUser struct {
		ID string `gorm:"primaryKey"`
	}
	type uuidUser struct {
		ID benchUUID `gorm:"primaryKey"`
	}
	signed, uints, strs, uuids := newCodec(t, &signedUser{}), newCodec(t, &uintUser{}), newCodec(t, &stringUser{}), newCodec(t, &uuidUser{})
	short := signed
	short.MaxLen = 3
	uints.Max = 1000
	strs.MaxLen, strs.Chars = 3, true
	strs.BadText = func(s string) string {
		if strings.Contains(s, "\x00") {
			return "contains a NUL byte"
		}
		return ""
	}
	var uuid benchUUID
	uuid[0], uuid[15] = 0xab, 0x01
	for _, c := range []struct {
		name  string
		codec Codec
		id    any
	}{
		{"signed", signed, userID(-42)}, {"signed zero", signed, userID(0)}, {"signed large", signed, userID(1 << 62)},
		{"over MaxLen", short, userID(1234)}, {"at MaxLen", short, userID(-12)},
		{"unsigned", uints, uint32(7)}, {"unsigned zero", uints, uint32(0)}, {"unsigned over Max", uints, uint32(1001)},
		{"unsigned at Max", uints, uint32(1000)},
		{"string", strs, "äbc"}, {"string over MaxLen", strs, "abcd"}, {"string empty", strs, ""},
		{"string bad text", strs, "a\x00"}, {"string spaces", strs, " 1 "},
		{"uuid", uuids, uuid}, {"uuid zero", uuids, benchUUID{}},
		{"other kind", signed, "12"}, {"other kind invalid", signed, "x"},
	} {
		want, err := c.codec.Normalize(c.id)
		got, ok := c.codec.AppendKey([]byte("prefix"), reflect.ValueOf(c.id))
		if ok != (err == nil) || string(got) != "prefix"+want {
			t.Errorf("%s: AppendKey(%#v) = %q, %v; Normalize gives %q, %v", c.name, c.id, got, ok, want, err)
		}
	}
	buf := make([]byte, 0, 64)
	for _, v := range []reflect.Value{reflect.ValueOf(userID(1234567)), reflect.ValueOf("abc")} {
		codec := signed
		if v.Kind() == reflect.String {
			codec = strs
		}
		if n := testing.AllocsPerRun(100, func() { buf, _ = codec.AppendKey(buf[:0], v) }); n != 0 {
			t.Errorf("AppendKey of a %s: %v allocations, want 0", v.Type(), n)
		}
	}
}
