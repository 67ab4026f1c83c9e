package keys

import (
	"hash/fnv"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestFNV32aMatchesHashFNV: the allocation-free hash is hash/fnv's FNV-1a
// 32, so that every version of the library places a user in the same shard
// and bucket.
func TestFNV32aMatchesHashFNV(t *testing.T) {
	for _, s := range []string{"", "1", "42", "1000000", "550e8400-e29b-41d4-a716-446655440000", "ÄÖÜ", "\x00\xff"} {
		h := fnv.New32a()
		h.Write([]byte(s))
		if got, want := fnv32a(s), h.Sum32(); got != want {
			t.Errorf("fnv32a(%q) = %d, want %d", s, got, want)
		}
	}
}

// TestLocate pins where ids land with 16 shards (256 buckets each) and with
// one shard (4,096 buckets): the layout of format 2.
func TestLocate(t *testing.T) {
	for _, c := range []struct {
		uid           string
		shards        int
		shard, bucket int
	}{
		{"42", 16, 3, 88}, {"42", 1, 0, 1411}, {"1", 16, 12, 113}, {"1000000", 1024, 924, 0}, // computed with FNV-1a in Python
	} {
		s, b := Locate(c.uid, c.shards)
		if s != c.shard || b != c.bucket {
			t.Errorf("Locate(%q, %d) = %d, %d, want %d, %d", c.uid, c.shards, s, b, c.shard, c.bucket)
		}
	}
	if n := testing.AllocsPerRun(100, func() { Locate("1000000", 16) }); n != 0 {
		t.Errorf("Locate allocates %v times, want 0", n)
	}
}

// TestRuleOfKey: a rule's lock key reads back as its rule; a key of a
// buffer whose prefix starts with prefix+":rule:" does not.
func TestRuleOfKey(t *testing.T) {
	for _, c := range []struct {
		key, name string
		ok        bool
	}{
		{RuleLock("app", "warn-80d"), "warn-80d", true},
		{"app:rule:x:{0}:lock", "", false}, // shard 0's lock of the buffer "app:rule:x"
		{"app:rule::lock", "", false},
		{"app:purge:lock", "", false},
		{"other:rule:warn:lock", "", false},
	} {
		name, ok := RuleOfKey("app", c.key)
		if name != c.name || ok != c.ok {
			t.Errorf("RuleOfKey(app, %q) = %q, %v; want %q, %v", c.key, name, ok, c.name, c.ok)
		}
	}
}

// TestPresenceKeys pins the presence keys: the whole buffer's, under the
// hash tag {presence}, which no shard's key carries (ShardOfKey refuses
// them) and which the SCAN pattern of the prefix's presence keys matches,
// glob characters in the prefix escaped.
func TestPresenceKeys(t *testing.T) {
	p := ForPresence("app")
	for _, c := range [][2]string{
		{p.Online(29539290), "app:{presence}:online:29539290"},
		{p.Active(time.Date(2026, 3, 1, 23, 30, 0, 0, time.FixedZone("UTC-2", -2*3600))), "app:{presence}:active:2026-03-02"},
		{PresenceKeys("app"), "app:{presence}:*"},
		{PresenceKeys("a*b"), `a\*b:{presence}:*`},
	} {
		if c[0] != c[1] {
			t.Errorf("key %q, want %q", c[0], c[1])
		}
	}
	if n, ok := ShardOfKey("app", p.Online(1)); ok {
		t.Errorf("ShardOfKey(app, %q) = %d, true; want false", p.Online(1), n)
	}
	if got, want := strings.Join(Owned("app"), " "), `app:{*}:* app:{presence}:* app:purge:lock app:manifest app:rule:*:lock`; got != want {
		t.Errorf("Owned(app) = %s, want %s", got, want)
	}
}

// TestWindowKey: WindowKey is Window, in one allocation.
func TestWindowKey(t *testing.T) {
	s := ForShard("app", 3, 16)
	for _, c := range []struct {
		b    int
		end  int64
		want string
	}{
		{0, 1772357700000, "app:{3}:window:0:1772357700000"},
		{255, 1772357700000, "app:{3}:window:255:1772357700000"},
		{7, -60000, "app:{3}:window:7:-60000"},
	} {
		if got := s.WindowKey(c.b, strconv.FormatInt(c.end, 10)); got != c.want || s.Window(c.b, c.end) != c.want {
			t.Errorf("WindowKey(%d, %d) = %q, Window = %q, want %q", c.b, c.end, got, s.Window(c.b, c.end), c.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { s.WindowKey(255, "1772357700000") }); n != 1 {
		t.Errorf("WindowKey allocates %v times, want 1", n)
	}
}
