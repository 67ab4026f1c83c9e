package lastseen

// redisBuf returns p's Redis buffer, for tests about Redis itself; it
// panics on a plugin without Redis.
func redisBuf(p *Plugin) *redisBuffer { return p.tracker.buf.(*redisBuffer) }
