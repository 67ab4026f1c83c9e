package dialect

import (
	"time"

	"github.com/lastseen/lastseen/internal/timecol"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
)

// Update runs the bulk UPDATE of a batch on db: the time column of each
// existing row whose key is ids[i] moves forward to ts[i] (a row is
// written when its column is NULL or older; never a row inserted), and
// returns the number of rows written. ids and ts have the same length,
// at most MaxBatch; ids hold int64 or uint64 for an integer key, else
// strings or the key's Scanner values, no two equal.
func (d *Dialect) Update(db *gorm.DB, t *Target, ids []any, ts []time.Time) (written int, err error) {
	tx := db.Exec("?", d.update(t, ids, ts))
	return int(tx.RowsAffected), tx.Error
}

// Upsert runs the batch as INSERT ... ON CONFLICT (MySQL: ON DUPLICATE KEY
// UPDATE) on db: a missing row is inserted with the key and the time
// column alone, an existing one moves forward as in Update; it returns the
// rows inserted or moved. On MySQL, which counts an update twice, it first
// counts the rows that exist (Count), so run it in a transaction for an
// exact count under concurrent writes.
func (d *Dialect) Upsert(db *gorm.DB, t *Target, ids []any, ts []time.Time) (written int, err error) {
	n, existing := len(ids), 0
	if d.upsertDoubleCounts {
		if existing, err = d.Count(db, t, ids); err != nil {
			return 0, err
		}
	}
	rows := make([]map[string]any, n)
	for i := range ids {
		rows[i] = map[string]any{t.PK: ids[i], t.Column: t.Codec.Value(ts[i])}
	}
	table := clause.Table{Name: t.Table}
	tx := db.Table("?", table).Clauses(clause.Insert{Table: table}, d.onConflict(t)).Create(&rows)
	if tx.Error != nil {
		return 0, tx.Error
	}
	written = int(tx.RowsAffected)
	if d.upsertDoubleCounts {
		// MySQL: 1 per inserted row, 2 per updated row, 0 per unchanged row.
		inserted := n - existing
		written = inserted + (written-inserted)/2
	}
	return written, nil
}

// Count returns how many of ids have a row in t's table, matching a
// string key exactly (ExactIn). On PostgreSQL an id too large for an
// integer key column matches nothing instead of failing the statement.
func (d *Dialect) Count(db *gorm.DB, t *Target, ids []any) (int, error) {
	var existing int64
	if d.count != nil {
		err := db.Raw("?", d.count(t, ids)).Scan(&existing).Error
		return int(existing), err
	}
	pk := clause.Column{Name: t.PK}
	q := db.Table("?", clause.Table{Name: t.Table}).Where(clause.IN{Column: pk, Values: ids})
	if exact, ok := d.ExactIn(pk, ids); ok && t.ExactKey { // only rows whose id is exactly one of ids
		q = q.Where(exact)
	}
	err := q.Count(&existing).Error
	return int(existing), err
}

// Uncomparable returns the query, on db, of the primary keys of the rows
// among ids whose time column holds a value Key cannot compare (not NULL,
// but its key is NULL): text in a Unix-time integer column, or an integer
// in a timestamp column. It is nil where columns cannot hold such values
// (every dialect but SQLite).
func (d *Dialect) Uncomparable(db *gorm.DB, t *Target, ids []any) *gorm.DB {
	if !d.anyValue {
		return nil
	}
	pk, col := clause.Column{Name: t.PK}, clause.Column{Name: t.Column}
	q := db.Table("?", clause.Table{Name: t.Table}).Select("?", pk).
		Where(clause.IN{Column: pk, Values: ids}).
		Where("? IS NOT NULL AND ? IS NULL", col, d.Key(t.Codec.Encoding(), col))
	if exact, ok := d.ExactIn(pk, ids); ok && !t.IntKey { // only rows whose id is exactly one of ids
		q = q.Where(exact)
	}
	return q
}

// standardOnConflict is PostgreSQL's and SQLite's ON CONFLICT (pk) DO UPDATE
// with the newer-only guard in its WHERE, compared through key (nil: plain).
func standardOnConflict(key func(enc timecol.Encoding, x any) clause.Expr) func(t *Target) clause.OnConflict {
	d := &Dialect{key: key}
	return func(t *Target) clause.OnConflict {
		cur := clause.Column{Table: t.Table, Name: t.Column}
		excluded := clause.Column{Table: "excluded", Name: t.Column}
		return clause.OnConflict{
			Columns:   []clause.Column{{Name: t.PK}},
			DoUpdates: clause.Set{{Column: clause.Column{Name: t.Column}, Value: excluded}},
			Where: clause.Where{Exprs: []clause.Expression{clause.Or(
				clause.Expr{SQL: "? IS NULL", Vars: []any{cur}},
				d.Compare(t.Codec.Encoding(), cur, "<", excluded),
			)}},
		}
	}
}
