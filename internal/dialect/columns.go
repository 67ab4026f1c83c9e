package dialect

import (
	"math"
	"strings"

	"gorm.io/gorm"
)

// Column is a column of a table as the catalog declares it.
type Column struct {
	// Name is the column's name.
	Name string
	// Type is its declared type as Classify reads it, in lower case:
	// PostgreSQL's udt_name ("timestamp", "int8", "varchar"), MySQL's
	// DATA_TYPE ("datetime", "varbinary"), SQLite's declared type.
	Type string
	// Length is its declared length (64 for varchar(64)), math.MaxInt64
	// for a string type of any length (PostgreSQL text and bytea), 0 for
	// none.
	Length int64
}

// Columns reads table's columns from the catalog, in their order.
// PostgreSQL reads
// information_schema.columns itself, for the table to_regclass finds (as
// the statements name it), through any database/sql driver: GORM's
// Migrator().ColumnTypes fails on PostgreSQL through a driver other than
// pgx given as postgres.Config.Conn (lib/pq, a wrapper without pgx's
// NamedValueChecker), as it passes pgx's query mode as an argument. MySQL
// and SQLite read them through GORM's Migrator().ColumnTypes.
func (d *Dialect) Columns(db *gorm.DB, table string) ([]Column, error) {
	if d.columns != nil {
		return d.columns(db, table)
	}
	cols, err := db.Migrator().ColumnTypes(table)
	if err != nil {
		return nil, err
	}
	out := make([]Column, len(cols))
	for i, c := range cols {
		out[i] = Column{Name: c.Name(), Type: strings.ToLower(c.DatabaseTypeName())}
		if n, ok := c.Length(); ok && n > 0 {
			out[i].Length = n
		}
	}
	return out, nil
}

// postgresColumns is Columns on PostgreSQL: udt_name (a domain's
// underlying type) and character_maximum_length, as GORM's Migrator reads
// them; text and bytea, which have none, hold any length (as pgx and
// lib/pq report their result columns' length).
func postgresColumns(db *gorm.DB, table string) ([]Column, error) {
	var rows []struct {
		Name   string `gorm:"column:name"` // columns named whatever db's NamingStrategy
		Type   string `gorm:"column:type"`
		Length int64  `gorm:"column:length"`
	}
	err := db.Raw(`SELECT c.column_name AS name, c.udt_name AS type, coalesce(c.character_maximum_length, 0) AS length
FROM information_schema.columns c
JOIN pg_namespace n ON n.nspname = c.table_schema JOIN pg_class r ON r.relnamespace = n.oid AND r.relname = c.table_name
WHERE r.oid = to_regclass(?) ORDER BY c.ordinal_position`, db.Statement.Quote(table)).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make([]Column, len(rows))
	for i, r := range rows {
		out[i] = Column{Name: r.Name, Type: strings.ToLower(r.Type), Length: r.Length}
		if out[i].Type == "text" || out[i].Type == "bytea" {
			out[i].Length = math.MaxInt64
		}
	}
	return out, nil
}
