package lastseen

import (
	"reflect"
	"unsafe"

	"github.com/lastseen/lastseen/internal/idcodec"
)

// keyLayout is where a row of the tracked model holds its primary key when
// the read overlay can read it without reflection: a field of an integer
// or string kind at a fixed offset from the start of the struct (a field of
// the model, or of a struct embedded by value, such as gorm.Model). A query
// that loads a slice of the model's structs or pointers, or one struct,
// then costs the overlay a read and a decimal formatting per row, not a
// dozen reflect calls; every other shape (Joins, a key behind an embedded
// pointer, a pointer or Scanner key) goes the reflect way.
type keyLayout struct {
	ok     bool
	offset uintptr
	kind   reflect.Kind
}

// newKeyLayout finds the key's layout in typ from its GORM index path; ok
// is false when a step is an embedded pointer (a negative index) or the key
// is not of a kind codec reads as an integer or a string.
func newKeyLayout(typ reflect.Type, index []int, codec idcodec.Codec) keyLayout {
	var offset uintptr
	t := typ
	for _, i := range index {
		if i < 0 || t.Kind() != reflect.Struct {
			return keyLayout{}
		}
		f := t.Field(i)
		offset += f.Offset
		t = f.Type
	}
	k := t.Kind()
	switch {
	case codec.Kind == idcodec.Signed && k >= reflect.Int && k <= reflect.Int64,
		codec.Kind == idcodec.Unsigned && k >= reflect.Uint && k <= reflect.Uintptr,
		codec.Kind == idcodec.String && k == reflect.String:
		return keyLayout{ok: true, offset: offset, kind: k}
	}
	return keyLayout{}
}

// appendKey appends the canonical text of the key of the struct at row (a
// value of the model's type) to dst, or reports false when it is no valid
// id (codec.AppendKey's rules).
func (l keyLayout) appendKey(dst []byte, row unsafe.Pointer, codec idcodec.Codec) ([]byte, bool) {
	p := unsafe.Add(row, l.offset)
	switch l.kind {
	case reflect.Int:
		return codec.AppendSigned(dst, int64(*(*int)(p)))
	case reflect.Int8:
		return codec.AppendSigned(dst, int64(*(*int8)(p)))
	case reflect.Int16:
		return codec.AppendSigned(dst, int64(*(*int16)(p)))
	case reflect.Int32:
		return codec.AppendSigned(dst, int64(*(*int32)(p)))
	case reflect.Int64:
		return codec.AppendSigned(dst, *(*int64)(p))
	case reflect.Uint:
		return codec.AppendUnsigned(dst, uint64(*(*uint)(p)))
	case reflect.Uint8:
		return codec.AppendUnsigned(dst, uint64(*(*uint8)(p)))
	case reflect.Uint16:
		return codec.AppendUnsigned(dst, uint64(*(*uint16)(p)))
	case reflect.Uint32:
		return codec.AppendUnsigned(dst, uint64(*(*uint32)(p)))
	case reflect.Uint64:
		return codec.AppendUnsigned(dst, *(*uint64)(p))
	case reflect.Uintptr:
		return codec.AppendUnsigned(dst, uint64(*(*uintptr)(p)))
	case reflect.String:
		return codec.AppendString(dst, *(*string)(p))
	}
	return dst, false
}

// appendSliceIDs appends to s the ids of the rows of rv, a slice of the
// model's structs (typ) or of pointers to them, read by l: s.ends and s.of
// (the element's index) for each valid one. It reports false, having
// appended nothing, for any other value.
func (l keyLayout) appendSliceIDs(s *overlayScratch, rv reflect.Value, typ reflect.Type, codec idcodec.Codec) bool {
	if !l.ok || rv.Kind() != reflect.Slice {
		return false
	}
	elem, n := rv.Type().Elem(), rv.Len()
	var stride uintptr
	switch {
	case elem == typ:
		stride = typ.Size()
	case elem.Kind() == reflect.Pointer && elem.Elem() == typ:
		stride = unsafe.Sizeof(unsafe.Pointer(nil))
	default:
		return false
	}
	base := rv.UnsafePointer() // the first element
	for i := range n {
		row := unsafe.Add(base, uintptr(i)*stride)
		if elem != typ {
			if row = *(*unsafe.Pointer)(row); row == nil {
				continue
			}
		}
		var ok bool
		if s.text, ok = l.appendKey(s.text, row, codec); ok {
			s.ends = append(s.ends, len(s.text))
			s.of = append(s.of, i)
		}
	}
	return true
}
