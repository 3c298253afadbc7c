package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/cmd/fenced/torture"
	"github.com/fenced-dev/fenced/destination/artifact"
	"github.com/fenced-dev/fenced/driver"
	"github.com/fenced-dev/fenced/internal/pointer"
)

// fenced torture --artifacts: every publication goes through an artifact, and every read
// follows the published pointer.
//
// artifactDriver sits under the torture's recording, so the history holds what the workers
// meant to publish and what the readers got back through the pointers, and the checker's
// payload rule (a read returns the payload of the publication that set the published
// generation) becomes: a read following the pointer returns exactly the bytes its winning
// publisher uploaded. An object that is missing, altered, or another attempt's, reads as a
// payload no publication had: a violation.
type artifactDriver struct {
	driver.Driver
	s      *fenced.Store // over the inner driver: a lease value for an upload's key
	b      *artifact.Bucket
	mutant string
	last   map[string]artifact.Pointer // the previous upload on each resource (the mutants)
}

// Mutants of the artifact path (fenced torture --artifacts --mutant, hidden; tests only).
const (
	// mutantArtifactOtherPointer publishes the pointer of this process's previous upload on
	// the resource (another attempt's object) instead of its own.
	mutantArtifactOtherPointer = "artifact-other-pointer"
	// mutantArtifactOverwrite also overwrites the previous upload's object with this
	// attempt's bytes, as a store without create-only keys shared between attempts would.
	mutantArtifactOverwrite = "artifact-overwrite"
)

// artifactFiller is how many bytes follow the payload in an artifact.
const artifactFiller = 4096

// artifactContent is the artifact published for payload: the payload, a NUL, then bytes
// derived from the payload, so that any other publication's bytes, or damaged ones, decode
// to something no publication had.
func artifactContent(payload []byte) []byte {
	out := make([]byte, 0, len(payload)+1+artifactFiller)
	out = append(out, payload...)
	out = append(out, 0)
	sum := sha256.Sum256(payload)
	for len(out) < cap(out) {
		out = append(out, sum[:min(len(sum), cap(out)-len(out))]...)
	}
	return out
}

// payloadOf reverses artifactContent; ok is false for bytes it cannot have produced.
func payloadOf(content []byte) ([]byte, bool) {
	i := bytes.IndexByte(content, 0)
	if i < 0 {
		return nil, false
	}
	return content[:i], bytes.Equal(artifactContent(content[:i]), content)
}

func newArtifactDriver(ctx context.Context, drv driver.Driver, b *artifact.Bucket, mutant string) (*artifactDriver, error) {
	s, err := fenced.New(ctx, drv, &fenced.Config{SkipMigrate: true, AllowNonDurable: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	return &artifactDriver{Driver: drv, s: s, b: b, mutant: mutant, last: map[string]artifact.Pointer{}}, nil
}

// upload stores payload's artifact under l's key and returns the pointer's payload.
func (d *artifactDriver) upload(ctx context.Context, l driver.LeaseRef, payload []byte) ([]byte, error) {
	lease, err := d.s.LeaseFor(l.Resource, l.Owner, fenced.Token{Epoch: l.Epoch, Generation: l.Generation})
	if err != nil {
		return nil, err
	}
	content := artifactContent(payload)
	p, err := artifact.Upload(ctx, lease, d.b, bytes.NewReader(content))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", driver.ErrNotApplied, err) // nothing was sent to the database
	}
	prev, hasPrev := d.last[l.Resource]
	d.last[l.Resource] = p
	switch {
	case d.mutant == mutantArtifactOtherPointer && hasPrev:
		p = prev
	case d.mutant == mutantArtifactOverwrite && hasPrev:
		if err := d.b.Blob().WriteAll(ctx, prev.Key, content, nil); err != nil {
			return nil, err
		}
	}
	return pointer.Encode(p)
}

func (d *artifactDriver) Publish(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload, err := d.upload(ctx, l, pub.Payload)
	if err != nil {
		return false, err
	}
	pub.Payload = payload
	return d.Driver.Publish(ctx, l, pub)
}

func (d *artifactDriver) PublishAndRelease(ctx context.Context, l driver.LeaseRef, pub driver.Publication) (bool, error) {
	payload, err := d.upload(ctx, l, pub.Payload)
	if err != nil {
		return false, err
	}
	pub.Payload = payload
	return d.Driver.PublishAndRelease(ctx, l, pub)
}

// ReadPayload follows the published pointer and returns the payload its artifact carries, or,
// when the object cannot be read back exactly, a description of why, as the payload: the
// checker then finds a read no publication explains.
func (d *artifactDriver) ReadPayload(ctx context.Context, resource string) ([]byte, int64, error) {
	payload, gen, err := d.Driver.ReadPayload(ctx, resource)
	if err != nil || gen == 0 {
		return payload, gen, err
	}
	got, err := d.follow(ctx, resource, payload, gen)
	return got, gen, err
}

// follow reads the artifact a pointer names and returns the payload it carries, or, when the
// object cannot be read back exactly, a description of why, as the payload.
func (d *artifactDriver) follow(ctx context.Context, resource string, payload []byte, gen int64) ([]byte, error) {
	p, err := artifact.DecodePointer(resource, payload)
	if err != nil {
		return unreadable(err), nil
	}
	r, err := artifact.OpenPointer(ctx, d.b, resource, p, gen)
	switch {
	case errors.Is(err, artifact.ErrMissing), errors.Is(err, artifact.ErrCorrupt):
		return unreadable(err), nil
	case err != nil:
		return nil, err
	}
	defer r.Close()
	content, err := io.ReadAll(r)
	switch {
	case errors.Is(err, artifact.ErrCorrupt):
		return unreadable(err), nil
	case err != nil:
		return nil, err
	}
	got, ok := payloadOf(content)
	if !ok {
		return unreadable(errors.New("the artifact's bytes are not those of any publication")), nil
	}
	return got, nil
}

func unreadable(err error) []byte { return []byte("UNREADABLE ARTIFACT: " + err.Error()) }

// Read reports the payload size of the publication's own payload, not of its pointer, as the
// checker compares it with what was published. The pointer is read until it is the one of the
// publication the row shows.
func (d *artifactDriver) Read(ctx context.Context, resource string) (driver.State, error) {
	for {
		st, err := d.Driver.Read(ctx, resource)
		if err != nil || st.PublishedGeneration == 0 {
			return st, err
		}
		payload, gen, err := d.Driver.ReadPayload(ctx, resource)
		if err != nil {
			return driver.State{}, err
		}
		if gen != st.PublishedGeneration {
			continue // a publication landed between the two reads
		}
		if p, err := artifact.DecodePointer(resource, payload); err == nil {
			st.PayloadSize = p.Size - 1 - artifactFiller
		}
		return st, nil
	}
}

// collect runs artifact.Collect once the workers have stopped: the published objects must
// survive it (the final reads follow their pointers), and the orphans go.
func (d *artifactDriver) collect(ctx context.Context, w io.Writer) {
	rep, err := artifact.Collect(ctx, d.s, d.b, 0, false)
	if err != nil {
		fmt.Fprintf(w, "artifact collection after the run: %v\n", err)
		return
	}
	fmt.Fprintf(w, "artifact collection after the run: %d orphans deleted (%d bytes), %d objects kept\n",
		len(rep.Deleted), rep.Bytes, rep.Kept)
}

// checkTortureArtifacts checks --artifacts, --store and --mutant together.
func checkTortureArtifacts(o tortureOptions) error {
	switch {
	case o.store != "" && !o.artifacts:
		return usagef("--store needs --artifacts")
	case o.artifacts && o.unfenced:
		return usagef("--artifacts is not implemented with --unfenced: the plain lock's write is of the payload itself")
	case o.mutant == mutantArtifactOtherPointer || o.mutant == mutantArtifactOverwrite:
		if !o.artifacts {
			return usagef("the %s mutant needs --artifacts", o.mutant)
		}
	case o.mutant != "" && o.mutant != mutantRenewAfterExpiry && o.mutant != mutantBusyAfterExpiry:
		return usagef("unknown mutant %q", o.mutant)
	}
	return nil
}

// openArtifacts opens the artifacts' store (--store, else a folder in the report directory),
// which the workers will open too, and wraps the torture's own driver (readers and the final
// collection) in the artifact path.
func (t *tortureRun) openArtifacts(ctx context.Context, drv driver.Driver, dir string) (*artifactDriver, error) {
	t.storeURL = t.o.store
	if t.storeURL == "" {
		abs, err := filepath.Abs(filepath.Join(dir, "artifacts"))
		if err != nil {
			return nil, err
		}
		t.storeURL = artifact.FileURL(abs)
	}
	b, err := artifact.OpenBucket(ctx, t.storeURL)
	if err != nil {
		var inv *artifact.URLError
		if errors.As(err, &inv) {
			return nil, usagef("invalid --store: %v", err)
		}
		return nil, err
	}
	ad, err := newArtifactDriver(ctx, drv, b, "")
	if err != nil {
		_ = b.Close()
		return nil, err
	}
	if t.copier != nil {
		t.copier = artifactCopier{t.copier, ad}
	}
	fmt.Fprintf(t.a.stdout, "artifacts in %s\n", t.storeURL)
	return ad, nil
}

// workerArtifacts wraps a worker's driver in the artifact path, with an artifact mutant if
// one is named (any other mutant goes under it).
func workerArtifacts(ctx context.Context, drv driver.Driver, storeURL, mutant string) (driver.Driver, error) {
	b, err := artifact.OpenBucket(ctx, storeURL)
	if err != nil {
		return nil, err
	}
	artifactMutant := ""
	if mutant == mutantArtifactOtherPointer || mutant == mutantArtifactOverwrite {
		artifactMutant, mutant = mutant, ""
	}
	if drv, err = mutate(drv, mutant); err != nil {
		return nil, err
	}
	return newArtifactDriver(ctx, drv, b, artifactMutant)
}

// artifactCopier is the restore fault's copier under --artifacts: the copy's payloads are
// pointers, and the history records what they carry, as every other payload in it.
type artifactCopier struct {
	storeCopier
	d *artifactDriver
}

func (c artifactCopier) take(ctx context.Context) (map[string]torture.State, error) {
	snap, err := c.storeCopier.take(ctx)
	if err != nil {
		return nil, err
	}
	for res, st := range snap {
		if st.PublishedGeneration == 0 || !artifact.IsPointer([]byte(st.Payload)) {
			continue
		}
		payload, err := c.d.follow(ctx, res, []byte(st.Payload), st.PublishedGeneration)
		if err != nil {
			return nil, fmt.Errorf("read the copy's artifact of %s: %w", res, err)
		}
		st.Payload = string(payload)
		snap[res] = st
	}
	return snap, nil
}
