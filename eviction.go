package lastseen

import (
	"context"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis maxmemory policies (redis.conf "maxmemory-policy") as the buffer
// sees them: only noeviction never drops a key to make room. The allkeys-*
// policies can evict the pending and in-flight hashes; the volatile-* ones
// evict keys with a time-to-live only, the throttle markers and the locks
// (a lost lock lets two flushers take one shard). Every policy but
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
// two checks of the policy and the eviction counter (at the start of a
// flush or a Status).
const evictionCheckInterval = time.Minute

// evictionWatch reads Redis's maxmemory-policy and its evicted_keys counter
// (INFO stats) at Initialize and then at most once per
// evictionCheckInterval, logs one warning per change to a policy that can
// evict, and counts the keys evicted between two checks into
// Stats.Evictions.
type evictionWatch struct {
	rdb     func() *redisClient // the plugin's client (redisclient.go)
	log     *slog.Logger
	now     func() time.Time
	stats   *counters
	require bool // Config.RequireNoEviction: an unknown policy is logged as a warning

	mu      sync.Mutex
	checked time.Time        // plugin's clock at the last check; zero before the first
	policy  string           // last policy read (one per master, joined by ","), PolicyUnknown before
	risk    bool             // some master's policy can evict
	logged  string           // policy of the last log line about it ("" none yet)
	evicted map[string]int64 // evicted_keys per master address at the last check
}

func newEvictionWatch(cfg settings, rdb func() *redisClient, log *slog.Logger, stats *counters) *evictionWatch {
	return &evictionWatch{rdb: rdb, log: log, now: cfg.Now, stats: stats, require: cfg.RequireNoEviction,
		policy: PolicyUnknown, evicted: map[string]int64{}}
}

// nodeEviction is what one Redis server (one master of a cluster) said.
type nodeEviction struct {
	addr    string
	policy  string
	evicted int64
	counted bool // evicted was read
}

// state returns the policy and risk of the last check; "" and false for a
// nil watch (no Redis).
func (w *evictionWatch) state() (policy string, risk bool) {
	if w == nil {
		return "", false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.policy, w.risk
}

// maybeCheck checks when the last check is evictionCheckInterval old or
// there was none yet. Its Redis calls get at most one second of ctx. A nil
// watch (no Redis) does nothing.
func (w *evictionWatch) maybeCheck(ctx context.Context) {
	if w == nil {
		return
	}
	w.mu.Lock()
	due := w.checked.IsZero() || w.now().Sub(w.checked) >= evictionCheckInterval
	w.mu.Unlock()
	if due {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		w.check(ctx)
	}
}

// check reads every master, then updates the policy, logs what changed and
// adds the evictions since the last check to Stats.Evictions. It never
// fails: what it cannot read is "unknown" or not counted.
func (w *evictionWatch) check(ctx context.Context) {
	nodes := w.read(ctx)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checked = w.now()
	var policies []string
	w.risk = false
	var evicted int64
	for _, n := range nodes {
		if !slices.Contains(policies, n.policy) {
			policies = append(policies, n.policy)
		}
		w.risk = w.risk || (n.policy != PolicyNoEviction && n.policy != PolicyUnknown)
		if !n.counted {
			continue
		}
		if prev, ok := w.evicted[n.addr]; ok {
			d := n.evicted - prev
			if d < 0 { // the server restarted or ran CONFIG RESETSTAT
				d = n.evicted
			}
			evicted += d
		}
		w.evicted[n.addr] = n.evicted
	}
	slices.Sort(policies)
	w.policy = strings.Join(policies, ",")
	if w.policy == "" {
		w.policy = PolicyUnknown
	}
	w.logPolicy()
	if evicted > 0 {
		w.stats.evictions.Add(evicted)
		w.log.Warn("lastseen: Redis evicted keys since the last check; pending timestamps may have been lost",
			"evicted", evicted, "maxmemory_policy", w.policy)
	}
}

// logPolicy logs the policy once per change: a warning for one that can
// evict (the risk and the fix, as Sidekiq does), nothing when it is unknown
// (a warning under RequireNoEviction; Status shows it), and a note when it went back to
// noeviction after a warning. Called with mu held.
func (w *evictionWatch) logPolicy() {
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
// the one server of any other client, within ctx (redisClient.do).
func (w *evictionWatch) read(ctx context.Context) []nodeEviction {
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
	if info, err := c.Info(ctx, "stats").Result(); err == nil {
		if v, ok := infoField(info, "evicted_keys"); ok {
			if k, err := strconv.ParseInt(v, 10, 64); err == nil {
				n.evicted, n.counted = k, true
			}
		}
	}
	return n
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
