package tests

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"strconv"
	"testing"

	"github.com/lastseen/lastseen"
	"github.com/lastseen/lastseen/tests/testenv"
)

// jsonClaimID is a named float type, as an app's claims struct may declare.
type jsonClaimID float64

// TestUserIDFromJSONNumbers: a whole float of magnitude up to 2^53 and a
// json.Number name an integer key's user exactly; fractions, NaN, infinities,
// floats past 2^53 and floats for a string key are ErrInvalidUserID, each
// with its exact message.
func TestUserIDFromJSONNumbers(t *testing.T) {
	codecs := map[string]idCodec{}
	for _, c := range fuzzCodecs(t) {
		codecs[c.name] = c.codec
	}
	cases := []struct {
		key  string
		id   any
		want string // canonical id, or the error text
	}{
		{"uint64", float64(42), "42"},
		{"uint64", float32(42), "42"},
		{"uint64", jsonClaimID(7), "7"},
		{"uint64", float64(1 << 53), "9007199254740992"},
		{"int64", float64(-(1 << 53)), "-9007199254740992"},
		{"int64", float64(-17), "-17"},
		{"int32", float64(math.MaxInt32), "2147483647"},
		{"uint64", json.Number("42"), "42"},
		{"uint64", json.Number("42.0"), "42"},
		{"uint64", json.Number("4.2e1"), "42"},
		{"uint64", json.Number("18446744073709551615"), "18446744073709551615"},
		{"string", json.Number("42"), "42"},
		{"uint64", 42.5, "lastseen: invalid user id: float64 42.5 is not a whole number"},
		{"uint64", math.NaN(), "lastseen: invalid user id: float64 NaN"},
		{"uint64", math.Inf(1), "lastseen: invalid user id: float64 +Inf"},
		{"int64", math.Inf(-1), "lastseen: invalid user id: float64 -Inf"},
		{"uint64", float64(1<<53 + 2), "lastseen: invalid user id: float64 9.007199254740994e+15 is beyond 2^53, where a float64 does not hold every integer exactly"},
		{"uint64", float64(0), "lastseen: invalid user id: float64 is zero, which GORM treats as no primary key"},
		{"uint64", math.Copysign(0, -1), "lastseen: invalid user id: float64 is zero, which GORM treats as no primary key"},
		{"uint64", float64(-1), "lastseen: invalid user id: float64 -1 is negative but the primary key is unsigned"},
		{"int32", float64(math.MaxInt32 + 1), "lastseen: invalid user id: float64 \"2147483648\": not a 32-bit integer"},
		{"string", float64(42), "lastseen: invalid user id: float64 for a string primary key (a number is accepted for an integer key only)"},
		{"uuid", float64(42), "lastseen: invalid user id: float64 for a uuid.UUID primary key (a number is accepted for an integer key only)"},
		{"uint64", json.Number("42.5"), "lastseen: invalid user id: json.Number 42.5 is not a whole number"},
		{"uint64", json.Number("abc"), "lastseen: invalid user id: json.Number \"abc\" is not a number"},
		{"uint64", json.Number("1e300"), "lastseen: invalid user id: json.Number 1e+300 is beyond 2^53, where a float64 does not hold every integer exactly"},
	}
	for _, c := range cases {
		got, err := codecs[c.key].normalize(c.id)
		if err != nil {
			if !errors.Is(err, lastseen.ErrInvalidUserID) {
				t.Errorf("%s key, %T %v: error %v does not wrap ErrInvalidUserID", c.key, c.id, c.id, err)
			}
			got = err.Error()
		}
		equal(t, c.key+" key, "+strconv.Quote(fmtID(c.id)), got, c.want)
	}
}

func fmtID(v any) string { b, _ := json.Marshal(v); return string(b) }

// TestTouchJSONClaimUsesLocalCache: a JWT claim decoded by encoding/json
// (float64) is touched like the integer it holds: one pending entry under
// "42", and the second touch is a local-cache hit with no Redis command.
func TestTouchJSONClaimUsesLocalCache(t *testing.T) {
	h := newHarness(t, testenv.SQLite(), testenv.Miniredis())
	ctx := context.Background()
	p, _ := h.plugin(h.config())
	var claims map[string]any
	must(t, json.Unmarshal([]byte(`{"sub": 42}`), &claims))
	recorded, err := p.Touch(ctx, claims["sub"])
	must(t, err)
	equal(t, "first touch recorded", recorded, true)
	cc := countCommands(h.r.Client)
	recorded, err = p.Touch(ctx, claims["sub"])
	must(t, err)
	equal(t, "second touch recorded", recorded, false)
	equal(t, "second touch redis commands", cc.sent.Load(), 0)
	_, ok, err := p.Pending(ctx, uint64(42))
	must(t, err)
	equal(t, "pending for user 42", ok, true)
	_, err = p.Touch(ctx, 42.5)
	equal(t, "fractional claim", errors.Is(err, lastseen.ErrInvalidUserID), true)
	s := p.Stats()
	equal(t, "touches", s.Touches, 3)
	equal(t, "recorded", s.Recorded, 1)
	equal(t, "cache hits", s.CacheHits, 1)
	equal(t, "invalid", s.Invalid, 1)
}

// FuzzFloatUserID: for every float64, an integer key accepts it exactly
// when it is whole, nonzero, of magnitude at most 2^53 and in the key's
// range, and then names the same user as the integer; never a panic. Its
// seeds (testdata/fuzz/FuzzFloatUserID) are whole and fractional values,
// ±2^53 and 2^53+2, the int32 and uint16 bounds, the extremes, +Inf and NaN.
func FuzzFloatUserID(f *testing.F) {
	codecs := fuzzCodecs(f)
	f.Fuzz(func(t *testing.T, v float64) {
		for _, c := range codecs {
			id, err := c.codec.normalize(v)
			ok := checkNormalized(t, c, v, id, err)
			isInt := c.name != "string" && c.name != "uuid"
			whole := !math.IsNaN(v) && !math.IsInf(v, 0) && v == math.Trunc(v) && math.Abs(v) <= 1<<53
			want := isInt && whole && v != 0 && int64(v) >= c.min && (v < 0 || uint64(v) <= c.max)
			if ok != want {
				t.Fatalf("%s: normalize(%v) accepted=%v (%q, %v), want %v", c.name, v, ok, id, err, want)
			}
			if ok && id != strconv.FormatInt(int64(v), 10) {
				t.Fatalf("%s: normalize(%v) = %q, want %d", c.name, v, id, int64(v))
			}
		}
	})
}
