package lastseen

import (
	"cmp"
	"slices"
	"strings"
)

// sortBatch orders a batch by primary key before its statement: integer
// keys by value, string and Scanner keys (UUIDs) by their stored text,
// byte by byte. The rows a statement updates then come in index order
// (neighbouring ids share pages: less random I/O), and concurrent writers
// of overlapping batches (several instances, a refused batch written
// again) take the row locks in one order, which cannot deadlock one
// another (PostgreSQL manual, "Deadlocks": acquire locks in a consistent
// order).
func sortBatch(batch []entry) {
	slices.SortFunc(batch, func(a, b entry) int {
		switch x := a.id.(type) {
		case int64:
			if y, ok := b.id.(int64); ok {
				return cmp.Compare(x, y)
			}
		case uint64:
			if y, ok := b.id.(uint64); ok {
				return cmp.Compare(x, y)
			}
		}
		return strings.Compare(a.field, b.field)
	})
}
