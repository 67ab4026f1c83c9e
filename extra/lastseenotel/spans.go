package lastseenotel

import (
	"context"

	"github.com/lastseen/lastseen"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// Span names: "{db.operation.name} {db.collection.name}" as the database
// semantic conventions name a span, with " shard" or " batch" for the
// children; the shard or batch number is an attribute, never in the name.
// Spans are of kind Internal: each wraps many Redis and SQL calls (a GORM
// tracing plugin's client spans nest under them).

// StartFlush starts the "flush <table>" span and times the run for
// lastseen.flush.duration. The span ends with the run's counts as
// lastseen.* attributes, and an error status when the run failed.
func (i *Instrumentation) StartFlush(ctx context.Context) (context.Context, func(lastseen.FlushResult, error)) {
	start := i.now()
	ctx, span := i.tracer.Start(ctx, "flush "+i.flushSpan[1].Value.AsString(),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.flushSpan...))
	return ctx, func(r lastseen.FlushResult, err error) {
		i.flushDuration.Record(ctx, i.now().Sub(start).Seconds(), i.with(attribute.String("lastseen.result", result(err))))
		span.SetAttributes(flushCounts(r)...)
		span.SetAttributes(attribute.Int("lastseen.shards", r.Shards), attribute.Int("lastseen.skipped_shards", r.Skipped))
		endSpan(span, err)
	}
}

// StartFlushShard starts the "flush <table> shard" child span, with the
// shard number in lastseen.shard.
func (i *Instrumentation) StartFlushShard(ctx context.Context, shard int) (context.Context, func(lastseen.FlushResult, error)) {
	ctx, span := i.tracer.Start(ctx, "flush "+i.flushSpan[1].Value.AsString()+" shard",
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.flushSpan...),
		trace.WithAttributes(attribute.Int("lastseen.shard", shard)))
	return ctx, func(r lastseen.FlushResult, err error) {
		span.SetAttributes(flushCounts(r)...)
		span.SetAttributes(attribute.Bool("lastseen.skipped", r.Skipped > 0))
		endSpan(span, err)
	}
}

// StartPurge starts the "purge <sessions table>" span and times the run for
// lastseen.purge.duration (runs that did not get the lock are not timed;
// their span has lastseen.result "locked" and no error status).
func (i *Instrumentation) StartPurge(ctx context.Context) (context.Context, func(lastseen.PurgeResult, error)) {
	start := i.now()
	ctx, span := i.tracer.Start(ctx, "purge "+i.purgeSpan[1].Value.AsString(),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.purgeSpan...))
	return ctx, func(r lastseen.PurgeResult, err error) {
		res := result(err)
		span.SetAttributes(attribute.String("lastseen.result", res), attribute.Int("lastseen.deleted", r.Deleted),
			attribute.Int("lastseen.batches", r.Batches), attribute.Int("lastseen.retries", r.Retries))
		if res == "locked" {
			span.End()
			return
		}
		i.purgeDuration.Record(ctx, i.now().Sub(start).Seconds(), i.with(attribute.String("lastseen.result", res)))
		endSpan(span, err)
	}
}

// StartPurgeBatch starts the "purge <sessions table> batch" child span, with
// the batch number in lastseen.batch.
func (i *Instrumentation) StartPurgeBatch(ctx context.Context, batch int) (context.Context, func(int, error)) {
	ctx, span := i.tracer.Start(ctx, "purge "+i.purgeSpan[1].Value.AsString()+" batch",
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.purgeSpan...),
		trace.WithAttributes(attribute.Int("lastseen.batch", batch)))
	return ctx, func(deleted int, err error) {
		span.SetAttributes(attribute.Int("lastseen.deleted", deleted))
		endSpan(span, err)
	}
}

// StartRule starts the "rule <rule's table>" span of a run of rule, with
// db.operation.name "rule" and the rule's name in lastseen.rule, and times
// the run for lastseen.rule.duration (runs that did not get the rule's lock
// are not timed; their span has lastseen.result "locked" and no error
// status). The span ends with lastseen.acted (the rows acted on),
// lastseen.kept, lastseen.batches and lastseen.retries.
func (i *Instrumentation) StartRule(ctx context.Context, rule string) (context.Context, func(lastseen.PurgeResult, error)) {
	start := i.now()
	table := i.ruleTables[rule]
	ctx, span := i.tracer.Start(ctx, "rule "+table,
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.ruleSpan(rule, table)...))
	return ctx, func(r lastseen.PurgeResult, err error) {
		res := result(err)
		span.SetAttributes(attribute.String("lastseen.result", res), attribute.Int("lastseen.acted", r.Deleted),
			attribute.Int("lastseen.kept", r.Kept), attribute.Int("lastseen.batches", r.Batches), attribute.Int("lastseen.retries", r.Retries))
		if res == "locked" {
			span.End()
			return
		}
		i.ruleDuration.Record(ctx, i.now().Sub(start).Seconds(),
			i.with(attribute.String("lastseen.rule", rule), attribute.String("lastseen.result", res)))
		endSpan(span, err)
	}
}

// StartRuleBatch starts the "rule <rule's table> batch" child span, with
// the batch number in lastseen.batch; it ends with lastseen.acted.
func (i *Instrumentation) StartRuleBatch(ctx context.Context, rule string, batch int) (context.Context, func(int, error)) {
	table := i.ruleTables[rule]
	ctx, span := i.tracer.Start(ctx, "rule "+table+" batch",
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(i.ruleSpan(rule, table)...),
		trace.WithAttributes(attribute.Int("lastseen.batch", batch)))
	return ctx, func(acted int, err error) {
		span.SetAttributes(attribute.Int("lastseen.acted", acted))
		endSpan(span, err)
	}
}

// ruleSpan is the attributes of a rule's spans.
func (i *Instrumentation) ruleSpan(rule, table string) []attribute.KeyValue {
	return []attribute.KeyValue{attribute.String("db.system.name", i.system), attribute.String("db.collection.name", table),
		attribute.String("db.operation.name", "rule"), attribute.String("lastseen.rule", rule)}
}

func flushCounts(r lastseen.FlushResult) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.Int("lastseen.drained", r.Drained), attribute.Int("lastseen.written", r.Written),
		attribute.Int("lastseen.unknown", r.Unknown), attribute.Int("lastseen.stale", r.Stale),
		attribute.Int("lastseen.rejected", r.Rejected), attribute.Int("lastseen.failed", r.Failed),
		attribute.Int("lastseen.batches", r.Batches),
	}
}

// endSpan ends span, with an error status and the error recorded as an
// event when err is not nil.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
