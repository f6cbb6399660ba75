package pseudofs

import "testing"

func TestUnder(t *testing.T) {
	for p, want := range map[string]string{
		"/proc": "/proc", "/proc/self/mem": "/proc", "/sys/fs": "/sys", "/dev/zero": "/dev",
		"/": "", "/procfs": "", "/devices/x": "", "/workspace/dev": "", "/system": "",
	} {
		got, ok := Under(p)
		if got != want || ok != (want != "") {
			t.Errorf("Under(%q) = %q, %v; want %q", p, got, ok, want)
		}
	}
}
