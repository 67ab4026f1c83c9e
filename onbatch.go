package lastseen

import (
	"fmt"
	"reflect"
	"time"

	"gorm.io/gorm"
)

// Seen is one entry of a batch as Flush.OnBatch receives it. The write
// only moved the column forward: a row already as new, or an id without a
// row, was left unchanged.
type Seen struct {
	ID any       // the primary key as the key field's Go type (int64, string, uuid.UUID, ...)
	At time.Time // the timestamp written (UTC, microseconds)
}

// SeenIDs returns the batch's ids as T, the key field's Go type, for a
// `WHERE id IN ?` in an OnBatch hook; it panics when T is another type.
//
//	ids := lastseen.SeenIDs[int64](batch)
func SeenIDs[T any](batch []Seen) []T {
	ids := make([]T, len(batch))
	for i, s := range batch {
		ids[i] = s.ID.(T)
	}
	return ids
}

// withHook runs write, the batch's one bulk statement, and, when
// Config.OnBatch is set, runs both in one transaction with the hook after
// the statement: the hook's statements commit or roll back with the batch's
// timestamps.
//
// The bulk statement is raw SQL (UPDATE ... FROM or JOIN, or INSERT ... ON
// CONFLICT with a map): GORM's model hooks (BeforeSave, BeforeUpdate,
// AfterUpdate, AfterSave, BeforeCreate, AfterCreate) do not run for it,
// autoUpdateTime fields (UpdatedAt) are not set, and the soft-delete filter
// does not apply (a soft-deleted row's column moves too). OnBatch is the
// place for what such hooks would do.
func (p *Plugin) withHook(db *gorm.DB, batch []entry, write func(tx *gorm.DB) (batchResult, error)) (batchResult, error) {
	hook := p.cfg.OnBatch
	if hook == nil {
		return write(db)
	}
	var br batchResult
	err := db.Transaction(func(tx *gorm.DB) error {
		var err error
		if br, err = write(tx); err != nil {
			return err
		}
		if err := runHook(hook, tx.Session(&gorm.Session{NewDB: true}), p.seen(batch)); err != nil {
			return fmt.Errorf("%w: %w", ErrOnBatch, err)
		}
		return nil
	})
	if err != nil {
		return batchResult{}, err
	}
	return br, nil
}

// seen converts a batch for OnBatch, each id to the primary key field's Go
// type where the codec's type differs only in width or name (int64 to int,
// uint64 to uint, string to a named string type).
func (p *Plugin) seen(batch []entry) []Seen {
	ft := p.users.model.pk.FieldType
	if ft.Kind() == reflect.Pointer {
		ft = ft.Elem()
	}
	out := make([]Seen, len(batch))
	for i, e := range batch {
		out[i] = Seen{ID: convertID(e.id, ft), At: e.at}
	}
	return out
}

func convertID(id any, to reflect.Type) any {
	v := reflect.ValueOf(id)
	if !v.IsValid() || v.Type() == to || kindClass(v.Kind()) == 0 || kindClass(v.Kind()) != kindClass(to.Kind()) {
		return id
	}
	return v.Convert(to).Interface()
}

// kindClass groups the kinds a key converts between without changing its
// value: 1 integers, 2 strings; 0 anything else.
func kindClass(k reflect.Kind) int {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return 1
	case reflect.String:
		return 2
	}
	return 0
}

// runHook calls the app's OnBatch hook, turning a panic into an error so
// that the batch rolls back and stays buffered: the hook runs on one of the
// flush's own goroutines, where the app cannot recover it.
func runHook(hook func(*gorm.DB, []Seen) error, tx *gorm.DB, batch []Seen) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return hook(tx, batch)
}
