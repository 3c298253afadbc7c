package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// TestInterruptDuringInjection interrupts a run while the command that injects a network
// fault is still running, after the change is made: the partition's "ip link set ... down",
// the loss fault's "nft -f -". The fault must be undone all the same. Before netCtx, the
// interruption killed the command, its error made the fault give up, and the link stayed
// down (a red CI run of TestTorturePartitionInterrupted: the link down, no partition
// recorded, the next run's requests going out of the default route).
//
// ip and nft are stand-ins on PATH that record their arguments, and block after the
// injection until released: the test cancels the run's context while one blocks, and
// releases it only once the fault has either returned (the command was killed: the bug) or
// has not within a second (the command lives on, as it must).
func TestInterruptDuringInjection(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	log, injected, release := filepath.Join(dir, "calls"), filepath.Join(dir, "injected"), filepath.Join(dir, "release")
	script := fmt.Sprintf(`#!/bin/sh
[ "$1" = "-f" ] && cat >/dev/null
echo "$(basename "$0") $*" >> %q
case "$*" in
*" down"|"-f -")
	touch %q
	i=0
	while [ ! -e %q ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done
	;;
esac
`, log, injected, release)
	for _, name := range []string{"ip", "nft"} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))

	for _, tc := range []struct {
		fault string
		run   func(*tortureRun, context.Context, torture.Fault)
		undo  string // the call that must follow the injection
	}{
		{torture.FaultPartition, (*tortureRun).partition, "ip link set dev fenced-x0 up"},
		{torture.FaultLoss, (*tortureRun).loss, "nft delete table netdev " + lossTable()},
	} {
		t.Run(tc.fault, func(t *testing.T) {
			for _, f := range []string{log, injected, release} {
				_ = os.Remove(f)
			}
			nem, err := torture.NewRecorder(filepath.Join(dir, tc.fault+".jsonl"), "nemesis")
			if err != nil {
				t.Fatal(err)
			}
			tr := &tortureRun{nem: nem}
			tr.o.partitionDev = "fenced-x0"
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan struct{})
			go func() {
				defer close(done)
				tc.run(tr, ctx, torture.Fault{Kind: tc.fault, For: time.Hour, LossPct: 30})
			}()
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) { // polling for the barrier
				if _, err := os.Stat(injected); err == nil {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the fault never ran its injection")
				}
			}
			cancel() // the interruption, while the injecting command still runs
			select {
			case <-done:
			case <-time.After(time.Second): // only a bound on seeing that nothing is killed
			}
			if err := os.WriteFile(release, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			<-done
			calls, err := os.ReadFile(log)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(calls), tc.undo+"\n") {
				t.Errorf("interrupted during the injection, the fault was not undone; calls:\n%s", calls)
			}
		})
	}
}
