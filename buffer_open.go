package lastseen

import (
	"log/slog"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/buffer/memory"
	"github.com/lastseen/lastseen/internal/buffer/redisbuf"
)

// openBuffer returns the plugin's buffer: Redis when Config.Redis holds a
// client, else in process. It is the one place that chooses, and that
// hands the buffer what it needs of the plugin: the settings, the clock,
// the logger, the counters and the test seam's hooks.
func (p *Plugin) openBuffer() buffer.Buffer {
	presence := buffer.Presence{OnlineWindow: p.cfg.OnlineWindow, ActiveRetention: p.cfg.ActiveUsersRetention}
	if !hasRedis(p.cfg) {
		return memory.New(memory.Options{Prefix: p.cfg.Prefix, Shards: p.cfg.Shards, Presence: presence, Now: p.cfg.Now})
	}
	var drops rateLimitedLog // one line per reason per interval (logs.go)
	log := p.log
	var hooks redisbuf.Hooks
	if h := p.hooks; h != nil {
		hooks = redisbuf.Hooks{BacklogTaken: h.BacklogTaken, LockRefreshed: h.Refreshed}
	}
	return redisbuf.New(redisbuf.Options{
		Client:            p.cfg.Redis,
		Prefix:            p.cfg.Prefix,
		Shards:            p.cfg.Shards,
		Throttle:          p.cfg.Throttle,
		TouchTimeout:      p.cfg.TouchTimeout,
		LockTTL:           p.cfg.LockTTL,
		BacklogSize:       p.cfg.BacklogSize,
		BreakerCooldown:   p.cfg.BreakerCooldown,
		RequireNoEviction: p.cfg.RequireNoEviction,
		Presence:          presence,
		Now:               p.cfg.Now,
		Logger:            log,
		LogLimited:        func(level slog.Level, msg string, args ...any) { drops.log(log, level, msg, args...) },
		Counters: redisbuf.Counters{RedisErrors: &p.stats.redisErrors, Canceled: &p.stats.canceled,
			Backlogged: &p.stats.backlogged, BacklogDropped: &p.stats.backlogDropped, Evictions: &p.stats.evictions},
		Hooks: hooks,
	})
}
