package artifact

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/fenced-dev/fenced"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
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

// ErrStoreWentBack is returned when the database shows less history than the artifact store has evidence of
// (it was restored from an older copy, or failed over to a replica that lost commits), so
// Collect cannot trust its rows to say which attempts are over, and deleted nothing more.
var ErrStoreWentBack = errors.New("the database went back in time (restored from an older copy or lost commits); run `fenced epoch bump`, then collect again")

// WentBackError is ErrStoreWentBack for one resource, with the evidence.
type WentBackError struct {
	Resource string
	Evidence string // what the store or the earlier read shows that the row does not
}

func (e *WentBackError) Error() string {
	return fmt.Sprintf("collect artifacts: %q: %s: %v", e.Resource, e.Evidence, ErrStoreWentBack)
}

func (e *WentBackError) Is(target error) bool { return target == ErrStoreWentBack }

// watermarkKey is where Collect records, per resource, the newest acquisition it has seen in
// the database: outside KeyPrefix, so it is never listed as an artifact.
const watermarkKey = "fenced-collect/watermarks.json"

// Collect deletes the artifacts under KeyPrefix that no published pointer names and that no
// attempt can publish any more, once they are older than olderThan (by the store's modification
// time and this machine's clock). With dryRun it deletes nothing and reports what it would.
//
// An object is deleted only if, in a read of its resource's row taken after the listing, its
// attempt's token is superseded (a newer acquisition or a newer epoch), or its generation has
// already published or was released, and if the pointer read after that row does not name it.
// Such an attempt can never publish again while the database keeps its history, so no pointer
// to a deleted object can appear later, however long the attempt was paused; the current
// holder's upload is kept whatever its age. Expiry alone is not enough (it is judged by a
// clock): the orphan of an attempt that expired is collected once the resource is acquired
// again. Reading the row before the pointer matters: read the other way round, a publication
// and a new acquisition could both land between the two reads, and the fresh pointer would be
// missed. A reader that followed a pointer before it was replaced can still find its object
// gone (ErrMissing), never wrong bytes.
//
// A database restored from an older copy (or failed over with lost commits) breaks "can never
// publish again" until `fenced epoch bump`: an attempt whose object was deleted can be current
// again. Collect looks for the evidence and then deletes nothing, returning ErrStoreWentBack:
// an object whose token is newer than its row's newest acquisition, a row older than the one
// an earlier Collect recorded in the store (watermarkKey), and, right before each deletion, a
// row read again that is older than the one the decision rested on. After an epoch bump none of
// this is evidence any more, since every earlier token is refused. What no check can see is a
// restore that lands after the last read of a row and before its deletion, or after the
// deletion: only the bump closes that.
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
	marks, err := readWatermarks(ctx, b)
	if err != nil {
		return rep, fmt.Errorf("collect artifacts: %w", err)
	}
	// Every row is read, and every piece of evidence weighed, before anything is deleted.
	type doomed struct {
		o  obj
		st fenced.State // the row the decision rests on
	}
	var plan []doomed
	now := time.Now()
	for _, res := range order {
		objs := byResource[res]
		var st fenced.State
		var published string
		var err error
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
			rep.Kept += len(objs) // no row to prove anything against: keep
			continue
		}
		if err != nil {
			return Report{Skipped: rep.Skipped}, fmt.Errorf("collect artifacts: %w", err)
		}
		if ev := evidence(st, marks[res], func(yield func(fenced.Token) bool) {
			for _, o := range objs {
				if !yield(o.key.token) {
					return
				}
			}
		}); ev != "" && !collectTrustsRow {
			return Report{Skipped: rep.Skipped}, &WentBackError{Resource: res, Evidence: ev}
		}
		if row := rowToken(st); row.Compare(marks[res]) > 0 {
			marks[res] = row
		}
		for _, o := range objs {
			if now.Sub(o.attr.ModTime) < olderThan || o.attr.Key == published || !finished(st, o.key.token) {
				rep.Kept++
				continue
			}
			plan = append(plan, doomed{o, st})
		}
	}
	if !dryRun && len(plan) > 0 {
		if err := writeWatermarks(ctx, b, marks); err != nil {
			return Report{Skipped: rep.Skipped}, fmt.Errorf("collect artifacts: %w", err)
		}
	}
	for _, d := range plan {
		if !dryRun {
			if testHookBeforeDelete != nil {
				testHookBeforeDelete(d.o.attr.Key)
			}
			// The row again, right before the deletion: a restore since the decision would make
			// the attempt current again.
			again, err := s.Show(ctx, d.o.key.resource)
			if err != nil {
				return rep, fmt.Errorf("collect artifacts: read %q again before deleting: %w", d.o.key.resource, err)
			}
			if behind(d.st, again) && !collectTrustsRow {
				return rep, &WentBackError{Resource: d.o.key.resource, Evidence: fmt.Sprintf(
					"its row went back from %s to %s while collecting", describeRow(d.st), describeRow(again))}
			}
			if err := b.b.Delete(ctx, d.o.attr.Key); err != nil {
				return rep, fmt.Errorf("collect artifacts: delete %q: %w", d.o.attr.Key, err)
			}
		}
		rep.Deleted = append(rep.Deleted, Collected{Key: d.o.attr.Key, Resource: d.o.key.resource, Token: d.o.key.token,
			Size: d.o.attr.Size, ModTime: d.o.attr.ModTime})
		rep.Bytes += d.o.attr.Size
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

func rowToken(st fenced.State) fenced.Token {
	return fenced.Token{Epoch: st.Epoch, Generation: st.Generation}
}

func describeRow(st fenced.State) string {
	d := "acquisition " + rowToken(st).String()
	if st.PublishedGeneration > 0 {
		d += fmt.Sprintf(", published %d.%d", st.PublishedEpoch, st.PublishedGeneration)
	}
	if st.Owner == "" {
		d += ", free"
	}
	return d
}

// evidence says what shows that the row st has lost acquisitions, or "" when nothing does:
// an object uploaded under a token newer than the row's newest acquisition, or a newer
// acquisition recorded by an earlier Collect. A token of an epoch older than the store's is
// no evidence: the bump that raised the epoch refuses it.
func evidence(st fenced.State, mark fenced.Token, tokens func(func(fenced.Token) bool)) string {
	row := rowToken(st)
	ahead := func(t fenced.Token) bool {
		return t.Epoch > st.CurrentEpoch || t.Epoch == st.CurrentEpoch && t.Compare(row) > 0
	}
	for t := range tokens {
		if ahead(t) {
			return fmt.Sprintf("the store holds an object uploaded under %s, newer than the row's newest acquisition %s", t, row)
		}
	}
	if mark.Epoch > 0 && ahead(mark) {
		return fmt.Sprintf("an earlier collection saw acquisition %s, newer than the row's newest acquisition %s", mark, row)
	}
	return ""
}

// behind reports whether the row now shows less history than it did before, with no epoch
// bump in between (a bump refuses every token the earlier decisions were about).
func behind(before, now fenced.State) bool {
	switch {
	case now.CurrentEpoch != before.CurrentEpoch:
		return now.CurrentEpoch < before.CurrentEpoch
	case rowToken(now) != rowToken(before):
		return rowToken(now).Compare(rowToken(before)) < 0
	}
	pb := fenced.Token{Epoch: before.PublishedEpoch, Generation: before.PublishedGeneration}
	pn := fenced.Token{Epoch: now.PublishedEpoch, Generation: now.PublishedGeneration}
	if pn != pb {
		return pn.Compare(pb) < 0
	}
	return before.Owner == "" && now.Owner != "" // released, then held again by the same token
}

// readWatermarks returns the newest acquisition of each resource that an earlier Collect saw.
func readWatermarks(ctx context.Context, b *Bucket) (map[string]fenced.Token, error) {
	marks := map[string]fenced.Token{}
	data, err := b.b.ReadAll(ctx, watermarkKey)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return marks, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", watermarkKey, err)
	}
	var raw map[string]string
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("read %s: %w", watermarkKey, err)
	}
	for res, s := range raw {
		t, ok := parseToken(s)
		if !ok {
			return nil, fmt.Errorf("read %s: %q is not a token", watermarkKey, s)
		}
		marks[res] = t
	}
	return marks, nil
}

// writeWatermarks records marks before anything is deleted. Two collections writing at once
// keep one's marks: a lost mark is only less evidence, never a wrong deletion.
func writeWatermarks(ctx context.Context, b *Bucket, marks map[string]fenced.Token) error {
	raw := make(map[string]string, len(marks))
	for res, t := range marks {
		raw[res] = t.String()
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return err
	}
	if err := b.b.WriteAll(ctx, watermarkKey, data, &blob.WriterOptions{ContentType: "application/json"}); err != nil {
		return fmt.Errorf("write %s: %w", watermarkKey, err)
	}
	return nil
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

// testHookBeforeDelete, when set, runs right before Collect reads the row again and deletes
// key, so a test can restore the database there.
var testHookBeforeDelete func(key string)

// collectTrustsRow is set by a test to show that the restore tests catch a collector that
// looks for no evidence of a database gone back.
var collectTrustsRow bool

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
