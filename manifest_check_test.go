package lastseen

import (
	"testing"
	"time"
)

// TestManifestZone: the manifest names the app's column location so that
// the operator tools load the same zone: nil is "", a zone its IANA name,
// and a zone without DST and with no IANA name of the same offsets its
// offset.
func TestManifestZone(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 3, 1, 9, 30, 0, 0, time.UTC)
	for _, c := range []struct {
		loc  *time.Location
		want string
	}{
		{nil, ""},
		{time.UTC, "UTC"},
		{berlin, "Europe/Berlin"},
		{time.FixedZone("Berlin winter", 3600), "+01:00"},
		{time.FixedZone("", -5*3600-1800), "-05:30"},
		{time.FixedZone("CET", 3600), "+01:00"}, // not the IANA CET, which has summer time
	} {
		if got := manifestZone(c.loc, now); got != c.want {
			t.Errorf("manifestZone(%v) = %q, want %q", c.loc, got, c.want)
		}
	}
}
