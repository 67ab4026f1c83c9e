package redisbuf

import "github.com/lastseen/lastseen/internal/keys"

// shardKeys are the keys of one shard (layout in the package doc and in
// internal/keys), with the lists the scripts and pipelines name built once.
type shardKeys struct {
	keys.Shard
	pending, inflight []string // by bucket
	buffered          []string // pending then in-flight: what swap.lua, sample.lua and Active name
	readArgs          []any    // pending and in-flight of bucket b at 2b and 2b+1, boxed once: the read script's KEYS (read.go)
}

func newShardKeys(prefix string, n, shards int) shardKeys {
	k := keys.ForShard(prefix, n, shards)
	pending, inflight := k.AllPending(), k.AllInFlight()
	readArgs := make([]any, 0, 2*len(pending))
	for b := range pending {
		readArgs = append(readArgs, pending[b], inflight[b])
	}
	return shardKeys{Shard: k, pending: pending, inflight: inflight, buffered: append(pending[:len(pending):len(pending)], inflight...),
		readArgs: readArgs}
}
