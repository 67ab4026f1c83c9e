package redisbuf

import (
	"context"
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"
)

// The buffer's Lua scripts, one per file in lua/, each starting with a
// comment that lists its KEYS and ARGV and what it returns. Every script
// touches the keys of one shard only (one Redis Cluster slot), but the
// manifest's, which is one key, and the read's on a single server, which
// may touch several shards' (read.go).
var (
	//go:embed lua/move.lua
	moveLua string
	//go:embed lua/active.lua
	activeLua string
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
	//go:embed lua/manifest.lua
	manifestLua string

	// mergeScript moves the throttle windows' new entries of some buckets
	// to pending and raises pending timestamps: a late touch (Touch), a
	// renamed user's copy (Rename) and the backlog's replay
	// (replayBacklog).
	mergeScript = redis.NewScript(moveLua + mergeLua)
	// swapScript moves the throttle windows' new entries to pending and
	// renames the pending hashes to in-flight under the shard lock (Swap).
	swapScript = redis.NewScript(moveLua + swapLua)
	// activeScript tells whether a shard has work for a flush (Active).
	activeScript = redis.NewScript(moveLua + activeLua)
	// ackScript removes committed entries from the in-flight hashes, clears
	// their refusal counts and refreshes the shard lock (Ack).
	ackScript = redis.NewScript(ackLua)
	// failScript moves refused entries back to pending, counting their
	// refusals, and drops those refused the limit-th time (Requeue).
	failScript = redis.NewScript(moveLua + failLua)
	// readScript reads users' pending and in-flight values of one shard
	// (Newest).
	readScript = redis.NewScript(moveLua + readLua)
	// sampleScript reads the sizes of one shard's pending and in-flight
	// sets and samples their values (Sample).
	sampleScript = redis.NewScript(moveLua + sampleLua)
	// manifestScript creates the manifest if absent and returns it
	// (Manifest).
	manifestScript = redis.NewScript(manifestLua)
)

// LoadMergeScript loads the merge script, which a late touch runs, into
// c's Redis (SCRIPT LOAD), so that the next late touch runs EVALSHA alone.
func LoadMergeScript(ctx context.Context, c redis.Scripter) error {
	return mergeScript.Load(ctx, c).Err()
}

// scriptCall is one call of a Lua script: its KEYS and ARGV.
type scriptCall struct {
	keys []string
	args []any
}

// evalPipelined runs calls of script in one pipeline of EVALSHA. A pipeline
// cannot fall back on EVAL per command as redis.Script.Run does, so when
// Redis does not know the script (NOSCRIPT: a restarted server, a failover,
// a new cluster master) it loads it (SCRIPT LOAD, on every master of a
// cluster) and runs the pipeline once more. The commands hold each call's
// reply or error; the error is the first command's error, as Pipelined's.
func evalPipelined(ctx context.Context, rdb *client, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
	run := func() ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(calls))
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for i, c := range calls {
				cmds[i] = script.EvalSha(ctx, pipe, c.keys, c.args...)
			}
			return nil
		})
		return cmds, err
	}
	cmds, err := run()
	if err != nil && isNoScript(err) {
		if lerr := script.Load(ctx, rdb).Err(); lerr != nil {
			return cmds, errors.Join(err, lerr)
		}
		cmds, err = run()
	}
	return cmds, err
}

// isNoScript reports whether err is Redis's NOSCRIPT error.
func isNoScript(err error) bool {
	return errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT")
}
