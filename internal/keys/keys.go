// Package keys is the Redis key layout of the lastseen buffer: the one place
// that names the keys, for the library (its buffers, its presence counts)
// and for its tools in cmd/lastseen, which fill, inspect and clean the
// buffer directly. The in-process buffer names its presence sets by the
// same keys.
//
// Every key of shard N carries the Redis Cluster hash tag "{N}", so one Lua
// script or RENAME can touch keys of one cluster slot only. Inside a
// shard, users are spread over Buckets(shards) buckets (Locate), so that
// each hash stays small enough for Redis's compact listpack encoding (at
// most hash-max-listpack-entries fields, 512 by default). The presence
// counts are the whole buffer's, not a shard's: one HyperLogLog per minute
// and one per day, all under the hash tag "{presence}" (never a shard's,
// whose tags are numbers), so that a count over several minutes or days is
// one PFCOUNT in one cluster slot:
//
//	<prefix>:{N}:pending:<b>        hash: user id -> Unix microseconds (UTC)
//	<prefix>:{N}:inflight:<b>       hash: the pending hash a flush is writing
//	<prefix>:{N}:window:<b>:<e>     hash: user id -> Unix microseconds (UTC) of
//	                                the touch that opened the user's throttle
//	                                window ending at e (Unix ms), or "" once a
//	                                flush moved it to pending
//	<prefix>:{N}:windows            hash: end e of every window of the shard
//	                                -> entries a flush moved out of it
//	<prefix>:{N}:lock               redislock lock of the shard's flusher
//	<prefix>:{N}:refusals           hash: user id -> times the database refused its entry
//	<prefix>:{presence}:online:<m>  HyperLogLog of the users of every shard whose
//	                                touch opened a window in Unix minute m
//	                                (Plugin.Online)
//	<prefix>:{presence}:active:<d>  HyperLogLog of the same per UTC day d,
//	                                as DayLayout (Plugin.ActiveUsers)
//	<prefix>:purge:lock             redislock lock of the session purge
//	<prefix>:rule:<name>:lock       redislock lock of the inactivity rule <name>
//	<prefix>:manifest               hash: what the buffer is (shards, dialect,
//	                                database, table, column, key type, format)
//
// A prefix holds no '{' or '}' (the plugin refuses them), so the hash tag
// of a shard's key or a presence key ends its prefix: such a key under one
// prefix is never a key under another.
package keys

import (
	"strconv"
	"strings"
	"time"
)

// DayLayout is the time layout of the day in an active-users key
// (Presence.Active).
const DayLayout = "2006-01-02"

// MaxShards is the largest shard count a Config accepts.
const MaxShards = 1024

// TotalBuckets is the number of buckets over all shards: Buckets(shards)
// per shard. 4,096 keeps every hash listpack-encoded (at most 512 fields)
// up to about 2,000,000 users in the pending hashes and as many recorded
// in one throttle window.
const TotalBuckets = 4096

// Buckets returns the number of buckets of each shard: TotalBuckets /
// shards, at least 1.
func Buckets(shards int) int { return max(1, TotalBuckets/shards) }

// Shard holds the keys of one shard.
type Shard struct {
	Lock, Refusals string
	// Buckets is the shard's number of buckets (Buckets(shards)).
	Buckets int
	tag     string
}

// ForShard returns the keys of shard n (0 <= n < shards) under prefix.
func ForShard(prefix string, n, shards int) Shard {
	tag := prefix + ":{" + strconv.Itoa(n) + "}:"
	return Shard{Lock: tag + "lock", Refusals: tag + "refusals", Buckets: Buckets(shards), tag: tag}
}

// presenceTag is the hash tag of the presence keys: not a number, so never
// a shard's.
const presenceTag = "{presence}"

// Presence names the presence HyperLogLogs of the buffer under a prefix:
// one per Unix minute (users online) and one per UTC day (users active),
// for all the shards' users, every one in the same cluster slot.
type Presence struct {
	online, active string
}

// ForPresence returns the presence keys under prefix.
func ForPresence(prefix string) Presence {
	tag := prefix + ":" + presenceTag + ":"
	return Presence{online: tag + "online:", active: tag + "active:"}
}

// Online returns the key of the users online in Unix minute m (Unix
// seconds / 60).
func (p Presence) Online(m int64) string { return p.online + strconv.FormatInt(m, 10) }

// Active returns the key of the users active on the UTC day of t.
func (p Presence) Active(t time.Time) string { return p.active + t.UTC().Format(DayLayout) }

// PresenceKeys returns a Redis SCAN/KEYS pattern matching every presence
// key under prefix, and no other buffer's.
func PresenceKeys(prefix string) string { return escape(prefix) + ":" + presenceTag + ":*" }

// Pending returns the key of bucket b's pending hash.
func (s Shard) Pending(b int) string { return s.tag + "pending:" + strconv.Itoa(b) }

// InFlight returns the key of bucket b's in-flight hash.
func (s Shard) InFlight(b int) string { return s.tag + "inflight:" + strconv.Itoa(b) }

// Window returns the key of bucket b's hash of the throttle window that
// ends at end (Unix ms).
func (s Shard) Window(b int, end int64) string {
	return s.tag + "window:" + strconv.Itoa(b) + ":" + strconv.FormatInt(end, 10)
}

// WindowKey is Window for an end already formatted in decimal
// (strconv.FormatInt(end, 10)), in one allocation.
func (s Shard) WindowKey(b int, end string) string {
	var buf [128]byte
	k := append(buf[:0], s.tag...)
	k = append(k, "window:"...)
	k = strconv.AppendInt(k, int64(b), 10)
	k = append(k, ':')
	k = append(k, end...)
	return string(k)
}

// Windows returns the key of the shard's hash of its windows: end (Unix
// ms) -> entries moved out of the window's hashes.
func (s Shard) Windows() string { return s.tag + "windows" }

// AllPending returns the keys of the shard's pending hashes, bucket order.
func (s Shard) AllPending() []string { return s.all(s.Pending) }

// AllInFlight returns the keys of the shard's in-flight hashes, bucket
// order.
func (s Shard) AllInFlight() []string { return s.all(s.InFlight) }

func (s Shard) all(key func(int) string) []string {
	out := make([]string, s.Buckets)
	for b := range out {
		out[b] = key(b)
	}
	return out
}

// Locate returns the shard and the bucket of a user id in its stored text
// form (decimal for integer ids): with h the FNV-1a 32 hash of the text,
// the shard is h modulo shards and the bucket (h / shards) modulo
// Buckets(shards). Every instance sharing a prefix must use the same shard
// count to agree on both.
func Locate(uid string, shards int) (shard, bucket int) {
	sum := fnv32a(uid)
	return int(sum % uint32(shards)), int(sum / uint32(shards) % uint32(Buckets(shards)))
}

// Hash is the hash Locate spreads user ids by: FNV-1a 32 of the id's
// stored text.
func Hash(uid string) uint32 { return fnv32a(uid) }

// fnv32a is FNV-1a 32 (hash/fnv's New32a) of s, without allocating.
func fnv32a(s string) uint32 {
	const offset32, prime32 = 2166136261, 16777619
	h := uint32(offset32)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= prime32
	}
	return h
}

// ShardOf returns the shard of a user id (Locate).
func ShardOf(uid string, shards int) int {
	s, _ := Locate(uid, shards)
	return s
}

// WindowPrefix returns the start of the keys of the shard's window hashes.
func (s Shard) WindowPrefix() string { return s.tag + "window:" }

// Buffered returns Redis SCAN/KEYS patterns matching every pending, every
// in-flight hash and every shard's hash of windows under prefix, of any
// shard and bucket: where a timestamp waits for a flush (a window's
// entries are moved to pending by the flush, the hash of windows names
// them).
func Buffered(prefix string) []string {
	return []string{escape(prefix) + ":{*}:pending:*", escape(prefix) + ":{*}:inflight:*", escape(prefix) + ":{*}:windows"}
}

// ShardOfKey returns the shard N of a key "<prefix>:{N}:..." under prefix.
func ShardOfKey(prefix, key string) (int, bool) {
	rest, ok := strings.CutPrefix(key, prefix+":{")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, "}:")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	return n, err == nil && n >= 0
}

// PurgeLock returns the key of the purge lock under prefix.
func PurgeLock(prefix string) string { return prefix + ":purge:lock" }

// RuleLock returns the key of the lock of the inactivity rule name under
// prefix. Rule names hold no ':' (the plugin refuses them), which tells
// these keys from those of a buffer whose prefix starts with prefix+":rule:"
// (RuleOfKey).
func RuleLock(prefix, name string) string { return prefix + ":rule:" + name + ":lock" }

// RuleOfKey returns the rule name of a rule lock key under prefix
// (RuleLock), or false when key is not one: its name would hold a ':'.
func RuleOfKey(prefix, key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, prefix+":rule:")
	if !ok {
		return "", false
	}
	name, ok := strings.CutSuffix(rest, ":lock")
	if !ok || name == "" || strings.Contains(name, ":") {
		return "", false
	}
	return name, true
}

// Manifest returns the key of the buffer's manifest under prefix.
func Manifest(prefix string) string { return prefix + ":manifest" }

// Used returns a Redis SCAN/KEYS pattern matching every key under prefix
// but the manifest, which an instance writes at start before any use: the
// manifest is the only key whose name after "<prefix>:" starts with "m".
func Used(prefix string) string { return escape(prefix) + ":[^m]*" }

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

// Owned returns Redis SCAN/KEYS patterns matching the keys of the buffer
// under prefix: the keys of its shards, its presence counts, its purge
// lock, its manifest and its rules' locks. The first pattern also matches
// the presence keys, and the last keys of a buffer whose prefix starts with
// prefix+":": keep of the first only the keys ShardOfKey reads, of the last
// those RuleOfKey reads.
func Owned(prefix string) []string {
	return []string{escape(prefix) + ":{*}:*", PresenceKeys(prefix), escape(PurgeLock(prefix)), escape(Manifest(prefix)),
		escape(prefix) + ":rule:*:lock"}
}
