package cli_test

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/fenced-dev/fenced/driver/drivertest"
)

type resolveOut struct {
	OpID       string  `json:"op_id"`
	Outcome    string  `json:"outcome"`
	Resource   string  `json:"resource"`
	Epoch      int64   `json:"epoch"`
	Generation int64   `json:"generation"`
	RecordedAt *string `json:"recorded_at"`
}

func TestOperationIDsAndResolve(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(tg target) {
		t := tg.t
		tg.ok(nil, "provision", "r")
		l := tg.acquire("r", "1m")
		out := string(tg.ok([]byte("v1"), leaseArgs("publish", "r", l, "--op-id", "job-1")...))
		if !strings.Contains(out, `"op_id":"job-1"`) {
			t.Fatalf("publish output %s does not name the operation", out)
		}
		r := decode[resolveOut](t, tg.ok(nil, "resolve", "job-1"))
		if r.Outcome != "accepted" || r.Resource != "r" || r.Generation != l.Generation || r.Epoch != l.Epoch {
			t.Fatalf("resolve job-1: %+v", r)
		}
		r = decode[resolveOut](t, tg.ok(nil, "resolve", "never-sent"))
		if r.Outcome != "not_accepted" || r.Resource != "" {
			t.Fatalf("resolve never-sent: %+v", r)
		}
		tg.ok(nil, leaseArgs("release", "r", l)...)
		l2 := tg.acquire("r", "1m")
		tg.fails(5, []byte("late"), leaseArgs("publish", "r", l2, "--op-id", "never-sent")...)
		tg.fails(2, []byte("x"), leaseArgs("publish", "r", l2, "--op-id", "has space")...)
		tg.fails(2, nil, "resolve")
		tg.ok([]byte("v2"), leaseArgs("publish", "r", l2)...) // a fresh id is generated
	})
}

func TestSourceVersion(t *testing.T) {
	tg := runTarget(t)
	l := tg.acquire("job", "1m")
	tg.ok([]byte("v5"), leaseArgs("publish", "job", l, "--source-version", "5", "--release")...)
	l = tg.acquire("job", "1m")
	if msg := tg.fails(5, []byte("v3"), leaseArgs("publish", "job", l, "--source-version", "3")...); !strings.Contains(msg, "source version") {
		t.Fatalf("stale source refusal says %q", msg)
	}
	if st := tg.show("job"); st.SourceVersion != 5 || st.PublishedGeneration != 1 {
		t.Fatalf("after a stale source: %+v", st)
	}
	tg.fails(2, []byte("x"), leaseArgs("publish", "job", l, "--source-version", "x")...)
}

func TestEpochBump(t *testing.T) {
	tg := runTarget(t)
	old := tg.acquire("job", "1m")
	if old.Epoch < 1<<40 {
		t.Fatalf("first epoch %d; want the database's clock in microseconds", old.Epoch)
	}
	bumped := decode[struct {
		Epoch int64 `json:"epoch"`
	}](t, tg.ok(nil, "epoch", "bump"))
	if bumped.Epoch <= old.Epoch {
		t.Fatalf("epoch bump printed %d after %d", bumped.Epoch, old.Epoch)
	}
	tg.wantRefused(fmt.Sprintf("lease %s was acquired before the epoch was bumped to %d", old.Token, bumped.Epoch), []byte("old"), leaseArgs("publish", "job", old)...)
	l := tg.acquire("job", "1m")
	if l.Epoch != bumped.Epoch || l.Generation != old.Generation+1 || l.Token != fmt.Sprintf("%d.%d", bumped.Epoch, l.Generation) {
		t.Fatalf("after the bump: %+v", l)
	}
	oldEpoch := strconv.FormatInt(old.Epoch, 10)
	tg.wantRefused(fmt.Sprintf("lease %d.%d names the wrong epoch", old.Epoch, l.Generation), []byte("wrong epoch"), leaseArgs("publish", "job", l, "--epoch", oldEpoch)...)
	tg.ok([]byte("new"), leaseArgs("publish", "job", l)...) // the epoch is the holder's without --epoch
	if st := tg.show("job"); st.Epoch != l.Epoch || st.CurrentEpoch != l.Epoch || st.PublishedEpoch != l.Epoch {
		t.Fatalf("show after the bump: %+v", st)
	}
	tg.fails(2, nil, leaseArgs("release", "job", l, "--epoch", "0")...)
}

func TestGrantAndPrune(t *testing.T) {
	tg := runTarget(t)
	if msg := tg.fails(2, nil, "grant", "--role", "app"); !strings.Contains(msg, "no roles") {
		t.Fatalf("grant on SQLite: %q", msg)
	}
	tg.fails(2, nil, "grant")
	if out := string(tg.ok(nil, "--max-ttl", "1h", "prune", "--older-than", "25h")); out != "{\"pruned\":0}\n" {
		t.Fatalf("prune printed %q", out)
	}
	tg.fails(2, nil, "prune", "--older-than", "0s")
	// Below the minimum (the longest ttl plus a day), nothing is deleted and the message says why.
	if msg := tg.fails(2, nil, "prune", "--older-than", "1h"); !strings.Contains(msg, "at least --max-ttl (8784h0m0s) plus 24h0m0s") {
		t.Fatalf("prune below the minimum: %q", msg)
	}
	tg.fails(2, nil, "--max-ttl", "1h", "prune", "--older-than", "24h")
	// --max-ttl also bounds what is acquired.
	tg.ok(nil, "provision", "q")
	if msg := tg.fails(2, nil, "--max-ttl", "1h", "acquire", "q", "--ttl", "2h"); !strings.Contains(msg, "2h0m0s is outside 1ms to 1h0m0s") {
		t.Fatalf("acquire past --max-ttl: %q", msg)
	}
}

// proxiedPostgres is a fresh PostgreSQL schema reached directly and through a proxy that can
// lose a reply.
func proxiedPostgres(t *testing.T) (direct, proxied target, proxy *drivertest.Proxy) {
	direct = target{t: t, url: postgresSchema(t), dir: t.TempDir()}
	u, err := url.Parse(direct.url)
	if err != nil {
		t.Fatal(err)
	}
	proxy = drivertest.StartProxy(t, u.Host)
	u.Host = proxy.Addr()
	return direct, target{t: t, url: u.String(), dir: direct.dir}, proxy
}

// TestUnknownOutcome loses the reply to a publication after PostgreSQL committed it: the
// command exits 6 and names the operation, and resolve then says it was accepted.
func TestUnknownOutcome(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedPostgres(t)

	direct.ok(nil, "provision", "r")
	l := direct.acquire("r", "1m")
	opID := "lost-" + rand.Text()
	proxy.LoseReplyTo([]byte(opID))
	r := proxied.run([]byte("committed"), leaseArgs("publish", "r", l, "--op-id", opID)...)
	if r.code != 6 || !strings.Contains(r.stderr, opID) || len(r.stdout) != 0 {
		t.Fatalf("publish with its reply lost: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	checkSentence(t, r.stderr)
	res := decode[resolveOut](t, direct.ok(nil, "resolve", opID))
	if res.Outcome != "accepted" || res.Generation != l.Generation {
		t.Fatalf("resolve after the lost reply: %+v", res)
	}
	if got := direct.ok(nil, "get", "r"); string(got) != "committed" {
		t.Fatalf("published %q", got)
	}
}

// TestUnknownAcquireNamesOwner loses the reply to an acquisition after PostgreSQL committed
// it: the command exits 6 naming the owner it would have installed and how to find and free
// the lease, and following that advice works. Before, the owner was left out, and a lease
// granted with a long TTL could not be released.
func TestUnknownAcquireNamesOwner(t *testing.T) {
	t.Parallel()
	direct, proxied, proxy := proxiedPostgres(t)

	res := "lost-acquire-" + rand.Text()
	direct.ok(nil, "provision", res)
	// The acquisition's execution (Bind, with the resource among its parameters).
	proxy.LoseReplyToRequest(func(req []byte) bool { return len(req) > 0 && req[0] == 'B' && bytes.Contains(req, []byte(res)) })
	r := proxied.run(nil, "acquire", res, "--ttl", "24h")
	checkSentence(t, r.stderr)
	m := regexp.MustCompile(`granted to owner (\S+):.*; "fenced show ` + res + `" tells whether owner (\S+) holds it, and if so "fenced release ` +
		res + ` --owner (\S+) --generation G"`).FindStringSubmatch(r.stderr)
	if r.code != 6 || m == nil || m[1] != m[2] || m[2] != m[3] {
		t.Fatalf("acquire with its reply lost: exit %d, stderr %q", r.code, r.stderr)
	}
	st := direct.show(res)
	if !st.Held || st.Owner == nil || *st.Owner != m[1] {
		t.Fatalf("the lease granted with the lost reply: %+v, want it held by %s", st, m[1])
	}
	direct.ok(nil, "release", res, "--owner", m[1], "--generation", strconv.FormatInt(st.Generation, 10))
	if st := direct.show(res); st.Held {
		t.Fatalf("still held after the release the message suggested: %+v", st)
	}
}
