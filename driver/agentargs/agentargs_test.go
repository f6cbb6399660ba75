package agentargs

import (
	"reflect"
	"slices"
	"testing"
	"time"
)

// Every field survives Argv and Parse; what is unset is not written.
func TestUnitRoundTrip(t *testing.T) {
	for _, a := range []Args{
		{},
		{Lifetime: 90 * time.Second, User: "1000:1000", RelayPort: 40123},
		{User: "123456:123456", Drawn: true},
		{Lifetime: time.Second, User: "nobody", FileSize: 1 << 30, OpenFiles: 1024, Procs: 64,
			KeepEnv: []string{"HOME", "PATH"}, Listen: "/dev/agentsandbox.sock", Writable: []string{"/tmp", "/dev/shm", "/dev/mqueue"}},
		{Connect: "/dev/agentsandbox.sock"},
		{Lifetime: time.Hour, Lease: 30 * time.Second, Listen: "/dev/agentsandbox.sock", RelayPort: 9},
		{Install: "/.agentsandbox/agent", Isolate: true},
		{Activity: true, RelayPort: 9},
	} {
		argv, err := a.Argv()
		if err != nil {
			t.Fatalf("%+v: %v", a, err)
		}
		b, err := Parse(argv)
		if err != nil || !reflect.DeepEqual(a, b) {
			t.Errorf("%+v -> %q -> %+v, %v", a, argv, b, err)
		}
	}
	if argv, _ := (Args{}).Argv(); len(argv) != 0 {
		t.Errorf("the zero value renders %q", argv)
	}
	argv, _ := Args{Lifetime: 90 * time.Second, User: "1000:1000", Drawn: true, RelayPort: 8}.Argv()
	if want := []string{"-lifetime=1m30s", "-user=1000:1000", "-drawn", "-relay=8"}; !slices.Equal(argv, want) {
		t.Errorf("argv %q, want %q", argv, want)
	}
	argv, _ = Args{Lease: 20 * time.Second, Listen: "/s"}.Argv()
	if want := []string{"-lease=20s", "-listen=/s"}; !slices.Equal(argv, want) {
		t.Errorf("argv %q, want %q", argv, want)
	}
}

// What the agent could not read back is an error, not a different value.
func TestUnitRefused(t *testing.T) {
	for _, a := range []Args{
		{KeepEnv: []string{"A,B"}},
		{KeepEnv: []string{""}},
		{Writable: []string{"/tmp", "/a,b"}},
		{FileSize: -1},
		{RelayPort: -1},
		{Lifetime: -time.Second},
		{Lease: -time.Second, Listen: "/s"},
		{Lease: time.Second}, // a lease without a socket
	} {
		if argv, err := a.Argv(); err == nil {
			t.Errorf("%+v rendered as %q", a, argv)
		}
	}
	for _, argv := range [][]string{{"-bogus"}, {"-lifetime=soon"}, {"-nproc=-3"}, {"-user=x", "stray"}, {"-relay=x"}, {"-lease=-1s", "-listen=/s"}, {"-lease=1s"}, {"-lease=soon", "-listen=/s"}} {
		if a, err := Parse(argv); err == nil {
			t.Errorf("%q parsed as %+v", argv, a)
		}
	}
}
