package keys

import (
	"hash/fnv"
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

// TestWindowKeys: the keys built at once are Window's, bucket by bucket,
// in three allocations (the bytes, one string, the slice).
func TestWindowKeys(t *testing.T) {
	s := ForShard("app", 3, 16)
	const end = 1772357700000
	got := s.WindowKeys(end)
	if len(got) != 256 {
		t.Fatalf("WindowKeys returned %d keys, want 256", len(got))
	}
	if got[0] != "app:{3}:window:0:1772357700000" || got[255] != "app:{3}:window:255:1772357700000" {
		t.Errorf("WindowKeys: first %q, last %q", got[0], got[255])
	}
	for b, k := range got {
		if want := s.Window(b, end); k != want {
			t.Errorf("WindowKeys[%d] = %q, want %q", b, k, want)
		}
	}
	if n := testing.AllocsPerRun(10, func() { s.WindowKeys(end) }); n != 3 {
		t.Errorf("WindowKeys allocates %v times, want 3", n)
	}
}
