package lastseen

import (
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"
)

// FuzzCheckSchedule: a schedule is accepted only when every ";"-separated
// spec parses as robfig/cron parses it and no "@every" (behind a TZ= or
// CRON_TZ= prefix or not) is under 1s; every refusal wraps
// ErrInvalidConfig and names the option. Seeds: testdata/fuzz.
func FuzzCheckSchedule(f *testing.F) {
	f.Fuzz(func(t *testing.T, specs string) {
		err := checkSchedule("Flush.Schedule", specs)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "lastseen: invalid config: Flush.Schedule ") {
				t.Fatalf("checkSchedule(%q) = %v: the message does not name the option", specs, err)
			}
			return
		}
		list := splitSpecs(specs)
		if len(list) == 0 {
			t.Fatalf("checkSchedule(%q) accepted no spec", specs)
		}
		for _, spec := range list {
			if _, err := cron.ParseStandard(spec); err != nil {
				t.Fatalf("checkSchedule(%q) accepted %q, which robfig/cron refuses: %v", specs, spec, err)
			}
			if every, ok := strings.CutPrefix(withoutZone(spec), "@every"); ok {
				if d, err := time.ParseDuration(strings.TrimSpace(every)); err == nil && d < time.Second {
					t.Fatalf("checkSchedule(%q) accepted an interval of %v", specs, d)
				}
			}
		}
	})
}
