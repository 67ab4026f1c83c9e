package lastseen

import (
	"context"

	"github.com/lastseen/lastseen/internal/testseam"
)

// publish hands s, the plugin's own test seam, what the module's black-box
// tests read or call of a live plugin. Initialize calls it once the tracker
// and the scheduler are set, and only with Config.Test.Seam set.
func (p *Plugin) publish(s *testseam.Seam) {
	enc := p.users.model.enc
	v := testseam.Published{
		Buffer:         p.tracker.buf,
		StopTracker:    p.tracker.close,
		FlushJob:       p.flushJob,
		PurgeJob:       p.purgeJob,
		Closing:        p.closing.Done(),
		Handle:         p.ready,
		WriteTarget:    func(ctx context.Context) error { _, err := p.writeTarget(ctx); return err },
		SetMaxParams:   func(n int) { p.dialect = p.dialect.WithMaxParams(n) },
		SchedulesPurge: p.schedulesPurge,
		UsersEncoding:  int(enc.Encoding()),
		UsersNaive:     enc.Naive(),
		TracksActive:   p.sessions != nil && p.sessions.active != nil,
	}
	v.RuleJobs = map[string]func(context.Context){}
	for _, r := range p.rules {
		v.RuleJobs[r.cfg.Name] = p.ruleJob(r)
	}
	if p.sched != nil {
		v.Scheduler, v.JobsContext = p.sched.cron, p.sched.ctx
	}
	s.Published = v
}
