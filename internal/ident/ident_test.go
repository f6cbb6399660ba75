package ident

import (
	"os"
	"path/filepath"
	"testing"
)

func TestParse(t *testing.T) {
	for spec, ok := range map[string]bool{
		"1000": true, "1000:1000": true, "0": true, "app": true, "app:staff": true, "1000:staff": true, "app:0": true,
		"": false, ":": false, "1000:": false, ":1000": false, "a b": false, "a\nb": false, "a:b:c": false,
		"4294967295": false, "4294967294": true, "1x": false, "-1": true, // "-1" is a name (no digit first)
	} {
		if _, err := Parse(spec); (err == nil) != ok {
			t.Errorf("Parse(%q): %v, want ok=%v", spec, err, ok)
		}
	}
}

func TestResolve(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	os.WriteFile(passwd, []byte("root:x:0:0::/root:/bin/sh\napp:x:1000:100::/home/app:/bin/sh\n"), 0o644)
	os.WriteFile(group, []byte("root:x:0:\nusers:x:100:\nstaff:x:50:\n"), 0o644)
	for _, c := range []struct {
		spec     string
		uid, gid uint32
		err      bool
	}{
		{"0", 0, 0, false},
		{"1000", 1000, 100, false},  // its passwd group
		{"1234", 1234, 1234, false}, // no entry: the same number
		{"app", 1000, 100, false},
		{"app:staff", 1000, 50, false},
		{"1234:staff", 1234, 50, false},
		{"1234:77", 1234, 77, false},
		{"nobody", 0, 0, true},
		{"app:nogroup", 0, 0, true},
	} {
		uid, gid, err := Resolve(c.spec, passwd, group)
		if uid != c.uid || gid != c.gid || (err != nil) != c.err {
			t.Errorf("Resolve(%q) = %d:%d, %v", c.spec, uid, gid, err)
		}
	}
	if uid, gid, err := Resolve("5", filepath.Join(dir, "none"), filepath.Join(dir, "none")); err != nil || uid != 5 || gid != 5 {
		t.Errorf("without passwd: %d:%d, %v", uid, gid, err)
	}
}
