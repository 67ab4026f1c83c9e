package tests

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/lastseen/lastseen"
	"gorm.io/gorm/schema"
)

// Fuzz tests of the user-id codec. The seeds, in testdata/fuzz/FuzzUserID
// and testdata/fuzz/FuzzFloatUserID, run in every `go test`; to fuzz:
// go test -run '^$' -fuzz FuzzUserID -fuzztime 1m (or FuzzFloatUserID;
// FuzzParseMicros is in the root package).

// Primary keys of every kind the codec supports.
type (
	fuzzInt64  struct{ ID int64 }
	fuzzUint64 struct{ ID uint64 }
	fuzzInt32  struct{ ID int32 }
	fuzzUint16 struct{ ID uint16 }
	fuzzString struct{ ID string }
	fuzzUUID   struct{ ID uuid.UUID }
)

// fuzzCodec is a codec with what its key type accepts.
type fuzzCodec struct {
	name  string
	codec idCodec
	// min and max bound the integer kinds; unused for string and UUID.
	min int64
	max uint64
}

// defaultMaxIDLength is the longest id Touch takes for a key column
// without a declared length.
const defaultMaxIDLength = 128

func fuzzCodecs(t testing.TB) []fuzzCodec {
	t.Helper()
	codec := func(m any) idCodec {
		s, err := schema.Parse(m, &sync.Map{}, schema.NamingStrategy{})
		if err != nil {
			t.Fatal(err)
		}
		c, err := newIDCodec(s.PrioritizedPrimaryField)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	return []fuzzCodec{
		{"int64", codec(&fuzzInt64{}), math.MinInt64, math.MaxInt64},
		{"uint64", codec(&fuzzUint64{}), 0, math.MaxUint64},
		{"int32", codec(&fuzzInt32{}), math.MinInt32, math.MaxInt32},
		{"uint16", codec(&fuzzUint16{}), 0, math.MaxUint16},
		{"string", codec(&fuzzString{}), 0, 0},
		{"uuid", codec(&fuzzUUID{}), 0, 0},
	}
}

// checkNormalized asserts the contract of one normalize call: an error
// wraps ErrInvalidUserID and starts with its text; a success is a canonical
// id of 1 to 128 bytes that normalizes to itself, parses into the key's
// type, and that parsed value normalizes back to the same id.
func checkNormalized(t *testing.T, c fuzzCodec, input any, id string, err error) (ok bool) {
	t.Helper()
	if err != nil {
		if !errors.Is(err, lastseen.ErrInvalidUserID) || !strings.HasPrefix(err.Error(), "lastseen: invalid user id: ") {
			t.Fatalf("%s: normalize(%#v): error %q does not wrap ErrInvalidUserID", c.name, input, err)
		}
		return false
	}
	if id == "" || len(id) > defaultMaxIDLength {
		t.Fatalf("%s: normalize(%#v) = %q: length %d, want 1 to %d", c.name, input, id, len(id), defaultMaxIDLength)
	}
	again, err := c.codec.normalize(id)
	if err != nil || again != id {
		t.Fatalf("%s: normalize(%q) = %q, %v: the canonical form must normalize to itself", c.name, id, again, err)
	}
	v, err := c.codec.parse(id)
	if err != nil {
		t.Fatalf("%s: parse(%q) of a canonical id: %v", c.name, id, err)
	}
	back, err := c.codec.normalize(v)
	if err != nil || back != id {
		t.Fatalf("%s: normalize(parse(%q)) = %q, %v: the value bound for SQL must round-trip", c.name, id, back, err)
	}
	return true
}

// FuzzUserID feeds a string, a signed and an unsigned integer to the
// normalization of every primary-key kind. Never a panic; errors wrap
// ErrInvalidUserID; what is accepted is exactly what the key type holds,
// in canonical form, and round-trips. Its seeds (testdata/fuzz/FuzzUserID)
// are texts of every kind (integers at each key type's bounds, other
// spellings, UUIDs in every form, 128 and 129 bytes, invalid UTF-8), each
// with len(text)-3 and len(text) as the integers, and integers at the
// int64, int32 and uint16 bounds.
func FuzzUserID(f *testing.F) {
	codecs := fuzzCodecs(f)
	f.Fuzz(func(t *testing.T, s string, n int64, u uint64) {
		for _, c := range codecs {
			id, err := c.codec.normalize(s)
			ok := checkNormalized(t, c, s, id, err)
			_, perr := c.codec.parse(s) // never panics, whatever the text
			switch c.name {
			case "string":
				want := s != "" && len(s) <= defaultMaxIDLength
				if ok != want || (ok && id != s) {
					t.Fatalf("string: normalize(%q) = %q, %v; want it accepted as is: %v", s, id, err, want)
				}
			case "uuid":
				parsed, uerr := uuid.Parse(s)
				want := s != "" && len(s) <= defaultMaxIDLength && uerr == nil
				if ok != want || (ok && id != parsed.String()) {
					t.Fatalf("uuid: normalize(%q) = %q, %v; want %v (%q)", s, id, err, want, parsed.String())
				}
			default: // integers: decimal text, no surrounding space (refused for it), in range, not zero
				bare := strings.TrimSpace(s) == s
				v, serr := strconv.ParseInt(s, 10, 64)
				want := bare && serr == nil && v != 0 && v >= c.min && (v < 0 || uint64(v) <= c.max) && len(s) <= defaultMaxIDLength
				if c.min == 0 { // unsigned: ParseUint, which also takes values above MaxInt64, and a "+" as ParseInt does
					uv, uerr := strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, 64)
					want = bare && uerr == nil && uv != 0 && uv <= c.max && len(s) <= defaultMaxIDLength
				}
				if !bare && len(s) <= defaultMaxIDLength && (ok || !strings.Contains(err.Error(), "leading or trailing spaces are not allowed for an integer key")) {
					t.Fatalf("%s: normalize(%q) = %q, %v; want refused for its spaces", c.name, s, id, err)
				}
				if ok != want {
					t.Fatalf("%s: normalize(%q) accepted=%v (%q, %v), want %v", c.name, s, ok, id, err, want)
				}
			}
			if ok && perr != nil {
				t.Fatalf("%s: normalize(%q) accepted it but parse refused it: %v", c.name, s, perr)
			}

			id, err = c.codec.normalize(n)
			ok = checkNormalized(t, c, n, id, err)
			if c.name == "int64" || c.name == "int32" || c.name == "uint64" || c.name == "uint16" {
				want := n != 0 && n >= c.min && (n < 0 || uint64(n) <= c.max)
				if ok != want || (ok && id != strconv.FormatInt(n, 10)) {
					t.Fatalf("%s: normalize(int64 %d) = %q, %v; want accepted %v", c.name, n, id, err, want)
				}
			}
			id, err = c.codec.normalize(u)
			ok = checkNormalized(t, c, u, id, err)
			if c.name == "int64" || c.name == "int32" || c.name == "uint64" || c.name == "uint16" {
				want := u != 0 && u <= c.max
				if ok != want || (ok && id != strconv.FormatUint(u, 10)) {
					t.Fatalf("%s: normalize(uint64 %d) = %q, %v; want accepted %v", c.name, u, id, err, want)
				}
			}
			if utf8.ValidString(s) && c.name == "string" {
				// A fmt.Stringer is taken by its String method.
				id, err = c.codec.normalize(stringer(s))
				checkNormalized(t, c, stringer(s), id, err)
			}
		}
	})
}

type stringer string

func (s stringer) String() string { return string(s) }

// TestHandWrittenPendingValues: entries written into a pending hash by
// hand or by another version are read by the flush with buffer.ParseMicros
// and the user-id codec: readable ones are written, the rest are dropped
// and counted (Rejected) and leave Redis; a touch is never blocked by a stored
// value the flush would refuse, such as one from the far future.
func TestHandWrittenPendingValues(t *testing.T) {
	forEachDialect(t, func(t *testing.T, h *harness) {
		ctx := context.Background()
		h.clock.Set(mustTime("2026-03-01T10:00:00Z"))
		cfg := h.config()
		cfg.Buffer.Shards = 1
		cfg.Throttle = time.Minute
		p, db := h.plugin(cfg)
		want := seedFaultUsers(t, db, 12)
		ten := strconv.FormatInt(mustTime("2026-03-01T10:00:00Z").UnixMicro(), 10)
		hour := strconv.FormatInt(mustTime("2026-03-01T11:00:00Z").UnixMicro(), 10) // now + 1h, the most a timestamp may lie ahead
		for field, value := range map[string]string{
			"1":   ten,                    // valid
			"007": hour,                   // valid, non-canonical id, at the skew limit
			"3":   "garbage",              // rejected
			"4":   "-5",                   // rejected: before 1970
			"5":   "0",                    // rejected
			"6":   "253402300799999999",   // rejected: far future
			"8":   ten + ".5",             // rejected: not an integer
			"9":   " " + ten,              // rejected: spaces
			"10":  "1772362800000001",     // rejected: one µs past the skew limit
			"abc": ten,                    // rejected: not an id of an integer key
			"-2":  ten,                    // rejected: negative id for an unsigned key
			"11":  "99999999999999999999", // rejected: beyond int64
		} {
			must(t, h.r.Client.HSet(ctx, pendingKey(p, field), field, value).Err())
		}
		want[1] = "2026-03-01T10:00:00Z"
		want[7] = "2026-03-01T11:00:00Z"

		// Touches of users whose stored value is refused: the touch wins.
		for _, id := range []int{3, 6, 10, 11} {
			ok, err := p.TouchAt(ctx, id, mustTime("2026-03-01T09:45:00Z"))
			must(t, err)
			equal(t, "recorded", ok, true)
			want[id] = "2026-03-01T09:45:00Z"
		}
		res, err := p.Flush(ctx)
		must(t, err)
		equal(t, "drained", res.Drained, 12)
		equal(t, "written", res.Written, 6)
		equal(t, "rejected", res.Rejected, 6)
		checkFaultColumns(t, db, "after the flush", want)
		equal(t, "redis buffers left", len(h.pendingKeys()), 0)
	})
}
