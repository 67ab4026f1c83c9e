package lastseen

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

	"gorm.io/gorm/schema"
)

// idKind is how a primary key's values are written as text and read back.
type idKind int

const (
	idSigned   idKind = iota // any signed integer kind
	idUnsigned               // any unsigned integer kind
	idString                 // string kind
	idScanner                // a type that implements sql.Scanner, such as uuid.UUID
)

// idCodec turns user ids into the canonical text stored in Redis, and that
// text back into a value of the primary key's Go type for SQL.
type idCodec struct {
	kind idKind
	typ  reflect.Type // primary key's Go type, pointer removed
	bits int          // integer size, for range checks
	max  uint64       // largest unsigned key the dialect stores, if below the type's range (0: no limit)
	// maxLen is the longest id in bytes once written as text
	// (Config.MaxIDLength).
	maxLen int
	// badText reports why a string key cannot hold s (dialect.badText),
	// nil for other kinds of key.
	badText func(s string) string
}

var scannerType = reflect.TypeOf((*sql.Scanner)(nil)).Elem()

func newIDCodec(pk *schema.Field) (idCodec, error) {
	t := pk.FieldType
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	c := idCodec{typ: t, maxLen: defaultMaxIDLength}
	switch {
	case reflect.PointerTo(t).Implements(scannerType):
		c.kind = idScanner
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Int64:
		c.kind, c.bits = idSigned, t.Bits()
	case t.Kind() >= reflect.Uint && t.Kind() <= reflect.Uintptr:
		c.kind, c.bits = idUnsigned, t.Bits()
	case t.Kind() == reflect.String:
		c.kind = idString
	default:
		return c, fmt.Errorf("primary key %s is a %s; want an integer, a string or a sql.Scanner such as a UUID type", pk.Name, pk.FieldType)
	}
	return c, nil
}

// normalize returns the canonical text of a user id given to Touch: an
// integer in decimal, a string as is, a fmt.Stringer by its String method,
// each checked against the primary key's type. For an integer key it also
// takes what JSON decoding gives apps (a JWT's "sub" or "uid" claim): a
// float64 or float32 holding a whole number of magnitude at most 2^53, and
// a json.Number (fromFloat, fromNumber). The error wraps
// ErrInvalidUserID and names the value's type.
func (c idCodec) normalize(id any) (string, error) {
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
		return "", fmt.Errorf("%w: nil", ErrInvalidUserID)
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
				return "", fmt.Errorf("%w: nil %T", ErrInvalidUserID, id)
			}
			s = st.String()
		} else if rv.Kind() == reflect.String {
			s = rv.String()
		} else {
			return "", fmt.Errorf("%w: unsupported type %T (want an integer, a string or a fmt.Stringer)", ErrInvalidUserID, id)
		}
	}
	return c.fromString(s, id)
}

func (c idCodec) fromInt(n int64, id any) (string, error) {
	if n < 0 && c.kind == idUnsigned {
		return "", fmt.Errorf("%w: %T %d is negative but the primary key is unsigned", ErrInvalidUserID, id, n)
	}
	return c.fromString(strconv.FormatInt(n, 10), id)
}

// maxExactFloat is 2^53: every integer up to it in magnitude is exactly a
// float64 (IEEE 754 binary64 has a 53-bit significand), beyond it a float64
// may be a neighbouring integer rounded, so it names no id for sure.
const maxExactFloat = 1 << 53

// fromFloat accepts a whole float of magnitude at most 2^53 for an integer
// key; a fractional, NaN, infinite or larger one, or a float for a string or
// UUID key, is ErrInvalidUserID.
func (c idCodec) fromFloat(f float64, id any) (string, error) {
	switch {
	case c.kind != idSigned && c.kind != idUnsigned:
		return "", fmt.Errorf("%w: %T for a %s primary key (a number is accepted for an integer key only)", ErrInvalidUserID, id, c.typ)
	case math.IsNaN(f) || math.IsInf(f, 0):
		return "", fmt.Errorf("%w: %T %v", ErrInvalidUserID, id, f)
	case f != math.Trunc(f):
		return "", fmt.Errorf("%w: %T %v is not a whole number", ErrInvalidUserID, id, f)
	case math.Abs(f) > maxExactFloat:
		return "", fmt.Errorf("%w: %T %v is beyond 2^53, where a float64 does not hold every integer exactly", ErrInvalidUserID, id, f)
	}
	return c.fromInt(int64(f), id)
}

// fromNumber reads a json.Number (encoding/json's Decoder.UseNumber): for
// an integer key its text as an integer, else as a float by fromFloat's
// rule ("42", "42.0" and "4.2e1" are user 42); for a string or UUID key its
// text as is.
func (c idCodec) fromNumber(n json.Number, id any) (string, error) {
	if c.kind != idSigned && c.kind != idUnsigned {
		return c.fromString(string(n), id)
	}
	if s, err := c.fromString(string(n), id); err == nil {
		return s, nil
	}
	f, err := n.Float64()
	if err != nil {
		return "", fmt.Errorf("%w: %T %q is not a number", ErrInvalidUserID, id, truncate(string(n)))
	}
	return c.fromFloat(f, id)
}

func (c idCodec) fromUint(n uint64, id any) (string, error) {
	return c.fromString(strconv.FormatUint(n, 10), id)
}

// fromString validates s against the primary key type and returns its
// canonical form ("007" becomes "7" for an integer key, a UUID is written as
// its Value method writes it).
func (c idCodec) fromString(s string, id any) (string, error) {
	if s == "" {
		return "", fmt.Errorf("%w: empty %T", ErrInvalidUserID, id)
	}
	if len(s) > c.maxLen {
		return "", fmt.Errorf("%w: %T of %d bytes (at most %d)", ErrInvalidUserID, id, len(s), c.maxLen)
	}
	v, err := c.parse(s)
	if err != nil {
		return "", fmt.Errorf("%w: %T %q: %v", ErrInvalidUserID, id, truncate(s), err)
	}
	switch c.kind {
	case idSigned:
		if v.(int64) == 0 {
			return "", fmt.Errorf("%w: %T is zero, which GORM treats as no primary key", ErrInvalidUserID, id)
		}
		return strconv.FormatInt(v.(int64), 10), nil
	case idUnsigned:
		if v.(uint64) == 0 {
			return "", fmt.Errorf("%w: %T is zero, which GORM treats as no primary key", ErrInvalidUserID, id)
		}
		return strconv.FormatUint(v.(uint64), 10), nil
	case idScanner:
		return c.text(v)
	}
	return s, nil
}

// parse turns stored text into the value bound for the primary key: int64,
// uint64, string, or the key's own Scanner type. It never panics, whatever
// the text.
func (c idCodec) parse(s string) (any, error) {
	if s == "" || len(s) > c.maxLen {
		return nil, fmt.Errorf("length %d, want 1 to %d bytes", len(s), c.maxLen)
	}
	switch c.kind {
	case idSigned:
		n, err := strconv.ParseInt(strings.TrimSpace(s), 10, c.bits)
		if err != nil {
			return nil, fmt.Errorf("not a %d-bit integer", c.bits)
		}
		return n, nil
	case idUnsigned:
		n, err := strconv.ParseUint(strings.TrimPrefix(strings.TrimSpace(s), "+"), 10, c.bits) // "+7" as ParseInt reads it
		if err != nil {
			return nil, fmt.Errorf("not an unsigned %d-bit integer", c.bits)
		}
		if c.max > 0 && n > c.max {
			return nil, fmt.Errorf("over %d, the largest key the database stores", c.max)
		}
		return n, nil
	case idScanner:
		v := reflect.New(c.typ)
		if err := v.Interface().(sql.Scanner).Scan(s); err != nil {
			return nil, err
		}
		return v.Elem().Interface(), nil
	}
	if c.badText != nil {
		if why := c.badText(s); why != "" {
			return nil, errors.New(why)
		}
	}
	return s, nil
}

// text writes a Scanner-typed key as text through its driver.Valuer, so that
// two spellings of one UUID share one Redis entry.
func (c idCodec) text(v any) (string, error) {
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

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}
