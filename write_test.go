package lastseen

import (
	"fmt"
	"reflect"
	"testing"
)

// TestSeenIDsHaveKeyType: OnBatch gets ids of the primary key field's Go
// type where the codec's differs only in width or name.
func TestSeenIDsHaveKeyType(t *testing.T) {
	type named string
	for _, c := range []struct {
		id   any
		to   reflect.Type
		want string
	}{
		{int64(7), reflect.TypeOf(int(0)), "int 7"},
		{uint64(7), reflect.TypeOf(uint(0)), "uint 7"},
		{int64(7), reflect.TypeOf(int32(0)), "int32 7"},
		{"ab", reflect.TypeOf(named("")), "lastseen.named ab"},
		{int64(7), reflect.TypeOf(""), "int64 7"}, // never an integer to a rune string
		{"ab", reflect.TypeOf("ab"), "string ab"},
	} {
		got := convertID(c.id, c.to)
		equal(t, fmt.Sprintf("%T to %v", c.id, c.to), fmt.Sprintf("%T %v", got, got), c.want)
	}
}

// TestSeenIDsTyped: SeenIDs returns the ids as the key field's type, in
// batch order, and panics for another type.
func TestSeenIDsTyped(t *testing.T) {
	batch := []Seen{{ID: int64(3)}, {ID: int64(1)}, {ID: int64(2)}}
	equal(t, "ids", fmt.Sprint(SeenIDs[int64](batch)), "[3 1 2]")
	equal(t, "empty", len(SeenIDs[string](nil)), 0)
	defer func() {
		equal(t, "panics for another type", recover() != nil, true)
	}()
	_ = SeenIDs[string](batch)
}
