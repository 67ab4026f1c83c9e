package lastseen

import (
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// colClass is what a column's declared SQL type holds, as far as a time
// column goes (dialect.classify).
type colClass int

const (
	classAny     colClass = iota // SQLite column without a declared type: any value
	classZoned                   // an instant: PostgreSQL timestamptz, MySQL TIMESTAMP
	classNaive                   // a wall time: PostgreSQL timestamp, MySQL DATETIME
	classText                    // SQLite text, date or time types: a timestamp as text
	classInteger                 // an integer type
	classOther                   // anything else (date, numeric, real, varchar on PostgreSQL/MySQL)
)

// fits reports whether a column of class k can hold c's encoding.
func (c *timeCodec) fits(k colClass) bool {
	switch k {
	case classAny:
		return true
	case classZoned, classNaive, classText:
		return !c.integer()
	case classInteger:
		return c.integer()
	}
	return false
}

// describe is c's Go side for messages: "a models.CustomTime stored as
// unixmilli (Value() returns Unix milliseconds)".
func (c *timeCodec) describe() string {
	return fmt.Sprintf("a %s stored as %v (%s)", c.field.FieldType, c.enc, c.how)
}

// optCodec is one configured time column of a table: the Config field that
// names it, as configured, and its codec.
type optCodec struct {
	opt, name string
	c         *timeCodec
}

// checkColumnTypes reads the declared types of c's time columns from the
// catalog (GORM's Migrator: PostgreSQL information_schema.columns, MySQL
// information_schema.COLUMNS, SQLite's table definition) and checks each
// against its codec. It records whether each is naive and returns the
// first mismatch as a message naming the Config field, the Go type and the
// column type, or "" when all fit. A catalog it cannot read is not a
// mismatch: the flush's guard reports values it cannot compare.
func (p *Plugin) checkColumnTypes(db *gorm.DB, c tableCheck) string {
	cols, err := db.Migrator().ColumnTypes(c.model.table)
	if err != nil {
		return ""
	}
	for _, oc := range c.codecs {
		for _, col := range cols {
			if col.Name() != oc.c.field.DBName {
				continue
			}
			typ := strings.ToLower(col.DatabaseTypeName())
			k := p.dialect.classify(typ)
			if !oc.c.fits(k) {
				return fmt.Sprintf("Config.%s %q: %s.%s is %s, but column %s.%s is %s, which holds %s",
					oc.opt, oc.name, c.model.schema.Name, oc.c.field.Name, oc.c.describe(),
					c.model.table, col.Name(), strings.ToUpper(typ), k)
			}
			if oc.c.naiveSQL != nil {
				oc.c.naive.Store(k == classNaive)
			}
		}
	}
	return ""
}

// String says what a column of class k holds.
func (k colClass) String() string {
	switch k {
	case classAny:
		return "any value"
	case classZoned:
		return "timestamps with a time zone"
	case classNaive:
		return "timestamps without a time zone"
	case classText:
		return "timestamps as text"
	case classInteger:
		return "integers"
	}
	return "neither timestamps nor integers"
}

// classifyPostgres reads information_schema.columns.udt_name.
func classifyPostgres(typ string) colClass {
	switch typ {
	case "timestamptz":
		return classZoned
	case "timestamp":
		return classNaive
	case "int8", "int4", "int2":
		return classInteger
	}
	return classOther
}

// classifyMySQL reads information_schema.COLUMNS.DATA_TYPE.
func classifyMySQL(typ string) colClass {
	switch typ {
	case "timestamp":
		return classZoned
	case "datetime":
		return classNaive
	case "bigint", "int", "integer", "mediumint":
		return classInteger
	}
	return classOther
}

// classifySQLite follows SQLite's type affinity rules (the declared type
// containing "INT" is an integer; "REAL", "FLOA", "DOUB" and "BLOB" hold
// neither timestamps nor integers here; no type holds anything). Other
// names (DATETIME, TIMESTAMP, TEXT) take the text drivers write.
func classifySQLite(typ string) colClass {
	switch {
	case typ == "":
		return classAny
	case strings.Contains(typ, "int"):
		return classInteger
	case strings.Contains(typ, "real"), strings.Contains(typ, "floa"), strings.Contains(typ, "doub"), strings.Contains(typ, "blob"):
		return classOther
	}
	return classText
}
