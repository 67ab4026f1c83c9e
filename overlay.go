package lastseen

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	"github.com/lastseen/lastseen/internal/idcodec"
	"gorm.io/gorm"
)

// The read overlay (Config.Overlay): a GORM callback after gorm:query that
// puts the freshest buffered value into the last-seen field of the tracked
// model's rows a query loaded, where it is newer than the column. It reads
// the buffer once per query (Buffer.Newest: with Redis one round trip
// through the touch path's circuit breaker and TouchTimeout, then the
// in-process backlog); when Redis fails it leaves the column's values and
// logs a rate-limited warning. The query's result and error are never
// changed otherwise. It caches nothing: every query reads what the buffer
// holds at that moment. Its cost with nothing buffered for the rows is
// measured by the tests module's BenchmarkOverlayFind (docs/benchmarks.md).

// registerOverlay adds the overlay right after gorm:query on db's
// callbacks, before gorm:preload and so before gorm:after_query (a model's
// AfterFind sees the fresh value), at Initialize when Config.Overlay is
// set. It is named after the plugin ("lastseen:<model>.<field>:overlay"),
// so each tracked model on one db has its own.
func (p *Plugin) registerOverlay(db *gorm.DB) error {
	m := p.users.model
	p.reads.key = newKeyLayout(m.typ, m.pk.StructField.Index, p.users.ids)
	return db.Callback().Query().After("gorm:query").Before("gorm:preload").Register(p.name+":overlay", p.overlay)
}

// overlayReads is the overlay's state on the Plugin.
type overlayReads struct {
	key     keyLayout // where a row holds its key (overlay_keys.go)
	scratch sync.Pool // *overlayScratch between calls
}

// overlay is the callback. It works on db.Statement.ReflectValue: a struct
// of the tracked model, or a slice or array of them or of pointers to them,
// and the tracked model's rows loaded by Joins into such a result (rows
// loaded by Preload go through their own query, and so through the
// overlay); anything else (maps, a projection into another type) is left
// alone, as is a query that did not select the last-seen column.
func (p *Plugin) overlay(db *gorm.DB) {
	st, t := db.Statement, p.tracker
	if db.Error != nil || t == nil || st.Schema == nil {
		return
	}
	s, _ := p.reads.scratch.Get().(*overlayScratch)
	if s == nil {
		s = new(overlayScratch)
	}
	if p.collectIDs(st, s) {
		p.overlayOn(st.Context, s)
	}
	if s.reset() {
		p.reads.scratch.Put(s)
	}
}

// overlayScratch is what one overlay call works in, reused through
// overlayReads.scratch so that a query allocates no slice per row.
type overlayScratch struct {
	src  reflect.Value   // the loaded slice, when its rows are read in place
	rows []reflect.Value // else the loaded rows of the tracked model
	text []byte          // the rows' ids, one after the other
	ends []int           // where each id ends in text
	of   []int           // the index in src or rows of each id's row
	uids []string        // the ids, slices of one string
	at   []time.Time     // the buffered value of each id
}

// overlayScratchMax is the most rows a scratch keeps room for when it goes
// back to the pool: a rare huge query does not pin its slices.
const overlayScratchMax = 4096

// reset drops the scratch's references to rows and ids, and reports
// whether it is small enough to keep.
func (s *overlayScratch) reset() bool {
	s.src = reflect.Value{}
	clear(s.rows)
	clear(s.uids)
	s.rows, s.text, s.ends, s.of, s.uids = s.rows[:0], s.text[:0], s.ends[:0], s.of[:0], s.uids[:0]
	return cap(s.rows) <= overlayScratchMax && cap(s.of) <= overlayScratchMax && cap(s.uids) <= overlayScratchMax
}

// row returns the row of the j-th id.
func (s *overlayScratch) row(j int) reflect.Value {
	if s.src.IsValid() {
		return derefReflect(s.src.Index(s.of[j]))
	}
	return s.rows[s.of[j]]
}

// collectIDs writes into s the ids of the rows of the tracked model that
// the statement loaded with the last-seen column (its own result's, or
// those its Joins loaded), and reports whether there is any. A slice of
// the model's structs or pointers is read in place (keyLayout); other
// shapes through reflect.
func (p *Plugin) collectIDs(st *gorm.Statement, s *overlayScratch) bool {
	m := p.users.model
	if st.Schema.ModelType == m.typ {
		if !selects(st.Selects, st.Omits, m) {
			return false
		}
		rv := derefReflect(st.ReflectValue)
		if p.reads.key.appendSliceIDs(s, rv, m.typ, p.tracker.ids) {
			s.src = rv
			return len(s.of) > 0
		}
		s.rows = appendModelRows(s.rows, rv, m.typ)
	} else {
		s.rows = p.joinedRows(st, s.rows)
	}
	for i, row := range s.rows {
		var ok bool
		if s.text, ok = p.appendRowID(st.Context, s.text, row); ok {
			s.ends = append(s.ends, len(s.text))
			s.of = append(s.of, i)
		}
	}
	return len(s.of) > 0
}

// joinedRows appends to rows the rows of the tracked model that the
// statement's Joins loaded with the last-seen column.
func (p *Plugin) joinedRows(st *gorm.Statement, rows []reflect.Value) []reflect.Value {
	m := p.users.model
	for _, j := range st.Joins {
		rel := st.Schema.Relationships.Relations[j.Name]
		if rel == nil || rel.FieldSchema == nil || rel.FieldSchema.ModelType != m.typ || !selects(j.Selects, j.Omits, m) {
			continue
		}
		parents := len(rows)
		rows = appendModelRows(rows, st.ReflectValue, st.Schema.ModelType)
		n := parents
		for _, parent := range rows[parents:] {
			if v := derefReflect(rel.Field.ReflectValueOf(st.Context, parent)); v.Kind() == reflect.Struct && v.CanAddr() {
				rows[n] = v
				n++
			}
		}
		clear(rows[n:])
		rows = rows[:n]
	}
	return rows
}

// overlayOn puts the freshest buffered value into the last-seen field of
// the row of each id in s where it is newer than the column's: one read of
// the buffer for all of them, the ids written into one string.
func (p *Plugin) overlayOn(ctx context.Context, s *overlayScratch) {
	t := p.tracker
	text, start := string(s.text), 0
	for _, end := range s.ends {
		s.uids = append(s.uids, text[start:end])
		start = end
	}
	s.at = slices.Grow(s.at[:0], len(s.uids))[:len(s.uids)]
	if err := t.buf.Newest(ctx, s.uids, s.at, t.now(), true); err != nil {
		t.warn.Do(func() { p.log.Warn("lastseen: redis unreadable; the overlay leaves the column's values", "err", err) })
	}
	for j, at := range s.at {
		if !at.IsZero() {
			p.overlayRow(ctx, s.row(j), at)
		}
	}
}

// appendRowID appends the canonical text of row's primary key to dst
// (Normalize's, without boxing an integer or string key), or reports false
// when the row has no valid id. row is an addressable struct of the model.
func (p *Plugin) appendRowID(ctx context.Context, dst []byte, row reflect.Value) ([]byte, bool) {
	m, ids := p.users.model, p.tracker.ids
	switch {
	case p.reads.key.ok:
		return p.reads.key.appendKey(dst, row.Addr().UnsafePointer(), ids)
	case ids.Kind == idcodec.Scanner: // a UUID: through its own methods, as Touch takes it
		id, zero := m.pk.ValueOf(ctx, row)
		if zero {
			return dst, false
		}
		uid, err := ids.Normalize(derefValue(id))
		if err != nil {
			return dst, false
		}
		return append(dst, uid...), true
	}
	v := fieldValue(row, m.pk.StructField.Index)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if !v.IsValid() || v.Kind() == reflect.Pointer {
		return dst, false
	}
	return ids.AppendKey(dst, v)
}

// overlayRow puts at into row's last-seen field when it is newer than the
// column's value.
func (p *Plugin) overlayRow(ctx context.Context, row reflect.Value, at time.Time) {
	m := p.users.model
	cur, _ := m.time.ValueOf(ctx, row)
	if c, has := m.enc.FromGo(cur); has && !at.After(c) {
		return
	}
	_ = m.time.Set(ctx, row, m.enc.ToGo(at)) // GORM's setter converts, or calls the field's Scan
}

// fieldValue returns the field at GORM's index path in row (a negative
// step is an embedded pointer, -i-1), or the zero Value when a pointer on
// the way is nil. Unlike GORM's ReflectValueOf it never allocates a nil
// embedded struct.
func fieldValue(row reflect.Value, index []int) reflect.Value {
	v := row
	for _, i := range index {
		if i < 0 {
			i = -i - 1
		}
		if v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}
			}
			v = v.Elem()
		}
		v = v.Field(i)
	}
	return v
}

// selects reports whether a statement (or a join) with these Select and
// Omit lists loads the last-seen column: no Select at all, "*", or the
// field by Go or column name, and no Omit of it.
func selects(sel, omit []string, m *model) bool {
	named := func(list []string) bool {
		return slices.ContainsFunc(list, func(s string) bool { return s == m.time.Name || s == m.time.DBName || s == "*" })
	}
	if len(omit) > 0 && named(omit) {
		return false
	}
	return len(sel) == 0 || named(sel)
}

// appendModelRows appends to rows the addressable struct values of type
// typ in rv: rv itself, or the elements of a slice or array, through
// pointers.
func appendModelRows(rows []reflect.Value, rv reflect.Value, typ reflect.Type) []reflect.Value {
	rv = derefReflect(rv)
	switch rv.Kind() {
	case reflect.Struct:
		if rv.Type() == typ && rv.CanAddr() {
			rows = append(rows, rv)
		}
	case reflect.Slice, reflect.Array:
		n := rv.Len()
		for i := range n {
			if e := derefReflect(rv.Index(i)); e.Kind() == reflect.Struct && e.Type() == typ && e.CanAddr() {
				rows = append(rows, e)
			}
		}
	}
	return rows
}

func derefReflect(rv reflect.Value) reflect.Value {
	for rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface {
		if rv.IsNil() {
			return reflect.Value{}
		}
		rv = rv.Elem()
	}
	return rv
}

// derefValue returns what a non-nil pointer points to (a *uint64 primary
// key), or v.
func derefValue(v any) any {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer && !rv.IsNil() {
		if _, stringer := v.(interface{ String() string }); !stringer {
			return rv.Elem().Interface()
		}
	}
	return v
}
