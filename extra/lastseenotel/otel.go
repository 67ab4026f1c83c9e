// Package lastseenotel reports a lastseen plugin to OpenTelemetry: metrics
// with the meanings of the Prometheus collector in extra/lastseenprom, and a
// span per flush, per purge and per inactivity rule run, with a child span
// per shard and per purge or rule batch. It is a module of its own so that the lastseen module does not
// depend on OpenTelemetry.
//
//	p := lastseen.New(lastseen.Config{Redis: rdb})
//	if err := db.Use(p); err != nil { ... }
//	inst, err := lastseenotel.New(p) // global providers, or WithMeterProvider/WithTracerProvider
//	defer inst.Close()
//
// Attributes follow the OpenTelemetry database semantic conventions:
// db.system.name (postgresql, mysql or sqlite), db.collection.name (the
// table) and, on spans, db.operation.name (flush, purge or rule). The
// instruments and spans of inactivity rules carry lastseen.rule (Rule.Name).
// No attribute holds a user id.
package lastseenotel

import (
	"errors"
	"fmt"
	"time"

	"github.com/lastseen/lastseen"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the meter and the tracer: this
// package's import path.
const ScopeName = "github.com/lastseen/lastseen/extra/lastseenotel"

// maxBufferSample is the largest perHash Plugin.SampleBuffer accepts: the
// library's limit, repeated here to check the option before the first
// collection.
const maxBufferSample = 1000

// Defaults of the options.
const (
	// DefaultBufferSample is the number of entries sampled per Redis hash
	// for lastseen.buffer.oldest_age (Plugin.SampleBuffer's perHash).
	DefaultBufferSample = 16
	// DefaultCollectTimeout bounds the Redis read of one metrics collection.
	DefaultCollectTimeout = time.Second
)

// Bucket boundaries of the duration histograms, in seconds (the same as
// extra/lastseenprom's).
var (
	FlushBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
	PurgeBuckets = []float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 1800, 3600}
)

type options struct {
	mp      metric.MeterProvider
	tp      trace.TracerProvider
	sample  int
	timeout time.Duration
}

// Option configures New.
type Option func(*options)

// WithMeterProvider sets the meter provider; default otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option { return func(o *options) { o.mp = mp } }

// WithTracerProvider sets the tracer provider; default
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option { return func(o *options) { o.tp = tp } }

// WithBufferSample sets how many entries per Redis hash a collection samples
// for lastseen.buffer.oldest_age: 0 to 1000, default
// DefaultBufferSample; 0 leaves that gauge out. See Plugin.SampleBuffer.
func WithBufferSample(perHash int) Option { return func(o *options) { o.sample = perHash } }

// WithCollectTimeout bounds the Redis read of one collection; default
// DefaultCollectTimeout.
func WithCollectTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// Instrumentation is the OpenTelemetry view of one plugin. It observes the
// plugin's flushes, purges and rule runs (lastseen.Observer) from New on.
type Instrumentation struct {
	p       *lastseen.Plugin
	tracer  trace.Tracer
	sample  int
	timeout time.Duration
	now     func() time.Time // measures run durations; tests replace it
	reg     metric.Registration

	common        attribute.Set // db.system.name, db.collection.name (users table)
	flushSpan     []attribute.KeyValue
	purgeSpan     []attribute.KeyValue
	system        string            // db.system.name
	ruleTables    map[string]string // each rule's table, by rule name
	flushDuration metric.Float64Histogram
	purgeDuration metric.Float64Histogram
	ruleDuration  metric.Float64Histogram
	gauges        instruments
}

var _ lastseen.Observer = (*Instrumentation)(nil)

// New creates the instruments on the meter named ScopeName, registers their
// callback and makes the instrumentation observe p. p must be initialized
// (db.Use). Errors: lastseen.ErrNotInitialized, an option out of range, or
// the meter's error wrapped; nothing is observed after an error.
func New(p *lastseen.Plugin, opts ...Option) (*Instrumentation, error) {
	target, err := p.Target()
	if err != nil {
		return nil, fmt.Errorf("lastseenotel: %w", err)
	}
	o := options{sample: DefaultBufferSample, timeout: DefaultCollectTimeout}
	for _, opt := range opts {
		opt(&o)
	}
	if o.sample < 0 || o.sample > maxBufferSample {
		return nil, fmt.Errorf("lastseenotel: buffer sample is %d, want 0 to %d", o.sample, maxBufferSample)
	}
	if o.timeout <= 0 {
		return nil, fmt.Errorf("lastseenotel: collect timeout is %v, want a positive duration", o.timeout)
	}
	if o.mp == nil {
		o.mp = otel.GetMeterProvider()
	}
	if o.tp == nil {
		o.tp = otel.GetTracerProvider()
	}
	system := DBSystem(target.Dialect)
	i := &Instrumentation{
		p: p, tracer: o.tp.Tracer(ScopeName), sample: o.sample, timeout: o.timeout, now: time.Now,
		system: system, ruleTables: map[string]string{},
		common: attribute.NewSet(attribute.String("db.system.name", system), attribute.String("db.collection.name", target.Table)),
		flushSpan: []attribute.KeyValue{attribute.String("db.system.name", system),
			attribute.String("db.collection.name", target.Table), attribute.String("db.operation.name", "flush")},
		purgeSpan: []attribute.KeyValue{attribute.String("db.system.name", system),
			attribute.String("db.collection.name", target.SessionTable), attribute.String("db.operation.name", "purge")},
	}
	for _, r := range p.RuleStats() {
		i.ruleTables[r.Name] = r.Table
	}
	meter := o.mp.Meter(ScopeName)
	if err := i.createInstruments(meter); err != nil {
		return nil, fmt.Errorf("lastseenotel: %w", err)
	}
	p.AddObserver(i)
	return i, nil
}

// Close unregisters the metrics callback; the spans and histograms of runs
// keep being recorded (an observer cannot be removed from a plugin).
func (i *Instrumentation) Close() error {
	if err := i.reg.Unregister(); err != nil {
		return fmt.Errorf("lastseenotel: unregister: %w", err)
	}
	return nil
}

// DBSystem maps a GORM dialector name to the semantic conventions'
// db.system.name: "postgres" to "postgresql"; "mysql" (also used for
// MariaDB by gorm.io/driver/mysql) and "sqlite" as they are.
func DBSystem(dialect string) string {
	if dialect == "postgres" {
		return "postgresql"
	}
	return dialect
}

// with returns the common attributes plus kv.
func (i *Instrumentation) with(kv ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributeSet(attribute.NewSet(append(i.common.ToSlice(), kv...)...))
}

func result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lastseen.ErrLocked):
		return "locked"
	}
	return "error"
}
