package lastseen

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"gorm.io/gorm/clause"
	"gorm.io/gorm/schema"
)

// Encoding is how a time column stores an instant: as a timestamp, or as a
// whole number of seconds or milliseconds since the Unix epoch (UTC). The
// flush binds its values, the forward-only guard and the scopes compare, and
// the reads decode in the column's own encoding. See the README, "Column
// types", for the table of field types.
type Encoding int

const (
	// EncodingAuto (the default) learns the encoding from the field, first
	// match wins: a `lastseen:"time"`, `lastseen:"unix"` or
	// `lastseen:"unixmilli"` struct tag; time.Time or *time.Time: Time; a
	// driver.Valuer (sql.NullTime, a CustomTime): what its Value() returns
	// for a known instant (a time.Time or a string: Time; an int64: Unix
	// seconds or milliseconds, whichever equals the instant's); a named type
	// over time.Time: Time; an integer field tagged with GORM's
	// autoUpdateTime or autoCreateTime: its unit ("milli": milliseconds,
	// none: seconds). Anything else, an integer without a unit included, is
	// refused by Initialize (ErrInvalidConfig) with a message naming the
	// field and its type.
	EncodingAuto Encoding = iota
	// EncodingTime stores a timestamp: PostgreSQL timestamptz or timestamp,
	// MySQL/MariaDB DATETIME or TIMESTAMP, SQLite text (compared through
	// julianday). Naive columns (PostgreSQL timestamp, MySQL DATETIME) hold
	// the wall time in Config.ColumnLocation.
	EncodingTime
	// EncodingUnixSeconds stores whole seconds since 1970-01-01T00:00:00Z
	// in an integer column; instants are truncated to the second.
	EncodingUnixSeconds
	// EncodingUnixMillis stores whole milliseconds since the epoch in an
	// integer column (JavaScript's Date.now()); truncated to the millisecond.
	EncodingUnixMillis
)

// String returns "auto", "time", "unix" or "unixmilli", the values of the
// `lastseen` struct tag.
func (e Encoding) String() string {
	switch e {
	case EncodingAuto:
		return "auto"
	case EncodingTime:
		return "time"
	case EncodingUnixSeconds:
		return "unix"
	case EncodingUnixMillis:
		return "unixmilli"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// timeCodec is one resolved time column: its encoding, and, for a naive
// timestamp column, the location of its wall time.
type timeCodec struct {
	enc   Encoding // Time, UnixSeconds or UnixMillis
	field *schema.Field
	how   string // how the encoding was chosen, for messages
	// loc is Config.ColumnLocation: the location of a naive column's wall
	// times. nil leaves them to the driver, as a query of the app's own
	// does: pgx writes and reads PostgreSQL timestamp as UTC (the plugin
	// binds UTC times), go-sql-driver/mysql uses its DSN's loc (UTC unless
	// set).
	loc *time.Location
	// naiveSQL casts a wall-time literal to the dialect's naive timestamp
	// type (nil: the dialect has none, SQLite).
	naiveSQL func(wall string) clause.Expr
	// naive is set when the column is a timestamp without time zone: from
	// the catalog when the table is first found, until then the dialect's
	// default (MySQL: GORM creates DATETIME).
	naive atomic.Bool
}

// probeTime is the known instant a driver.Valuer is asked to encode: its
// Unix seconds (1,000,000,000) and milliseconds (1,000,000,000,123) differ.
var probeTime = time.Date(2001, 9, 9, 1, 46, 40, 123456789, time.UTC)

var valuerType = reflect.TypeOf((*driver.Valuer)(nil)).Elem()

// newTimeCodec resolves field's encoding: configured (not Auto) wins, then
// the rules of EncodingAuto. opt names the Config field for messages.
func newTimeCodec(s *schema.Schema, f *schema.Field, name string, configured Encoding, opt string, d *dialect, loc *time.Location) (*timeCodec, error) {
	c := &timeCodec{field: f, loc: loc}
	if d != nil && d.naiveCast != nil {
		c.naiveSQL = d.naiveCast
		c.naive.Store(d.naiveDefault)
	}
	if configured < EncodingAuto || configured > EncodingUnixMillis {
		return nil, fmt.Errorf("%s %q: encoding %v is not EncodingAuto, EncodingTime, EncodingUnixSeconds or EncodingUnixMillis", opt, name, configured)
	}
	enc, how, err := fieldEncoding(f, configured)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %s.%s is a %s: %v", opt, name, s.Name, f.Name, f.FieldType, err)
	}
	c.enc, c.how = enc, how
	return c, nil
}

// fieldEncoding applies the rules of EncodingAuto (or checks a configured
// encoding against the Go type) and says how it decided.
func fieldEncoding(f *schema.Field, configured Encoding) (Encoding, string, error) {
	base := f.FieldType
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	isValuer := base.Implements(valuerType) || reflect.PointerTo(base).Implements(valuerType)
	isInt := base.Kind() >= reflect.Int && base.Kind() <= reflect.Uint64 && base.Kind() != reflect.Uintptr
	isTime := base.ConvertibleTo(timeType)
	want := "want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, " +
		"or an int64 of Unix seconds or milliseconds (Config encoding or a `lastseen` tag)"
	if configured == EncodingAuto {
		if tag, ok := f.Tag.Lookup("lastseen"); ok {
			for e := EncodingTime; e <= EncodingUnixMillis; e++ {
				if tag == e.String() {
					configured = e
				}
			}
			if configured == EncodingAuto {
				return 0, "", fmt.Errorf("tag lastseen:%q, want \"time\", \"unix\" or \"unixmilli\"", tag)
			}
		}
	}
	switch {
	case configured == EncodingTime && (isTime || isValuer):
		return EncodingTime, "configured", nil
	case configured != EncodingAuto && configured != EncodingTime && (isInt && base.Size() == 8 || isValuer):
		return configured, "configured", nil
	case configured != EncodingAuto:
		return 0, "", fmt.Errorf("cannot hold encoding %v; %s", configured, want)
	case base == timeType:
		return EncodingTime, "time.Time", nil
	case isValuer:
		return probeValuer(base)
	case isTime:
		return EncodingTime, "named time type", nil
	case isInt && base.Size() == 8:
		switch max(f.AutoUpdateTime, f.AutoCreateTime) {
		case schema.UnixSecond:
			return EncodingUnixSeconds, "GORM tag autoUpdateTime", nil
		case schema.UnixMillisecond:
			return EncodingUnixMillis, "GORM tag autoUpdateTime:milli", nil
		case schema.UnixNanosecond:
			return 0, "", fmt.Errorf("GORM's autoUpdateTime:nano is not supported: an integer needs its unit" +
				": set the Config encoding (EncodingUnixSeconds or EncodingUnixMillis) or tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`")
		}
		return 0, "", fmt.Errorf("an integer needs its unit: set the Config encoding (EncodingUnixSeconds or EncodingUnixMillis) or tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`")
	}
	return 0, "", fmt.Errorf("%s", want)
}

// probeValuer learns a driver.Valuer's encoding: it builds a value holding
// probeTime (a conversion for a named time type, else its sql.Scanner given
// a time.Time) and looks at what Value() returns.
func probeValuer(base reflect.Type) (Encoding, string, error) {
	ptr := reflect.New(base)
	switch {
	case base.ConvertibleTo(timeType):
		ptr.Elem().Set(reflect.ValueOf(probeTime).Convert(base))
	case ptr.Type().Implements(scannerType):
		if err := ptr.Interface().(sql.Scanner).Scan(probeTime); err != nil {
			return 0, "", fmt.Errorf("a driver.Valuer whose Scan refuses a time.Time (%v): set the Config encoding", err)
		}
	default:
		return 0, "", fmt.Errorf("a driver.Valuer that is neither a named time type nor an sql.Scanner: set the Config encoding")
	}
	var v driver.Valuer
	if base.Implements(valuerType) {
		v = ptr.Elem().Interface().(driver.Valuer)
	} else {
		v = ptr.Interface().(driver.Valuer)
	}
	dv, err := v.Value()
	if err != nil {
		return 0, "", fmt.Errorf("its Value() failed for %s: %v", probeTime.Format(time.RFC3339Nano), err)
	}
	switch x := dv.(type) {
	case time.Time:
		return EncodingTime, "Value() returns a time.Time", nil
	case string, []byte:
		var ct columnTime
		if ct.Scan(x) == nil && ct.Time.Truncate(time.Millisecond).Equal(probeTime.Truncate(time.Millisecond)) {
			return EncodingTime, "Value() returns text", nil
		}
	case int64:
		switch x {
		case probeTime.Unix():
			return EncodingUnixSeconds, "Value() returns Unix seconds", nil
		case probeTime.UnixMilli():
			return EncodingUnixMillis, "Value() returns Unix milliseconds", nil
		}
	}
	return 0, "", fmt.Errorf("its Value() returns %T %v for %s, neither a time, Unix seconds (%d) nor milliseconds (%d): set the Config encoding",
		dv, dv, probeTime.Format(time.RFC3339Nano), probeTime.Unix(), probeTime.UnixMilli())
}

// integer reports an integer encoding.
func (c *timeCodec) integer() bool { return c.enc != EncodingTime }

// count is t as a whole number of the unit, truncated.
func (c *timeCodec) count(t time.Time) int64 {
	if c.enc == EncodingUnixSeconds {
		return t.Unix()
	}
	return t.UnixMilli()
}

// fromCount is the instant of n units.
func (c *timeCodec) fromCount(n int64) time.Time {
	if c.enc == EncodingUnixSeconds {
		return time.Unix(n, 0).UTC()
	}
	return time.UnixMilli(n).UTC()
}

// wallTime reports whether values are written, compared and read as wall
// times in loc: a naive column with ColumnLocation set.
func (c *timeCodec) wallTime() bool { return c.loc != nil && c.naiveSQL != nil && c.naive.Load() }

// wall is t's wall time in the column's location, for a naive column.
func (c *timeCodec) wall(t time.Time) string {
	return t.In(c.loc).Format("2006-01-02 15:04:05.999999")
}

// value is t as the column stores it, for a bound parameter: an int64 for
// an integer encoding, a cast wall-time literal for a naive timestamp
// column with ColumnLocation, else t in UTC (which the driver writes in
// its own location).
func (c *timeCodec) value(t time.Time) any {
	switch {
	case c.integer():
		return c.count(t)
	case c.wallTime():
		return c.naiveSQL(c.wall(t))
	}
	return t.UTC()
}

// bound is t as the right side of "column op t" for an integer encoding,
// rounded so that the comparison of whole units is exact: a column of n
// units is at or after t when n >= ceil(t), at or before t when n <= floor(t).
func (c *timeCodec) bound(t time.Time, op string) any {
	if !c.integer() {
		return c.value(t)
	}
	n := c.count(t)
	if (op == ">=" || op == "<") && !c.fromCount(n).Equal(t) {
		n++
	}
	return n
}

// text is t as PostgreSQL's array input reads it for the column's type.
func (c *timeCodec) text(t time.Time) string { return string(c.appendText(nil, t)) }

// appendText appends text(t) to b.
func (c *timeCodec) appendText(b []byte, t time.Time) []byte {
	switch {
	case c.integer():
		return strconv.AppendInt(b, c.count(t), 10)
	case c.wallTime():
		return t.In(c.loc).AppendFormat(b, "2006-01-02T15:04:05.999999")
	}
	return t.UTC().AppendFormat(b, "2006-01-02T15:04:05.999999Z07:00")
}

// decode reads a value the driver returned for the column: NULL is not
// valid; an integer encoding reads an integer (or its decimal text); a
// timestamp reads as columnTime does, a naive column's wall time in the
// column's location.
func (c *timeCodec) decode(v any) (time.Time, bool, error) {
	if v == nil {
		return time.Time{}, false, nil
	}
	if c.integer() {
		var n int64
		switch x := v.(type) {
		case int64:
			n = x
		case []byte, string:
			var err error
			if n, err = strconv.ParseInt(strings.TrimSpace(asString(x)), 10, 64); err != nil {
				return time.Time{}, false, fmt.Errorf("lastseen: cannot read %q as %v", truncate(asString(x)), c.enc)
			}
		default:
			return time.Time{}, false, fmt.Errorf("lastseen: cannot read a %T as %v", v, c.enc)
		}
		return c.fromCount(n), true, nil
	}
	var ct columnTime
	if err := ct.Scan(v); err != nil {
		return time.Time{}, false, err
	}
	t := ct.Time
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

// codecScan scans one column through its codec (sql.Scanner).
type codecScan struct {
	c     *timeCodec
	Time  time.Time
	Valid bool
}

// Scan implements sql.Scanner.
func (s *codecScan) Scan(v any) (err error) {
	s.Time, s.Valid, err = s.c.decode(v)
	return err
}

// fromGo reads the field's Go value (field.ValueOf): a time, a named time
// type, a driver.Valuer (its Value() decoded), or an integer of the unit.
// Zero times, NULLs and nil pointers are not valid.
func (c *timeCodec) fromGo(v any) (time.Time, bool) {
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
		t, valid, err := c.decode(dv)
		return t, valid && err == nil && !t.IsZero()
	}
	switch {
	case rv.Type().ConvertibleTo(timeType):
		t := rv.Convert(timeType).Interface().(time.Time)
		return t, !t.IsZero()
	case rv.CanInt() && c.integer():
		return c.fromCount(rv.Int()), rv.Int() != 0
	case rv.CanUint() && c.integer():
		return c.fromCount(int64(rv.Uint())), rv.Uint() != 0
	}
	return time.Time{}, false
}

// toGo is t as a value GORM's setter of the field takes (field.Set): an
// int64 for an integer encoding (a Scanner gets it in Scan), else a new
// *time.Time in UTC (set as a pointer, converted to a named time type, or
// given to a Scanner's Scan), so that no time another row points to is
// overwritten.
func (c *timeCodec) toGo(t time.Time) any {
	if c.integer() {
		return c.count(t)
	}
	u := t.UTC()
	return &u
}
