package lastseen

import (
	"context"
	_ "embed"
	"errors"

	"github.com/redis/go-redis/v9"
)

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
func evalPipelined(ctx context.Context, rdb *redisClient, script *redis.Script, calls []scriptCall) ([]*redis.Cmd, error) {
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
