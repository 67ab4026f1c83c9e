package redisbuf

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis maxmemory policies (redis.conf "maxmemory-policy") as the buffer
// sees them: only noeviction never drops a key to make room. The allkeys-*
// policies can evict the throttle windows, the pending and the in-flight
// hashes; the volatile-* ones evict keys with a time-to-live only, the
// presence counts and the locks (a lost lock lets two flushers take one
// shard). Every policy but
// noeviction counts as a risk.
const (
	// PolicyNoEviction is the only maxmemory-policy under which Redis never
	// evicts the buffer: at maxmemory it refuses writes instead (OOM), which
	// touches answer by keeping the timestamp in the backlog.
	PolicyNoEviction = "noeviction"
	// PolicyUnknown is reported when neither CONFIG GET maxmemory-policy nor
	// INFO memory answered (managed Redis often renames or disables CONFIG;
	// miniredis has neither).
	PolicyUnknown = "unknown"
)

// evictionCheckInterval is the least time, on the plugin's clock, between
// two checks of the policy and the eviction counter (MaybeCheck: at the
// start of a flush or a status read).
const evictionCheckInterval = time.Minute

// EvictionWatch reads Redis's maxmemory-policy and its evicted_keys counter
// (INFO stats) when the plugin starts (Check) and then at most once a
// minute on the plugin's clock (MaybeCheck), logs one warning per change to
// a policy that can evict, and counts the keys evicted between two reads
// into Counters.Evictions; every flush reads evicted_keys too
// (Buffer.Active), and takes what was counted since the previous flush
// (TakeEvicted). Its methods are safe for concurrent use, and on
// a nil watch (no Redis) do nothing.
type EvictionWatch struct {
	rdb     func() *client // the buffer's client
	log     *slog.Logger
	now     func() time.Time
	evicted *atomic.Int64 // Counters.Evictions
	require bool          // Options.RequireNoEviction: an unknown policy is logged as a warning

	mu         sync.Mutex
	checked    time.Time        // plugin's clock at the last check; zero before the first
	policy     string           // last policy read (one per master, joined by ","), PolicyUnknown before
	risk       bool             // some master's policy can evict
	logged     string           // policy of the last log line about it ("" none yet)
	byNode     map[string]int64 // evicted_keys per master address at the last read
	unreported int64            // evictions counted since the last TakeEvicted
}

func newEvictionWatch(rdb func() *client, log *slog.Logger, now func() time.Time, evicted *atomic.Int64, require bool) *EvictionWatch {
	return &EvictionWatch{rdb: rdb, log: log, now: now, evicted: evicted, require: require,
		policy: PolicyUnknown, byNode: map[string]int64{}}
}

// Eviction returns the buffer's eviction watch.
func (b *Buffer) Eviction() *EvictionWatch { return b.eviction }

// nodeEviction is what one Redis server (one master of a cluster) said.
type nodeEviction struct {
	addr    string
	policy  string
	evicted int64
	counted bool // evicted was read
}

// State returns the policy of the last check (one per master, sorted and
// joined by ","; PolicyUnknown before the first or when unreadable) and
// whether some master's policy can evict; "" and false for a nil watch.
func (w *EvictionWatch) State() (policy string, risk bool) {
	if w == nil {
		return "", false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.policy, w.risk
}

// MaybeCheck checks when the last check is a minute old or there was none
// yet. Its Redis calls get at most one second of ctx.
func (w *EvictionWatch) MaybeCheck(ctx context.Context) {
	if w == nil {
		return
	}
	w.mu.Lock()
	due := w.checked.IsZero() || w.now().Sub(w.checked) >= evictionCheckInterval
	w.mu.Unlock()
	if due {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		w.Check(ctx)
	}
}

// Check reads every master within ctx, then updates the policy, logs what
// changed and adds the evictions since the last read to
// Counters.Evictions (count). It never fails: what it cannot read is
// PolicyUnknown or not counted.
func (w *EvictionWatch) Check(ctx context.Context) {
	if w == nil {
		return
	}
	nodes := w.read(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checked = w.now()
	var policies []string
	w.risk = false
	for _, n := range nodes {
		if !slices.Contains(policies, n.policy) {
			policies = append(policies, n.policy)
		}
		w.risk = w.risk || (n.policy != PolicyNoEviction && n.policy != PolicyUnknown)
	}
	slices.Sort(policies)
	w.policy = strings.Join(policies, ",")
	if w.policy == "" {
		w.policy = PolicyUnknown
	}
	w.logPolicy()
	w.count(nodes)
}

// count adds the evictions of nodes since the last read of each to
// Counters.Evictions and to what TakeEvicted returns next, and logs them
// as a warning with the number. Called with mu held.
func (w *EvictionWatch) count(nodes []nodeEviction) {
	var evicted int64
	for _, n := range nodes {
		if !n.counted {
			continue
		}
		if prev, ok := w.byNode[n.addr]; ok {
			d := n.evicted - prev
			if d < 0 { // the server restarted or ran CONFIG RESETSTAT
				d = n.evicted
			}
			evicted += d
		}
		w.byNode[n.addr] = n.evicted
	}
	if evicted > 0 {
		w.evicted.Add(evicted)
		w.unreported += evicted
		w.log.Warn("lastseen: Redis evicted keys since the last check; pending timestamps may have been lost",
			"evicted", evicted, "maxmemory_policy", w.policy)
	}
}

// TakeEvicted returns the evictions counted since its last call (by the
// checks and by the flushes' reads, Buffer.Active), and starts again from
// 0; 0 for a nil watch.
func (w *EvictionWatch) TakeEvicted() int64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.unreported
	w.unreported = 0
	return n
}

// counted adds what one read of INFO stats found (Buffer.Active) to the
// watch (count).
func (w *EvictionWatch) counted(nodes []nodeEviction) {
	if w == nil || len(nodes) == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.count(nodes)
}

// logPolicy logs the policy once per change: a warning for one that can
// evict (the risk and the fix, as Sidekiq does), nothing when it is unknown
// (a warning under RequireNoEviction; the plugin's Status shows it), and a note when it went back to
// noeviction after a warning. Called with mu held.
func (w *EvictionWatch) logPolicy() {
	if w.policy == w.logged {
		return
	}
	prev := w.logged
	w.logged = w.policy
	switch {
	case w.risk:
		w.log.Warn("lastseen: Redis maxmemory-policy is "+w.policy+": at maxmemory Redis may evict the pending and in-flight hashes, "+
			"and the touches they hold are lost without an error; run CONFIG SET maxmemory-policy noeviction "+
			"(and set it in redis.conf), or give lastseen a Redis of its own", "maxmemory_policy", w.policy)
	case w.policy == PolicyUnknown: // miniredis, or a proxy that answers neither: Status shows it
		if w.require {
			w.log.Warn("lastseen: cannot read Redis maxmemory-policy (CONFIG GET and INFO memory did not answer); "+
				"make sure it is noeviction", "maxmemory_policy", w.policy)
		}
	case prev != "":
		w.log.Info("lastseen: Redis maxmemory-policy is now "+w.policy, "maxmemory_policy", w.policy)
	}
}

// read asks every master of a cluster (ClusterClient.ForEachMaster), or
// the one server of any other client, within ctx (client.do).
func (w *EvictionWatch) read(ctx context.Context) []nodeEviction {
	c := w.rdb()
	var nodes []nodeEviction
	if err := c.do(ctx, func(ctx context.Context) error {
		nodes = readAll(ctx, c.UniversalClient)
		return nil
	}); err != nil {
		return []nodeEviction{{policy: PolicyUnknown}}
	}
	return nodes
}

// readAll is read on one client.
func readAll(ctx context.Context, rdb redis.UniversalClient) []nodeEviction {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return []nodeEviction{readNode(ctx, rdb, "")}
	}
	var mu sync.Mutex
	var nodes []nodeEviction
	err := cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n := readNode(ctx, m, m.Options().Addr)
		mu.Lock()
		nodes = append(nodes, n)
		mu.Unlock()
		return nil
	})
	if err != nil || len(nodes) == 0 { // the cluster's layout could not be read
		return []nodeEviction{{policy: PolicyUnknown}}
	}
	return nodes
}

// readNode reads one server's maxmemory-policy with CONFIG GET, else from
// INFO memory's maxmemory_policy field, else reports PolicyUnknown; and its
// evicted_keys from INFO stats.
func readNode(ctx context.Context, c redis.Cmdable, addr string) nodeEviction {
	n := nodeEviction{addr: addr, policy: PolicyUnknown}
	if m, err := c.ConfigGet(ctx, "maxmemory-policy").Result(); err == nil && m["maxmemory-policy"] != "" {
		n.policy = m["maxmemory-policy"]
	} else if info, err := c.Info(ctx, "memory").Result(); err == nil {
		if v, ok := infoField(info, "maxmemory_policy"); ok && v != "" {
			n.policy = v
		}
	}
	n.evicted, n.counted = evictedKeys(c.Info(ctx, "stats"))
	return n
}

// evictedKeys reads evicted_keys from the reply of INFO stats; false when
// the command failed or the field is missing (miniredis).
func evictedKeys(cmd *redis.StringCmd) (int64, bool) {
	info, err := cmd.Result()
	if err != nil {
		return 0, false
	}
	v, ok := infoField(info, "evicted_keys")
	if !ok {
		return 0, false
	}
	k, err := strconv.ParseInt(v, 10, 64)
	return k, err == nil
}

// readEvicted reads evicted_keys from every master of a cluster
// (ClusterClient.ForEachMaster), or from the one server of any other
// client, within ctx; the masters that did not answer are left out.
func readEvicted(ctx context.Context, rdb redis.UniversalClient) []nodeEviction {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		k, counted := evictedKeys(rdb.Info(ctx, "stats"))
		return []nodeEviction{{evicted: k, counted: counted}}
	}
	var mu sync.Mutex
	var nodes []nodeEviction
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		k, counted := evictedKeys(m.Info(ctx, "stats"))
		mu.Lock()
		defer mu.Unlock()
		nodes = append(nodes, nodeEviction{addr: m.Options().Addr, evicted: k, counted: counted})
		return nil
	})
	return nodes
}

// infoField returns the value of one "name:value" line of an INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}
