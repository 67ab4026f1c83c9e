package redisbuf

import (
	"context"

	"github.com/lastseen/lastseen/internal/keys"
)

// Format is the buffer's format version, recorded in its manifest: the key
// layout of the package doc and the stored timestamp form (Unix
// microseconds, decimal). Format 1 kept a key per throttle marker and one
// pending hash per shard; format 2 kept both in small bucketed hashes, with
// sliding windows; format 3 records a touch in the hash of its fixed
// throttle window, which the flush moves to pending.
const Format = "3"

// Manifest creates the buffer's manifest, the hash keys.Manifest(prefix),
// from layout (name, value, name, value, ...) when it is absent, and, when
// the first compared pairs of layout agree with it, sets each of settings
// (name, value pairs) that differs from the stored value, in one atomic
// step. It returns what the manifest held before the settings were set:
// the layout created by this call or by an earlier instance. An instance
// whose settings agree with the manifest writes nothing. It is bounded by
// ctx. On success the manifest is known to exist (ManifestGone
// reports false until Active finds it gone again).
func (b *Buffer) Manifest(ctx context.Context, layout []string, compared int, settings []string) (map[string]string, error) {
	args := make([]any, 0, 2+len(layout)+len(settings))
	args = append(args, len(layout)/2, compared)
	for _, f := range append(layout[:len(layout):len(layout)], settings...) {
		args = append(args, f)
	}
	var kv []string
	err := b.redis(ctx, func(ctx context.Context, rdb *client) (err error) {
		kv, err = manifestScript.Run(ctx, rdb.UniversalClient, []string{keys.Manifest(b.prefix)}, args...).StringSlice()
		return err
	})
	if err != nil {
		return nil, err
	}
	got := make(map[string]string, len(kv)/2)
	for i := 0; i+1 < len(kv); i += 2 {
		got[kv[i]] = kv[i+1]
	}
	b.manifestGone.Store(false)
	return got, nil
}

// ManifestGone reports whether the last Active found no manifest under the
// prefix: Redis lost its data (a restart without persistence, FLUSHALL),
// and the manifest should be written again before an instance of another
// layout claims the prefix.
func (b *Buffer) ManifestGone() bool { return b.manifestGone.Load() }
