package artifact

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/pointer"
	"gocloud.dev/blob"
	"gocloud.dev/gcerrors"
)

var (
	// ErrNotArtifact: the resource's published payload is an ordinary payload, not a pointer.
	ErrNotArtifact = errors.New("the published payload is not an artifact pointer")
	// ErrMissing: the published pointer names an object that is not in the store.
	ErrMissing = errors.New("the published artifact is missing from the store")
	// ErrCorrupt: the object's bytes are not those the pointer describes.
	ErrCorrupt = errors.New("the artifact's bytes do not match its pointer")
)

// ReadPointer returns the resource's published pointer and the generation that published it.
func ReadPointer(ctx context.Context, s *fenced.Store, resource string) (Pointer, int64, error) {
	payload, gen, err := s.Get(ctx, resource)
	if err != nil {
		return Pointer{}, 0, err
	}
	p, err := DecodePointer(resource, payload)
	return p, gen, err
}

// DecodePointer parses a payload read from resource as a pointer, and checks that its key
// belongs to that resource.
func DecodePointer(resource string, payload []byte) (Pointer, error) {
	if !pointer.Is(payload) {
		return Pointer{}, fmt.Errorf("artifact %q: %w", resource, ErrNotArtifact)
	}
	p, err := pointer.Decode(payload)
	if err != nil {
		return Pointer{}, fmt.Errorf("artifact %q: the published pointer is invalid: %s", resource, err)
	}
	if k, ok := parseKey(p.Key); !ok || k.resource != resource {
		return Pointer{}, fmt.Errorf("artifact %q: the published pointer's key %q is not an artifact key of this resource", resource, p.Key)
	}
	return p, nil
}

// Reader streams a published artifact and checks it against its pointer while it streams: Read
// returns io.EOF only after exactly Size bytes whose SHA-256 is the pointer's; otherwise it
// returns an error matching ErrCorrupt. Bytes already read are not trusted until io.EOF: a
// consumer that must never act on wrong bytes stages them and commits only at io.EOF.
type Reader struct {
	Pointer    Pointer
	Generation int64 // the generation that published the pointer

	r    *blob.Reader
	h    hash.Hash
	n    int64
	err  error
	name string
}

// Open reads the resource's published pointer and opens the object it names. It returns
// fenced.ErrNothingPublished, ErrNotArtifact or ErrMissing when there is nothing to stream.
func Open(ctx context.Context, s *fenced.Store, b *Bucket, resource string) (*Reader, error) {
	p, gen, err := ReadPointer(ctx, s, resource)
	if err != nil {
		return nil, err
	}
	return OpenPointer(ctx, b, resource, p, gen)
}

// OpenPointer opens the object a pointer names, for a caller that read the pointer itself
// (with DecodePointer) as generation gen's publication on resource. It returns ErrMissing when
// the object is not in the store.
func OpenPointer(ctx context.Context, b *Bucket, resource string, p Pointer, gen int64) (*Reader, error) {
	r, err := b.b.NewReader(ctx, p.Key, nil)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return nil, fmt.Errorf("artifact %q (generation %d, key %q): %w", resource, gen, p.Key, ErrMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("artifact %q: open %q: %w", resource, p.Key, err)
	}
	ar := &Reader{Pointer: p, Generation: gen, r: r, h: sha256.New(), name: resource}
	if r.Size() != p.Size {
		_ = r.Close()
		return nil, fmt.Errorf("artifact %q (generation %d): the object is %d bytes, the pointer says %d: %w",
			resource, gen, r.Size(), p.Size, ErrCorrupt)
	}
	return ar, nil
}

func (a *Reader) Read(b []byte) (int, error) {
	if a.err != nil {
		return 0, a.err
	}
	n, err := a.r.Read(b)
	a.h.Write(b[:n])
	a.n += int64(n)
	switch {
	case a.n > a.Pointer.Size:
		a.err = fmt.Errorf("artifact %q (generation %d): the object has more than the %d bytes of its pointer: %w",
			a.name, a.Generation, a.Pointer.Size, ErrCorrupt)
	case err == io.EOF && a.n < a.Pointer.Size:
		a.err = fmt.Errorf("artifact %q (generation %d): the object ended after %d of %d bytes: %w",
			a.name, a.Generation, a.n, a.Pointer.Size, ErrCorrupt)
	case err == io.EOF:
		if sum := hex.EncodeToString(a.h.Sum(nil)); sum != a.Pointer.SHA256 {
			a.err = fmt.Errorf("artifact %q (generation %d): the object's SHA-256 is %s, the pointer says %s: %w",
				a.name, a.Generation, sum, a.Pointer.SHA256, ErrCorrupt)
		} else {
			a.err = io.EOF
		}
	case err != nil:
		a.err = fmt.Errorf("artifact %q: read: %w", a.name, err)
	}
	if a.err != nil && a.err != io.EOF {
		return n, a.err
	}
	return n, err
}

// Close closes the object.
func (a *Reader) Close() error { return a.r.Close() }

// WriteTo streams the whole artifact to w and returns an error unless every byte was verified.
func (a *Reader) WriteTo(w io.Writer) (int64, error) {
	return io.Copy(w, struct{ io.Reader }{a}) // the struct hides WriteTo, so Read does the checks
}
