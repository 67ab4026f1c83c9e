// Package timecol is how a time column (a last-seen or an expiry column)
// stores an instant: its Encoding (a timestamp, or whole Unix seconds or
// milliseconds in an integer column), the Codec that binds, compares,
// decodes and converts its values, the Class of a declared column type,
// and NullTime, the scanner of a timestamp as every dialect returns it.
package timecol

import (
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"time"

	"gorm.io/gorm/schema"
)

// Encoding is how a time column stores an instant: as a timestamp, or as a
// whole number of seconds or milliseconds since the Unix epoch (UTC).
type Encoding int

const (
	// Auto learns the encoding from the field (FieldEncoding), first match
	// wins: a `lastseen:"time"`, `lastseen:"unix"` or
	// `lastseen:"unixmilli"` struct tag; time.Time or *time.Time: Time; a
	// driver.Valuer (sql.NullTime, a CustomTime): what its Value() returns
	// for a known instant (a time.Time or a string: Time; an int64: Unix
	// seconds or milliseconds, whichever equals the instant's); a named type
	// over time.Time: Time; an integer field tagged with GORM's
	// autoUpdateTime or autoCreateTime: its unit ("milli": milliseconds,
	// none: seconds). Anything else, an integer without a unit included, is
	// an error naming the field's type.
	Auto Encoding = iota
	// Time stores a timestamp: PostgreSQL timestamptz or timestamp,
	// MySQL/MariaDB DATETIME or TIMESTAMP, SQLite text (compared through
	// julianday). Naive columns (PostgreSQL timestamp, MySQL DATETIME)
	// hold the wall time in the Codec's location.
	Time
	// UnixSeconds stores whole seconds since 1970-01-01T00:00:00Z in an
	// integer column; instants are truncated to the second.
	UnixSeconds
	// UnixMillis stores whole milliseconds since the epoch in an integer
	// column (JavaScript's Date.now()); truncated to the millisecond.
	UnixMillis
)

// String returns "auto", "time", "unix" or "unixmilli", the values of the
// `lastseen` struct tag, and "Encoding(n)" for any other n.
func (e Encoding) String() string {
	switch e {
	case Auto:
		return "auto"
	case Time:
		return "time"
	case UnixSeconds:
		return "unix"
	case UnixMillis:
		return "unixmilli"
	}
	return fmt.Sprintf("Encoding(%d)", int(e))
}

// probeTime is the known instant a driver.Valuer is asked to encode: its
// Unix seconds (1,000,000,000) and milliseconds (1,000,000,000,123) differ.
var probeTime = time.Date(2001, 9, 9, 1, 46, 40, 123456789, time.UTC)

var (
	timeType    = reflect.TypeOf(time.Time{})
	valuerType  = reflect.TypeOf((*driver.Valuer)(nil)).Elem()
	scannerType = reflect.TypeOf((*sql.Scanner)(nil)).Elem()
)

// FieldEncoding is the encoding of field f: configured when it is not Auto
// (checked against the field's Go type), else the one the rules of Auto
// learn. how says how it was chosen, for messages: "configured",
// "time.Time", "named time type", "GORM tag autoUpdateTime",
// "GORM tag autoUpdateTime:milli" or "Value() returns ...". The error says
// why the field cannot be read as a time (an integer without a unit, a
// tag other than the three encodings, a type that is not a time).
func FieldEncoding(f *schema.Field, configured Encoding) (enc Encoding, how string, err error) {
	base := f.FieldType
	for base.Kind() == reflect.Pointer {
		base = base.Elem()
	}
	isValuer := base.Implements(valuerType) || reflect.PointerTo(base).Implements(valuerType)
	isInt := base.Kind() >= reflect.Int && base.Kind() <= reflect.Uint64 && base.Kind() != reflect.Uintptr
	isTime := base.ConvertibleTo(timeType)
	want := "want time.Time, *time.Time, sql.NullTime, a named type over time.Time, a driver.Valuer over a time, " +
		"or an int64 of Unix seconds or milliseconds (a `lastseen` tag)"
	if configured == Auto {
		if tag, ok := f.Tag.Lookup("lastseen"); ok {
			for e := Time; e <= UnixMillis; e++ {
				if tag == e.String() {
					configured = e
				}
			}
			if configured == Auto {
				return 0, "", fmt.Errorf("tag lastseen:%q, want \"time\", \"unix\" or \"unixmilli\"", tag)
			}
		}
	}
	switch {
	case configured == Time && (isTime || isValuer):
		return Time, "configured", nil
	case configured != Auto && configured != Time && (isInt && base.Size() == 8 || isValuer):
		return configured, "configured", nil
	case configured != Auto:
		return 0, "", fmt.Errorf("cannot hold encoding %v; %s", configured, want)
	case base == timeType:
		return Time, "time.Time", nil
	case isValuer:
		return probeValuer(base)
	case isTime:
		return Time, "named time type", nil
	case isInt && base.Size() == 8:
		switch max(f.AutoUpdateTime, f.AutoCreateTime) {
		case schema.UnixSecond:
			return UnixSeconds, "GORM tag autoUpdateTime", nil
		case schema.UnixMillisecond:
			return UnixMillis, "GORM tag autoUpdateTime:milli", nil
		case schema.UnixNanosecond:
			return 0, "", fmt.Errorf("GORM's autoUpdateTime:nano is not supported: an integer needs its unit" +
				": tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`")
		}
		return 0, "", fmt.Errorf("an integer needs its unit: tag it `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`")
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
			return 0, "", fmt.Errorf("a driver.Valuer whose Scan refuses a time.Time (%v): tag the field `lastseen:\"time\"`, `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`", err)
		}
	default:
		return 0, "", fmt.Errorf("a driver.Valuer that is neither a named time type nor an sql.Scanner: tag the field `lastseen:\"time\"`, `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`")
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
		return Time, "Value() returns a time.Time", nil
	case string, []byte:
		var nt NullTime
		if nt.Scan(x) == nil && nt.Time.Truncate(time.Millisecond).Equal(probeTime.Truncate(time.Millisecond)) {
			return Time, "Value() returns text", nil
		}
	case int64:
		switch x {
		case probeTime.Unix():
			return UnixSeconds, "Value() returns Unix seconds", nil
		case probeTime.UnixMilli():
			return UnixMillis, "Value() returns Unix milliseconds", nil
		}
	}
	return 0, "", fmt.Errorf("its Value() returns %T %v for %s, neither a time, Unix seconds (%d) nor milliseconds (%d): tag the field `lastseen:\"time\"`, `lastseen:\"unix\"` or `lastseen:\"unixmilli\"`",
		dv, dv, probeTime.Format(time.RFC3339Nano), probeTime.Unix(), probeTime.UnixMilli())
}
