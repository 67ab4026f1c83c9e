package lastseen

// flushHooks are test hooks called at fixed points of a flush, to stop a
// flusher exactly there (crash tests kill the process at these points). The
// Plugin's hooks field is nil in production; every method is a no-op then.
type flushHooks struct {
	// AfterSwap: the shard's pending hash was just renamed to in-flight.
	AfterSwap func(shard int)
	// AfterCommit: batch number batch (from 1) of the shard committed in the
	// database; it is still in the in-flight hash.
	AfterCommit func(shard, batch int)
	// AfterAck: the batch was removed from the in-flight hash; the next
	// batch has not started.
	AfterAck func(shard, batch int)
	// BeforeUnlink: every batch is written and acknowledged; the final
	// acknowledgement, which unlinks the in-flight hash, comes next.
	BeforeUnlink func(shard int)
	// AfterBacklogTake: a flush took n entries out of the backlog to replay
	// them into Redis; touches that fail now find an empty backlog.
	AfterBacklogTake func(n int)
	// LockRefreshed: the lock under key was refreshed by its keeper
	// (lockKeeper), while the flush or purge holding it runs.
	LockRefreshed func(key string)
}

func (h *flushHooks) afterBacklogTake(n int) {
	if h != nil && h.AfterBacklogTake != nil {
		h.AfterBacklogTake(n)
	}
}

func (h *flushHooks) lockRefreshed(key string) {
	if h != nil && h.LockRefreshed != nil {
		h.LockRefreshed(key)
	}
}

func (h *flushHooks) afterSwap(shard int) {
	if h != nil && h.AfterSwap != nil {
		h.AfterSwap(shard)
	}
}

func (h *flushHooks) afterCommit(shard, batch int) {
	if h != nil && h.AfterCommit != nil {
		h.AfterCommit(shard, batch)
	}
}

func (h *flushHooks) afterAck(shard, batch int) {
	if h != nil && h.AfterAck != nil {
		h.AfterAck(shard, batch)
	}
}

func (h *flushHooks) beforeUnlink(shard int) {
	if h != nil && h.BeforeUnlink != nil {
		h.BeforeUnlink(shard)
	}
}
