// Package artifact keeps outputs too large for a row in a blob store, behind a fenced pointer.
//
// A holder uploads an immutable object under a key that only its own acquisition can produce
// (resource, token, owner, random nonce), with a create-only write, and then publishes a
// pointer to it (key, SHA-256, size, content type) through the lease's conditional
// publication. The fence is on the pointer: an attempt that lost its lease can upload, but its
// pointer is refused, so readers, who only ever follow the published pointer, never see its
// object. Such orphans are removed by Collect.
package artifact

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/internal/pointer"
)

// Pointer names a published artifact: its key in the store and what its bytes must be.
type Pointer = pointer.Pointer

// Option adjusts an upload and its publication.
type Option func(*options)

type options struct {
	contentType string
	publish     []fenced.PublishOption
}

// WithContentType records the artifact's media type in its pointer and, where the store keeps
// one, on the object. Default application/octet-stream.
func WithContentType(ct string) Option { return func(o *options) { o.contentType = ct } }

// WithPublishOptions passes options (operation id, source version) to the pointer's publication.
func WithPublishOptions(opts ...fenced.PublishOption) Option {
	return func(o *options) { o.publish = append(o.publish, opts...) }
}

func collect(opts []Option) options {
	o := options{contentType: "application/octet-stream"}
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Upload streams r to a new object under a key unique to lease's acquisition, computing its
// SHA-256 and size on the way, and returns the pointer to publish. It publishes nothing: an
// uploaded object that no pointer names is invisible to readers and collected later.
func Upload(ctx context.Context, lease *fenced.Lease, b *Bucket, r io.Reader, opts ...Option) (Pointer, error) {
	o := collect(opts)
	return upload(ctx, lease, b, r, o)
}

func upload(ctx context.Context, lease *fenced.Lease, b *Bucket, r io.Reader, o options) (Pointer, error) {
	if len(o.contentType) > 255 {
		return Pointer{}, fmt.Errorf("artifact for %q: the content type is longer than 255 bytes: %w", lease.Resource(), fenced.ErrInvalid)
	}
	key := objectKey(lease.Resource(), lease.Owner(), lease.Token(), newNonce())
	sum, n, err := b.put(ctx, key, o.contentType, r)
	if err != nil {
		return Pointer{}, fmt.Errorf("upload artifact for %q (generation %d): %w", lease.Resource(), lease.Generation(), err)
	}
	return Pointer{Key: key, SHA256: hex.EncodeToString(sum), Size: n, ContentType: o.contentType}, nil
}

// Publish uploads r and publishes the pointer to it under lease, in that order. A refused
// publication is *fenced.RefusedError and leaves the uploaded object as an orphan for Collect;
// *fenced.OutcomeUnknownError can be settled with Store.Resolve and the operation id given
// with WithPublishOptions(fenced.WithOpID(...)).
func Publish(ctx context.Context, lease *fenced.Lease, b *Bucket, r io.Reader, opts ...Option) (Pointer, error) {
	return publishWith(ctx, lease, b, r, opts, lease.Publish)
}

// PublishAndRelease is Publish that frees the lease in the same statement as the publication.
func PublishAndRelease(ctx context.Context, lease *fenced.Lease, b *Bucket, r io.Reader, opts ...Option) (Pointer, error) {
	return publishWith(ctx, lease, b, r, opts, lease.PublishAndRelease)
}

func publishWith(ctx context.Context, lease *fenced.Lease, b *Bucket, r io.Reader, opts []Option,
	publish func(context.Context, []byte, ...fenced.PublishOption) error) (Pointer, error) {
	o := collect(opts)
	p, err := upload(ctx, lease, b, r, o)
	if err != nil {
		return Pointer{}, err
	}
	payload, err := encode(p)
	if err != nil {
		return Pointer{}, fmt.Errorf("artifact for %q: %w", lease.Resource(), err)
	}
	if err := publish(ctx, payload, o.publish...); err != nil {
		return p, err
	}
	return p, nil
}

// ProduceFunc writes an artifact under a lease. ctx dies with the lease.
type ProduceFunc func(ctx context.Context, lease *fenced.Lease, w io.Writer) error

// Build adapts produce to fenced.Run: what produce writes is streamed into a new object, and
// the build's result is the pointer, which Run then publishes and releases like any payload.
// If produce fails, the partial upload is discarded.
func Build(b *Bucket, produce ProduceFunc, opts ...Option) fenced.BuildFunc {
	o := collect(opts)
	return func(ctx context.Context, lease *fenced.Lease) ([]byte, error) {
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			err := produce(ctx, lease, pw)
			pw.CloseWithError(err) // nil closes with io.EOF
			done <- err
		}()
		p, err := upload(ctx, lease, b, pr, o)
		pr.CloseWithError(errors.New("the artifact's upload stopped")) // unblock produce if the upload failed
		perr := <-done
		switch {
		case perr != nil && (err == nil || errors.Is(err, perr)):
			return nil, perr // the producer's failure, which also failed the upload
		case err != nil:
			return nil, err // the store's failure, which also stopped the producer
		}
		return encode(p)
	}
}

// encode is the pointer's payload.
func encode(p Pointer) ([]byte, error) { return pointer.Encode(p) }

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// IsPointer reports whether a published payload is an artifact pointer.
func IsPointer(payload []byte) bool { return pointer.Is(payload) }

// PublishPointer publishes, under lease, the pointer to an artifact that Upload stored earlier
// under the same lease: the two-step form of Publish, for a holder that uploads long before it
// knows whether to publish. A pointer from another lease's upload is refused with
// fenced.ErrInvalid, before anything is sent.
func PublishPointer(ctx context.Context, lease *fenced.Lease, p Pointer, opts ...fenced.PublishOption) error {
	if k, ok := parseKey(p.Key); !ok || k.resource != lease.Resource() || k.token != lease.Token() {
		return fmt.Errorf("artifact for %q: the pointer's key %q was not uploaded under this lease (generation %s): %w",
			lease.Resource(), p.Key, lease.Token(), fenced.ErrInvalid)
	}
	payload, err := encode(p)
	if err != nil {
		return fmt.Errorf("artifact for %q: %w", lease.Resource(), err)
	}
	return lease.Publish(ctx, payload, opts...)
}
