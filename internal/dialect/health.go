package dialect

import "gorm.io/gorm"

// Health is what the catalog and statistics tell of the cost of writing a
// table's time column.
type Health struct {
	// Indexes are the table's indexes that include the column, as a key
	// column or (PostgreSQL) in an index expression or predicate, by name;
	// nil when there are none.
	Indexes []Index
	// HOT reports heap-only-tuple updates (PostgreSQL only); Updates,
	// HOTUpdates and FillFactor are read only then.
	HOT bool
	// Updates and HOTUpdates are pg_stat_user_tables' n_tup_upd and
	// n_tup_hot_upd for the table.
	Updates, HOTUpdates int64
	// FillFactor is the table's fillfactor in percent (pg_class.reloptions),
	// 100 when unset.
	FillFactor int
}

// Index is one index that includes the column.
type Index struct {
	Name       string `gorm:"column:name"`       // the index's name
	Definition string `gorm:"column:definition"` // its CREATE INDEX statement (PostgreSQL, SQLite), else ""
}

// Health reads the indexes of table that include column and, on
// PostgreSQL, the table's HOT counters and fillfactor: a few small catalog
// queries on db. A table PostgreSQL does not find wraps ErrNoTable; the
// error names the catalog that failed ("pg_index: ...").
func (d *Dialect) Health(db *gorm.DB, table, column string) (Health, error) {
	return d.health(db, table, column)
}
