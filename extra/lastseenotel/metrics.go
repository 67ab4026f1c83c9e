package lastseenotel

import (
	"context"
	"errors"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// instruments are the observable instruments, read from Plugin.Stats,
// Plugin.RuleStats, Plugin.Breaker and Plugin.SampleBuffer in one callback per collection.
type instruments struct {
	touches, flushRuns, flushEntries, flushSkipped     metric.Int64ObservableCounter
	purgeRuns, purgeDeleted, redisErrors, backlogDrops metric.Int64ObservableCounter
	evictions                                          metric.Int64ObservableCounter
	ruleRuns, ruleActed, ruleBatches, ruleKept         metric.Int64ObservableCounter
	flushDropped, purgeRefused, ruleRefused            metric.Int64ObservableCounter
	bufferReadErrors                                   metric.Int64ObservableCounter
	pending, inflight, backlog, breaker                metric.Int64ObservableGauge
	oldestAge, lastFlush, lastRule                     metric.Float64ObservableGauge
	readErrors                                         atomic.Int64
}

// createInstruments creates every instrument on meter and registers the
// callback. Names are "lastseen." plus a dotted path; units are UCUM ("s")
// or an annotation in braces.
func (i *Instrumentation) createInstruments(meter metric.Meter) error {
	g := &i.gauges
	var errs []error
	counter := func(name, unit, desc string) metric.Int64ObservableCounter {
		c, err := meter.Int64ObservableCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	gauge := func(name, unit, desc string) metric.Int64ObservableGauge {
		c, err := meter.Int64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	fgauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		c, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	hist := func(name, desc string, bounds []float64) metric.Float64Histogram {
		h, err := meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	g.touches = counter("lastseen.touches", "{touch}", "Touch and TouchAt calls by lastseen.result: recorded, throttled, cached, invalid, error.")
	g.pending = gauge("lastseen.buffer.pending", "{user}", "Users in the Redis pending hashes (HLEN).")
	g.inflight = gauge("lastseen.buffer.inflight", "{user}", "Users in the Redis in-flight hashes (HLEN).")
	g.oldestAge = fgauge("lastseen.buffer.oldest_age", "s", "Age of the oldest buffered timestamp, from a bounded sample per hash: exact for small hashes, never overstated; 0 when empty.")
	g.bufferReadErrors = counter("lastseen.buffer.read_errors", "{error}", "Collections whose Redis read of the buffer failed; the buffer gauges are left out of those.")
	g.flushRuns = counter("lastseen.flush.runs", "{run}", "Flush runs by lastseen.result: ok or error.")
	g.flushEntries = counter("lastseen.flush.entries", "{entry}", "Buffered entries a flush took, by lastseen.outcome: written, unknown, stale, rejected, failed, uncomparable, ambiguous.")
	g.flushDropped = counter("lastseen.flush.dropped", "{entry}", "Buffered timestamps dropped for good: refused by the database Flush.MaxRefusals times (each refusal also counted failed), or left in the in-process buffer at Close.")
	g.purgeRefused = counter("lastseen.purge.refused", "{session}", "Expired session rows the database refused to delete, skipped, counted at each purge that met them.")
	g.ruleRefused = counter("lastseen.rule.refused", "{row}", "Inactive rows the database refused to act on, skipped, by lastseen.rule.")
	g.flushSkipped = counter("lastseen.flush.skipped_shards", "{shard}", "Shards a flush skipped because another instance held their lock.")
	g.lastFlush = fgauge("lastseen.flush.last_success", "s", "Unix time at which the last flush run without error ended; absent before the first.")
	g.purgeRuns = counter("lastseen.purge.runs", "{run}", "Purge runs by lastseen.result: ok, error or locked.")
	g.purgeDeleted = counter("lastseen.purge.deleted", "{session}", "Expired session rows deleted by purges.")
	g.ruleRuns = counter("lastseen.rule.runs", "{run}", "Inactivity rule runs by lastseen.rule and lastseen.result: ok, error or locked.")
	g.ruleActed = counter("lastseen.rule.acted", "{row}", "Inactive rows rule runs acted on (deleted, or handed to the rule's Action), by lastseen.rule.")
	g.ruleBatches = counter("lastseen.rule.batches", "{batch}", "Transactions rule runs committed, by lastseen.rule; a batch whose rows were all held back by buffered activity opens none.")
	g.ruleKept = counter("lastseen.rule.kept", "{row}", "Inactive rows rule runs left because their newer activity was still buffered (or the buffer could not be read), by lastseen.rule.")
	g.lastRule = fgauge("lastseen.rule.last_success", "s", "Unix time at which the last run of the rule without error ended, by lastseen.rule; absent before the first.")
	g.redisErrors = counter("lastseen.redis.errors", "{error}", "Redis calls that failed or timed out, by lastseen.operation (touch).")
	g.backlog = gauge("lastseen.backlog.size", "{user}", "Users kept in this process's memory because Redis did not answer.")
	g.backlogDrops = counter("lastseen.backlog.dropped", "{touch}", "Touches dropped because the in-process backlog was full.")
	g.evictions = counter("lastseen.redis.evicted_keys", "{key}", "Keys Redis evicted (INFO stats evicted_keys, every master) seen by the plugin's checks; any increase means buffered timestamps may be lost.")
	g.breaker = gauge("lastseen.breaker.state", "1", "Circuit breaker in front of Redis, per lastseen.state: 1 for the current state, 0 for the others.")
	i.flushDuration = hist("lastseen.flush.duration", "Duration of flush runs by lastseen.result: ok or error.", FlushBuckets)
	i.purgeDuration = hist("lastseen.purge.duration", "Duration of purge runs that held the lock, by lastseen.result: ok or error.", PurgeBuckets)
	i.ruleDuration = hist("lastseen.rule.duration", "Duration of inactivity rule runs that held the rule's lock, by lastseen.rule and lastseen.result: ok or error.", PurgeBuckets)
	if err := errors.Join(errs...); err != nil {
		return err
	}
	reg, err := meter.RegisterCallback(i.observe, g.touches, g.pending, g.inflight, g.oldestAge, g.bufferReadErrors,
		g.flushRuns, g.flushEntries, g.flushSkipped, g.lastFlush, g.purgeRuns, g.purgeDeleted, g.redisErrors,
		g.backlog, g.backlogDrops, g.breaker, g.evictions, g.ruleRuns, g.ruleActed, g.ruleBatches, g.ruleKept, g.lastRule,
		g.flushDropped, g.purgeRefused, g.ruleRefused)
	if err != nil {
		return err
	}
	i.reg = reg
	return nil
}

// observe is the metrics callback.
func (i *Instrumentation) observe(ctx context.Context, o metric.Observer) error {
	g := &i.gauges
	s := i.p.Stats()
	res := func(v string) attribute.KeyValue { return attribute.String("lastseen.result", v) }
	o.ObserveInt64(g.touches, s.Recorded, i.with(res("recorded")))
	o.ObserveInt64(g.touches, s.Throttled-s.CacheHits, i.with(res("throttled")))
	o.ObserveInt64(g.touches, s.CacheHits, i.with(res("cached")))
	o.ObserveInt64(g.touches, s.Invalid, i.with(res("invalid")))
	o.ObserveInt64(g.touches, s.RedisErrors, i.with(res("error")))
	o.ObserveInt64(g.flushRuns, s.Flushes-s.FlushErrors, i.with(res("ok")))
	o.ObserveInt64(g.flushRuns, s.FlushErrors, i.with(res("error")))
	for _, e := range []struct {
		outcome string
		n       int64
	}{{"written", s.RowsWritten}, {"unknown", s.Unknown}, {"stale", s.Stale}, {"rejected", s.Rejected}, {"failed", s.Failed},
		{"uncomparable", s.Uncomparable}, {"ambiguous", s.Ambiguous}} {
		o.ObserveInt64(g.flushEntries, e.n, i.with(attribute.String("lastseen.outcome", e.outcome)))
	}
	o.ObserveInt64(g.flushDropped, s.Dropped, i.with())
	o.ObserveInt64(g.flushSkipped, s.FlushSkipped, i.with())
	if !s.LastFlush.IsZero() {
		o.ObserveFloat64(g.lastFlush, float64(s.LastFlush.UnixNano())/1e9, i.with())
	}
	o.ObserveInt64(g.purgeRuns, s.Purges-s.PurgeErrors, i.with(res("ok")))
	o.ObserveInt64(g.purgeRuns, s.PurgeErrors, i.with(res("error")))
	o.ObserveInt64(g.purgeRuns, s.PurgeSkipped, i.with(res("locked")))
	o.ObserveInt64(g.purgeDeleted, s.SessionsDeleted, i.with())
	o.ObserveInt64(g.purgeRefused, s.PurgeRefused, i.with())
	for _, r := range i.p.RuleStats() {
		rule := attribute.String("lastseen.rule", r.Name)
		o.ObserveInt64(g.ruleRuns, r.Runs-r.Errors, i.with(rule, res("ok")))
		o.ObserveInt64(g.ruleRuns, r.Errors, i.with(rule, res("error")))
		o.ObserveInt64(g.ruleRuns, r.Skipped, i.with(rule, res("locked")))
		o.ObserveInt64(g.ruleActed, r.Rows, i.with(rule))
		o.ObserveInt64(g.ruleBatches, r.Batches, i.with(rule))
		o.ObserveInt64(g.ruleKept, r.Kept, i.with(rule))
		o.ObserveInt64(g.ruleRefused, r.Refused, i.with(rule))
		if !r.LastRun.IsZero() {
			o.ObserveFloat64(g.lastRule, float64(r.LastRun.UnixNano())/1e9, i.with(rule))
		}
	}
	o.ObserveInt64(g.redisErrors, s.RedisErrors, i.with(attribute.String("lastseen.operation", "touch")))
	o.ObserveInt64(g.backlog, s.Backlog, i.with())
	o.ObserveInt64(g.backlogDrops, s.BacklogDropped, i.with())
	o.ObserveInt64(g.evictions, s.Evictions, i.with())
	state := i.p.Breaker()
	for _, st := range []string{"closed", "half-open", "open"} {
		v := int64(0)
		if st == state {
			v = 1
		}
		o.ObserveInt64(g.breaker, v, i.with(attribute.String("lastseen.state", string(st))))
	}
	ctx, cancel := context.WithTimeout(ctx, i.timeout)
	defer cancel()
	if b, err := i.p.SampleBuffer(ctx, i.sample); err != nil {
		g.readErrors.Add(1)
	} else {
		o.ObserveInt64(g.pending, b.Pending, i.with())
		o.ObserveInt64(g.inflight, b.InFlight, i.with())
		if i.sample > 0 {
			o.ObserveFloat64(g.oldestAge, b.OldestAge().Seconds(), i.with())
		}
	}
	o.ObserveInt64(g.bufferReadErrors, g.readErrors.Load(), i.with())
	return nil
}
