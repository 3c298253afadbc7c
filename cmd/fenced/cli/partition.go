package cli

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/fenced-dev/fenced/backend/etcd"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// setLink sets the network interface up or down with ip(8).
func setLink(ctx context.Context, dev string, up bool) error {
	state := "down"
	if up {
		state = "up"
	}
	out, err := exec.CommandContext(ctx, "ip", "link", "set", "dev", dev, state).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip link set dev %s %s: %w: %s", dev, state, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// partition is the partition fault: the interface to the server's namespace is set down for
// f.For, then up again, also when the run is interrupted meanwhile. Requests in flight stall
// (TCP retransmits) or fail; the server's clock runs on, so leases expire while their holders
// cannot reach it.
//
// On etcd the link is the one between the clients' member and its peers: the member is made
// the leader before the first cut, a follower before the second, and so on (etcdRole), and it
// goes on answering the clients while it cannot reach a quorum.
func (t *tortureRun) partition(ctx context.Context, f torture.Fault) {
	what := ""
	if d, ok := t.drv.(*etcd.Driver); ok {
		t.partitions++
		roleCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		role, err := etcdRole(roleCtx, d, t.url, t.partitions%2 == 1)
		cancel()
		if err != nil {
			role = "the clients' member (its role not arranged: " + err.Error() + ")"
		}
		what = "etcd " + role + " cut off from its peers, clients still talking to it: "
	}
	begin := torture.Now()
	if err := setLink(ctx, t.o.partitionDev, false); err != nil {
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: "partition: " + err.Error()})
		return
	}
	wait(ctx, f.For)
	// Up again whatever happened, with a context of its own: an interrupted run must not leave
	// the server cut off.
	upCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	detail := fmt.Sprintf("%s%s down for %s", what, t.o.partitionDev, f.For)
	if err := setLink(upCtx, t.o.partitionDev, true); err != nil {
		detail += "; " + err.Error()
	}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultPartition, Time: begin, EndTime: torture.Now(), Detail: detail})
}
