package lastseen

import (
	"fmt"
	"testing"
)

// TestSortBatchOrdersByKey: integer keys sort by value (not as text: 10
// after 9), string and UUID keys by their stored text, byte by byte.
func TestSortBatchOrdersByKey(t *testing.T) {
	ids := func(b []entry) string {
		out := make([]any, len(b))
		for i, e := range b {
			out[i] = e.id
		}
		return fmt.Sprint(out)
	}
	signed := []entry{{field: "10", id: int64(10)}, {field: "9", id: int64(9)}, {field: "-3", id: int64(-3)}, {field: "100", id: int64(100)}}
	sortBatch(signed)
	equal(t, "signed", ids(signed), "[-3 9 10 100]")
	unsigned := []entry{{field: "18446744073709551615", id: uint64(18446744073709551615)}, {field: "2", id: uint64(2)}, {field: "11", id: uint64(11)}}
	sortBatch(unsigned)
	equal(t, "unsigned", ids(unsigned), "[2 11 18446744073709551615]")
	text := []entry{{field: "b", id: "b"}, {field: "B", id: "B"}, {field: "aa", id: "aa"}, {field: "a", id: "a"}}
	sortBatch(text)
	equal(t, "strings", ids(text), "[B a aa b]")
}
