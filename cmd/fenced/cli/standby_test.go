package cli_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/backend/postgres"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// readOnlySentence is what every write to a hot standby says.
const readOnlySentence = "the database server is read-only (a standby or replica); connect to the primary"

// TestHotStandbyAndPromotion makes a real standby with pg_basebackup -R from a primary of the
// test's own, reads through it (the command and the library), sees every write refused with
// one sentence, then promotes it as a failover would: acquisitions are refused until "fenced
// epoch bump", the old holder's lease is refused (exit 5) naming both incarnations, and the
// next acquisition gets the next generation in the new epoch.
func TestHotStandbyAndPromotion(t *testing.T) {
	t.Parallel()
	pg := newPGServers(t)
	primary := pg.primary("primary")
	primary.start()
	pt := target{t: t, url: primary.URL(), dir: t.TempDir()}

	// Epochs bumped twice first, so that no epoch coincides with a generation below.
	const res = "rép lica 1"
	pt.ok(nil, "migrate")
	pt.ok(nil, "epoch", "bump")
	epoch := decode[struct{ Epoch int64 }](t, pt.ok(nil, "epoch", "bump")).Epoch
	pt.ok(nil, "provision", res)
	payload := []byte("first\x00result\x00")
	first := pt.acquire(res, "1m")
	pt.ok(payload, append(leaseArgs("publish", res, first, "--epoch", strconv.FormatInt(first.Epoch, 10)), "--release")...)
	holder := pt.acquire(res, "10m") // the holder that the failover leaves behind, unpublished
	if holder.Epoch != epoch || holder.Generation == epoch {
		t.Fatalf("holder %+v: want epoch %d and a generation that differs from it", holder, epoch)
	}
	// A schema nobody migrated, to see Migrate refused on the standby.
	var unmigrated string
	primary.query(`SELECT 'fenced_unmigrated_' || md5(random()::text)`, &unmigrated)
	primary.exec(`CREATE SCHEMA ` + unmigrated)

	standby := pg.standby("standby", primary)
	standby.start()
	standby.caughtUp(primary)
	st := target{t: t, url: standby.URL(), dir: t.TempDir()}

	// Reads work on the standby and see the primary's state.
	want := pt.show(res)
	got := st.show(res)
	if got.Generation != want.Generation || got.Epoch != want.Epoch || got.Owner == nil || *got.Owner != holder.Owner ||
		got.PublishedGeneration != first.Generation || got.CurrentEpoch != epoch {
		t.Errorf("show on the standby: %+v, want the primary's %+v", got, want)
	}
	if out := st.ok(nil, "get", res); !bytes.Equal(out, payload) {
		t.Errorf("get on the standby: %q, want %q", out, payload)
	}
	st.ok(nil, "migrate") // nothing to migrate: skipped, not refused
	libraryReads(t, standby.URL(), res, holder.Generation, payload)

	// A schema that needs migrating is refused there, saying why.
	msg := target{t: t, url: standby.URL() + "&search_path=" + unmigrated, dir: t.TempDir()}.fails(1, nil, "show", res)
	if !strings.Contains(msg, "the schema needs migrating (it is at version 0") || !strings.Contains(msg, readOnlySentence) {
		t.Errorf("show on the standby in an unmigrated schema: %q, want the schema and the read-only server named", msg)
	}

	// Every write is refused with the one sentence.
	for _, m := range everyCommand(t, st, res, holder) {
		switch m.args[0] {
		case "show", "get", "migrate":
			if m.code != 0 {
				t.Errorf("fenced %s on the standby: exit %d, %q", m.cmd, m.code, m.stderr)
			}
		default:
			if m.code != 1 || !strings.Contains(m.stderr, readOnlySentence) {
				t.Errorf("fenced %s on the standby: exit %d, %q; want exit 1 and %q", m.cmd, m.code, m.stderr, readOnlySentence)
			}
		}
	}

	// Failover: the primary goes away and the standby is promoted to a new timeline.
	primary.stop()
	standby.promote()
	var sysid string
	standby.query(`SELECT system_identifier::text FROM pg_control_system()`, &sysid)
	before, after := sysid+"/1", sysid+"/2"

	msg = st.fails(1, nil, "acquire", res, "--ttl", "1m")
	if strings.Count(msg, "restored or promoted") != 1 || !strings.Contains(msg, after) || !strings.Contains(msg, before) ||
		!strings.Contains(msg, "bump the epoch") {
		t.Errorf("acquire after the promotion: %q, want one sentence naming %s and %s and the bump", msg, after, before)
	}
	holderArgs := func(op string, extra ...string) []string {
		return append(leaseArgs(op, res, holder, "--epoch", strconv.FormatInt(holder.Epoch, 10)), extra...)
	}
	for _, args := range [][]string{holderArgs("publish"), holderArgs("renew", "--ttl", "1m"), holderArgs("release")} {
		msg := st.fails(5, []byte("stale"), args...)
		if strings.Count(msg, "restored or promoted") != 1 || !strings.Contains(msg, after) || !strings.Contains(msg, before) {
			t.Errorf("fenced %s after the promotion: %q, want one refusal naming %s and %s", args[0], msg, after, before)
		}
	}
	for _, m := range everyCommand(t, st, res, holder, "epoch") { // the bump comes next, on its own
		switch m.args[0] {
		case "acquire", "run":
			if m.code != 1 || !strings.Contains(m.stderr, after) {
				t.Errorf("fenced %s after the promotion: exit %d, %q; want exit 1 naming %s", m.cmd, m.code, m.stderr, after)
			}
		case "renew", "publish", "release":
			if m.code != 5 || !strings.Contains(m.stderr, after) {
				t.Errorf("fenced %s after the promotion: exit %d, %q; want exit 5 naming %s", m.cmd, m.code, m.stderr, after)
			}
		}
	}

	// The bump records the new incarnation: the next acquisition gets the next generation in
	// the new epoch, and the old holder stays refused.
	bumped := decode[struct{ Epoch int64 }](t, st.ok(nil, "epoch", "bump")).Epoch
	if bumped <= epoch {
		t.Fatalf("epoch bump after the promotion: %d, want more than %d", bumped, epoch)
	}
	next := st.acquire(res, "1m")
	if next.Epoch != bumped || next.Generation != holder.Generation+1 {
		t.Errorf("acquire after the bump: %+v, want epoch %d generation %d", next, bumped, holder.Generation+1)
	}
	st.fails(5, []byte("stale"), holderArgs("publish")...)
	st.ok([]byte("second"), leaseArgs("publish", res, next, "--epoch", strconv.FormatInt(next.Epoch, 10))...)
	if out := st.ok(nil, "get", res); string(out) != "second" {
		t.Errorf("get after the new holder published: %q", out)
	}
}

// libraryReads reads through the library on a hot standby: New (which migrates) and the reads
// work, a write says the server is read-only.
func libraryReads(t *testing.T, url, res string, generation int64, payload []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drv, err := postgres.Open(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	s, err := fenced.New(ctx, drv, nil)
	if err != nil {
		t.Fatalf("New on a hot standby with a current schema: %v", err)
	}
	defer s.Close()
	if st, err := s.Show(ctx, res); err != nil || st.Generation != generation {
		t.Errorf("Show on the standby: %+v, %v; want generation %d", st, err, generation)
	}
	if got, _, err := s.Get(ctx, res); err != nil || !bytes.Equal(got, payload) {
		t.Errorf("Get on the standby: %q, %v", got, err)
	}
	_, err = s.Acquire(ctx, res, time.Minute)
	if !errors.Is(err, fenced.ErrReadOnly) || errors.Is(err, fenced.ErrOutcomeUnknown) {
		t.Errorf("Acquire on the standby: %v, want ErrReadOnly, certainly not applied", err)
	}
}

// TestUnreachableServer: every command says which server it could not reach and why, once,
// on every backend with a server, and soon: a command that waits for a connection until it is
// killed exits -1, not 1 (etcd's client, unless told otherwise, waits forever).
func TestUnreachableServer(t *testing.T) {
	t.Parallel()
	lease := leaseOut{Owner: "OWNER", Epoch: 2, Generation: 3}
	for _, c := range []struct {
		server string // as the message names it
		url    func(addr string) string
	}{
		{"PostgreSQL", func(a string) string { return "postgres://postgres@" + a + "/postgres?connect_timeout=5" }},
		{"MySQL or MariaDB", func(a string) string { return "mysql://root@" + a + "/fenced" }},
		{"Redis", func(a string) string { return "redis://" + a + "/0" }},
		{"etcd", func(a string) string { return "etcd://" + a }},
	} {
		t.Run(c.server, func(t *testing.T) {
			t.Parallel()
			addr := drivertest.ClosedAddr(t) // nothing listens there
			tg := target{t: t, url: c.url(addr), dir: t.TempDir()}
			want := fmt.Sprintf("cannot connect to the %s server at %s: connection refused", c.server, addr)
			for _, m := range everyCommand(t, tg, "r", lease) {
				if m.code != 1 || !strings.Contains(m.stderr, want) {
					t.Errorf("fenced %s with the server down: exit %d, %q; want exit 1 and %q", m.cmd, m.code, m.stderr, want)
				}
			}
		})
	}
}

// commandRun is one command's run and what it printed on stderr.
type commandRun struct {
	args   []string
	cmd    string
	code   int
	stderr string
}

// everyCommand runs every command that touches the database against tg, checks that whatever
// it printed on stderr is one sentence without internal words or repetition, and returns the
// runs. Commands named in skip are left out.
func everyCommand(t *testing.T, tg target, res string, l leaseOut, skip ...string) []commandRun {
	t.Helper()
	epoch := strconv.FormatInt(l.Epoch, 10)
	cmds := [][]string{
		{"migrate"},
		{"provision", res, "other resource"},
		{"acquire", res, "--ttl", "1m"},
		leaseArgs("renew", res, l, "--epoch", epoch, "--ttl", "1m"),
		leaseArgs("publish", res, l, "--epoch", epoch),
		leaseArgs("release", res, l, "--epoch", epoch),
		{"show", res},
		{"get", res},
		{"resolve", "OPERATION1"},
		{"epoch", "bump"},
		{"grant", "--role", "fenced_no_such_role"},
		{"prune", "--older-than", "10000h"}, // past the default --max-ttl plus the margin
		{"run", res, "--ttl", "1m", "--", "true"},
	}
	var out []commandRun
	for _, args := range cmds {
		if slices.Contains(skip, args[0]) {
			continue
		}
		r := tg.run([]byte("payload"), args...)
		m := commandRun{args: args, cmd: strings.Join(args, " "), code: r.code, stderr: r.stderr}
		if r.code != 0 {
			t.Logf("fenced %s: exit %d: %s", m.cmd, m.code, strings.TrimSpace(m.stderr))
			checkMessage(t, m)
		}
		out = append(out, m)
	}
	return out
}

// internalWords must never reach a user: the library's and the drivers' vocabulary, the
// engine's error codes, and the migration every command starts with.
var internalWords = []string{"not applied", "sqlstate", "fnc01", "25006", "acquire connection", "failed to connect",
	"dial error", "pgconn", "(14)", "migrate:"}

// checkMessage fails unless m's stderr is one sentence, free of internal words, that says
// nothing twice (no run of five words appears twice).
func checkMessage(t *testing.T, m commandRun) {
	t.Helper()
	checkSentence(t, m.stderr)
	lower := strings.ToLower(m.stderr)
	for _, w := range internalWords {
		if strings.Contains(lower, w) && (w != "migrate:" || m.args[0] != "migrate") {
			t.Errorf("fenced %s: %q says %q", m.cmd, m.stderr, w)
		}
	}
	words := strings.Fields(strings.Trim(lower, ".\n"))
	seen := map[string]bool{}
	for i := 0; i+5 <= len(words); i++ {
		k := strings.Join(words[i:i+5], " ")
		if seen[k] {
			t.Errorf("fenced %s: %q says %q twice", m.cmd, m.stderr, k)
			break
		}
		seen[k] = true
	}
}

// TestSQLiteUnopenable: a database file that cannot be opened is named, with the reason.
func TestSQLiteUnopenable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for path, reason := range map[string]string{
		filepath.Join(dir, "missing", "dir", "x.db"): "the directory " + filepath.Join(dir, "missing", "dir") + " does not exist",
		dir:                         "it is a directory",
		filepath.Join(file, "x.db"): "not a directory",
	} {
		tg := target{t: t, url: "sqlite:" + path, dir: dir}
		msg := tg.fails(1, nil, "show", "r")
		if !strings.Contains(msg, path) || !strings.Contains(msg, reason) {
			t.Errorf("show on sqlite:%s: %q, want the path and %q", path, msg, reason)
		}
		checkMessage(t, commandRun{args: []string{"show", "r"}, cmd: "show r", code: 1, stderr: msg})
	}
}
