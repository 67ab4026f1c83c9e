package lastseen

import (
	"context"
	"fmt"
)

// stayBuffered is what the error of a missing users table says of the
// touches (keeps).
const stayBuffered = "; touches stay buffered until it exists"

// keeps returns kept, the words an error of a flush uses for the entries
// it did not write ("68 entries kept", "back in pending for the next
// flush"), or "" during Close's final flush of the in-process buffer: what
// that flush does not write is lost with the process, and Close's error
// says so (lostAtClose).
func (p *Plugin) keeps(kept string) string {
	if p.closingFlush.Load() {
		return ""
	}
	return kept
}

// finalFlush is Close's flush, logged as one line. Without Redis the
// buffer ends with the process: the entries the flush could not write are
// counted in Stats.Dropped and reported, in one ERROR line and in the
// error returned, as lost (lostAtClose).
func (p *Plugin) finalFlush(ctx context.Context) error {
	memory := !hasRedis(p.cfg)
	p.closingFlush.Store(memory)
	res, err := p.flush(ctx)
	if memory { // nothing would flush an in-process touch from now on
		p.touchClosed.Store(true)
		if lost := p.lostAtClose(ctx, res, err); lost != nil {
			return lost
		}
	}
	p.logFlush("lastseen: flush at Close", res, err)
	return err
}

// lostAtClose counts what the in-process buffer still holds after Close's
// final flush (res, err): none, nil; otherwise it adds them to
// Stats.Dropped, logs one ERROR line with the flush's counts and returns
// the error saying how many timestamps were lost and why.
func (p *Plugin) lostAtClose(ctx context.Context, res FlushResult, err error) error {
	sizes, _ := p.tracker.buf.Sizes(ctx) // the in-process buffer never fails
	var n int64
	for _, s := range sizes {
		n += s.Pending + s.InFlight
	}
	if n == 0 {
		return nil
	}
	p.stats.dropped.Add(n)
	lost := &lostError{n: n, err: err}
	p.log.Error(lost.Error(), "lost", n, "drained", res.Drained, "written", res.Written, "failed", res.Failed,
		"batches", res.Batches, "duration", res.Duration)
	return lost
}

// lostError is Close's error for the timestamps the in-process buffer
// still held after the final flush: n of them, and the flush's error (nil
// when they were touched while the flush ran), which it wraps.
type lostError struct {
	n   int64
	err error
}

func (e *lostError) Error() string {
	msg := fmt.Sprintf("lastseen: %d timestamps lost at Close: ", e.n)
	if e.n == 1 {
		msg = "lastseen: 1 timestamp lost at Close: "
	}
	errs := []error{e.err}
	if j, ok := e.err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	switch {
	case e.err == nil:
		return msg + "touched while the final flush ran, after their shard was written; the in-process buffer ends with the process"
	case len(errs) > 1:
		return fmt.Sprintf("%sthe final flush could not write them (%v; and %d more errors)", msg, errs[0], len(errs)-1)
	}
	return fmt.Sprintf("%sthe final flush could not write them (%v)", msg, e.err)
}

func (e *lostError) Unwrap() error { return e.err }
