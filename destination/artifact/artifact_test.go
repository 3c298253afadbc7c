package artifact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/pointer"
	"gocloud.dev/blob"
)

// A resource name with a space, a slash, a dot segment and non-ASCII, to test the key escaping.
const resource = "rapport annuel/../€ 2026"

// env is one blob store and one pointer home, with the resource provisioned and the epoch
// bumped twice so that epoch and generation differ.
type env struct {
	t      *testing.T
	ctx    context.Context
	s      *fenced.Store
	lossy  *fenced.Store
	arm    func()
	b      *Bucket
	home   home
	store  store
	expire func(resource string)
}

func forEach(t *testing.T, fn func(t *testing.T, e *env)) {
	for _, st := range stores() {
		for _, newHome := range homes() {
			t.Run(st.name+"+"+newHome.name, func(t *testing.T) {
				h := newHome.open(t)
				{
					s, lossy, arm := h.open(t)
					e := &env{t: t, ctx: testCtx(t), s: s, lossy: lossy, arm: arm, b: st.open(t), home: h, store: st}
					e.expire = func(r string) {
						if err := h.expire(e.ctx, r); err != nil {
							t.Fatal(err)
						}
					}
					if err := s.Provision(e.ctx, resource); err != nil {
						t.Fatal(err)
					}
					for range 2 {
						if _, err := s.BumpEpoch(e.ctx); err != nil {
							t.Fatal(err)
						}
					}
					fn(t, e)
				}
			})
		}
	}
}

func (e *env) acquire() *fenced.Lease {
	e.t.Helper()
	l, err := e.s.Acquire(e.ctx, resource, time.Minute)
	if err != nil {
		e.t.Fatal(err)
	}
	if l.Epoch() == l.Generation() {
		e.t.Fatalf("epoch and generation are both %d: the test would not tell them apart", l.Epoch())
	}
	return l
}

// content is an artifact's bytes: NUL bytes, the pointer prefix itself, and a tag.
func content(tag string, n int) []byte {
	b := bytes.Repeat([]byte("\x00"+pointer.Prefix+tag+" "), n)
	return b
}

// readAll opens the published artifact and reads it to its verified end.
func (e *env) readAll() ([]byte, error) {
	r, err := Open(e.ctx, e.s, e.b, resource)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var buf bytes.Buffer
	_, err = r.WriteTo(&buf)
	return buf.Bytes(), err
}

func (e *env) wantContent(want []byte) {
	e.t.Helper()
	got, err := e.readAll()
	if err != nil {
		e.t.Fatalf("read the published artifact: %v", err)
	}
	if !bytes.Equal(got, want) {
		e.t.Fatalf("read %d bytes, want exactly the %d published", len(got), len(want))
	}
}

func (e *env) keys() []string {
	e.t.Helper()
	var out []string
	it := e.b.b.List(&blob.ListOptions{Prefix: KeyPrefix + "/"})
	for {
		o, err := it.Next(e.ctx)
		if err == io.EOF {
			return out
		}
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, o.Key)
	}
}

func (e *env) exists(key string) bool {
	e.t.Helper()
	ok, err := e.b.b.Exists(e.ctx, key)
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

func (e *env) collect(olderThan time.Duration) Report {
	e.t.Helper()
	rep, err := Collect(e.ctx, e.s, e.b, olderThan, false)
	if err != nil {
		e.t.Fatalf("collect: %v", err)
	}
	return rep
}

// pausedReader yields first, then blocks until resume is closed, then yields rest: an
// upload paused in the middle.
type pausedReader struct {
	first, rest []byte
	paused      chan struct{}
	resume      chan struct{}
	once        sync.Once
}

func (p *pausedReader) Read(b []byte) (int, error) {
	if len(p.first) > 0 {
		n := copy(b, p.first)
		p.first = p.first[n:]
		return n, nil
	}
	p.once.Do(func() { close(p.paused); <-p.resume })
	if len(p.rest) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.rest)
	p.rest = p.rest[n:]
	return n, nil
}

// The handover with artifacts: A's upload is paused past its lease, B acquires, uploads and
// publishes, A resumes and its pointer is refused; readers get B's bytes exactly; A's object
// stays under its own key until Collect removes it, and only once it is old enough.
func TestHandover(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		leaseA := e.acquire()
		a, b := content("A", 5000), content("B", 7000)
		pr := &pausedReader{first: a[:1000], rest: a[1000:], paused: make(chan struct{}), resume: make(chan struct{})}
		type result struct {
			p   Pointer
			err error
		}
		done := make(chan result, 1)
		go func() {
			p, err := PublishAndRelease(e.ctx, leaseA, e.b, pr, WithContentType("text/plain; charset=utf-8"))
			done <- result{p, err}
		}()
		<-pr.paused
		e.expire(resource)
		leaseB := e.acquire()
		pb, err := PublishAndRelease(e.ctx, leaseB, e.b, bytes.NewReader(b))
		if err != nil {
			t.Fatalf("B's publication: %v", err)
		}
		close(pr.resume)
		ra := <-done
		var refused *fenced.RefusedError
		if !errors.As(ra.err, &refused) || refused.Cause != fenced.CauseSuperseded {
			t.Fatalf("A's late pointer: %v, want a refusal (superseded)", ra.err)
		}
		if ra.p.Size != int64(len(a)) || ra.p.Key == pb.Key {
			t.Fatalf("A's upload: %+v (B's key %q)", ra.p, pb.Key)
		}
		e.wantContent(b)
		if p, gen, err := ReadPointer(e.ctx, e.s, resource); err != nil || p != pb || gen != leaseB.Generation() {
			t.Fatalf("pointer %+v generation %d (%v), want B's %+v at %d", p, gen, err, pb, leaseB.Generation())
		}
		if !e.exists(ra.p.Key) {
			t.Fatalf("A's object %q is gone before any collection", ra.p.Key)
		}
		if k, ok := parseKey(ra.p.Key); !ok || k.resource != resource || k.token != leaseA.Token() {
			t.Fatalf("A's key %q parses as %+v, %v", ra.p.Key, k, ok)
		}

		if rep := e.collect(time.Hour); len(rep.Deleted) != 0 || rep.Kept != 2 {
			t.Fatalf("collect of objects younger than the age: %+v %q", rep, e.keys())
		}
		rep := e.collect(0)
		if len(rep.Deleted) != 1 || rep.Deleted[0].Key != ra.p.Key || rep.Bytes != int64(len(a)) || rep.Kept != 1 {
			t.Fatalf("collect: %+v, want A's orphan %q (%d bytes) deleted and B's kept", rep, ra.p.Key, len(a))
		}
		if e.exists(ra.p.Key) || !e.exists(pb.Key) {
			t.Fatal("after collect: A's orphan still there, or B's object gone")
		}
		e.wantContent(b)
		if rep := e.collect(0); len(rep.Deleted) != 0 {
			t.Fatalf("a second collect deleted %+v", rep.Deleted)
		}
	})
}

// A lost reply to the pointer's publication is settled by its operation id, and the artifact
// is then readable.
func TestLostReplySettledByOpID(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if _, err := e.lossy.Acquire(e.ctx, resource, time.Minute); err != nil {
			t.Fatal(err)
		}
		e.expire(resource)
		lease, err := e.lossy.Acquire(e.ctx, resource, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		data := content("lost reply", 3000)
		e.arm()
		p, err := PublishAndRelease(e.ctx, lease, e.b, bytes.NewReader(data),
			WithPublishOptions(fenced.WithOpID("op-artifact-1"), fenced.WithSourceVersion(7)))
		var unknown *fenced.OutcomeUnknownError
		if !errors.As(err, &unknown) || unknown.OpID != "op-artifact-1" {
			t.Fatalf("publication with a lost reply: %v, want the outcome unknown with its op id", err)
		}
		r, err := e.s.Resolve(e.ctx, "op-artifact-1")
		if err != nil || !r.Accepted || r.Token != lease.Token() {
			t.Fatalf("resolve: %+v, %v; want accepted for %s", r, err, lease.Token())
		}
		e.wantContent(data)
		if got, _, _ := ReadPointer(e.ctx, e.s, resource); got != p {
			t.Fatalf("published pointer %+v, want %+v", got, p)
		}
		if st, _ := e.s.Show(e.ctx, resource); st.SourceVersion != 7 || st.Owner != "" {
			t.Fatalf("row after the settled PublishAndRelease: %+v", st)
		}
		// The first acquisition's generation never uploaded; collect has nothing to do.
		if rep := e.collect(0); len(rep.Deleted) != 0 || rep.Kept != 1 {
			t.Fatalf("collect: %+v", rep)
		}
	})
}

// A holder that crashes between upload and publication leaves an orphan. Collect keeps it while
// the holder could still publish, and removes it once a later acquisition supersedes it, or
// once the holder released.
func TestCrashBetweenUploadAndPublication(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		lease := e.acquire()
		p, err := Upload(e.ctx, lease, e.b, bytes.NewReader(content("crash", 100)))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Open(e.ctx, e.s, e.b, resource); !errors.Is(err, fenced.ErrNothingPublished) {
			t.Fatalf("open before any publication: %v, want nothing published", err)
		}
		if rep := e.collect(0); len(rep.Deleted) != 0 {
			t.Fatalf("collect deleted the current holder's upload: %+v", rep)
		}
		e.expire(resource) // expired, but judged by a clock: kept until superseded
		if rep := e.collect(0); len(rep.Deleted) != 0 {
			t.Fatalf("collect deleted the upload of an expired, not superseded, holder: %+v", rep)
		}
		next := e.acquire()
		if rep := e.collect(0); len(rep.Deleted) != 1 || rep.Deleted[0].Key != p.Key {
			t.Fatalf("collect after a new acquisition: %+v, want %q deleted", rep, p.Key)
		}
		// The next holder uploads and releases without publishing: its orphan goes too.
		p2, err := Upload(e.ctx, next, e.b, bytes.NewReader(content("released", 10)))
		if err != nil {
			t.Fatal(err)
		}
		if err := next.Release(e.ctx); err != nil {
			t.Fatal(err)
		}
		if rep := e.collect(0); len(rep.Deleted) != 1 || rep.Deleted[0].Key != p2.Key {
			t.Fatalf("collect after a release: %+v, want %q deleted", rep, p2.Key)
		}
		if keys := e.keys(); len(keys) != 0 {
			t.Fatalf("objects left: %q", keys)
		}
	})
}

// A truncated, altered or missing object is an error, never silently wrong bytes.
func TestDamagedObjectDetected(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		data := content("intact", 2000)
		p, err := PublishAndRelease(e.ctx, e.acquire(), e.b, bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		e.wantContent(data)

		altered := bytes.Clone(data)
		altered[len(altered)-1] ^= 1
		e.store.corrupt(t, e.b, p.Key, altered)
		got, err := e.readAll()
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "SHA-256") {
			t.Fatalf("altered object: %v, want ErrCorrupt naming the SHA-256", err)
		}
		if len(got) == len(data) && err == nil {
			t.Fatal("altered bytes were returned as good")
		}

		e.store.corrupt(t, e.b, p.Key, data[:len(data)-1])
		if _, err := e.readAll(); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("truncated object: %v, want ErrCorrupt", err)
		}
		e.store.corrupt(t, e.b, p.Key, append(bytes.Clone(data), 'x'))
		if _, err := e.readAll(); !errors.Is(err, ErrCorrupt) {
			t.Fatalf("extended object: %v, want ErrCorrupt", err)
		}
		if err := e.b.b.Delete(e.ctx, p.Key); err != nil {
			t.Fatal(err)
		}
		if _, err := e.readAll(); !errors.Is(err, ErrMissing) {
			t.Fatalf("deleted object: %v, want ErrMissing", err)
		}
	})
}

// The store refuses to overwrite a key: the second upload fails and the first bytes stay.
func TestCreateOnly(t *testing.T) {
	for _, st := range stores() {
		t.Run(st.name, func(t *testing.T) {
			ctx, b := testCtx(t), st.open(t)
			key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
			if _, _, err := b.put(ctx, key, "", strings.NewReader("first")); err != nil {
				t.Fatal(err)
			}
			_, _, err := b.put(ctx, key, "", strings.NewReader("second"))
			if !errors.Is(err, ErrExists) {
				t.Fatalf("second upload of %q: %v, want ErrExists", key, err)
			}
			if got, err := b.b.ReadAll(ctx, key); err != nil || string(got) != "first" {
				t.Fatalf("after the refused upload: %q, %v", got, err)
			}
		})
	}
}

// Two uploads of one key that both staged their bytes before either committed: exactly one
// wins. The file store's commit is a hard link for this; the stat-then-rename that fileblob's
// IfNotExist does lets both through, which the mutation below shows.
func TestCreateOnlyRaceFileStore(t *testing.T) {
	if n := raceCommits(t); n != 1 {
		t.Fatalf("%d of 2 racing uploads of one key succeeded, want 1", n)
	}
}

func TestCreateOnlyRaceCatchesStatThenRename(t *testing.T) {
	var statted sync.WaitGroup
	statted.Add(2)
	commitFile = func(old, path string) error {
		_, err := os.Stat(path)
		statted.Done()
		statted.Wait() // both writers have looked before either renames
		if err == nil {
			return os.ErrExist
		}
		side := path + ".mutant-" + newNonce()
		if err := linkStaged(old, side); err != nil {
			return err
		}
		return os.Rename(side, path) // replaces what the other writer renamed there
	}
	defer func() { commitFile = linkStaged }()
	if n := raceCommits(t); n != 2 {
		t.Fatalf("with stat-then-rename, %d of 2 racing uploads succeeded; the race test cannot catch it", n)
	}
}

func raceCommits(t *testing.T) int {
	ctx, b := testCtx(t), fileStore.open(t)
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	var staged sync.WaitGroup
	staged.Add(2)
	testHookBeforeCommit = func(string) { staged.Done(); staged.Wait() }
	defer func() { testHookBeforeCommit = nil }()
	errs := make(chan error, 2)
	for i := range 2 {
		go func() {
			_, _, err := b.put(ctx, key, "", strings.NewReader(fmt.Sprint("writer ", i)))
			errs <- err
		}()
	}
	n := 0
	for range 2 {
		err := <-errs
		switch {
		case err == nil:
			n++
		case !errors.Is(err, ErrExists):
			t.Fatal(err)
		}
	}
	return n
}
