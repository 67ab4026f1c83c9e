package keys

import (
	"hash/fnv"
	"testing"
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
