package lastseen

import (
	"context"
	"fmt"
	"strconv"

	"github.com/lastseen/lastseen/internal/buffer"
)

// writeBacklog writes the backlog of a buffer whose replay into Redis
// failed (buffer.Backlog: the Redis buffer's touches Redis did not take)
// straight to the table, so that presence reaches the database, and
// survives Close, while Redis is down: BatchSize entries per statement,
// with the flush's own write (writeBatch: forward-only, refused rows
// isolated).
// Entries not written (a batch that failed, refused rows, what comes after
// a failure) go back to the backlog for the next flush; an unreadable entry
// cannot occur (Touch normalized it). It returns the counts of what it
// wrote and the first error.
func (p *Plugin) writeBacklog(ctx context.Context, h buffer.Backlog) (FlushResult, error) {
	m := h.TakeBacklog()
	var res FlushResult
	if len(m) == 0 {
		return res, nil
	}
	now := p.now()
	all := make([]entry, 0, len(m))
	for uid, ts := range m {
		id, err := p.users.ids.Parse(uid)
		at, ok := buffer.ParseMicros(strconv.FormatInt(ts, 10), now)
		if err != nil || !ok {
			continue // never true for what Touch put there; dropped like an unreadable entry
		}
		all = append(all, entry{field: uid, value: strconv.FormatInt(ts, 10), id: id, at: at, bucket: -1})
	}
	for start := 0; start < len(all); start += p.cfg.BatchSize {
		batch := all[start:min(start+p.cfg.BatchSize, len(all))]
		br, refused, err := p.writeBatch(ctx, batch)
		res.add(br)
		if err != nil {
			h.ReturnBacklog(entriesMap(all[start:]))
			return res, fmt.Errorf("lastseen: write backlog to the database: %w", err)
		}
		written := len(batch) - len(refused)
		res.Drained += written
		if len(refused) > 0 {
			back := make(map[string]int64, len(refused))
			for _, r := range refused {
				back[r.field] = m[r.field]
			}
			h.ReturnBacklog(back)
			res.Failed += len(refused)
		}
	}
	return res, nil
}

func entriesMap(es []entry) map[string]int64 {
	m := make(map[string]int64, len(es))
	for _, e := range es {
		ts, _ := strconv.ParseInt(e.value, 10, 64)
		m[e.field] = ts
	}
	return m
}
