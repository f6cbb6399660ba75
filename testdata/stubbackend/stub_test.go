package stubbackend

import (
	"context"
	"reflect"
	"testing"
	"time"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/driver/agentargs"
	"github.com/agentsandbox/sandbox/driver/owner"
)

// The command line the stub renders is the one the agent reads back, and
// the instance carries this process's owner labels.
func TestUnitCreate(t *testing.T) {
	d := New()
	defer d.Close()
	spec := &driver.Spec{Agent: agentargs.Args{Lifetime: time.Minute, User: "1000:1000"},
		Resources: driver.Resources{FileSize: 1 << 20}, Labels: map[string]string{"team": "x"}}
	inst, err := d.Create(context.Background(), spec)
	if err != nil {
		t.Skipf("no agent for this architecture: %v", err)
	}
	in := inst.(*Instance)
	got, err := Parsed(in.Command())
	want := agentargs.Args{Lifetime: time.Minute, User: "1000:1000", FileSize: 1 << 20}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("command %q parsed as %+v, %v; want %+v", in.Command(), got, err, want)
	}
	if in.labels[owner.LabelOwner] != owner.ID() || in.labels["team"] != "x" || len(in.program) == 0 || len(in.seccomp) == 0 {
		t.Errorf("labels %v, program %d bytes, seccomp %d bytes", in.labels, len(in.program), len(in.seccomp))
	}
	if n, _ := d.Prune(context.Background()); n != 0 {
		t.Errorf("Prune removed %d instances of a live owner", n)
	}
}
