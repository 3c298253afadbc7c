package artifact

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
)

// The current holder's upload is kept by Collect whatever its age, because that holder may
// still publish a pointer to it: here it publishes right after the collection, and the pointer
// must name an object that exists.
func TestCollectKeepsTheCurrentHoldersUpload(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if err := collectRacingCurrentHolder(e); err != nil {
			t.Fatal(err)
		}
	})
}

// collectRacingCurrentHolder: the holder uploads, Collect runs with no age limit, then the
// holder publishes. It returns the reader's error if the pointer names a deleted object.
func collectRacingCurrentHolder(e *env) error {
	lease := e.acquire()
	data := content("slow holder", 100)
	p, err := Upload(e.ctx, lease, e.b, bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	e.collect(0) // the upload is "older than" an age of zero
	payload := mustEncode(e.t, p)
	if err := lease.PublishAndRelease(e.ctx, payload); err != nil {
		e.t.Fatalf("the current holder's publication: %v", err)
	}
	got, err := e.readAll()
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		e.t.Fatal("wrong bytes")
	}
	return nil
}

// The row is read before the pointer. Here the holder publishes, and a successor acquires,
// between Collect's two reads: read in this order, the row still shows the holder as current,
// so its object is kept; the published pointer must stay readable.
func TestCollectRacingAPublicationAndAHandover(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		if err := collectRacingPublication(e); err != nil {
			t.Fatal(err)
		}
	})
}

func collectRacingPublication(e *env) error {
	lease := e.acquire()
	data := content("published during gc", 100)
	p, err := Upload(e.ctx, lease, e.b, bytes.NewReader(data))
	if err != nil {
		e.t.Fatal(err)
	}
	testHookAfterRow = func(string) {
		testHookAfterRow = nil
		if err := PublishPointer(e.ctx, lease, p); err != nil {
			e.t.Errorf("publication between the reads: %v", err)
		}
		e.expire(resource)
		e.acquire() // a successor that has not published yet
	}
	defer func() { testHookAfterRow = nil }()
	e.collect(0)
	got, err := e.readAll()
	if err != nil {
		return err
	}
	if !bytes.Equal(got, data) {
		e.t.Fatal("wrong bytes")
	}
	return nil
}

// The two schedules above must be able to fail: with a collector that trusts age alone, or
// that reads the pointer before the row, each leaves a published pointer to a deleted object.
func TestCollectRacesCatchMutants(t *testing.T) {
	for _, m := range []struct {
		name string
		flag *bool
		run  func(*env) error
	}{
		{"age only", &collectByAgeOnly, collectRacingCurrentHolder},
		{"pointer before row", &collectPointerFirst, collectRacingPublication},
	} {
		t.Run(m.name, func(t *testing.T) {
			*m.flag = true
			defer func() { *m.flag = false }()
			forEach(t, func(t *testing.T, e *env) {
				if err := m.run(e); !errors.Is(err, ErrMissing) {
					t.Fatalf("with the mutant collector, the read returned %v; want ErrMissing", err)
				}
			})
		})
	}
}

// Collect never deletes an object it cannot parse, nor one whose resource has no row, and a
// dry run deletes nothing but reports the same.
func TestCollectDryRunAndForeignObjects(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		first := e.acquire()
		p, err := Upload(e.ctx, first, e.b, bytes.NewReader(content("orphan", 10)))
		if err != nil {
			t.Fatal(err)
		}
		e.expire(resource)
		e.acquire()
		foreign := []string{KeyPrefix + "/not-an-artifact", KeyPrefix + "/a/b/c/d"}
		for _, k := range foreign {
			if err := e.b.b.WriteAll(e.ctx, k, []byte("x"), nil); err != nil {
				t.Fatal(err)
			}
		}
		unprovisioned := objectKey("never provisioned", "o", fenced.Token{Epoch: 1, Generation: 1}, "n")
		if _, _, err := e.b.put(e.ctx, unprovisioned, "", strings.NewReader("y")); err != nil {
			t.Fatal(err)
		}
		dry, err := Collect(e.ctx, e.s, e.b, 0, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(dry.Deleted) != 1 || dry.Deleted[0].Key != p.Key || !e.exists(p.Key) {
			t.Fatalf("dry run: %+v", dry)
		}
		if len(dry.Skipped) != 2 || dry.Kept != 1 {
			t.Fatalf("dry run skipped %q, kept %d; want the 2 foreign keys skipped and the unprovisioned one kept", dry.Skipped, dry.Kept)
		}
		rep := e.collect(0)
		if len(rep.Deleted) != 1 || e.exists(p.Key) {
			t.Fatalf("collect: %+v", rep)
		}
		for _, k := range append(foreign, unprovisioned) {
			if !e.exists(k) {
				t.Fatalf("collect deleted %q", k)
			}
		}
		if _, err := Collect(e.ctx, e.s, e.b, -time.Second, false); !errors.Is(err, fenced.ErrInvalid) {
			t.Fatalf("negative age: %v", err)
		}
	})
}

// Build streams what a producer writes through fenced.Run into an artifact; a producer's
// failure publishes nothing and leaves no object.
func TestBuildThroughRun(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		data := content("run", 50000)
		res, err := fenced.Run(e.ctx, e.s, resource, &fenced.RunOptions{TTL: time.Minute},
			Build(e.b, func(ctx context.Context, lease *fenced.Lease, w io.Writer) error {
				for rest := data; len(rest) > 0; rest = rest[min(4096, len(rest)):] {
					if _, err := w.Write(rest[:min(4096, len(rest))]); err != nil {
						return err
					}
				}
				return nil
			}, WithContentType("application/x-report")))
		if err != nil {
			t.Fatal(err)
		}
		e.wantContent(data)
		if p, gen, _ := ReadPointer(e.ctx, e.s, resource); gen != res.Generation || p.ContentType != "application/x-report" {
			t.Fatalf("pointer %+v at generation %d, want %d", p, gen, res.Generation)
		}
		before := e.keys()
		boom := errors.New("producer failed")
		_, err = fenced.Run(e.ctx, e.s, resource, &fenced.RunOptions{TTL: time.Minute},
			Build(e.b, func(ctx context.Context, lease *fenced.Lease, w io.Writer) error {
				if _, err := w.Write(data[:5000]); err != nil {
					return err
				}
				return boom
			}))
		if !errors.Is(err, boom) {
			t.Fatalf("run with a failing producer: %v", err)
		}
		if after := e.keys(); len(after) != len(before) {
			t.Fatalf("a failed producer left objects: %q -> %q", before, after)
		}
		e.wantContent(data)
	})
}

func mustEncode(t *testing.T, p Pointer) []byte {
	t.Helper()
	b, err := encode(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A file store upload that crashed before its commit can leave a staging file only where the
// staging file has a name (the fallback where O_TMPFILE is not available): Collect removes it
// once old enough. An upload in flight while Collect runs either keeps its bytes (an unnamed
// staging file, which Collect cannot see) or fails at its commit (a named one Collect
// removed); it never publishes a pointer to missing bytes.
func TestCollectStagedFiles(t *testing.T) {
	for _, named := range []bool{false, true} {
		t.Run(fmt.Sprintf("named=%t", named), func(t *testing.T) {
			namedStagingOnly = named
			defer func() { namedStagingOnly = false }()
			collectStagedDuringUpload(t, named)
		})
	}
}

func collectStagedDuringUpload(t *testing.T, named bool) {
	ctx, b := testCtx(t), fileStore.open(t)
	staging := filepath.Join(b.dir, tmpDir)
	if err := os.WriteFile(filepath.Join(staging, "upload-crashed"), []byte("partial"), 0o666); err != nil {
		t.Fatal(err)
	}
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	collected := make(chan Report, 1)
	testHookBeforeCommit = func(string) {
		rep, err := Collect(ctx, nil, b, 0, false) // no objects to judge: the store is not read
		if err != nil {
			t.Error(err)
		}
		collected <- rep
	}
	defer func() { testHookBeforeCommit = nil }()
	data := "bytes \x00 of € 2026"
	_, n, err := b.put(ctx, key, "", strings.NewReader(data))
	rep := <-collected
	if entries, _ := os.ReadDir(staging); len(entries) != 0 {
		t.Fatalf("staging files left: %v", entries)
	}
	if named {
		if err == nil || errors.Is(err, ErrExists) {
			t.Fatalf("an upload whose staging file was collected: %v, want a failed commit", err)
		}
		if rep.Staged != 2 {
			t.Fatalf("collect removed %d staging files, want 2", rep.Staged)
		}
		if ok, _ := b.b.Exists(ctx, key); ok {
			t.Fatal("the object exists after a failed commit")
		}
		return
	}
	if err != nil || n != int64(len(data)) {
		t.Fatalf("an upload with an unnamed staging file: %d bytes, %v", n, err)
	}
	if rep.Staged != 1 {
		t.Fatalf("collect removed %d staging files, want 1 (the crashed upload's)", rep.Staged)
	}
	if got, err := b.b.ReadAll(ctx, key); err != nil || string(got) != data {
		t.Fatalf("the object reads %q, %v; want %q", got, err, data)
	}
}

// While a file store upload stages its bytes, the staging directory holds no name for them,
// and after a failed upload it holds nothing: a crash cannot leave a staging file.
func TestStagingHasNoName(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("unnamed staging files (O_TMPFILE) are Linux only")
	}
	ctx, b := testCtx(t), fileStore.open(t)
	staging := filepath.Join(b.dir, tmpDir)
	key := objectKey(resource, "owner", fenced.Token{Epoch: 3, Generation: 1}, newNonce())
	var seen []os.DirEntry
	r := io.MultiReader(strings.NewReader("half \x00 written"), readerFunc(func([]byte) (int, error) {
		seen, _ = os.ReadDir(staging)
		return 0, errors.New("the producer failed")
	}))
	if _, _, err := b.put(ctx, key, "", r); err == nil {
		t.Fatal("an upload whose reader failed succeeded")
	}
	if len(seen) != 0 {
		t.Fatalf("the staging directory held %v during the upload, want nothing", seen)
	}
	if entries, _ := os.ReadDir(staging); len(entries) != 0 {
		t.Fatalf("staging files left: %v", entries)
	}
	if ok, _ := b.b.Exists(ctx, key); ok {
		t.Fatal("the object exists after a failed upload")
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// PublishPointer refuses a pointer that another lease uploaded, before anything is sent.
func TestPublishPointerOnlyOwnUpload(t *testing.T) {
	forEach(t, func(t *testing.T, e *env) {
		first := e.acquire()
		p, err := Upload(e.ctx, first, e.b, strings.NewReader("first"))
		if err != nil {
			t.Fatal(err)
		}
		e.expire(resource)
		second := e.acquire()
		if err := PublishPointer(e.ctx, second, p); !errors.Is(err, fenced.ErrInvalid) {
			t.Fatalf("publishing another lease's upload: %v, want ErrInvalid", err)
		}
		if err := PublishPointer(e.ctx, first, p); !errors.Is(err, fenced.ErrRefused) {
			t.Fatalf("the superseded lease's own pointer: %v, want refused", err)
		}
		if _, _, err := ReadPointer(e.ctx, e.s, resource); !errors.Is(err, fenced.ErrNothingPublished) {
			t.Fatalf("after both: %v", err)
		}
	})
}
