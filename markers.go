package lastseen

import "time"

// Throttle markers in Redis (lua/touch.lua). A marker per user as a key of
// its own costs about 117 bytes of Redis memory; as a field of a small
// hash, which Redis keeps in its compact listpack encoding, about 10 (an
// integer id and a small integer value). So the markers of shard N, bucket
// b are fields of one hash per generation: the plugin's clock cut into
// periods of one throttle window (Config.Throttle),
//
//	<prefix>:{N}:seen:<b>:<s>   s = the generation's start, Unix ms, a
//	                            multiple of Throttle in ms
//
// A field holds the end of the user's window in ms from s, a small integer;
// the hash expires at the end of the next generation, when every window it
// holds has ended (a window is at most one Throttle long). Windows stay
// sliding, anchored at the time seen (tracker.window): a touch reads the
// user's field in the previous, the current and the next generation and is
// throttled while any of them is still open. Naming a generation by its
// start keeps instances whose Throttle differs (logged by the manifest
// check) from misreading each other's offsets: they use other keys, or
// the same start.

// generation is where the plugin's clock stands among the marker
// generations.
type generation struct {
	start  int64 // Unix ms: a multiple of length
	into   int64 // ms since start
	length int64 // ms: the throttle window
}

// generation returns the marker generation at now.
func (b *redisBuffer) generation(now time.Time) generation {
	length := max(b.throttle.Milliseconds(), 1)
	ms := now.UnixMilli()
	n := ms / length
	if ms < 0 && ms%length != 0 {
		n-- // floor: clocks before 1970 are refused earlier, but keep the arithmetic right
	}
	return generation{start: n * length, into: ms - n*length, length: length}
}
