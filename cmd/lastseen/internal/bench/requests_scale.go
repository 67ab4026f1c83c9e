package bench

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"gorm.io/gorm"
)

// scaleRun is one point of the request scale curve: the lastseen+local
// variant (the library's defaults) alone, at one number of users.
type scaleRun struct {
	Users    int     `json:"users"`
	Requests int     `json:"requests"`
	Variant  variant `json:"lastseen_local"`
}

// runScale replays, for each of ScaleUsers, a stream of 10 requests per
// user (Zipf, the same seed) through lastseen+local, so that the cost's
// growth with the users is visible: requests/s, flush rows/s, peak heap
// growth and heap bytes per distinct user.
func (e *env) runScale(ctx context.Context) ([]scaleRun, error) {
	c := e.cmd
	var out []scaleRun
	for _, n := range c.ScaleUsers {
		st := newStream(n, 10*n, c.Zipf, c.Seed)
		c.progress("scale: %d users, %d requests (%d distinct)", n, len(st.ids), st.distinct)
		prefix := e.prefix + "-scale" + strconv.Itoa(n)
		v, err := e.runVariant(ctx, "lastseen+local", "scale"+strconv.Itoa(n)+"_", st, func(db *gorm.DB, _ string) (design, error) {
			return e.openLastseen(db, prefix, 0, st.boxed)
		})
		if err != nil {
			return nil, err
		}
		out = append(out, scaleRun{Users: n, Requests: len(st.ids), Variant: v})
	}
	return out, nil
}

func writeScale(w io.Writer, runs []scaleRun) {
	fmt.Fprintf(w, "\n## Requests at scale: lastseen+local (library defaults), 10 requests per user\n\n")
	fmt.Fprint(w, "| users | requests | distinct users | requests/s | tracking call p50 | flush rows/s | rows written | peak heap growth | peak live heap growth | heap bytes per distinct user | allocated per request | check |\n")
	fmt.Fprint(w, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|---|\n")
	for _, r := range runs {
		v := r.Variant
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %.0f B | %.0f B | %s |\n",
			fmtInt(int64(r.Users)), fmtInt(int64(r.Requests)), fmtInt(v.UsersUpdated), fmtRate(v.RequestsPerSec), fmtDur(v.P50),
			fmtRate(v.FlushRowsPerSec), fmtInt(v.RowsWritten), fmtBytes(v.Heap.PeakHeapGrowth), fmtBytes(v.Heap.PeakLiveGrowth),
			v.HeapPerUser, float64(v.Heap.Allocated)/float64(r.Requests), v.Check)
	}
}
