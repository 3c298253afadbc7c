package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced/cmd/fenced/cli"
	"github.com/fenced-dev/fenced/destination/artifact"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// runEnv is runIn with extra environment variables; FENCED_STORE is unset unless given.
func runEnv(t *testing.T, tg target, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = tg.dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FENCED_DB=") && !strings.HasPrefix(kv, "FENCED_STORE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(append(cmd.Env, "FENCED_DB="+tg.url), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if _, ok := err.(*exec.ExitError); err != nil && !ok {
		t.Fatalf("run fenced %s: %v", strings.Join(args, " "), err)
	}
	return result{code: cmd.ProcessState.ExitCode(), stdout: stdout.Bytes(), stderr: stderr.String()}
}

type pointerOut struct {
	Key         string `json:"key"`
	SHA256      string `json:"sha256"`
	Size        int64  `json:"size"`
	ContentType string `json:"content_type"`
	Generation  int64  `json:"generation"`
}

type gcOut struct {
	DryRun  bool `json:"dry_run"`
	Deleted []struct {
		Key        string `json:"key"`
		Resource   string `json:"resource"`
		Epoch      int64  `json:"epoch"`
		Generation int64  `json:"generation"`
		Bytes      int64  `json:"bytes"`
	} `json:"deleted"`
	DeletedBytes int64    `json:"deleted_bytes"`
	Kept         int      `json:"kept"`
	Skipped      []string `json:"skipped"`
	Staged       int      `json:"staged_deleted"`
}

func artifactArgs(resource string, l leaseOut, file string, extra ...string) []string {
	return append(leaseArgs("publish", resource, l, "--epoch", strconv.FormatInt(l.Epoch, 10), "--artifact", file), extra...)
}

// The handover through the command line: A's lease runs out, B publishes an artifact, A's late
// artifact is refused; get follows B's pointer byte for byte, show and get --pointer print it,
// and gc removes A's orphan only.
func TestArtifactHandover(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		const res = "rapport annuel/€ 1"
		store := artifact.FileURL(filepath.Join(tg.dir, "store"))
		env := []string{"FENCED_STORE=" + store}
		ok := func(args ...string) []byte {
			t.Helper()
			r := runEnv(t, tg, env, args...)
			if r.code != 0 || r.stderr != "" {
				t.Fatalf("fenced %s: exit %d, stderr %q", strings.Join(args, " "), r.code, r.stderr)
			}
			return r.stdout
		}
		ok("provision", res)
		ok("epoch", "bump")
		ok("epoch", "bump")
		a := decode[leaseOut](t, ok("acquire", res, "--ttl", "1s"))
		fileA, fileB := filepath.Join(tg.dir, "a.bin"), filepath.Join(tg.dir, "b.bin")
		dataA := bytes.Repeat([]byte("A\x00é"), 100000)
		dataB := bytes.Repeat([]byte("B\x00€"), 150000)
		if err := os.WriteFile(fileA, dataA, 0o666); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(fileB, dataB, 0o666); err != nil {
			t.Fatal(err)
		}
		tg.waitExpired(res)
		b := decode[leaseOut](t, ok("acquire", res, "--ttl", "1m"))
		if b.Epoch == b.Generation {
			t.Fatalf("epoch and generation are both %d", b.Epoch)
		}
		ok(artifactArgs(res, b, fileB, "--release", "--content-type", "application/x-test")...)

		r := runEnv(t, tg, env, artifactArgs(res, a, fileA)...)
		if r.code != cli.ExitRefused || len(r.stdout) != 0 {
			t.Fatalf("A's late artifact: exit %d, stdout %q, stderr %q; want refused", r.code, r.stdout, r.stderr)
		}
		checkSentence(t, r.stderr)

		if got := ok("get", res); !bytes.Equal(got, dataB) {
			t.Fatalf("get returned %d bytes, want B's %d exactly", len(got), len(dataB))
		}
		out := filepath.Join(tg.dir, "out.bin")
		ok("get", res, "--output", out)
		if got, _ := os.ReadFile(out); !bytes.Equal(got, dataB) {
			t.Fatal("get --output wrote other bytes")
		}
		p := decode[pointerOut](t, ok("get", res, "--pointer"))
		if p.Size != int64(len(dataB)) || p.Generation != b.Generation || p.ContentType != "application/x-test" || len(p.SHA256) != 64 {
			t.Fatalf("pointer %+v", p)
		}
		var shown struct {
			Artifact *pointerOut `json:"artifact"`
		}
		if err := json.Unmarshal(ok("show", res), &shown); err != nil || shown.Artifact == nil || *shown.Artifact != p {
			t.Fatalf("show's artifact %+v (%v), want %+v", shown.Artifact, err, p)
		}

		if g := decode[gcOut](t, ok("gc", "--older-than", "1h")); len(g.Deleted) != 0 || g.Kept != 2 {
			t.Fatalf("gc of young objects: %+v", g)
		}
		dry := decode[gcOut](t, ok("gc", "--older-than", "0s", "--dry-run"))
		if !dry.DryRun || len(dry.Deleted) != 1 || dry.Deleted[0].Generation != a.Generation || dry.DeletedBytes != int64(len(dataA)) {
			t.Fatalf("gc --dry-run: %+v", dry)
		}
		g := decode[gcOut](t, ok("gc", "--older-than", "0s"))
		if len(g.Deleted) != 1 || g.Deleted[0].Key != dry.Deleted[0].Key || g.Deleted[0].Resource != res {
			t.Fatalf("gc: %+v", g)
		}
		if g := decode[gcOut](t, ok("gc", "--older-than", "0s")); len(g.Deleted) != 0 {
			t.Fatalf("second gc: %+v", g)
		}
		if got := ok("get", res); !bytes.Equal(got, dataB) {
			t.Fatal("get after gc returned other bytes")
		}

		// A damaged object is an error, and --output then writes nothing.
		path := filepath.Join(tg.dir, "store", filepath.FromSlash(p.Key))
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(dataB[:len(dataB)-1], 'x'), 0o666); err != nil {
			t.Fatal(err)
		}
		bad := filepath.Join(tg.dir, "bad.bin")
		r = runEnv(t, tg, env, "get", res, "--output", bad)
		if r.code != cli.ExitOperational || !strings.Contains(r.stderr, "SHA-256") {
			t.Fatalf("get of an altered artifact: exit %d, stderr %q", r.code, r.stderr)
		}
		checkSentence(t, r.stderr)
		if _, err := os.Stat(bad); !os.IsNotExist(err) {
			t.Fatalf("get --output of an altered artifact left %s (%v)", bad, err)
		}
	})
}

// Without --store and FENCED_STORE, a SQLite database keeps its artifacts in PATH.artifacts;
// another database needs a store named.
func TestArtifactDefaultStore(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		const res = "défaut"
		if r := runEnv(t, tg, nil, "provision", res); r.code != 0 {
			t.Fatal(r.stderr)
		}
		l := decode[leaseOut](t, runEnv(t, tg, nil, "acquire", res, "--ttl", "10m").stdout)
		file := filepath.Join(tg.dir, "x")
		if err := os.WriteFile(file, []byte("x\x00y"), 0o666); err != nil {
			t.Fatal(err)
		}
		r := runEnv(t, tg, nil, artifactArgs(res, l, file)...)
		if strings.HasPrefix(tg.url, "sqlite:") {
			if r.code != 0 {
				t.Fatalf("publish with the default store: %d %q", r.code, r.stderr)
			}
			dir := strings.TrimPrefix(tg.url, "sqlite:") + ".artifacts"
			if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
				t.Fatalf("default store %s: %v", dir, err)
			}
			if got := runEnv(t, tg, nil, "get", res).stdout; string(got) != "x\x00y" {
				t.Fatalf("get: %q", got)
			}
			return
		}
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "no artifact store") {
			t.Fatalf("publish without a store on %s: exit %d, stderr %q", tg.url, r.code, r.stderr)
		}
		checkSentence(t, r.stderr)
	})
}

// Bad input: one sentence, the right exit code, nothing published.
func TestArtifactBadInput(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		const res = "bad input"
		store := artifact.FileURL(filepath.Join(tg.dir, "store"))
		runEnv(t, tg, nil, "provision", res)
		runEnv(t, tg, nil, "epoch", "bump")
		l := decode[leaseOut](t, runEnv(t, tg, nil, "acquire", res, "--ttl", "10m").stdout)
		file := filepath.Join(tg.dir, "x")
		if err := os.WriteFile(file, []byte("x"), 0o666); err != nil {
			t.Fatal(err)
		}
		azure := []string{"AZURE_STORAGE_ACCOUNT=devstoreaccount1", "AZURE_STORAGE_KEY=" +
			"Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="}
		for _, c := range []struct {
			name string
			args []string
			env  []string
			code int
			says string
		}{
			{"missing file", artifactArgs(res, l, filepath.Join(tg.dir, "nope"), "--store", store), nil, cli.ExitUsage, "cannot read --artifact"},
			{"directory", artifactArgs(res, l, tg.dir, "--store", store), nil, cli.ExitUsage, "not a regular file"},
			{"unknown scheme", artifactArgs(res, l, file, "--store", "ftp://host/x"), nil, cli.ExitUsage, `scheme "ftp" is not supported`},
			{"no scheme", artifactArgs(res, l, file, "--store", "just/a/path"), nil, cli.ExitUsage, "no scheme"},
			{"relative file", artifactArgs(res, l, file, "--store", "file:relative"), nil, cli.ExitUsage, "absolute path"},
			{"no container", artifactArgs(res, l, file, "--store", "azblob://"), azure, cli.ExitUsage, "names no bucket or container"},
			{"no container from the environment", artifactArgs(res, l, file), append([]string{"FENCED_STORE=s3://"}, azure...), cli.ExitUsage, "names no bucket or container"},
			{"unreachable file store", artifactArgs(res, l, file, "--store", "file:///proc/fenced-cannot-exist"), nil, cli.ExitOperational, "artifact store"},
			{"unreachable azure", artifactArgs(res, l, file, "--store",
				"azblob://c?protocol=http&domain="+drivertest.ClosedAddr(t)), azure, cli.ExitOperational, "not reachable"},
			{"both file and artifact", artifactArgs(res, l, file, "--file", file), nil, cli.ExitUsage, "not both"},
			{"pointer of an ordinary payload", []string{"get", "nothing", "--pointer"}, nil, cli.ExitNotFound, "not provisioned"},
			{"negative gc age", []string{"gc", "--older-than", "-1s", "--store", store}, nil, cli.ExitUsage, "--older-than"},
		} {
			r := runEnv(t, tg, c.env, c.args...)
			if r.code != c.code || len(r.stdout) != 0 || !strings.Contains(r.stderr, c.says) {
				t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d saying %q", c.name, r.code, r.stdout, r.stderr, c.code, c.says)
			}
			checkSentence(t, r.stderr)
		}
		var st stateOut
		_ = json.Unmarshal(runEnv(t, tg, nil, "show", res).stdout, &st)
		if st.PublishedGeneration != 0 {
			t.Fatalf("something was published: %+v", st)
		}
		// An ordinary payload is not a pointer: get --pointer says so, get prints it.
		if r := runEnv(t, tg, nil, leaseArgs("publish", res, l, "--epoch", strconv.FormatInt(l.Epoch, 10), "--file", file)...); r.code != 0 {
			t.Fatal(r.stderr)
		}
		if r := runEnv(t, tg, nil, "get", res, "--pointer"); r.code != cli.ExitNotFound || !strings.Contains(r.stderr, "not an artifact pointer") {
			t.Fatalf("get --pointer of a payload: %d %q", r.code, r.stderr)
		}
	})
}

// run --artifact streams the command's standard output, larger than a payload may be, into an
// artifact; a failing command publishes nothing and leaves no object behind.
func TestRunArtifact(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tg := target{t: t, url: "sqlite:" + filepath.Join(dir, "test.db"), dir: dir}
	const res = "job €"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	// 6 MiB: more than the 4 MiB payload limit.
	r := runEnv(t, tg, nil, "run", res, "--ttl", "1m", "--artifact", "--content-type", "text/plain", "--",
		"sh", "-c", `head -c 6291456 /dev/zero | tr '\0' 'x'; printf '%s' "$FENCED_GENERATION"`)
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("run --artifact: exit %d, stderr %q", r.code, r.stderr)
	}
	var out struct {
		Generation int64      `json:"generation"`
		Artifact   pointerOut `json:"artifact"`
	}
	if err := json.Unmarshal(r.stdout, &out); err != nil || out.Artifact.Size != 6291457 || out.Artifact.ContentType != "text/plain" {
		t.Fatalf("run --artifact printed %s (%v)", r.stdout, err)
	}
	got := runEnv(t, tg, nil, "get", res).stdout
	if want := append(bytes.Repeat([]byte("x"), 6291456), strconv.FormatInt(out.Generation, 10)...); !bytes.Equal(got, want) {
		t.Fatalf("get returned %d bytes, want the command's %d", len(got), len(want))
	}
	store := filepath.Join(dir, "test.db.artifacts")
	count := func() int {
		n := 0
		_ = filepath.WalkDir(filepath.Join(store, "fenced-artifacts"), func(_ string, d os.DirEntry, _ error) error {
			if d != nil && !d.IsDir() {
				n++
			}
			return nil
		})
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("%d objects in the store, want 1", n)
	}
	r = runEnv(t, tg, nil, "run", res, "--ttl", "1m", "--artifact", "--", "sh", "-c", "echo partial; exit 3")
	if r.code != 3 || !strings.Contains(r.stderr, "nothing was published") {
		t.Fatalf("failing command: exit %d, stderr %q", r.code, r.stderr)
	}
	if n := count(); n != 1 {
		t.Fatalf("a failed command left an object: %d objects", n)
	}
	var st stateOut
	if err := json.Unmarshal(tg.ok(nil, "show", res), &st); err != nil || st.PublishedGeneration != out.Generation {
		t.Fatalf("after the failed run: %+v (%v)", st, err)
	}
}
