package timecol

import "fmt"

// Class is what a column's declared SQL type holds, as far as a time
// column goes: a dialect classifies the type names of its catalog into
// these.
type Class int

const (
	// ClassAny is a SQLite column without a declared type: any value.
	ClassAny Class = iota
	// ClassZoned holds instants: PostgreSQL timestamptz, MySQL TIMESTAMP.
	ClassZoned
	// ClassNaive holds wall times: PostgreSQL timestamp, MySQL DATETIME.
	ClassNaive
	// ClassText is SQLite text, date or time types: a timestamp as text.
	ClassText
	// ClassInteger is an integer type.
	ClassInteger
	// ClassOther is anything else (numeric, real, varchar on PostgreSQL
	// and MySQL).
	ClassOther
	// ClassDate holds dates: PostgreSQL and MySQL date, SQLite a column
	// declared DATE (text "2006-01-02").
	ClassDate
)

// String says what a column of class k holds: "any value", "timestamps
// with a time zone", "timestamps without a time zone", "timestamps as
// text", "integers", "dates", else "neither timestamps nor integers".
func (k Class) String() string {
	switch k {
	case ClassAny:
		return "any value"
	case ClassZoned:
		return "timestamps with a time zone"
	case ClassNaive:
		return "timestamps without a time zone"
	case ClassText:
		return "timestamps as text"
	case ClassInteger:
		return "integers"
	case ClassDate:
		return "dates"
	}
	return "neither timestamps nor integers"
}

// Fits reports whether a column of class k can hold c's encoding: any
// value fits ClassAny, a timestamp fits the zoned, naive, text and date
// classes (a date holds its day), an integer encoding ClassInteger;
// nothing fits ClassOther.
func (c *Codec) Fits(k Class) bool {
	switch k {
	case ClassAny:
		return true
	case ClassZoned, ClassNaive, ClassText, ClassDate:
		return !c.Integer()
	case ClassInteger:
		return c.Integer()
	}
	return false
}

// SetClass records the class the catalog declares for the column: on a
// dialect with a naive timestamp type, the column is naive exactly when k
// is ClassNaive; a timestamp column is a date exactly when k is
// ClassDate.
func (c *Codec) SetClass(k Class) {
	if c.naiveSQL != nil {
		c.naive.Store(k == ClassNaive)
	}
	if !c.Integer() {
		c.date.Store(k == ClassDate)
	}
}

// Describe is c's Go side for messages: "a models.CustomTime stored as
// unixmilli (Value() returns Unix milliseconds)".
func (c *Codec) Describe() string {
	return fmt.Sprintf("a %s stored as %v (%s)", c.field.FieldType, c.enc, c.how)
}
