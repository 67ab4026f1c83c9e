package dialect

import (
	"errors"
	"fmt"
	"reflect"
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
	return d.upsert(db, t, ids, ts, -1)
}

// upsert is Upsert given the number of ids that have a row, or -1 to count
// them where the dialect needs it (MySQL).
func (d *Dialect) upsert(db *gorm.DB, t *Target, ids []any, ts []time.Time, existing int) (written int, err error) {
	n := len(ids)
	if d.upsertDoubleCounts && existing < 0 {
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

// Prior is what a write that reads the previous values (UpdatePrior,
// UpsertPrior) found of one entry of its batch.
type Prior struct {
	// Found reports that the entry's row existed before the write.
	Found bool
	// Written reports that the write moved the row's column to the entry's
	// value: its guard held (the column was NULL or older), or the upsert
	// created the row.
	Written bool
	// Before is the column's value before the write (a written row) or the
	// value it kept (a row not written), decoded by the Target's codec, in
	// UTC; zero when NULL, when there is no row, or when the value cannot
	// be decoded (a value SQLite's guard cannot compare).
	Before time.Time
}

// UpdatePrior is Update that also returns, for each entry i of the batch,
// prior[i]: whether its row exists, whether it was written and the value
// its column held before. Run it in a transaction. PostgreSQL returns the
// previous values of the rows written from the UPDATE itself (a self-join
// on the key, RETURNING), and reads the others after it, only when some
// were not written; the previous value is then the statement snapshot's:
// a write of the same column by another transaction not yet committed
// when the statement started is not seen. MySQL reads the batch's rows
// first with the guard's verdict, SELECT ... FOR UPDATE. SQLite reads them
// first by key (its RETURNING cannot name the joined table), its
// transaction's snapshot keeping them as read, and the UPDATE returns the
// keys it wrote.
func (d *Dialect) UpdatePrior(db *gorm.DB, t *Target, ids []any, ts []time.Time) (prior []Prior, written int, err error) {
	switch {
	case d.returning != nil:
		return d.updateReturning(db, t, ids, ts)
	case d.returnsKeys:
		return d.updateReturningKeys(db, t, ids, ts)
	}
	if prior, err = d.ReadPrior(db, t, ids, ts, true); err != nil {
		return nil, 0, err
	}
	if _, err := d.Update(db, t, ids, ts); err != nil {
		return nil, 0, err
	}
	return prior, countWritten(prior), nil
}

// updateReturning is UpdatePrior in one statement (returning), then, when
// some entries were not written, a read of their rows.
func (d *Dialect) updateReturning(db *gorm.DB, t *Target, ids []any, ts []time.Time) (prior []Prior, written int, err error) {
	prior = make([]Prior, len(ids))
	err = scanPrior(db.Raw("?", d.returning(t, ids, ts)), t, ids, func(i int, before scanTime, _ bool) {
		prior[i] = Prior{Found: true, Written: true, Before: before.time()}
	})
	if err != nil {
		return nil, 0, err
	}
	written = countWritten(prior)
	if written == len(ids) {
		return prior, written, nil
	}
	var rest []int // the entries not written: their rows, if any, as they are
	for i, p := range prior {
		if !p.Written {
			rest = append(rest, i)
		}
	}
	restIDs, restTS := make([]any, len(rest)), make([]time.Time, len(rest))
	for j, i := range rest {
		restIDs[j], restTS[j] = ids[i], ts[i]
	}
	err = scanPrior(db.Raw("?", d.readPrior(t, restIDs, restTS, false)), t, restIDs, func(j int, before scanTime, _ bool) {
		prior[rest[j]] = Prior{Found: true, Before: before.time()}
	})
	if err != nil {
		return nil, 0, err
	}
	return prior, written, nil
}

// updateReturningKeys is UpdatePrior as two statements: a read of the
// batch's rows by key (one bound parameter per id; a row whose key only
// its collation folds onto an id is skipped, scanPrior matching keys
// exactly), then the UPDATE returning the keys of the rows it wrote.
func (d *Dialect) updateReturningKeys(db *gorm.DB, t *Target, ids []any, ts []time.Time) (prior []Prior, written int, err error) {
	pk, col := clause.Column{Name: t.PK}, clause.Column{Name: t.Column}
	prior = make([]Prior, len(ids))
	read := db.Table("?", clause.Table{Name: t.Table}).Select("?, ?", pk, col).Where(clause.IN{Column: pk, Values: ids})
	err = scanPrior(read, t, ids, func(i int, before scanTime, _ bool) {
		prior[i] = Prior{Found: true, Before: before.time()}
	})
	if err != nil {
		return nil, 0, err
	}
	err = scanPrior(db.Raw("? RETURNING ?", d.update(t, ids, ts), pk), t, ids, func(i int, _ scanTime, _ bool) {
		prior[i].Written = true
	})
	if err != nil {
		return nil, 0, err
	}
	return prior, countWritten(prior), nil
}

// UpsertPrior is Upsert that also returns, for each entry, prior[i] as
// UpdatePrior does: it reads the batch's rows first (ReadPrior, locked),
// then upserts; an entry without a row is written (inserted). Run it in a
// transaction.
func (d *Dialect) UpsertPrior(db *gorm.DB, t *Target, ids []any, ts []time.Time) (prior []Prior, written int, err error) {
	if prior, err = d.ReadPrior(db, t, ids, ts, true); err != nil {
		return nil, 0, err
	}
	existing := 0
	for i := range prior {
		if prior[i].Found {
			existing++
		} else {
			prior[i].Written = true
		}
	}
	if _, err := d.upsert(db, t, ids, ts, existing); err != nil {
		return nil, 0, err
	}
	return prior, countWritten(prior), nil
}

// ReadPrior reads the rows of the batch's ids, as UpdatePrior returns
// them, without writing: prior[i].Written reports that the forward-only
// guard holds for ts[i] (the column is NULL or older), which an Update
// in the same transaction then writes. With lock, the rows are locked
// until the transaction ends where the dialect has row locks (PostgreSQL
// FOR UPDATE OF t, MySQL FOR UPDATE); SQLite locks the whole database at
// the transaction's first write instead.
func (d *Dialect) ReadPrior(db *gorm.DB, t *Target, ids []any, ts []time.Time, lock bool) ([]Prior, error) {
	prior := make([]Prior, len(ids))
	err := scanPrior(db.Raw("?", d.readPrior(t, ids, ts, lock)), t, ids, func(i int, before scanTime, newer bool) {
		prior[i] = Prior{Found: true, Written: newer, Before: before.time()}
	})
	if err != nil {
		return nil, err
	}
	return prior, nil
}

func countWritten(prior []Prior) int {
	n := 0
	for _, p := range prior {
		if p.Written {
			n++
		}
	}
	return n
}

// selectPrior is the SELECT of readPrior from a dialect's pieces of its
// UPDATE: the batch's rows as v (from, which may name more than one
// table), the join of row t to them (on), the forward-only guard, and the
// locking clause (lock, "" for none):
//
//	SELECT t."id", t."last_seen_at", CASE WHEN <guard> THEN 1 ELSE 0 END
//	FROM "users" AS t, <from> WHERE <on><lock>
func selectPrior(t *Target, from, on, guard clause.Expr, lock string) clause.Expr {
	return clause.Expr{SQL: "SELECT t.?, t.?, CASE WHEN ? THEN 1 ELSE 0 END FROM ? AS t, ? WHERE ?" + lock, Vars: []any{
		clause.Column{Name: t.PK}, clause.Column{Name: t.Column}, guard, clause.Table{Name: t.Table}, from, on,
	}}
}

// scanTime reads a time column through its codec and keeps a value it
// cannot decode as not valid instead of failing the scan.
type scanTime struct {
	codec *timecol.Codec
	at    time.Time
	valid bool
}

// Scan implements sql.Scanner.
func (s *scanTime) Scan(v any) error {
	at, valid, err := s.codec.Decode(v)
	s.at, s.valid = at, valid && err == nil
	return nil
}

func (s scanTime) time() time.Time {
	if !s.valid {
		return time.Time{}
	}
	return s.at.UTC()
}

// scanPrior runs q, whose rows are (key, time column) or (key, time
// column, guard), and calls found with the index in ids of each row's
// key, the column's value and the guard. A key is scanned into the Go type
// of ids' values and found by value (by its text for a type Go cannot
// compare); rows of keys not in ids are skipped.
func scanPrior(q *gorm.DB, t *Target, ids []any, found func(i int, before scanTime, newer bool)) error {
	if len(ids) == 0 {
		return nil
	}
	keyType := reflect.TypeOf(ids[0])
	comparable := keyType.Comparable()
	keyOf := func(v any) any {
		if comparable {
			return v
		}
		return fmt.Sprint(v)
	}
	index := make(map[any]int, len(ids))
	for i, id := range ids {
		index[keyOf(id)] = i
	}
	rows, err := q.Rows()
	if err != nil {
		return err
	}
	if rows == nil { // GORM's prepared-statement mode when preparing failed
		return errors.New("the database returned no result")
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return err
	}
	for rows.Next() {
		key := reflect.New(keyType)
		before := scanTime{codec: t.Codec}
		var newer int64
		dest := []any{key.Interface(), &before, &newer}
		if err := rows.Scan(dest[:len(cols)]...); err != nil {
			return err
		}
		if i, ok := index[keyOf(key.Elem().Interface())]; ok {
			found(i, before, newer == 1)
		}
	}
	return rows.Err()
}
