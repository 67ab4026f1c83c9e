package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/lastseen/lastseen"
)

// printHealth prints the tracked table's health (lastseen.TableHealth):
// the indexes that include the last-seen column, on PostgreSQL the HOT
// share of its updates and its fillfactor, then one line per advice. A
// missing users table is one line, not an error: status still reports the
// buffer and the sessions.
func (e *opsEnv) printHealth(ctx context.Context, out io.Writer) error {
	h, err := e.p.TableHealth(ctx)
	if err != nil {
		fmt.Fprintf(out, "table health: not read: %s\n", strings.TrimPrefix(err.Error(), "lastseen: "))
		return nil
	}
	fmt.Fprintf(out, "table %q, column %q: indexes on the column: %s\n", h.Table, h.Column, healthIndexes(h))
	if h.HOT {
		hot := "none yet"
		if h.Updates > 0 {
			hot = fmt.Sprintf("%d of %d (%.0f%%)", h.HOTUpdates, h.Updates, 100*h.HOTShare())
		}
		fmt.Fprintf(out, "hot updates: %s; fillfactor %d\n", hot, h.FillFactor)
	}
	for _, a := range h.Advice {
		fmt.Fprintf(out, "advice: %s\n", a)
	}
	return nil
}

func healthIndexes(h lastseen.TableHealth) string {
	if len(h.Indexes) == 0 {
		return "none"
	}
	names := make([]string, len(h.Indexes))
	for i, x := range h.Indexes {
		names[i] = x.Name
	}
	return strings.Join(names, ", ")
}
