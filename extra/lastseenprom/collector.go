// Package lastseenprom exports a lastseen plugin's figures as Prometheus
// metrics. It is a module of its own so that the lastseen module does not
// depend on client_golang.
//
//	p := lastseen.New(lastseen.Config{Redis: rdb})
//	if err := db.Use(p); err != nil { ... }
//	if _, err := lastseenprom.New(reg, p); err != nil { ... }
//
// Every metric starts with "lastseen_", is in base units (seconds) and
// carries a "table" constant label (the users table the plugin writes), so
// that plugins of two tracked models register on one registry. No label
// holds a user id.
//
// The module also ships a Grafana dashboard and Prometheus alerting rules
// for these metrics; its README says how to load them.
package lastseenprom

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/lastseen/lastseen"
	"github.com/prometheus/client_golang/prometheus"
)

// maxBufferSample is the largest perHash Plugin.SampleBuffer accepts: the
// library's limit, repeated here to check the option before the first
// collection.
const maxBufferSample = 1000

// Defaults of the options.
const (
	// DefaultBufferSample is the number of entries sampled per hash for the
	// oldest pending age (lastseen.Plugin.SampleBuffer's perHash).
	DefaultBufferSample = 16
	// DefaultScrapeTimeout bounds the Redis read a scrape makes.
	DefaultScrapeTimeout = time.Second
)

// Buckets of the duration histograms, in seconds. A flush of a million
// buffered users takes tens of seconds; a purge pauses between batches and
// may run for an hour.
var (
	FlushBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	PurgeBuckets = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600}
)

type options struct {
	labels  prometheus.Labels
	sample  int
	timeout time.Duration
}

// Option configures New.
type Option func(*options)

// WithConstLabels adds constant labels to every metric, for example
// {"service": "api"}. A "table" label given here replaces the users table's
// name, which New sets by default.
func WithConstLabels(l prometheus.Labels) Option {
	return func(o *options) {
		for k, v := range l {
			o.labels[k] = v
		}
	}
}

// WithBufferSample sets how many entries per Redis hash a scrape samples to
// find the oldest pending timestamp: 0 to 1000, default
// DefaultBufferSample; 0 leaves lastseen_oldest_pending_age_seconds out.
// See lastseen.Plugin.SampleBuffer for the accuracy.
func WithBufferSample(perHash int) Option { return func(o *options) { o.sample = perHash } }

// WithScrapeTimeout bounds the Redis read of one scrape; default
// DefaultScrapeTimeout.
func WithScrapeTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// Collector is a prometheus.Collector over one lastseen plugin: counters
// and gauges read from Plugin.Stats, Plugin.RuleStats, Plugin.Breaker and
// Plugin.SampleBuffer at scrape time, duration histograms fed by the
// flushes, purges and rule runs it observes (lastseen.Observer) from New
// on. The metrics of inactivity rules carry a "rule" label (Rule.Name).
type Collector struct {
	lastseen.NopObserver
	p       *lastseen.Plugin
	sample  int
	timeout time.Duration
	now     func() time.Time // measures run durations; tests replace it

	touches, flushRuns, flushRows, flushSkipped       *prometheus.Desc
	lastFlush, purgeRuns, purgeDeleted, redisErrors   *prometheus.Desc
	backlog, backlogDropped, breaker, evictions       *prometheus.Desc
	pending, inflight, oldestAge, bufferErrors        *prometheus.Desc
	ruleRuns, ruleRows, ruleBatches, ruleKept         *prometheus.Desc
	lastRule, flushDropped, purgeRefused, ruleRefused *prometheus.Desc
	flushDuration, purgeDuration, ruleDuration        *prometheus.HistogramVec
	bufferReadErrors                                  atomic.Int64
}

var _ prometheus.Collector = (*Collector)(nil)
var _ lastseen.Observer = (*Collector)(nil)

// New builds the collector for p, registers it on reg and makes it observe
// p's flushes, purges and rule runs. p must be initialized (db.Use) so that its table
// is known. Errors: reg nil (the global registry is never used silently:
// pass prometheus.DefaultRegisterer to want it), lastseen.ErrNotInitialized,
// an option out of range, or reg's registration error wrapped (errors.As
// finds a prometheus.AlreadyRegisteredError when the same table and
// constant labels are registered twice). Nothing is observed after an
// error.
func New(reg prometheus.Registerer, p *lastseen.Plugin, opts ...Option) (*Collector, error) {
	if reg == nil {
		return nil, errors.New("lastseenprom: nil Registerer")
	}
	target, err := p.Target()
	if err != nil {
		return nil, fmt.Errorf("lastseenprom: %w", err)
	}
	o := options{labels: prometheus.Labels{"table": target.Table}, sample: DefaultBufferSample, timeout: DefaultScrapeTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.sample < 0 || o.sample > maxBufferSample {
		return nil, fmt.Errorf("lastseenprom: buffer sample is %d, want 0 to %d", o.sample, maxBufferSample)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("lastseenprom: scrape timeout is %v, want a positive duration", o.timeout)
	}
	c := newCollector(p, o)
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("lastseenprom: register table %q: %w", target.Table, err)
	}
	p.AddObserver(c)
	return c, nil
}

func newCollector(p *lastseen.Plugin, o options) *Collector {
	l := o.labels
	desc := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc("lastseen_"+name, help, vars, l)
	}
	return &Collector{
		p: p, sample: o.sample, timeout: o.timeout, now: time.Now,
		touches: desc("touches_total", "Touch and TouchAt calls by result: recorded (opened a throttle window), "+
			"throttled (Redis answered: inside a window), cached (the local cache answered), invalid (bad id or time), "+
			"error (Redis did not answer; kept in the backlog or dropped).", "result"),
		pending:      desc("pending_users", "Users in the Redis pending hashes, waiting for the next flush (HLEN)."),
		inflight:     desc("inflight_users", "Users in the Redis in-flight hashes: being written, or left by a failed flush (HLEN)."),
		oldestAge:    desc("oldest_pending_age_seconds", "Age of the oldest buffered timestamp (pending or in flight), from a bounded sample per hash: exact for small hashes, never overstated; 0 when empty."),
		bufferErrors: desc("buffer_read_errors_total", "Scrapes whose Redis read of the buffer failed; the buffer gauges are left out of those scrapes."),
		flushRuns:    desc("flush_runs_total", "Flush runs by result: ok or error.", "result"),
		flushRows: desc("flush_rows_total", "Buffered entries a flush took, by outcome: written (the column moved forward), "+
			"unknown (no such row, Update mode), stale (the column was as new), rejected (unreadable, dropped), "+
			"failed (refused by the database, back in pending), uncomparable (the column could not be compared with), "+
			"ambiguous (in an hour a DST fall-back repeats, on a naive MySQL column: left unwritten).", "outcome"),
		flushDropped: desc("flush_dropped_total", "Buffered timestamps dropped for good: refused by the database Flush.MaxRefusals times (each refusal also counted failed), "+
			"or left in the in-process buffer at Close."),
		purgeRefused:   desc("purge_refused_sessions_total", "Expired session rows the database refused to delete, skipped, counted at each purge that met them."),
		ruleRefused:    desc("rule_refused_rows_total", "Inactive rows the database refused to act on, skipped, by rule.", "rule"),
		flushSkipped:   desc("flush_shards_skipped_total", "Shards a flush skipped because another instance held their lock."),
		lastFlush:      desc("last_successful_flush_timestamp_seconds", "Unix time at which the last flush run without error ended, on the plugin's clock; absent before the first."),
		purgeRuns:      desc("purge_runs_total", "Purge runs by result: ok, error, or locked (another instance held the purge lock).", "result"),
		purgeDeleted:   desc("purge_deleted_sessions_total", "Expired session rows deleted by purges."),
		ruleRuns:       desc("rule_runs_total", "Inactivity rule runs by rule and result: ok, error, or locked (another instance held the rule's lock).", "rule", "result"),
		ruleRows:       desc("rule_acted_rows_total", "Inactive rows rule runs acted on (deleted, or handed to the rule's Action), by rule.", "rule"),
		ruleBatches:    desc("rule_batches_total", "Transactions rule runs committed, by rule; a batch whose rows were all held back by buffered activity opens none.", "rule"),
		ruleKept:       desc("rule_kept_rows_total", "Inactive rows rule runs left because their newer activity was still buffered (or the buffer could not be read), by rule.", "rule"),
		lastRule:       desc("last_successful_rule_run_timestamp_seconds", "Unix time at which the last run of the rule without error ended, on the plugin's clock, by rule; absent before the first.", "rule"),
		redisErrors:    desc("redis_errors_total", "Redis calls that failed or timed out, by operation (touch).", "operation"),
		backlog:        desc("backlog_users", "Users kept in this process's memory because Redis did not answer; the next flush sends them."),
		backlogDropped: desc("backlog_dropped_total", "Touches dropped because the in-process backlog was full."),
		evictions:      desc("redis_evicted_keys_total", "Keys Redis evicted (INFO stats evicted_keys, every master, whatever their prefix) seen by the plugin's checks since it started; any increase means buffered timestamps may be lost: set maxmemory-policy noeviction."),
		breaker:        desc("redis_breaker_state", "State of the circuit breaker in front of Redis on the touch path: 1 for the current state, 0 for the others.", "state"),
		flushDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lastseen_flush_duration_seconds", Help: "Duration of flush runs by result: ok or error.",
			Buckets: FlushBuckets, ConstLabels: l,
		}, []string{"result"}),
		purgeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lastseen_purge_duration_seconds", Help: "Duration of purge runs that held the lock, by result: ok or error.",
			Buckets: PurgeBuckets, ConstLabels: l,
		}, []string{"result"}),
		ruleDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "lastseen_rule_duration_seconds", Help: "Duration of inactivity rule runs that held the rule's lock, by rule and result: ok or error.",
			Buckets: PurgeBuckets, ConstLabels: l,
		}, []string{"rule", "result"}),
	}
}

// Describe sends every metric's description.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.touches, c.pending, c.inflight, c.oldestAge, c.bufferErrors,
		c.flushRuns, c.flushRows, c.flushSkipped, c.lastFlush, c.purgeRuns, c.purgeDeleted,
		c.redisErrors, c.backlog, c.backlogDropped, c.breaker, c.evictions,
		c.ruleRuns, c.ruleRows, c.ruleBatches, c.ruleKept, c.lastRule, c.flushDropped, c.purgeRefused, c.ruleRefused} {
		ch <- d
	}
	c.flushDuration.Describe(ch)
	c.purgeDuration.Describe(ch)
	c.ruleDuration.Describe(ch)
}

// Collect reads Stats, the breaker and the buffer (one pipelined Redis
// round trip, bounded by the scrape timeout) and sends the metrics.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	counter := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(c.touches, s.Recorded, "recorded")
	counter(c.touches, s.Throttled-s.CacheHits, "throttled")
	counter(c.touches, s.CacheHits, "cached")
	counter(c.touches, s.Invalid, "invalid")
	counter(c.touches, s.RedisErrors, "error")
	counter(c.flushRuns, s.Flushes-s.FlushErrors, "ok")
	counter(c.flushRuns, s.FlushErrors, "error")
	counter(c.flushRows, s.RowsWritten, "written")
	counter(c.flushRows, s.Unknown, "unknown")
	counter(c.flushRows, s.Stale, "stale")
	counter(c.flushRows, s.Rejected, "rejected")
	counter(c.flushRows, s.Failed, "failed")
	counter(c.flushRows, s.Uncomparable, "uncomparable")
	counter(c.flushRows, s.Ambiguous, "ambiguous")
	counter(c.flushDropped, s.Dropped)
	counter(c.flushSkipped, s.FlushSkipped)
	if !s.LastFlush.IsZero() {
		gauge(c.lastFlush, float64(s.LastFlush.UnixNano())/1e9)
	}
	counter(c.purgeRuns, s.Purges-s.PurgeErrors, "ok")
	counter(c.purgeRuns, s.PurgeErrors, "error")
	counter(c.purgeRuns, s.PurgeSkipped, "locked")
	counter(c.purgeDeleted, s.SessionsDeleted)
	counter(c.purgeRefused, s.PurgeRefused)
	for _, r := range c.p.RuleStats() {
		counter(c.ruleRuns, r.Runs-r.Errors, r.Name, "ok")
		counter(c.ruleRuns, r.Errors, r.Name, "error")
		counter(c.ruleRuns, r.Skipped, r.Name, "locked")
		counter(c.ruleRows, r.Rows, r.Name)
		counter(c.ruleBatches, r.Batches, r.Name)
		counter(c.ruleKept, r.Kept, r.Name)
		counter(c.ruleRefused, r.Refused, r.Name)
		if !r.LastRun.IsZero() {
			gauge(c.lastRule, float64(r.LastRun.UnixNano())/1e9, r.Name)
		}
	}
	counter(c.redisErrors, s.RedisErrors, "touch")
	gauge(c.backlog, float64(s.Backlog))
	counter(c.backlogDropped, s.BacklogDropped)
	counter(c.evictions, s.Evictions)
	state := c.p.Breaker()
	for _, st := range []string{"closed", "half-open", "open"} {
		gauge(c.breaker, map[bool]float64{true: 1}[st == state], string(st))
	}
	c.collectBuffer(ch, gauge)
	c.flushDuration.Collect(ch)
	c.purgeDuration.Collect(ch)
	c.ruleDuration.Collect(ch)
}

// collectBuffer sends the buffer gauges, or counts a failed read.
func (c *Collector) collectBuffer(ch chan<- prometheus.Metric, gauge func(*prometheus.Desc, float64, ...string)) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	b, err := c.p.SampleBuffer(ctx, c.sample)
	if err != nil {
		c.bufferReadErrors.Add(1)
	} else {
		gauge(c.pending, float64(b.Pending))
		gauge(c.inflight, float64(b.InFlight))
		if c.sample > 0 {
			gauge(c.oldestAge, b.OldestAge().Seconds())
		}
	}
	ch <- prometheus.MustNewConstMetric(c.bufferErrors, prometheus.CounterValue, float64(c.bufferReadErrors.Load()))
}

// StartFlush times a flush run for lastseen_flush_duration_seconds.
func (c *Collector) StartFlush(ctx context.Context) (context.Context, func(lastseen.FlushResult, error)) {
	start := c.now()
	return ctx, func(_ lastseen.FlushResult, err error) {
		c.flushDuration.WithLabelValues(result(err)).Observe(c.now().Sub(start).Seconds())
	}
}

// StartPurge times a purge run for lastseen_purge_duration_seconds; runs
// that did not get the lock are counted in lastseen_purge_runs_total only.
func (c *Collector) StartPurge(ctx context.Context) (context.Context, func(lastseen.PurgeResult, error)) {
	start := c.now()
	return ctx, func(_ lastseen.PurgeResult, err error) {
		if errors.Is(err, lastseen.ErrLocked) {
			return
		}
		c.purgeDuration.WithLabelValues(result(err)).Observe(c.now().Sub(start).Seconds())
	}
}

// StartRule times a run of rule for lastseen_rule_duration_seconds; runs
// that did not get the rule's lock are counted in lastseen_rule_runs_total
// only.
func (c *Collector) StartRule(ctx context.Context, rule string) (context.Context, func(lastseen.PurgeResult, error)) {
	start := c.now()
	return ctx, func(_ lastseen.PurgeResult, err error) {
		if errors.Is(err, lastseen.ErrLocked) {
			return
		}
		c.ruleDuration.WithLabelValues(rule, result(err)).Observe(c.now().Sub(start).Seconds())
	}
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}
