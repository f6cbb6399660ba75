package docker

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"

	"github.com/docker/docker/api/types/network"

	"github.com/agentsandbox/sandbox/driver"
	"github.com/agentsandbox/sandbox/internal/engine"
	"github.com/agentsandbox/sandbox/internal/firewall"
	"github.com/agentsandbox/sandbox/internal/leftover"
)

// openNet is an Open sandbox's bridge network and host firewall rules.
type openNet struct {
	id     string // network ID
	name   string
	bridge string
	rules  *firewall.Rules
}

// subnetBase is where Open sandboxes' networks get their /28s: 10.213.0.0/16.
var subnetBase = netip.MustParseAddr("10.213.0.0")

// createOpenNetwork makes the bridge network and host firewall rules of an
// Open sandbox: the sandbox reaches out, but not the host's services, the
// engine's other networks or other sandboxes.
func (in *instance) createOpenNetwork(ctx context.Context) error {
	if err := in.d.firewallSupported(); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrNetworkUnsupported, err)
	}
	var suffix [6]byte
	rand.Read(suffix[:])
	tag := hex.EncodeToString(suffix[:])
	n := &openNet{name: "agentsandbox-" + tag, bridge: "asb" + tag}
	in.net = n
	var created network.CreateResponse
	var gateway string
	for try := 0; ; try++ {
		var b [2]byte
		rand.Read(b[:])
		base := subnetBase.As4()
		idx := binary.BigEndian.Uint16(b[:]) & 0x0fff // 4096 /28s
		base[2], base[3] = byte(idx>>4), byte(idx<<4)
		subnet := netip.PrefixFrom(netip.AddrFrom4(base), 28)
		gw := subnet.Addr().Next()
		dctx, cancel := detached(ctx) // a cancelled create may still happen: keep its ID
		var err error
		created, err = in.cli.NetworkCreate(dctx, n.name, network.CreateOptions{
			Driver: "bridge",
			IPAM:   &network.IPAM{Config: []network.IPAMConfig{{Subnet: subnet.String(), Gateway: gw.String()}}},
			Options: map[string]string{
				"com.docker.network.bridge.name":       n.bridge,
				"com.docker.network.bridge.enable_icc": "false",
			},
			Labels: in.labels("network", nil),
		})
		cancel()
		if err == nil {
			gateway = gw.String()
			break
		}
		if !engine.IsSubnetOverlap(err) || try >= 20 {
			return in.d.err("create network", err)
		}
	}
	n.id = created.ID
	if err := ctxErr(ctx, "create network"); err != nil {
		return err
	}
	var err error
	if n.rules, err = firewall.Isolate(ctx, n.bridge, gateway, 0, n.id); err != nil {
		return fmt.Errorf("sandbox: network policy: %w", err)
	}
	return nil
}

// removeNetwork removes the firewall rules and the network (after the
// container is gone).
func (in *instance) removeNetwork(ctx context.Context) error {
	n := in.net
	if n == nil {
		return nil
	}
	var errs []error
	if err := n.rules.Remove(); err != nil {
		errs = append(errs, err)
	}
	// Without an ID the create may still have happened (its answer was
	// lost): the name is unique, remove by it.
	if target := cmp.Or(n.id, n.name); target != "" {
		err := engine.RetryBusy(ctx, func() error {
			if err := in.cli.NetworkRemove(ctx, target); err != nil && !engine.IsNotFound(err) {
				return err
			}
			return nil
		}, engine.IsInUse) // the container is still going away
		if err != nil {
			in.d.remember(leftover.Network, target, err)
			errs = append(errs, fmt.Errorf("sandbox: remove network: %w", err))
		}
	}
	return errors.Join(errs...)
}
