package lastseen

import (
	"fmt"
	"reflect"

	"github.com/lastseen/lastseen/internal/clip"
	"github.com/lastseen/lastseen/internal/dialect"
	"gorm.io/gorm"
)

// A comparison that cannot be made is never "stale". Where a column may hold
// values the forward-only guard cannot compare (Dialect.Uncomparable:
// SQLite, where an INTEGER column can hold text and a DATETIME column an
// integer), the guard's key is NULL for them, so the row is neither written
// nor older. After a batch that left rows unwritten, the flush asks for
// those rows of the batch ("column IS NOT NULL AND key(column) IS NULL"):
// their entries are not Stale but Uncomparable, go back to pending like a
// refused entry, and the flush returns ErrUncomparable naming the column,
// the encoding and the first id. Initialize refuses a declared column type
// that does not fit the field (checkColumnTypes); this catches the values.

// findUncomparable returns the batch's ids (as their canonical text, the
// entries' fields) whose row holds a value the guard cannot compare; nil
// when the dialect's columns cannot hold one.
func (p *Plugin) findUncomparable(db *gorm.DB, t *dialect.Target, ids []any) ([]string, error) {
	q := p.dialect.Uncomparable(db, t, ids)
	if q == nil {
		return nil, nil
	}
	codec := p.users.ids
	rows, err := q.Rows()
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		id := reflect.New(codec.Type)
		if err := rows.Scan(id.Interface()); err != nil {
			return nil, err
		}
		if uid, err := codec.Normalize(id.Elem().Interface()); err == nil {
			out = append(out, uid)
		}
	}
	return out, rows.Err()
}

// uncomparableError is the error of one entry whose row's value cannot be
// compared.
func (p *Plugin) uncomparableError(field string) error {
	m := p.users.model
	what := "an integer"
	if !m.enc.Integer() {
		what = "a timestamp SQLite's julianday reads"
	}
	return fmt.Errorf("%w: %s.%s of id %s is not %s (Field encoding %v); the entry stays pending",
		ErrUncomparable, m.table, m.time.DBName, clip.Text(field), what, m.enc.Encoding())
}

// takeUncomparable moves the entries of batch whose fields are in
// uncomparable out of the written ones, as refusals with their error.
func (p *Plugin) takeUncomparable(batch []entry, uncomparable []string) []refusal {
	if len(uncomparable) == 0 {
		return nil
	}
	set := make(map[string]struct{}, len(uncomparable))
	for _, f := range uncomparable {
		set[f] = struct{}{}
	}
	var out []refusal
	for _, e := range batch {
		if _, ok := set[e.field]; ok {
			out = append(out, refusal{e, p.uncomparableError(e.field)})
		}
	}
	return out
}
