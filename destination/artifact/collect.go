package artifact

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	"gocloud.dev/blob"
)

// Collected is one object Collect deleted, or would delete in a dry run.
type Collected struct {
	Key      string
	Resource string
	Token    fenced.Token
	Size     int64
	ModTime  time.Time
}

// Report is what Collect did.
type Report struct {
	Deleted []Collected // deleted, or to be deleted in a dry run
	Bytes   int64       // their total size
	Kept    int         // objects kept: published, young, or of an attempt that may still publish
	Skipped []string    // keys under KeyPrefix that are not artifact keys; never deleted
	// Staged counts a file store's staging files older than the age, left by uploads that
	// crashed before their commit, that were deleted (or would be, in a dry run). An upload
	// still running whose staging file is deleted fails at its commit: no pointer is published.
	Staged int
}

// Collect deletes the artifacts under KeyPrefix that no published pointer names and that no
// attempt can publish any more, once they are older than olderThan (by the store's modification
// time and this machine's clock). With dryRun it deletes nothing and reports what it would.
//
// An object is deleted only if, in a read of its resource's row taken after the listing, its
// attempt's token is superseded (a newer acquisition or a newer epoch), or its generation has
// already published or was released, and if the pointer read after that row does not name it. A superseded or
// already-published generation can never publish again (the database refuses it; a restore
// of the database to an older copy, before `fenced epoch bump`, is outside this rule), so no
// pointer to a deleted object can appear later, however long the attempt was paused; the
// current holder's upload is kept whatever its age. Expiry alone is not enough (it is judged by
// a clock): the orphan of an attempt that expired is collected once the resource is acquired
// again. Reading the row before the pointer
// matters: read the other way round, a publication and a new acquisition could both land
// between the two reads, and the fresh pointer would be missed. A reader that followed a
// pointer before it was replaced can still find its object gone (ErrMissing), never wrong bytes.
func Collect(ctx context.Context, s *fenced.Store, b *Bucket, olderThan time.Duration, dryRun bool) (Report, error) {
	if olderThan < 0 {
		return Report{}, fmt.Errorf("collect artifacts: the age %s is negative: %w", olderThan, fenced.ErrInvalid)
	}
	var rep Report
	type obj struct {
		key  parsedKey
		attr *blob.ListObject
	}
	byResource := map[string][]obj{}
	var order []string
	it := b.b.List(&blob.ListOptions{Prefix: KeyPrefix + "/"})
	for {
		o, err := it.Next(ctx)
		if err != nil {
			if err == io.EOF {
				break
			}
			return rep, fmt.Errorf("collect artifacts: list: %w", err)
		}
		if o.IsDir {
			continue
		}
		k, ok := parseKey(o.Key)
		if !ok {
			rep.Skipped = append(rep.Skipped, o.Key)
			continue
		}
		if _, seen := byResource[k.resource]; !seen {
			order = append(order, k.resource)
		}
		byResource[k.resource] = append(byResource[k.resource], obj{k, o})
	}
	now := time.Now()
	for _, res := range order {
		objs := byResource[res]
		var old []obj
		var err error
		for _, o := range objs {
			if now.Sub(o.attr.ModTime) < olderThan {
				rep.Kept++
				continue
			}
			old = append(old, o)
		}
		if len(old) == 0 {
			continue
		}
		var st fenced.State
		var published string
		if collectPointerFirst { // a mutation for the tests: the wrong order of the two reads
			if published, err = publishedKey(ctx, s, res); err == nil {
				if testHookAfterRow != nil {
					testHookAfterRow(res)
				}
				st, err = s.Show(ctx, res)
			}
		} else if st, err = s.Show(ctx, res); err == nil {
			if testHookAfterRow != nil {
				testHookAfterRow(res)
			}
			published, err = publishedKey(ctx, s, res)
		}
		if errors.Is(err, fenced.ErrNotProvisioned) {
			rep.Kept += len(old) // no row to prove anything against: keep
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("collect artifacts: %w", err)
		}
		for _, o := range old {
			if o.attr.Key == published || !finished(st, o.key.token) {
				rep.Kept++
				continue
			}
			if !dryRun {
				if err := b.b.Delete(ctx, o.attr.Key); err != nil {
					return rep, fmt.Errorf("collect artifacts: delete %q: %w", o.attr.Key, err)
				}
			}
			rep.Deleted = append(rep.Deleted, Collected{Key: o.attr.Key, Resource: res, Token: o.key.token,
				Size: o.attr.Size, ModTime: o.attr.ModTime})
			rep.Bytes += o.attr.Size
		}
	}
	if b.dir != "" {
		n, err := collectStaged(filepath.Join(b.dir, tmpDir), now, olderThan, dryRun)
		rep.Staged = n
		if err != nil {
			return rep, fmt.Errorf("collect artifacts: staging files: %w", err)
		}
	}
	return rep, nil
}

// collectStaged deletes staging files not written to for olderThan. A writer still streaming
// keeps its file's modification time fresh; one that resumes after the deletion fails at the
// link, which needs the staging file's name.
func collectStaged(dir string, now time.Time, olderThan time.Duration, dryRun bool) (int, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil || !fi.Mode().IsRegular() || now.Sub(fi.ModTime()) < olderThan {
			continue
		}
		if !dryRun {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !os.IsNotExist(err) {
				return n, err
			}
		}
		n++
	}
	return n, nil
}

// testHookAfterRow, when set, runs between Collect's read of a resource's row and its read of
// the pointer, so a test can publish there.
var testHookAfterRow func(resource string)

// finished reports whether the attempt with token t can never publish again, judged from a
// row read after its object was listed.
func finished(st fenced.State, t fenced.Token) bool {
	if collectByAgeOnly { // a mutation for the tests: the rule the fence makes unnecessary
		return true
	}
	row := fenced.Token{Epoch: st.Epoch, Generation: st.Generation}
	switch {
	case row.Compare(t) > 0, st.CurrentEpoch > t.Epoch:
		return true // superseded: the database refuses every later publication by t
	case row == t && st.PublishedEpoch == t.Epoch && st.PublishedGeneration == t.Generation:
		return true // t has published its one publication
	case row == t && st.Owner == "":
		return true // t was released: a released lease never publishes again
	}
	return false
}

// publishedKey is the key the resource's published pointer names, or "" when none does.
func publishedKey(ctx context.Context, s *fenced.Store, res string) (string, error) {
	p, _, err := ReadPointer(ctx, s, res)
	switch {
	case err == nil:
		return p.Key, nil
	case errors.Is(err, ErrNotArtifact), errors.Is(err, fenced.ErrNothingPublished):
		return "", nil
	}
	return "", err
}

// collectPointerFirst is set by a test to show that the barrier test catches a collector that
// reads the pointer before the row.
var collectPointerFirst bool

// collectByAgeOnly is set by a test to show that the barrier test catches a collector that
// trusts age alone.
var collectByAgeOnly bool
