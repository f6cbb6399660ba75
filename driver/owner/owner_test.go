package owner

import (
	"strconv"
	"strings"
	"testing"
)

// This process is alive; the same pid with another start time, or the
// same host after a reboot, is dead; another host's or a malformed label
// is never dead.
func TestUnitDead(t *testing.T) {
	me := ID()
	f := strings.Split(me, "/")
	if len(f) != 4 || f[0] == "" || f[1] == "" {
		t.Skipf("no hostname or boot id here: %q", me)
	}
	start, _ := strconv.ParseUint(f[3], 10, 64)
	for _, c := range []struct {
		label string
		dead  bool
	}{
		{me, false},
		{f[0] + "/" + f[1] + "/" + f[2] + "/" + strconv.FormatUint(start+1, 10), true},
		{f[0] + "/another-boot/" + f[2] + "/" + f[3], true},
		{"another-host/" + f[1] + "/" + f[2] + "/1", false},
		{f[0] + "/" + f[1] + "/x/1", false},
		{"", false},
		{"a/b/c", false},
	} {
		if got := Dead(c.label); got != c.dead {
			t.Errorf("Dead(%q) = %v, want %v", c.label, got, c.dead)
		}
	}
	l := Labels("disk", map[string]string{"team": "x", LabelKind: "forged"})
	if l["team"] != "x" || l[LabelKind] != "disk" || l[LabelOwner] != me || l[LabelManaged] != "true" {
		t.Errorf("labels %v", l)
	}
}
