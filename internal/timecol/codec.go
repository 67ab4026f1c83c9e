package timecol

import (
	"database/sql/driver"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/clip"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// Naive is a dialect's timestamp type without time zone, as a Codec needs
// it. The zero value is a dialect without one (SQLite).
type Naive struct {
	// Cast casts a wall-time literal ("2006-01-02 15:04:05.999999") to the
	// naive type, so that the driver's own location never shifts it: for
	// example CAST(? AS timestamp). nil: the dialect has no naive type.
	Cast func(wall string) clause.Expr
	// Default is whether a time column is taken for naive until its
	// declared type was read from the catalog (SetClass): true on MySQL,
	// where GORM creates DATETIME.
	Default bool
}

// Codec is one resolved time column: its field, its Encoding, and, for a
// naive timestamp column, the location of its wall times. Make it with
// New; it is safe for concurrent use (SetClass may run while others read).
type Codec struct {
	enc   Encoding // Time, UnixSeconds or UnixMillis
	field *schema.Field
	how   string // how the encoding was chosen, for messages
	// loc is the location of a naive column's wall times. nil leaves
	// them to the driver, as a query of the app's own does: pgx writes and
	// reads PostgreSQL timestamp as UTC (the codec binds UTC times),
	// go-sql-driver/mysql uses its DSN's loc (UTC unless set).
	loc *time.Location
	// naiveSQL is Naive.Cast (nil: the dialect has no naive type).
	naiveSQL func(wall string) clause.Expr
	// naive is set when the column is a timestamp without time zone: from
	// the catalog (SetClass), until then Naive.Default.
	naive atomic.Bool
}

// New resolves field f of s (named name in the option opt, both for
// messages) to a Codec: its encoding by FieldEncoding, given configured
// (Auto: learned from the field), naive the dialect's naive timestamp
// type, loc the location of a naive column's wall times (nil: the
// driver's). The error, `<opt> "<name>": <Schema>.<Field> is a <type>:
// <why>`, names a configured value outside Auto..UnixMillis or a field
// FieldEncoding refuses.
func New(s *schema.Schema, f *schema.Field, name string, configured Encoding, opt string, naive Naive, loc *time.Location) (*Codec, error) {
	c := &Codec{field: f, loc: loc}
	if naive.Cast != nil {
		c.naiveSQL = naive.Cast
		c.naive.Store(naive.Default)
	}
	if configured < Auto || configured > UnixMillis {
		return nil, fmt.Errorf("%s %q: encoding %v is not EncodingAuto, EncodingTime, EncodingUnixSeconds or EncodingUnixMillis", opt, name, configured)
	}
	enc, how, err := FieldEncoding(f, configured)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %s.%s is a %s: %v", opt, name, s.Name, f.Name, f.FieldType, err)
	}
	c.enc, c.how = enc, how
	return c, nil
}

// Encoding is the column's encoding: Time, UnixSeconds or UnixMillis.
func (c *Codec) Encoding() Encoding { return c.enc }

// Field is the model's field of the column.
func (c *Codec) Field() *schema.Field { return c.field }

// Naive reports whether the column is taken for a timestamp without time
// zone: as the catalog said (SetClass), else the dialect's Naive.Default.
func (c *Codec) Naive() bool { return c.naive.Load() }

// Location is the location given for a naive column's wall times (nil:
// the driver's), whether or not the column is naive.
func (c *Codec) Location() *time.Location { return c.loc }

// Integer reports an integer encoding (UnixSeconds or UnixMillis).
func (c *Codec) Integer() bool { return c.enc != Time }

// count is t as a whole number of the unit, truncated.
func (c *Codec) count(t time.Time) int64 {
	if c.enc == UnixSeconds {
		return t.Unix()
	}
	return t.UnixMilli()
}

// fromCount is the instant of n units.
func (c *Codec) fromCount(n int64) time.Time {
	if c.enc == UnixSeconds {
		return time.Unix(n, 0).UTC()
	}
	return time.UnixMilli(n).UTC()
}

// wallTime reports whether values are written, compared and read as wall
// times in loc: a naive column with a location set.
func (c *Codec) wallTime() bool { return c.loc != nil && c.naiveSQL != nil && c.naive.Load() }

// Value is t as the column stores it, for a bound parameter: an int64 of
// the unit (truncated) for an integer encoding, the dialect's cast of the
// wall time in the location (microseconds) for a naive timestamp column
// with a location, else t in UTC (which the driver writes in its own
// location).
func (c *Codec) Value(t time.Time) any {
	switch {
	case c.Integer():
		return c.count(t)
	case c.wallTime():
		return c.naiveSQL(t.In(c.loc).Format("2006-01-02 15:04:05.999999"))
	}
	return t.UTC()
}

// Bound is t as the right side of "column op t" (op "<", "<=", ">=" or
// ">"): for an integer encoding rounded so that the comparison of whole
// units is exact (a column of n units is at or after t when n >= ceil(t),
// at or before t when n <= floor(t)); else Value(t).
func (c *Codec) Bound(t time.Time, op string) any {
	if !c.Integer() {
		return c.Value(t)
	}
	n := c.count(t)
	if (op == ">=" || op == "<") && !c.fromCount(n).Equal(t) {
		n++
	}
	return n
}

// AppendText appends t as PostgreSQL's array input reads it for the
// column's type, and returns the extended buffer: the decimal count of the
// unit for an integer encoding; the wall time in the location,
// "2006-01-02T15:04:05.999999", for a naive column with a location; else
// the instant in UTC with microseconds, "2006-01-02T15:04:05.999999Z". The
// text holds no quote or backslash.
func (c *Codec) AppendText(b []byte, t time.Time) []byte {
	switch {
	case c.Integer():
		return strconv.AppendInt(b, c.count(t), 10)
	case c.wallTime():
		return t.In(c.loc).AppendFormat(b, "2006-01-02T15:04:05.999999")
	}
	return t.UTC().AppendFormat(b, "2006-01-02T15:04:05.999999Z07:00")
}

// Decode reads a value the driver returned for the column, as an instant
// in UTC: NULL is not valid; an integer encoding reads an int64 (or its
// decimal text); a timestamp reads as NullTime does, a naive column's wall
// time in the location. The error, "lastseen: cannot read ...", quotes at
// most 40 bytes of the value.
func (c *Codec) Decode(v any) (t time.Time, valid bool, err error) {
	if v == nil {
		return time.Time{}, false, nil
	}
	if c.Integer() {
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case []byte, string:
			var err error
			if n, err = strconv.ParseInt(strings.TrimSpace(asString(x)), 10, 64); err != nil {
				return time.Time{}, false, fmt.Errorf("lastseen: cannot read %q as %v", clip.Text(asString(x)), c.enc)
			}
		default:
			return time.Time{}, false, fmt.Errorf("lastseen: cannot read a %T as %v", v, c.enc)
		}
		return c.fromCount(n), true, nil
	}
	var nt NullTime
	if err := nt.Scan(v); err != nil {
		return time.Time{}, false, err
	}
	t = nt.Time
	if c.wallTime() {
		t = time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), c.loc)
	}
	return t.UTC(), true, nil
}

func asString(v any) string {
	if b, ok := v.([]byte); ok {
		return string(b)
	}
	s, _ := v.(string)
	return s
}

// FromGo reads the field's Go value (GORM's field.ValueOf): a time, a
// named time type, a driver.Valuer (its Value() decoded), or an integer of
// the unit. Zero times, NULLs, nil pointers and values it cannot read are
// not valid.
func (c *Codec) FromGo(v any) (t time.Time, valid bool) {
	rv := reflect.ValueOf(v)
	for rv.IsValid() && rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return time.Time{}, false
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return time.Time{}, false
	}
	vr, ok := rv.Interface().(driver.Valuer)
	if !ok && rv.CanAddr() {
		vr, ok = rv.Addr().Interface().(driver.Valuer)
	}
	if ok {
		dv, err := vr.Value()
		if err != nil {
			return time.Time{}, false
		}
		t, valid, err := c.Decode(dv)
		return t, valid && err == nil && !t.IsZero()
	}
	switch {
	case rv.Type().ConvertibleTo(timeType):
		t := rv.Convert(timeType).Interface().(time.Time)
		return t, !t.IsZero()
	case rv.CanInt() && c.Integer():
		return c.fromCount(rv.Int()), rv.Int() != 0
	case rv.CanUint() && c.Integer():
		return c.fromCount(int64(rv.Uint())), rv.Uint() != 0
	}
	return time.Time{}, false
}

// ToGo is t as a value GORM's setter of the field takes (field.Set): an
// int64 of the unit for an integer encoding (a Scanner gets it in Scan),
// else a new *time.Time in UTC (set as a pointer, converted to a named
// time type, or given to a Scanner's Scan), so that no time another row
// points to is overwritten.
func (c *Codec) ToGo(t time.Time) any {
	if c.Integer() {
		return c.count(t)
	}
	u := t.UTC()
	return &u
}

// Scan is an sql.Scanner of one column through its Codec: set Codec,
// scan, then read Time (in UTC) and Valid (false for NULL).
type Scan struct {
	Codec *Codec
	Time  time.Time
	Valid bool
}

// Scan implements sql.Scanner by Codec.Decode.
func (s *Scan) Scan(v any) (err error) {
	s.Time, s.Valid, err = s.Codec.Decode(v)
	return err
}
