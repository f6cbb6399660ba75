package sandbox_test

import (
	"testing"

	"github.com/agentsandbox/sandbox"
)

// BenchmarkOpenExec measures attaching to a running leased sandbox and
// its first command: Open + Exec("true") + Detach, beside New + Exec +
// Close of a tethered one and the bare engine's exec of true in a running
// container (create, attach, start, inspect), in the same run.
func BenchmarkOpenExec(b *testing.B) {
	b.Run("impl=engine-exec", func(b *testing.B) {
		cli := engineClient(b)
		id := warmFloor(b, cli)
		ctx := b.Context()
		for b.Loop() {
			if _, err := floorExec(ctx, cli, id); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=open", func(b *testing.B) {
		ctx := b.Context()
		sb := newSandbox(b, sandbox.WithLease(sandbox.MinLease*6))
		cpu := cpuTime()
		for b.Loop() {
			o, err := sandbox.Open(ctx, sb.ID())
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, o)
			if err := o.Detach(); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
	b.Run("impl=new", func(b *testing.B) {
		ctx := b.Context()
		cpu := cpuTime()
		for b.Loop() {
			sb, err := sandbox.New(ctx, sandbox.WithImage(busyboxImage))
			if err != nil {
				b.Fatal(err)
			}
			mustTrue(b, ctx, sb)
			if err := sb.Close(); err != nil {
				b.Fatal(err)
			}
		}
		reportCPU(b, cpu)
	})
}
