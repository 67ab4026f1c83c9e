package redisbuf

import (
	"context"
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/lastseen/lastseen/internal/buffer"
	"github.com/lastseen/lastseen/internal/keys"
	"github.com/redis/go-redis/v9"
)

// readCallIDs is about the most ids one read script call takes (it ends at
// the end of a bucket): a script holds Redis for its whole run, so a huge
// read goes in several calls that other clients' commands can come
// between.
const readCallIDs = 1000

// readEntryIDs is the most ids of one bucket entry of a call (one HMGET;
// Lua's unpack is bounded by its C stack), and maxReadID the longest id the
// read takes, in bytes: both are written in two bytes of the call's layout.
const (
	readEntryIDs = 1000
	maxReadID    = 1<<16 - 1
)

// Newest reads uids' pending and in-flight values with the read script
// (HMGET of the pending hash of each bucket holding some of them, and of
// its in-flight hash while a flush has one) and folds in the backlog. On a
// single server (a *redis.Client, Sentinel's included) one call takes up to
// readCallIDs ids of any shards; a Redis Cluster, a Ring or another client
// gets one call per shard (one slot each); several calls go in one
// pipeline (a server that refuses a call across shards, as a proxy in
// front of a cluster does, gets one call per shard from then on). A call
// carries two arguments besides its keys, its ids packed
// one after the other and their layout (see read.lua), the bucket keys are
// boxed once when the buffer opens, and the reply holds only the values
// found: a read of users with nothing buffered gets an empty reply. With
// guard the read goes through the breaker within TouchTimeout, as a touch.
// Duplicate ids are read once; an id longer than maxReadID bytes (the
// plugin's are at most 4,096) is not read. When some calls failed it
// returns what the others read, with the error.
func (b *Buffer) Newest(ctx context.Context, uids []string, out []time.Time, now time.Time, guard bool) error {
	clear(out[:len(uids)])
	if b.backlog.len() > 0 {
		for i, uid := range uids {
			if ts, ok := b.backlog.get(uid); ok {
				out[i] = time.UnixMicro(ts).UTC()
			}
		}
	}
	if len(uids) == 0 {
		return nil
	}
	plan := b.planRead(uids)
	if len(plan.locs) == 0 {
		return nil
	}
	var cmds []*redis.Cmd
	read := func(ctx context.Context, rdb *client) (_ []any, err error) {
		_, single := rdb.UniversalClient.(*redis.Client)
		single = single && !b.perShard.Load()
		cmds, err = evalArgs(ctx, rdb, readScript, plan.calls(b.shards, single))
		if single && plan.acrossShards() && refused(cmds) {
			cmds, err = b.readPerShard(ctx, rdb, plan, err)
		}
		return nil, err
	}
	var err error
	if guard {
		if _, err = b.call(ctx, read); err != nil {
			return err // the calls may still be running: read nothing of them
		}
	} else {
		err = b.redis(ctx, func(ctx context.Context, rdb *client) error {
			_, err := read(ctx, rdb)
			return err
		})
		if err != nil && ctx.Err() != nil { // cut short: the calls may still be running (client.do)
			return err
		}
	}
	plan.fold(cmds, out, now)
	return err
}

// readHash is the read script's SHA1, boxed once for its calls' arguments.
var readHash any = readScript.Hash()

// readPerShard reads plan again one shard per call after the server refused
// a call across shards (err), as a proxy in front of a Redis Cluster does
// (CROSSSLOT); when that read succeeds, every later read goes one shard per
// call, and a warning says so once.
func (b *Buffer) readPerShard(ctx context.Context, rdb *client, plan *readPlan, err error) ([]*redis.Cmd, error) {
	cmds, again := evalArgs(ctx, rdb, readScript, plan.calls(b.shards, false))
	if again == nil && !b.perShard.Swap(true) {
		b.log.Warn("lastseen: redis refused a read across shards; reading one shard per call from now on", "err", err)
	}
	return cmds, again
}

// refused reports whether Redis answered one of cmds with an error reply
// (not a lost connection or a timeout) other than NOSCRIPT.
func refused(cmds []*redis.Cmd) bool {
	for _, cmd := range cmds {
		var reply redis.Error
		if err := cmd.Err(); errors.As(err, &reply) && !isNoScript(err) {
			return true
		}
	}
	return false
}

// readPlan is one Newest's ids in the order the read script gets them:
// by shard, bucket and id, so that a call covers whole buckets and
// duplicates are neighbours.
type readPlan struct {
	uids  []string
	locs  []readLoc
	first []int32  // the index in locs of each distinct id, in order, then len(locs)
	base  []int    // the index in first of each call's first id, then the number of distinct ids
	ends  [][2]int // where each call's ids end in the packed text, and its layout in the layout
}

// readLoc is where uids[i] lives.
type readLoc struct {
	shard, bucket, i int32
}

// planRead locates and orders uids.
func (b *Buffer) planRead(uids []string) *readPlan {
	p := &readPlan{uids: uids, locs: make([]readLoc, 0, len(uids))}
	for i, uid := range uids {
		if len(uid) <= maxReadID {
			n, bucket := keys.Locate(uid, len(b.shards))
			p.locs = append(p.locs, readLoc{shard: int32(n), bucket: int32(bucket), i: int32(i)})
		}
	}
	slices.SortFunc(p.locs, func(x, y readLoc) int {
		switch {
		case x.shard != y.shard:
			return int(x.shard - y.shard)
		case x.bucket != y.bucket:
			return int(x.bucket - y.bucket)
		}
		return strings.Compare(uids[x.i], uids[y.i])
	})
	p.first = make([]int32, 0, len(uids)+1)
	for j, l := range p.locs {
		if j == 0 || uids[l.i] != uids[p.locs[j-1].i] {
			p.first = append(p.first, int32(j))
		}
	}
	p.first = append(p.first, int32(len(p.locs)))
	return p
}

// acrossShards reports whether the ids are of more than one shard.
func (p *readPlan) acrossShards() bool {
	return len(p.locs) > 0 && p.locs[0].shard != p.locs[len(p.locs)-1].shard
}

// loc is the location of the k-th distinct id.
func (p *readPlan) loc(k int) readLoc { return p.locs[p.first[k]] }

// calls returns the read script's calls as whole EVALSHA argument lists
// (see evalArgs), and sets base. A call ends where the shard changes
// (unless single: the keys of every shard are on one server) and at the
// end of the bucket where it reached readCallIDs ids; a bucket entry (a pair of keys) ends where the
// bucket changes or after readEntryIDs ids. The ids of every call are
// written into one string and their layouts into another, each call
// taking its slice of both.
func (p *readPlan) calls(shards []shardKeys, single bool) [][]any {
	distinct := len(p.first) - 1
	size := 0
	for k := range distinct {
		size += len(p.uids[p.loc(k).i])
	}
	text, layout := make([]byte, 0, size), make([]byte, 0, 4*distinct) // at most an entry per id
	var calls [][]any
	var args []any
	p.base, p.ends = p.base[:0], p.ends[:0]
	entry, n := 0, 0 // the current entry's count in layout, and its ids
	for k := range distinct {
		l := p.loc(k)
		uid := p.uids[l.i]
		moved := k == 0 || l.shard != p.loc(k-1).shard || l.bucket != p.loc(k-1).bucket
		if k == 0 || (!single && l.shard != p.loc(k-1).shard) || (moved && k-p.base[len(p.base)-1] >= readCallIDs) {
			if args != nil {
				calls = append(calls, endCall(args))
				p.ends = append(p.ends, [2]int{len(text), len(layout)})
			}
			args = make([]any, 3, 5+2*min(distinct-k, readCallIDs))
			args[0], args[1] = "evalsha", readHash
			p.base = append(p.base, k)
			moved = true
		}
		if moved || n == readEntryIDs {
			args = append(args, shards[l.shard].readArgs[2*l.bucket], shards[l.shard].readArgs[2*l.bucket+1])
			entry, n = len(layout), 0
			layout = append(layout, 0, 0)
		}
		n++
		binary.BigEndian.PutUint16(layout[entry:], uint16(n))
		layout = binary.BigEndian.AppendUint16(layout, uint16(len(uid)))
		text = append(text, uid...)
	}
	if args != nil {
		calls = append(calls, endCall(args))
		p.ends = append(p.ends, [2]int{len(text), len(layout)})
	}
	p.base = append(p.base, distinct)
	packed, lay := string(text), string(layout) // one string each, sliced for every call
	from := [2]int{}
	for c, end := range p.ends {
		calls[c] = append(calls[c], packed[from[0]:end[0]], lay[from[1]:end[1]])
		from = end
	}
	return calls
}

// endCall sets the number of keys of a call whose keys are all in args.
func endCall(args []any) []any {
	args[2] = len(args) - 3
	return args
}

// fold raises out to the values the calls read: the reply of a call is a
// code and a value for each value found, the code 2×(the id's position in
// the call) for a pending value and that plus 1 for an in-flight one.
func (p *readPlan) fold(cmds []*redis.Cmd, out []time.Time, now time.Time) {
	for c, cmd := range cmds {
		reply, _ := cmd.Val().([]any) // nil when the call failed
		for j := 0; j+1 < len(reply); j += 2 {
			code, ok := reply[j].(int64)
			s, isText := reply[j+1].(string)
			k := p.base[c] + int(code/2)
			if !ok || !isText || code < 0 || k >= p.base[c+1] {
				continue
			}
			at, valid := buffer.ParseMicros(s, now)
			if !valid {
				continue
			}
			for _, l := range p.locs[p.first[k]:p.first[k+1]] {
				if at.After(out[l.i]) {
					out[l.i] = at
				}
			}
		}
	}
}

// oneIDLayout is the read script's layout argument for one id alone, which
// is then its packed ids argument.
func oneIDLayout(uid string) string {
	return string([]byte{0, 1, byte(len(uid) >> 8), byte(len(uid))})
}

// evalArgs runs calls of script, each a whole EVALSHA argument list
// ("evalsha", script.Hash(), the number of keys, the keys, the arguments)
// that the caller built without go-redis boxing every key again: one call
// alone, several in one pipeline. When Redis does not know the script
// (NOSCRIPT) it loads it and runs them once more, as evalPipelined does.
// The commands hold each call's reply or error; the error is the first
// command's.
func evalArgs(ctx context.Context, rdb *client, script *redis.Script, calls [][]any) ([]*redis.Cmd, error) {
	run := func() ([]*redis.Cmd, error) {
		cmds := make([]*redis.Cmd, len(calls))
		for i, args := range calls {
			cmds[i] = redis.NewCmd(ctx, args...)
			cmds[i].SetFirstKeyPos(3)
		}
		if len(cmds) == 1 {
			return cmds, rdb.Process(ctx, cmds[0])
		}
		_, err := rdb.Pipelined(ctx, func(pipe redis.Pipeliner) error {
			for _, cmd := range cmds {
				_ = pipe.Process(ctx, cmd)
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
