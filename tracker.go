package lastseen

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/idcodec"
	"github.com/lastseen/lastseen/internal/timecol"
	"github.com/maypok86/otter/v2"
	"golang.org/x/time/rate"
)

// maxClockSkew is how far in the future a timestamp may lie, against the
// plugin's clock, and still be accepted by TouchAt or by a flush reading it
// back from the buffer: one hour.
const maxClockSkew = buffer.MaxClockSkew

// tracker is the request path: it normalizes ids, answers from the local
// throttle cache, and records the rest in the buffer (openBuffer).
type tracker struct {
	buf      buffer.Buffer
	throttle time.Duration
	ids      idcodec.Codec
	col      *timecol.Codec // the tracked column: a DATE column's windows end at midnight
	now      func() time.Time
	ticks    func() int64                  // nanoseconds on the clock of the local cache's deadlines
	cache    *otter.Cache[cacheKey, int64] // value: deadline in ticks()
	stats    *counters
	log      *slog.Logger
	warn     rate.Sometimes
}

// newTracker builds the request path. With realClock (Config.Now unset) the
// local cache's deadlines run on the monotonic clock alone, one vDSO read
// where time.Now makes two: it is most of the cost of a cached Touch.
func newTracker(cfg settings, buf buffer.Buffer, realClock bool, ids idcodec.Codec, col *timecol.Codec, log *slog.Logger, stats *counters) (*tracker, error) {
	t := &tracker{
		buf:      buf,
		throttle: cfg.Throttle,
		ids:      ids,
		col:      col,
		now:      cfg.Now,
		stats:    stats,
		log:      log,
		warn:     rate.Sometimes{Interval: 10 * time.Second},
	}
	if realClock {
		epoch := time.Now()
		t.ticks = func() int64 { return int64(time.Since(epoch)) }
	} else {
		t.ticks = func() int64 { return cfg.Now().UnixNano() }
	}
	if cfg.LocalCacheSize > 0 {
		// No otter expiry: the value is the entry's deadline on the plugin's
		// clock, checked on every hit (an entry ends with the throttle
		// window it was recorded or throttled in), and otter's own expiry would read the
		// real clock on every lookup. Stale entries are overwritten on the
		// next miss or evicted by size.
		c, err := otter.New(&otter.Options[cacheKey, int64]{
			MaximumSize: cfg.LocalCacheSize,
		})
		if err != nil {
			return nil, fmt.Errorf("local cache: %v", err)
		}
		t.cache = c
	}
	return t, nil
}

func (t *tracker) close() error {
	if t.cache != nil {
		t.cache.StopAllGoroutines()
	}
	return t.buf.Close()
}

// cacheKey identifies a user in the local cache without allocating: integer
// ids by value, string ids by their text.
type cacheKey struct {
	s       string
	n       uint64
	isNum   bool
	isFloat bool // a float64 id: its own entry, as a float may be refused where the integer is not
}

// Negative integers take the slow path: as a uint64 key they would collide
// with a large unsigned id that the primary key type may refuse.
func quickKey(id any) (cacheKey, bool) {
	switch v := id.(type) {
	case string:
		return cacheKey{s: v}, true
	case int:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case int64:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case uint64:
		return cacheKey{n: v, isNum: true}, true
	case uint:
		return cacheKey{n: uint64(v), isNum: true}, true
	case int32:
		return cacheKey{n: uint64(v), isNum: true}, v > 0
	case uint32:
		return cacheKey{n: uint64(v), isNum: true}, true
	case float64: // JSON-decoded claims: whole numbers only, as the id codec takes them
		return cacheKey{n: uint64(v), isNum: true, isFloat: true}, v >= 1 && v <= idcodec.MaxExactFloat && v == math.Trunc(v)
	}
	return cacheKey{}, false
}

func (t *tracker) checkTime(at, now time.Time) error {
	if at.IsZero() || at.Unix() <= 0 { // MySQL's TIMESTAMP starts at 1970-01-01T00:00:01Z
		return fmt.Errorf("%w: %s is before 1970-01-01T00:00:01Z", ErrInvalidTime, at.Format(time.RFC3339Nano))
	}
	if limit := now.Add(maxClockSkew); at.After(limit) {
		return fmt.Errorf("%w: %s is more than %v ahead of the clock", ErrInvalidTime, at.UTC().Format(time.RFC3339Nano), maxClockSkew)
	}
	return nil
}

// Touch is TouchAt at the plugin's clock.
func (p *Plugin) Touch(ctx context.Context, userID any) (recorded bool, err error) {
	if t := p.tracker; t != nil && t.cached(userID) { // at is the plugin's own clock: nothing to validate
		p.stats.touches.Add(1)
		p.stats.throttled.Add(1)
		p.stats.cacheHits.Add(1)
		return false, nil
	}
	now := p.now()
	return p.touch(ctx, userID, now, now)
}

// TouchAt records that userID (the primary key: an integer, string or
// fmt.Stringer; for an integer key also a whole float64 up to 2^53 or a
// json.Number) was seen at at. recorded is true when the call opened a
// throttle window and raised the buffered timestamp, false inside one.
// Errors: ErrInvalidUserID, ErrInvalidTime, and when Redis does not answer
// within Buffer.TouchTimeout (or the breaker is open, or ctx ends) an
// error wrapping the cause and ErrBuffered (kept, safe to ignore) or
// ErrDropped (lost: the 100,000-user backlog is full or closed).
func (p *Plugin) TouchAt(ctx context.Context, userID any, at time.Time) (recorded bool, err error) {
	return p.touch(ctx, userID, at, p.now())
}

// touch is TouchAt with one reading of the plugin's clock, now, used both to
// validate at and to check the local cache's deadline: on the cached path a
// clock read costs more than the cache lookup itself.
func (p *Plugin) touch(ctx context.Context, userID any, at, now time.Time) (recorded bool, err error) {
	t := p.tracker
	if t == nil {
		return false, p.notReady()
	}
	p.stats.touches.Add(1)
	if err := t.checkTime(at, now); err != nil { // before the cache: a cached user's bad time is still an error
		p.stats.invalid.Add(1)
		return false, err
	}
	if t.cached(userID) {
		p.stats.throttled.Add(1)
		p.stats.cacheHits.Add(1)
		return false, nil
	}
	qk, quick := quickKey(userID)
	uid, err := t.ids.Normalize(userID)
	if err != nil {
		p.stats.invalid.Add(1)
		return false, err
	}
	if p.touchClosed.Load() { // nothing would ever flush it
		return false, ErrClosed
	}
	recorded, ttl, err := t.buf.Touch(ctx, uid, at, now, t.windowEnd(at, now))
	if err != nil {
		return false, fmt.Errorf("lastseen: touch user %s: %w", uid, touchError(err))
	}
	if quick && t.cache != nil && ttl > 0 {
		t.cache.Set(qk, t.ticks()+int64(ttl))
	}
	if recorded {
		p.stats.recorded.Add(1)
	} else {
		p.stats.throttled.Add(1)
	}
	return recorded, nil
}

// cached reports whether the local cache knows the user is inside a
// throttle window. It does no I/O and no allocation.
func (t *tracker) cached(userID any) bool {
	if t.cache == nil {
		return false
	}
	qk, quick := quickKey(userID)
	if !quick {
		return false
	}
	deadline, ok := t.cache.GetIfPresent(qk)
	return ok && t.ticks() < deadline
}

// windowEnd is the end of the throttle window a touch at at falls in, read
// at now. Windows are fixed periods of the clock, Throttle long, counted
// from the Unix epoch: every instance names the same window by its end,
// and a user is recorded at most once in each. A time ahead of now (within
// maxClockSkew) falls in now's window; a time whose window ended before now
// (a late event, a replay) gets an end not after now, which the buffer
// records without holding back the user's current touch. On a DATE column
// the window ends at the start of the day after at's, in the column's
// location, or at the end of at's Throttle period if that is sooner (a
// column found to be a DATE only after db.Use, whose Throttle was not
// fitted to it).
func (t *tracker) windowEnd(at, now time.Time) time.Time {
	if at.After(now) {
		at = now
	}
	ms := max(t.throttle.Milliseconds(), 1)
	end := time.UnixMilli((at.UnixMilli()/ms + 1) * ms)
	if t.col != nil && t.col.Date() {
		day := t.col.NextDay(at)
		if t.throttle >= dayThrottle || day.Before(end) {
			return day
		}
	}
	return end
}

// touchError is the error of a touch the buffer did not take: ErrBuffered
// and its cause when the timestamp was kept in the backlog, ErrDropped and
// its cause when it was lost.
func touchError(err error) error {
	var te *buffer.TouchError
	switch {
	case !errors.As(err, &te):
		return err
	case te.Kept:
		return fmt.Errorf("%w: %w", ErrBuffered, te.Err)
	}
	return fmt.Errorf("%w: %w", ErrDropped, te.Err)
}

// TouchKnown is Touch for an app that already loaded the user's last-seen
// value, such as the row read to authenticate the request:
//
//	p.TouchKnown(ctx, user.ID, user.LastSeenAt)
//
// When known is after now - Throttle (and at most an hour ahead), the
// user was recorded in this window already: it returns false, nil without
// any I/O or lookup, counted in Stats.Known. Otherwise, and for the zero
// time (a NULL column), it is Touch. known compares as an instant; on a
// DATE column it is the column's date as loaded (the date it carries, in
// its own location), and the user was recorded when it is today's date in
// the column's location.
func (p *Plugin) TouchKnown(ctx context.Context, userID any, known time.Time) (recorded bool, err error) {
	if t := p.tracker; t != nil && !known.IsZero() {
		now := p.now()
		if t.knownRecent(known, now) {
			p.stats.touches.Add(1)
			p.stats.throttled.Add(1)
			p.stats.known.Add(1)
			return false, nil
		}
		return p.touch(ctx, userID, now, now)
	}
	return p.Touch(ctx, userID)
}

// knownRecent reports whether a loaded column value known shows the user
// recorded in the window open at now (TouchKnown): after now - Throttle,
// at most maxClockSkew ahead; on a DATE column, today's date or later.
func (t *tracker) knownRecent(known, now time.Time) bool {
	if t.col != nil && t.col.Date() {
		day, _ := t.col.FromGo(known)
		return !day.Before(t.col.Day(now)) && !day.After(now.Add(maxClockSkew))
	}
	return known.After(now.Add(-t.throttle)) && !known.After(now.Add(maxClockSkew))
}

// Middleware returns net/http middleware (chi, gorilla/mux, ServeMux)
// that touches the user of every request before the next handler runs.
// userID returns the request's primary key, or false when anonymous. It is
// best effort: Redis gets at most Buffer.TouchTimeout, and an error is
// logged at most once per 10s and never fails the request. If its first
// 100 requests have no user it logs one warning: it probably runs before
// the authentication.
func (p *Plugin) Middleware(userID func(*http.Request) (any, bool)) func(http.Handler) http.Handler {
	warn := &rate.Sometimes{Interval: 10 * time.Second}
	users := &userWatch{msg: fmt.Sprintf("lastseen: middleware saw %d requests and never a user: it is probably mounted "+
		"outside (before) the authentication middleware, or its userID function returns false; mount it after authentication", anonymousLimit)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if id, ok := userID(r); ok {
				users.seen()
				if _, err := p.Touch(r.Context(), id); err != nil {
					warn.Do(func() { p.log.Warn("lastseen: middleware touch failed", "err", err) })
				}
			} else {
				users.anonymous(p)
			}
			next.ServeHTTP(w, r)
		})
	}
}

// requestUser is the holder DeferredMiddleware puts in a request's context
// for SetUser to fill.
type requestUser struct {
	mu    sync.Mutex
	id    any
	known time.Time
	set   bool
}

type requestUserKey struct{}

// SetUser names the request's user, from an authentication middleware in
// a sub-router, for the DeferredMiddleware around it to touch once the
// handler returns. userID is what Touch takes; a later call replaces an
// earlier one. It returns false, doing nothing, without a
// DeferredMiddleware.
func SetUser(ctx context.Context, userID any) bool {
	return setUser(ctx, userID, time.Time{})
}

// SetUserKnown is SetUser with the user's loaded last-seen value (zero for
// NULL): the touch is TouchKnown's.
func SetUserKnown(ctx context.Context, userID any, known time.Time) bool {
	return setUser(ctx, userID, known)
}

func setUser(ctx context.Context, userID any, known time.Time) bool {
	h, ok := ctx.Value(requestUserKey{}).(*requestUser)
	if !ok {
		return false
	}
	h.mu.Lock()
	h.id, h.known, h.set = userID, known, true
	h.mu.Unlock()
	return true
}

// DeferredMiddleware returns net/http middleware for apps that
// authenticate in sub-routers: after the handler returns it touches the
// user named with SetUser or SetUserKnown (nested ones share the
// outermost), ignoring the request's cancellation; not after a panic.
// Otherwise it works as Middleware.
func (p *Plugin) DeferredMiddleware() func(http.Handler) http.Handler {
	warn := &rate.Sometimes{Interval: 10 * time.Second}
	users := &userWatch{msg: fmt.Sprintf("lastseen: deferred middleware saw %d requests and never a user: SetUser is probably "+
		"never called; call SetUser or SetUserKnown in the authentication middleware, inside the deferred middleware", anonymousLimit)}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := r.Context().Value(requestUserKey{}).(*requestUser); ok {
				next.ServeHTTP(w, r) // an outer DeferredMiddleware owns the holder
				p.touchHeld(r.Context(), warn, users)
				return
			}
			h := &requestUser{}
			r = r.WithContext(context.WithValue(r.Context(), requestUserKey{}, h))
			next.ServeHTTP(w, r)
			p.touchHeld(r.Context(), warn, users)
		})
	}
}

// touchHeld touches the user held in ctx, if a handler named one.
func (p *Plugin) touchHeld(ctx context.Context, warn *rate.Sometimes, users *userWatch) {
	h := ctx.Value(requestUserKey{}).(*requestUser)
	h.mu.Lock()
	id, known, set := h.id, h.known, h.set
	h.mu.Unlock()
	if !set {
		users.anonymous(p)
		return
	}
	users.seen()
	if _, err := p.TouchKnown(context.WithoutCancel(ctx), id, known); err != nil {
		warn.Do(func() { p.log.Warn("lastseen: deferred middleware touch failed", "err", err) })
	}
}

// anonymousLimit is how many requests without a user a middleware serves
// before it warns, once, that it probably never sees one.
const anonymousLimit = 100

// userWatch is one middleware's count of requests without a user, until
// it sees one or has warned: two atomics, no lock and no allocation per
// request.
type userWatch struct {
	msg  string       // the warning
	n    atomic.Int64 // requests without a user so far
	done atomic.Bool  // a user was seen, or the warning logged: counting stopped
}

// seen records a request with a user: the watch stops.
func (u *userWatch) seen() {
	if !u.done.Load() { // a load per request; the store only once
		u.done.Store(true)
	}
}

// anonymous counts a request without a user and logs the warning on p's
// logger at the anonymousLimit-th, once.
func (u *userWatch) anonymous(p *Plugin) {
	if !u.done.Load() && u.n.Add(1) == anonymousLimit && u.done.CompareAndSwap(false, true) {
		p.log.Warn(u.msg)
	}
}
