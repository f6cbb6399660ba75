package agentconn

import (
	"context"

	"github.com/agentsandbox/sandbox/internal/wire"
)

// Usage asks the agent what the sandbox uses now; dirs are the writable
// places whose used space it sums. Bounded by ctx and the Conn's timeout.
func (c *Conn) Usage(ctx context.Context, dirs []string) (wire.Usage, error) {
	return ask[wire.Usage](c, ctx, wire.UsageQuery, wire.UsageRequest{Dirs: dirs}, wire.UsageState, "usage")
}
