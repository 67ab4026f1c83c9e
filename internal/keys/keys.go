// Package keys is the Redis key layout of the lastseen buffer: the one place
// that names the keys, for the library (buffer.go, purge.go) and for its
// tools in cmd/lastseen, which fill, inspect and clean the buffer directly.
//
// Every key of shard N carries the Redis Cluster hash tag "{N}", so one Lua
// script or RENAME only ever touches keys of one cluster slot:
//
//	<prefix>:{N}:pending       hash: user id -> Unix microseconds (UTC)
//	<prefix>:{N}:inflight      hash: the pending hash a flush is writing
//	<prefix>:{N}:lock          redislock lock of the shard's flusher
//	<prefix>:{N}:seen:<user>   throttle marker, PX = throttle window
//	<prefix>:{N}:refusals      hash: user id -> times the database refused its entry
//	<prefix>:{N}:online:<m>    HyperLogLog of users whose touch opened a
//	                           window in Unix minute m (Plugin.Online)
//	<prefix>:{N}:active:<day>  HyperLogLog of the same per UTC day,
//	                           day as 2006-01-02 (Plugin.ActiveUsers)
//	<prefix>:purge:lock        redislock lock of the session purge
package keys

import (
	"hash/fnv"
	"strconv"
)

// MaxShards is the largest shard count a Config accepts.
const MaxShards = 1024

// Shard holds the keys of one shard. Marker, Online and Active are key
// prefixes: the user id, the Unix minute or the UTC day is appended.
type Shard struct {
	Pending, InFlight, Lock, Marker, Refusals string
	Online, Active                            string
}

// ForShard returns the keys of shard n (0 <= n < shards) under prefix.
func ForShard(prefix string, n int) Shard {
	tag := prefix + ":{" + strconv.Itoa(n) + "}:"
	return Shard{Pending: tag + "pending", InFlight: tag + "inflight", Lock: tag + "lock", Marker: tag + "seen:",
		Refusals: tag + "refusals", Online: tag + "online:", Active: tag + "active:"}
}

// ShardOf returns the shard of a user id in its stored text form (decimal
// for integer ids): FNV-1a 32 of the text, modulo shards. Every instance
// sharing a prefix must use the same shard count to agree on it.
func ShardOf(uid string, shards int) int {
	h := fnv.New32a()
	h.Write([]byte(uid))
	return int(h.Sum32() % uint32(shards))
}

// PurgeLock returns the key of the purge lock under prefix.
func PurgeLock(prefix string) string { return prefix + ":purge:lock" }

// All returns a Redis SCAN/KEYS pattern matching every key under prefix
// (glob characters in prefix are escaped).
func All(prefix string) string { return escape(prefix) + ":*" }

// escape backslash-escapes the characters Redis glob patterns treat
// specially (* ? [ ] \), so that a prefix matches only itself.
func escape(s string) string {
	out := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '*', '?', '[', ']', '\\':
			out = append(out, '\\')
		}
		out = append(out, s[i])
	}
	return string(out)
}
