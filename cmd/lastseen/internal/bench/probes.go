package bench

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// The probes a run attaches to its clients: a Redis command counter, a
// Redis round-trip timer and a pgx statement and transaction tracer.

// redisCounter counts the commands and round trips the benchmark's
// own client sends.
type redisCounter struct {
	cmds, trips atomic.Int64
}

func (h *redisCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redisCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.cmds.Add(1)
		h.trips.Add(1)
		return next(ctx, cmd)
	}
}

func (h *redisCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.cmds.Add(int64(len(cmds)))
		h.trips.Add(1)
		return next(ctx, cmds)
	}
}

// redisTimer times, while on, every round trip of a client: how long
// the flush or purge waited for Redis.
type redisTimer struct {
	on           atomic.Bool
	trips, nanos atomic.Int64
}

// redisTime is what redisTimer saw.
type redisTime struct {
	RoundTrips int64         `json:"round_trips"`
	Time       time.Duration `json:"time_ns"`
}

func (h *redisTimer) start() {
	h.trips.Store(0)
	h.nanos.Store(0)
	h.on.Store(true)
}

func (h *redisTimer) stop() redisTime {
	h.on.Store(false)
	return redisTime{RoundTrips: h.trips.Load(), Time: time.Duration(h.nanos.Load())}
}

func (h *redisTimer) observe(t time.Time) {
	if h.on.Load() {
		h.trips.Add(1)
		h.nanos.Add(int64(time.Since(t)))
	}
}

func (h *redisTimer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *redisTimer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		defer h.observe(time.Now())
		return next(ctx, cmd)
	}
}

func (h *redisTimer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		defer h.observe(time.Now())
		return next(ctx, cmds)
	}
}

// sqlTracer is a pgx query tracer that, while on, times statements and
// transactions (BEGIN to COMMIT/ROLLBACK on one connection).
type sqlTracer struct {
	on    atomic.Bool
	mu    sync.Mutex
	begun map[*pgx.Conn]time.Time
	s     sqlStats
}

// sqlStats are what the tracer saw while on. Durations are as the
// client sees them (network round trip included).
type sqlStats struct {
	Statements   int64         `json:"statements"`
	Writes       int64         `json:"writes"` // INSERT, UPDATE, DELETE
	WriteTime    time.Duration `json:"write_time_ns"`
	LongestWrite time.Duration `json:"longest_write_ns"`
	ReadTime     time.Duration `json:"read_time_ns"` // SELECT
	LongestRead  time.Duration `json:"longest_read_ns"`
	Txs          int64         `json:"transactions"`
	TxTime       time.Duration `json:"transaction_time_ns"`
	LongestTx    time.Duration `json:"longest_transaction_ns"`
}

type traceKey struct{}

type traceStart struct {
	at   time.Time
	verb string
}

func newSQLTracer() *sqlTracer { return &sqlTracer{begun: map[*pgx.Conn]time.Time{}} }

func sqlVerb(sql string) string {
	sql = strings.TrimSpace(sql)
	if i := strings.IndexAny(sql, " \n\t("); i > 0 {
		sql = sql[:i]
	}
	return strings.ToLower(sql)
}

func (t *sqlTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if !t.on.Load() {
		return ctx
	}
	st := traceStart{at: time.Now(), verb: sqlVerb(d.SQL)}
	if st.verb == "begin" {
		t.mu.Lock()
		t.begun[conn] = st.at
		t.mu.Unlock()
	}
	return context.WithValue(ctx, traceKey{}, st)
}

func (t *sqlTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, _ pgx.TraceQueryEndData) {
	st, ok := ctx.Value(traceKey{}).(traceStart)
	if !ok {
		return
	}
	now := time.Now()
	d := now.Sub(st.at)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.s.Statements++
	switch st.verb {
	case "insert", "update", "delete":
		t.s.Writes++
		t.s.WriteTime += d
		t.s.LongestWrite = max(t.s.LongestWrite, d)
	case "select":
		t.s.ReadTime += d
		t.s.LongestRead = max(t.s.LongestRead, d)
	case "commit", "rollback":
		if b, ok := t.begun[conn]; ok {
			delete(t.begun, conn)
			tx := now.Sub(b)
			t.s.Txs++
			t.s.TxTime += tx
			t.s.LongestTx = max(t.s.LongestTx, tx)
		}
	}
}

// start clears the figures and starts recording; stop stops and returns them.
func (t *sqlTracer) start() {
	t.mu.Lock()
	t.s = sqlStats{}
	clear(t.begun)
	t.mu.Unlock()
	t.on.Store(true)
}

func (t *sqlTracer) stop() sqlStats {
	t.on.Store(false)
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.s
}
