package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestTortureEtcd runs the fenced and the unfenced schedule on the shared etcd, each under a
// key prefix of its own (bump acts on the prefix's epoch). The unfenced workers take the same
// leases and then write the payload with an unconditional Put: the checker must find the
// stale writes that lets through.
func TestTortureEtcd(t *testing.T) {
	t.Parallel()
	tortureBoth(t, etcdPrefix, []string{"pause", "kill", "drop-reply", "bump"}, "--faults", "pause,kill,drop-reply,bump")
}

// TestTortureEtcdRestore restores an etcd of the test's own from a snapshot taken during the
// run (the client's Snapshot API, then etcdutl or etcdctl snapshot restore into a fresh data
// directory): with the epoch bump after it nothing is violated; without it (the control) the
// restored generations are handed out again and stale writes accepted, and the model, which
// takes the restore as a legitimate rollback, finds nothing wrong with the history itself.
func TestTortureEtcdRestore(t *testing.T) {
	t.Parallel()
	args := func(restore string) []string {
		return []string{"--duration", "10s", "--faults", "restore,drop-reply", "--restore-cmd", restore}
	}
	t.Run("bump", func(t *testing.T) {
		t.Parallel()
		url, _, restore := ownEtcd(t)
		code, out := runTorture(t, url, args(restore)...)
		if code != 0 || !strings.Contains(out, "RESULT: no violations found\n") {
			t.Fatalf("etcd restore and bump: exit %d, want 0 and no violations", code)
		}
		checkTortured(t, out, "restore")
		if !regexp.MustCompile(`\n +bump +ok [1-9]`).MatchString(out) {
			t.Error("no epoch bump followed the restores")
		}
	})
	t.Run("without bump", func(t *testing.T) {
		t.Parallel()
		url, _, restore := ownEtcd(t)
		code, out := runTorture(t, url, append(args(restore), "--restore-without-bump")...)
		checkRestoreControl(t, code, out)
	})
}

// TestTortureEtcdPartition runs a three-member cluster, each member in a network namespace of
// the test's own, the workers talking to m1 only, and cuts m1 off from its peers while the
// workers keep talking to it: as the leader at the first partition, as a follower at the
// second. Nothing may be violated, the timeline must show both cuts, and the link must be up
// again after the run.
func TestTortureEtcdPartition(t *testing.T) {
	t.Parallel()
	url, dev, _, _ := netnsEtcd(t)
	report := t.TempDir()
	code, out := runTortureIn(t, report, url, "--duration", "12s", "--faults", "partition,drop-reply", "--partition-dev", dev)
	if code != 0 || !strings.Contains(out, "RESULT: no violations found") {
		t.Fatalf("partitioned etcd: exit %d, want 0 and no violations", code)
	}
	checkTortured(t, out, "partition")
	if !linkUp(t, dev) {
		t.Fatalf("%s is left down after the run", dev)
	}
	page, err := os.ReadFile(filepath.Join(report, "index.html"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), "cut off from its peers, clients still talking to it") {
		t.Error("the report's events do not show the cuts")
	}
	// The roles etcd reported at each cut, in order: the leader, a follower, the leader, ...
	nem, err := os.ReadFile(filepath.Join(report, "history", "nemesis.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var roles []string
	for _, m := range regexp.MustCompile(`"event":"partition".*?m1 \((the leader|a follower)`).FindAllStringSubmatch(string(nem), -1) {
		roles = append(roles, m[1])
	}
	if len(roles) < 2 {
		t.Fatalf("%d partitions with m1's role recorded, want at least 2", len(roles))
	}
	for i, r := range roles {
		if want := []string{"the leader", "a follower"}[i%2]; r != want {
			t.Errorf("partition %d cut m1 off as %s, want %s", i+1, r, want)
		}
	}
}
