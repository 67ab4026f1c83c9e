// Package idcodec turns user ids into the canonical text the buffer stores
// (Codec.Normalize), and that text back into a value of the primary key's
// Go type for SQL (Codec.Parse). The key is an integer, a string, or a
// type implementing sql.Scanner such as a UUID.
package idcodec

import (
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/lastseen/lastseen/internal/clip"
	"gorm.io/gorm/schema"
)

// ErrInvalid is wrapped by every error Normalize returns: the id is not
// an integer, string or fmt.Stringer, is empty, zero, too long, or does
// not fit the key. Its text is "lastseen: invalid user id".
var ErrInvalid = errors.New("lastseen: invalid user id")

// errSpaces is Parse's error for an integer key's text with leading or
// trailing white space.
var errSpaces = errors.New("leading or trailing spaces are not allowed for an integer key")

// DefaultMaxLen is the longest id in bytes New's Codec accepts, 128,
// until MaxLen is set.
const DefaultMaxLen = 128

// Kind is how a primary key's values are written as text and read back.
type Kind int

const (
	// Signed is any signed integer kind, stored in decimal.
	Signed Kind = iota
	// Unsigned is any unsigned integer kind, stored in decimal.
	Unsigned
	// String is a string kind, stored as is.
	String
	// Scanner is a type that implements sql.Scanner (on its pointer), such
	// as uuid.UUID, stored as its driver.Valuer (or fmt.Stringer) writes it.
	Scanner
)

// Codec is the id codec of one primary key. Make it with New, then set
// Max, MaxLen and BadText where the database needs them before use; it is
// a value, safe for concurrent use once set.
type Codec struct {
	// Kind is the key's kind.
	Kind Kind
	// Type is the key's Go type, pointer removed.
	Type reflect.Type
	// Bits is an integer key's size in bits, for range checks.
	Bits int
	// Max is the largest unsigned key the database stores, if below the
	// type's range (0: no limit): a larger id is refused.
	Max uint64
	// MaxLen is the longest id once written as text, in bytes, or in
	// characters with Chars (DefaultMaxLen bytes unless set).
	MaxLen int
	// Chars makes MaxLen count characters, as a key column's declared
	// length (varchar(n)) does on PostgreSQL and MySQL.
	Chars bool
	// BadText reports why a String key column can never hold s ("" when
	// it can), so that such an id is refused; nil accepts every string.
	BadText func(s string) string
}

var scannerType = reflect.TypeOf((*sql.Scanner)(nil)).Elem()

// New returns the codec of primary key field pk, with MaxLen
// DefaultMaxLen, no Max and no BadText. A key that is neither an integer,
// a string nor an sql.Scanner is an error naming the field and its type.
func New(pk *schema.Field) (Codec, error) {
	t := pk.FieldType
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	c := Codec{Type: t, MaxLen: DefaultMaxLen}
	switch {
	case reflect.PointerTo(t).Implements(scannerType):
		c.Kind = Scanner
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		c.Kind, c.Bits = Signed, t.Bits()
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr:
		c.Kind, c.Bits = Unsigned, t.Bits()
	case t.Kind() == reflect.String:
		c.Kind = String
	default:
		return c, fmt.Errorf("primary key %s is a %s; want an integer, a string or a sql.Scanner such as a UUID type", pk.Name, pk.FieldType)
	}
	return c, nil
}

// Integer reports a Signed or Unsigned key.
func (c Codec) Integer() bool { return c.Kind == Signed || c.Kind == Unsigned }

// Normalize returns the canonical text of a user id: an integer in
// decimal, a string as is, a fmt.Stringer by its String method, each
// checked against the primary key's type ("007" is "7" for an integer
// key, a UUID is written as its Value method writes it). An integer key's
// text with leading or trailing white space (" 3", "3\n") is refused; a
// string key's is kept as is. For an integer
// key it also takes what JSON decoding gives apps (a JWT's "sub" or "uid"
// claim): a float64 or float32 holding a whole number of magnitude at most
// 2^53, and a json.Number ("42", "42.0" and "4.2e1" are user 42). The
// error wraps ErrInvalid and names the value's type.
func (c Codec) Normalize(id any) (string, error) {
	var s string
	switch v := id.(type) {
	case string:
		s = v
	case int:
		return c.fromInt(int64(v), id)
	case int64:
		return c.fromInt(v, id)
	case int32:
		return c.fromInt(int64(v), id)
	case uint:
		return c.fromUint(uint64(v), id)
	case uint64:
		return c.fromUint(v, id)
	case uint32:
		return c.fromUint(uint64(v), id)
	case float64:
		return c.fromFloat(v, id)
	case json.Number:
		return c.fromNumber(v, id)
	case nil:
		return "", fmt.Errorf("%w: nil", ErrInvalid)
	default:
		rv := reflect.ValueOf(id)
		switch {
		case rv.Kind() >= reflect.Int && rv.Kind() <= reflect.Int64:
			return c.fromInt(rv.Int(), id)
		case rv.Kind() >= reflect.Uint && rv.Kind() <= reflect.Uintptr:
			return c.fromUint(rv.Uint(), id)
		case rv.Kind() == reflect.Float32 || rv.Kind() == reflect.Float64:
			return c.fromFloat(rv.Float(), id)
		}
		if st, ok := id.(fmt.Stringer); ok {
			if rv.Kind() == reflect.Pointer && rv.IsNil() {
				return "", fmt.Errorf("%w: nil %T", ErrInvalid, id)
			}
			s = st.String()
		} else if rv.Kind() == reflect.String {
			s = rv.String()
		} else {
			return "", fmt.Errorf("%w: unsupported type %T (want an integer, a string or a fmt.Stringer)", ErrInvalid, id)
		}
	}
	return c.fromString(s, id)
}

// AppendKey appends to dst the canonical text of a primary-key value held
// in v (the key's own type, pointer removed, as a loaded row holds it) and
// reports true, or returns dst unchanged and false when v is no valid id;
// the text and the verdict are Normalize's for v.Interface(). It allocates
// nothing for integer and string keys, which is why the read overlay uses
// it for every loaded row; for a Scanner key, or a v whose kind is not the
// key's, it calls Normalize.
func (c Codec) AppendKey(dst []byte, v reflect.Value) ([]byte, bool) {
	k := v.Kind()
	switch {
	case c.Kind == Signed && k >= reflect.Int && k <= reflect.Int64:
		return c.AppendSigned(dst, v.Int())
	case c.Kind == Unsigned && k >= reflect.Uint && k <= reflect.Uintptr:
		return c.AppendUnsigned(dst, v.Uint())
	case c.Kind == String && k == reflect.String:
		return c.AppendString(dst, v.String())
	}
	uid, err := c.Normalize(v.Interface())
	if err != nil {
		return dst, false
	}
	return append(dst, uid...), true
}

// AppendSigned is AppendKey of a Signed key's value n.
func (c Codec) AppendSigned(dst []byte, n int64) ([]byte, bool) {
	if n == 0 {
		return dst, false
	}
	return c.appendDecimal(dst, strconv.AppendInt(dst, n, 10))
}

// AppendUnsigned is AppendKey of an Unsigned key's value n.
func (c Codec) AppendUnsigned(dst []byte, n uint64) ([]byte, bool) {
	if n == 0 || (c.Max > 0 && n > c.Max) {
		return dst, false
	}
	return c.appendDecimal(dst, strconv.AppendUint(dst, n, 10))
}

// appendDecimal keeps the decimal text that grew dst into out when it is
// at most MaxLen long (bytes and characters agree).
func (c Codec) appendDecimal(dst, out []byte) ([]byte, bool) {
	if len(out)-len(dst) > c.MaxLen {
		return dst, false
	}
	return out, true
}

// AppendString is AppendKey of a String key's value s.
func (c Codec) AppendString(dst []byte, s string) ([]byte, bool) {
	if c.stringErr(s) != nil {
		return dst, false
	}
	return append(dst, s...), true
}

func (c Codec) fromInt(n int64, id any) (string, error) {
	if n < 0 && c.Kind == Unsigned {
		return "", fmt.Errorf("%w: %T %d is negative but the primary key is unsigned", ErrInvalid, id, n)
	}
	return c.fromString(strconv.FormatInt(n, 10), id)
}

// MaxExactFloat is 2^53, the largest magnitude of a float id Normalize
// takes for an integer key: every integer up to it is exactly a float64
// (IEEE 754 binary64 has a 53-bit significand), beyond it a float64 may be
// a neighbouring integer rounded, so it names no id for sure.
const MaxExactFloat = 1 << 53

// fromFloat accepts a whole float of magnitude at most 2^53 for an integer
// key; a fractional, NaN, infinite or larger one, or a float for a string or
// UUID key, is ErrInvalid.
func (c Codec) fromFloat(f float64, id any) (string, error) {
	switch {
	case !c.Integer():
		return "", fmt.Errorf("%w: %T for a %s primary key (a number is accepted for an integer key only)", ErrInvalid, id, c.Type)
	case math.IsNaN(f) || math.IsInf(f, 0):
		return "", fmt.Errorf("%w: %T %v", ErrInvalid, id, f)
	case f != math.Trunc(f):
		return "", fmt.Errorf("%w: %T %v is not a whole number", ErrInvalid, id, f)
	case math.Abs(f) > MaxExactFloat:
		return "", fmt.Errorf("%w: %T %v is beyond 2^53, where a float64 does not hold every integer exactly", ErrInvalid, id, f)
	}
	return c.fromInt(int64(f), id)
}

// fromNumber reads a json.Number (encoding/json's Decoder.UseNumber): for
// an integer key its text as an integer, else as a float by fromFloat's
// rule; for a string or UUID key its text as is.
func (c Codec) fromNumber(n json.Number, id any) (string, error) {
	if !c.Integer() {
		return c.fromString(string(n), id)
	}
	if s, err := c.fromString(string(n), id); err == nil || errors.Is(err, errSpaces) {
		return s, err
	}
	f, err := n.Float64()
	if err != nil {
		return "", fmt.Errorf("%w: %T %q is not a number", ErrInvalid, id, clip.Text(string(n)))
	}
	return c.fromFloat(f, id)
}

func (c Codec) fromUint(n uint64, id any) (string, error) {
	return c.fromString(strconv.FormatUint(n, 10), id)
}

// length is s's length in MaxLen's unit, and the unit's name.
func (c Codec) length(s string) (int, string) {
	if c.Chars {
		return utf8.RuneCountInString(s), "characters"
	}
	return len(s), "bytes"
}

// fromString validates s against the primary key type and returns its
// canonical form.
func (c Codec) fromString(s string, id any) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty %T", ErrInvalid, id)
	}
	if n, unit := c.length(s); n > c.MaxLen {
		return "", fmt.Errorf("%w: %T of %d %s (at most %d)", ErrInvalid, id, n, unit, c.MaxLen)
	}
	v, err := c.Parse(s)
	if err != nil {
		return "", fmt.Errorf("%w: %T %q: %w", ErrInvalid, id, clip.Text(s), err)
	}
	switch c.Kind {
	case Signed:
		if v.(int64) == 0 {
			return "", fmt.Errorf("%w: %T is zero, which GORM treats as no primary key", ErrInvalid, id)
		}
		return strconv.FormatInt(v.(int64), 10), nil
	case Unsigned:
		if v.(uint64) == 0 {
			return "", fmt.Errorf("%w: %T is zero, which GORM treats as no primary key", ErrInvalid, id)
		}
		return strconv.FormatUint(v.(uint64), 10), nil
	case Scanner:
		return c.text(v)
	}
	return s, nil
}

// Parse turns stored text into the value bound for the primary key: an
// int64 (Signed), a uint64 (Unsigned), a string, or a value of the key's
// own Scanner type. Text that is empty, longer than MaxLen, out of the
// key's range (Bits, Max), refused by BadText or by the Scanner is an
// error saying why (not wrapping ErrInvalid). It never panics, whatever
// the text.
func (c Codec) Parse(s string) (any, error) {
	if n, unit := c.length(s); s == "" || n > c.MaxLen {
		return nil, fmt.Errorf("length %d, want 1 to %d %s", n, c.MaxLen, unit)
	}
	if c.Integer() && len(strings.TrimSpace(s)) != len(s) {
		return nil, errSpaces
	}
	switch c.Kind {
	case Signed:
		n, err := strconv.ParseInt(s, 10, c.Bits)
		if err != nil {
			return nil, fmt.Errorf("not a %d-bit integer", c.Bits)
		}
		return n, nil
	case Unsigned:
		n, err := strconv.ParseUint(strings.TrimPrefix(s, "+"), 10, c.Bits) // "+7" as ParseInt reads it
		if err != nil {
			return nil, fmt.Errorf("not an unsigned %d-bit integer", c.Bits)
		}
		if c.Max > 0 && n > c.Max {
			return nil, fmt.Errorf("over %d, the largest key the database stores", c.Max)
		}
		return n, nil
	case Scanner:
		v := reflect.New(c.Type)
		if err := v.Interface().(sql.Scanner).Scan(s); err != nil {
			return nil, err
		}
		return v.Elem().Interface(), nil
	}
	if err := c.stringErr(s); err != nil {
		return nil, err
	}
	return s, nil
}

// stringErr is why a String key can not be s (Parse's checks for that
// kind), or nil.
func (c Codec) stringErr(s string) error {
	if n, unit := c.length(s); s == "" || n > c.MaxLen {
		return fmt.Errorf("length %d, want 1 to %d %s", n, c.MaxLen, unit)
	}
	if c.BadText != nil {
		if why := c.BadText(s); why != "" {
			return errors.New(why)
		}
	}
	return nil
}

// text writes a Scanner-typed key as text through its driver.Valuer, so that
// two spellings of one UUID share one buffer entry.
func (c Codec) text(v any) (string, error) {
	if vr, ok := v.(driver.Valuer); ok {
		dv, err := vr.Value()
		if err != nil {
			return "", err
		}
		switch dv := dv.(type) {
		case string:
			return dv, nil
		case []byte:
			return string(dv), nil
		}
	}
	if st, ok := v.(fmt.Stringer); ok {
		return st.String(), nil
	}
	return fmt.Sprint(v), nil
}
