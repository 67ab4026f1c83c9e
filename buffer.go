package lastseen

import (
	_ "embed"
	"strconv"
	"time"

	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// MaxClockSkew is how far in the future a timestamp may lie, against the
// plugin's clock, and still be accepted by TouchAt or by a flush reading it
// back from Redis.
const MaxClockSkew = time.Hour

// Redis keys. Every key of shard N carries the hash tag "{N}", so one Lua
// script or RENAME only ever touches keys of one Redis Cluster slot; inside
// a shard a user's entries live in one of keys.Buckets(Shards) buckets, so
// that each hash stays listpack-encoded (small and compact):
//
//	<prefix>:{N}:pending:<b>     hash: user id -> Unix microseconds (UTC)
//	<prefix>:{N}:inflight:<b>    hash: the pending hash a flush is writing
//	<prefix>:{N}:seen:<b>:<s>    hash: user id -> end of its throttle window,
//	                             ms from s, its generation's start in Unix ms
//	                             (markers.go)
//	<prefix>:{N}:lock            redislock lock of the shard's flusher
//	<prefix>:{N}:refusals        hash: user id -> times the database refused its entry
//	<prefix>:{N}:online:<m>      HyperLogLog of users whose touch opened a
//	                             window in Unix minute m (Online)
//	<prefix>:{N}:active:<day>    HyperLogLog of the same per UTC day,
//	                             day as 2006-01-02 (ActiveUsers)
//
// internal/keys names them (the CLI and the benchmark use it too).
type shardKeys struct {
	keys.Shard
	pending, inflight []string // by bucket
	buffered          []string // pending then in-flight: what swap.lua, sample.lua and active name
	lock, refusals    string
	online, active    string // key prefixes: add the minute or the day
}

func newShardKeys(prefix string, n, shards int) shardKeys {
	k := keys.ForShard(prefix, n, shards)
	pending, inflight := k.AllPending(), k.AllInFlight()
	return shardKeys{Shard: k, pending: pending, inflight: inflight, buffered: append(pending[:len(pending):len(pending)], inflight...),
		lock: k.Lock, refusals: k.Refusals, online: k.Online, active: k.Active}
}

// The buffer's Lua scripts, one per file in lua/, each starting with a
// comment that lists its KEYS and ARGV and what it returns. Every script
// touches the keys of one shard only (one Redis Cluster slot).
var (
	//go:embed lua/touch.lua
	touchLua string
	//go:embed lua/merge.lua
	mergeLua string
	//go:embed lua/swap.lua
	swapLua string
	//go:embed lua/ack.lua
	ackLua string
	//go:embed lua/fail.lua
	failLua string
	//go:embed lua/sample.lua
	sampleLua string
	//go:embed lua/read.lua
	readLua string

	// touchScript records one touch: sets the throttle marker if absent
	// and then raises the pending timestamp (touch).
	touchScript = redis.NewScript(touchLua)
	// mergeScript raises pending timestamps without markers; it replays
	// the backlog (replayBacklog).
	mergeScript = redis.NewScript(mergeLua)
	// swapScript renames the pending hash to in-flight under the shard
	// lock (shardRun.run).
	swapScript = redis.NewScript(swapLua)
	// ackScript removes committed entries from the in-flight hash, clears
	// their refusal counts and refreshes the shard lock (shardRun.ack).
	ackScript = redis.NewScript(ackLua)
	// failScript moves refused entries back to pending, counting their
	// refusals, and drops those refused MaxRefusals times (shardRun.requeue).
	failScript = redis.NewScript(failLua)
	// readScript reads users' pending and in-flight values of one shard
	// (redisBuffer.newest).
	readScript = redis.NewScript(readLua)
	// sampleScript reads the sizes of one shard's pending and in-flight
	// sets and samples their values (redisBuffer.sample).
	sampleScript = redis.NewScript(sampleLua)
)

// micros converts a time to the stored form: Unix microseconds, UTC.
func micros(at time.Time) int64 { return at.UnixMicro() }

// maxMicros is 9999-12-31T23:59:59.999999Z, the last instant every dialect
// stores.
var maxMicros = time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC).UnixMicro()

// parseMicros reads a stored timestamp back. It accepts a decimal integer of
// Unix microseconds from 1970 up to now+MaxClockSkew and reports anything
// else (garbage, negative, far future, written by hand or by another
// version) as not ok.
func parseMicros(s string, now time.Time) (time.Time, bool) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n > maxMicros || n > now.Add(MaxClockSkew).UnixMicro() {
		return time.Time{}, false
	}
	return time.UnixMicro(n).UTC(), true
}

// ceiling is the latest stored value a flush at now accepts (parseMicros):
// Unix microseconds of now+MaxClockSkew, at most 9999-12-31.
func ceiling(now time.Time) int64 { return min(micros(now.Add(MaxClockSkew)), maxMicros) }
