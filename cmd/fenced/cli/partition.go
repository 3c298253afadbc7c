package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
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

// netCtx is the context of an ip(8) or nft(8) call that changes the network. An interruption
// of the run does not cancel it: killed after the kernel made the change but before the
// command said so, the call would look failed, and the fault would stay in place with nobody
// to undo it (the link left down, TestInterruptDuringInjection). The timeout bounds a command
// that hangs.
func netCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
}

// partition is the partition fault: the interface to the server's namespace is set down for
// f.For, then up again, also when the run is interrupted meanwhile, during the down call
// included. Requests in flight stall (TCP retransmits) or fail; the server's clock runs on, so
// leases expire while their holders cannot reach it.
//
// On etcd the link is the one between the clients' member and its peers: the member is made
// the leader before the first cut, a follower before the second, and so on (etcdRole), and it
// goes on answering the clients while it cannot reach a quorum.
func (t *tortureRun) partition(ctx context.Context, f torture.Fault) {
	what := ""
	if d, ok := t.drv.(*etcd.Driver); ok {
		t.partitions++
		what = "etcd " + t.arrangeRole(ctx, d, t.partitions) + " cut off from its peers, clients still talking to it: "
	}
	if ctx.Err() != nil {
		return
	}
	begin := torture.Now()
	downCtx, cancelDown := netCtx(ctx)
	err := setLink(downCtx, t.o.partitionDev, false)
	cancelDown()
	// Up again whatever happened: an interrupted run must not leave the server cut off, nor
	// may a down call that failed after all (a timeout) that took effect.
	upCtx, cancel := netCtx(ctx)
	defer cancel()
	if err != nil {
		_ = setLink(upCtx, t.o.partitionDev, true)
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: "partition: " + err.Error()})
		return
	}
	wait(ctx, f.For)
	detail := fmt.Sprintf("%s%s down for %s", what, t.o.partitionDev, f.For)
	if err := setLink(upCtx, t.o.partitionDev, true); err != nil {
		detail += "; " + err.Error()
	}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultPartition, Time: begin, EndTime: torture.Now(), Detail: detail})
}

// lossTable is the nftables table of this run's loss fault: one per process, so that two runs
// on one machine never remove each other's rule.
func lossTable() string { return fmt.Sprintf("fenced_torture_loss_%d", os.Getpid()) }

// lossRule is the loss fault's table: two chains on the device itself (netdev family), one
// on its ingress and one on its egress, each dropping pct % of the frames at random and
// counting them. On the device, not in the inet hooks, so that it also sees the frames a
// bridge port forwards (etcd's members meet on a bridge).
func lossRule(table, dev string, pct int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "table netdev %s {\n", table)
	for _, hook := range []string{"ingress", "egress"} {
		fmt.Fprintf(&b, "\tchain %s {\n\t\ttype filter hook %s device %q priority 0; policy accept;\n\t\tnumgen random mod 100 < %d counter drop\n\t}\n",
			hook, hook, dev, pct)
	}
	b.WriteString("}\n")
	return b.String()
}

// nft runs nft(8) with the script on its standard input (when not empty).
func nft(ctx context.Context, script string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "nft", args...)
	if script != "" {
		cmd.Stdin = strings.NewReader(script)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("nft %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// lossApplies says whether the loss fault can run: it needs the partition fault's interface
// and nft.
func lossApplies(partitionErr error) error {
	if partitionErr != nil {
		return partitionErr
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return errors.New("needs nft (nftables) for its random drop rule (tc netem, where the kernel has it, is not used)")
	}
	return nil
}

var droppedRe = regexp.MustCompile(`counter packets (\d+)`)

// loss is the loss fault: f.LossPct % of the frames through --partition-dev are dropped at
// random, each way, for f.For, then the rule is removed, also when the run is interrupted
// meanwhile, during the call that adds the rule included. TCP retransmits what is lost (from
// 200 ms, doubling), so requests arrive late or their connections give up; the detail counts
// the frames dropped.
func (t *tortureRun) loss(ctx context.Context, f torture.Fault) {
	table, dev := lossTable(), t.o.partitionDev
	if ctx.Err() != nil {
		return
	}
	begin := torture.Now()
	addCtx, cancelAdd := netCtx(ctx)
	_, err := nft(addCtx, lossRule(table, dev, f.LossPct), "-f", "-")
	cancelAdd()
	// Removed whatever happened (see partition): an interrupted run must not leave the link
	// lossy.
	healCtx, cancel := netCtx(ctx)
	defer cancel()
	if err != nil {
		_, _ = nft(healCtx, "", "delete", "table", "netdev", table)
		_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: "error", Detail: "loss: " + err.Error()})
		return
	}
	wait(ctx, f.For)
	dropped := 0
	if out, err := nft(healCtx, "", "list", "table", "netdev", table); err == nil {
		for _, m := range droppedRe.FindAllStringSubmatch(out, -1) {
			n, _ := strconv.Atoi(m[1])
			dropped += n
		}
	}
	detail := fmt.Sprintf("loss %d%%: %s dropping %d%% of the frames each way for %s, %d dropped", f.LossPct, dev, f.LossPct, f.For, dropped)
	if _, err := nft(healCtx, "", "delete", "table", "netdev", table); err != nil {
		detail += "; " + err.Error()
	}
	_ = t.nem.Write(torture.Record{Kind: torture.KindEvent, Event: torture.FaultLoss, Time: begin, EndTime: torture.Now(), Detail: detail})
}
