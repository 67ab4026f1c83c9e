package lastseen

import (
	"fmt"
	"reflect"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/dialect"
	"github.com/robfig/cron/v3"
)

// invalid returns a configuration problem: ErrInvalidConfig wrapped with the
// formatted message.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// checkConfig returns the first problem with c's values on dialect d, in the
// order of Config's fields; Initialize calls it before resolving the models.
func checkConfig(c settings, d *dialect.Dialect) error {
	for _, check := range []func(settings, *dialect.Dialect) error{checkBuffer, checkFlush, checkPurge, checkIdle, checkRules, checkCounts} {
		if err := check(c, d); err != nil {
			return err
		}
	}
	for _, s := range []struct {
		name, spec string
		off        bool
	}{{"Flush.Schedule", c.FlushSchedule, c.DisableFlush}, {"Sessions.Schedule", c.PurgeSchedule, c.UnscheduledPurge}} {
		if s.off {
			continue
		}
		if err := checkSchedule(s.name, s.spec); err != nil {
			return err
		}
	}
	return nil
}

// hasRedis reports whether c.Redis holds a client: neither nil nor a typed
// nil pointer.
func hasRedis(c settings) bool {
	if c.Redis == nil {
		return false
	}
	v := reflect.ValueOf(c.Redis)
	return v.Kind() != reflect.Pointer || !v.IsNil()
}

// checkBuffer checks the request path and buffer settings. A typed nil
// Redis client is refused rather than taken for "no Redis": an app whose
// client was never set up must not silently run each instance on a buffer
// of its own.
func checkBuffer(c settings, _ *dialect.Dialect) error {
	switch {
	case c.Redis != nil && !hasRedis(c):
		return invalid("Config.Redis is a nil %T: give a client, or leave Config.Redis unset for the in-process buffer", c.Redis)
	case strings.ContainsAny(c.Prefix, "{}"):
		return invalid("Buffer.Prefix %q must not contain '{' or '}' (they are Redis Cluster hash tags)", c.Prefix)
	case c.Shards < 1 || c.Shards > 1024:
		return invalid("Buffer.Shards is %d, want 1 to 1024", c.Shards)
	case c.Throttle < time.Millisecond:
		return invalid("Throttle is %v, want at least 1ms", c.Throttle)
	case c.Throttle > maxThrottle:
		return invalid("Throttle is %v, want at most %v (31 days)", c.Throttle, maxThrottle)
	case c.TouchTimeout < time.Millisecond:
		return invalid("Buffer.TouchTimeout is %v, want at least 1ms", c.TouchTimeout)
	case c.BacklogSize < 0:
		return invalid("BacklogSize is %d, want a positive number", c.BacklogSize)
	case c.BreakerCooldown < 0:
		return invalid("BreakerCooldown is %v, want a positive duration", c.BreakerCooldown)
	case c.MaxIDLength < 1 || c.MaxIDLength > maxIDLengthLimit:
		return invalid("MaxIDLength is %d, want 1 to %d bytes", c.MaxIDLength, maxIDLengthLimit)
	}
	return nil
}

// checkFlush checks the flush settings against the dialect's bind-parameter
// limit.
func checkFlush(c settings, d *dialect.Dialect) error {
	switch {
	case c.BatchSize < 1:
		return invalid("Flush.BatchSize is %d, want 1 to %d", c.BatchSize, d.MaxBatch())
	case c.BatchSize > d.MaxBatch():
		return invalid("Flush.BatchSize %d exceeds the %s limit of %d users per statement (%d bind parameters, 2 per user)",
			c.BatchSize, d.Name(), d.MaxBatch(), d.MaxParams())
	case c.FlushConcurrency < 1 || c.FlushConcurrency > c.Shards:
		return invalid("Flush.Concurrency is %d, want 1 to Buffer.Shards (%d)", c.FlushConcurrency, c.Shards)
	case c.LockTTL < minLockTTL:
		return invalid("LockTTL is %v, want at least %v: the lock is refreshed every third of it, and a shorter one leaves a refresh too little time for a few Redis round trips",
			c.LockTTL, minLockTTL)
	case c.StatementTimeout <= 0:
		return invalid("StatementTimeout is %v, want a positive duration", c.StatementTimeout)
	case c.FlushTimeout < 100*time.Millisecond:
		return invalid("Flush.Timeout is %v, want at least 100ms", c.FlushTimeout)
	}
	return nil
}

// checkPurge checks the purge settings against the dialect's bind-parameter
// limit.
func checkPurge(c settings, d *dialect.Dialect) error {
	switch {
	case c.PurgeBatchSize < 1:
		return invalid("Sessions.BatchSize is %d, want 1 to %d", c.PurgeBatchSize, d.MaxParams()-1)
	case c.PurgeBatchSize > d.MaxParams()-1:
		return invalid("Sessions.BatchSize %d exceeds the %s limit of %d sessions per delete (%d bind parameters, 1 per session and 1 for the cutoff)",
			c.PurgeBatchSize, d.Name(), d.MaxParams()-1, d.MaxParams())
	case c.PurgeBatchTimeout < 0:
		return invalid("PurgeBatchTimeout is %v, want a positive duration", c.PurgeBatchTimeout)
	case c.PurgeTimeout <= 0:
		return invalid("PurgeTimeout is %v, want a positive duration", c.PurgeTimeout)
	}
	return nil
}

// checkSchedule checks one ";"-separated list of robfig/cron specs: at least
// one, each parsing, no "@every" under 1s (robfig/cron silently rounds
// "@every 0s", "@every -1m" or "@every 500ms" up to one second).
func checkSchedule(name, specs string) error {
	list := splitSpecs(specs)
	if len(list) == 0 {
		return invalid("%s %q has no cron spec", name, specs)
	}
	for _, spec := range list {
		if _, err := parseSpec(spec); err != nil {
			return invalid("%s %q: %v", name, spec, err)
		}
		if every, ok := strings.CutPrefix(withoutZone(spec), "@every"); ok {
			if d, err := time.ParseDuration(strings.TrimSpace(every)); err == nil && d < time.Second {
				return invalid("%s %q: the interval must be at least 1s", name, spec)
			}
		}
	}
	return nil
}

// parseSpec parses one spec as robfig/cron's standard parser does, whose
// v3.0.1 panics on a time zone without a schedule ("TZ=UTC"): that is an
// error here.
func parseSpec(spec string) (s cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("not a cron spec (%v)", r)
		}
	}()
	if withoutZone(spec) == spec && (strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=")) {
		return nil, fmt.Errorf("a time zone without a schedule")
	}
	return cron.ParseStandard(spec)
}

// withoutZone returns spec without robfig/cron's "TZ=Zone " or
// "CRON_TZ=Zone " prefix.
func withoutZone(spec string) string {
	if strings.HasPrefix(spec, "TZ=") || strings.HasPrefix(spec, "CRON_TZ=") {
		if _, rest, ok := strings.Cut(spec, " "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return spec
}

// splitSpecs splits a ";"-separated schedule into its non-empty specs.
func splitSpecs(s string) []string {
	var specs []string
	for _, spec := range strings.Split(s, ";") {
		if spec = strings.TrimSpace(spec); spec != "" {
			specs = append(specs, spec)
		}
	}
	return specs
}
