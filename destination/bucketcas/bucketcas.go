// Package bucketcas fences one object of a gocloud.dev/blob bucket, read in place, by
// compare-and-swap on the object's version: the portable variant of destination/azureblob's CAS
// for stores whose only concurrency control is a conditional write.
//
// The token lives in the object's metadata (MetadataKey). Fence and Write read the object's
// version and token, refuse if the stored token is newer (*destination.StaleError, nothing
// changed), and otherwise write conditionally on that version, so that a fence or a write that
// landed in between makes the store refuse this one; the loser reads again and compares again.
// One code path serves every store: the version is read from blob.Attributes and the condition
// is set through WriterOptions.BeforeWrite:
//
//   - Google Cloud Storage (gs://): the object's generation, ifGenerationMatch (the
//     *storage.ObjectHandle's Conditions). Every upload makes a new generation.
//   - Azure Blob Storage (azblob://): the ETag, If-Match (azblob.UploadStreamOptions).
//
// Amazon S3 is refused (ErrUnsupported), although S3 has If-Match on PutObject: an S3 ETag is
// the MD5 of the content, so a fence, which rewrites the same bytes with a newer token, leaves
// the ETag unchanged, and a superseded holder's write conditioned on the ETag it read before the
// fence still matches and is accepted (an A-B-A). TestS3ETagIsContentHash shows it on gofakes3.
//
// A fence rewrites the object (content unchanged, the new token in metadata): object stores
// cannot change metadata without a new version. It costs a read and an upload of the whole
// object. A missing object is created empty. A token no lease store issues (an epoch or a
// generation below 1) is refused before anything is sent, with an error matching
// destination.ErrMalformed.
//
// What is protected: that object, written through a CAS, from the moment a successor's Fence
// or Write returns. Not other objects, not writers that ignore the metadata, and not the
// high-water-mark gap: until the successor fences, a superseded holder whose token is still the
// newest the object has seen can write (fence on acquisition with fenced.Lease.Fence or
// fenced.RunOptions.Fence).
package bucketcas

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"cloud.google.com/go/storage"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	gblob "gocloud.dev/blob"
	"gocloud.dev/gcerrors"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// MetadataKey is the metadata entry that holds the token, as "<epoch>.<generation>": the same
// as destination/azureblob's.
const MetadataKey = "fencedtoken"

// maxAttempts bounds the retries after a lost race; each follows someone else's change.
const maxAttempts = 50

// ErrUnsupported means the bucket's store has no conditional write this package can rely on
// (S3, whose ETags are content hashes; the file and memory stores, which have none).
var ErrUnsupported = errors.New("the bucket's store cannot fence an object")

type store int

const (
	gcs store = iota + 1
	azure
	s3store // reachable only from tests, to show why New refuses S3
)

// Options tunes a CAS. A nil *Options means the defaults.
type Options struct {
	// Prefix is prepended to the resource name to make the object's key. Default "".
	Prefix string
}

// CAS fences objects of one bucket. A CAS is safe for concurrent use by multiple goroutines;
// the bucket stays the caller's to close.
type CAS struct {
	b      *gblob.Bucket
	prefix string
	kind   store
	// hook, for tests, runs after a fence or write compared the tokens and before its
	// conditional upload.
	hook func(op, resource string)
	// unconditional, for a mutation test, uploads without the version condition.
	unconditional bool
}

// New fences objects of b, a bucket on Google Cloud Storage or Azure Blob Storage;
// ErrUnsupported for any other store.
func New(b *gblob.Bucket, opts *Options) (*CAS, error) { return open(b, opts, false) }

// open is New; allowS3, for tests only, opens an S3 bucket to show the A-B-A New refuses.
func open(b *gblob.Bucket, opts *Options, allowS3 bool) (*CAS, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	c := &CAS{b: b, prefix: o.Prefix}
	var gc *storage.Client
	var ac *container.Client
	var sc *s3.Client
	switch {
	case b.As(&gc):
		c.kind = gcs
	case b.As(&ac):
		c.kind = azure
	case b.As(&sc) && allowS3:
		c.kind = s3store
	case b.As(&sc):
		return nil, fmt.Errorf("%w: S3's ETag is the MD5 of the content, so a fence that keeps the content keeps the ETag and a superseded holder's If-Match still matches", ErrUnsupported)
	default:
		return nil, fmt.Errorf("%w: only gs:// and azblob:// buckets have a conditional write it uses", ErrUnsupported)
	}
	return c, nil
}

// version is what a conditional write compares: a GCS generation or an ETag; none if the
// object does not exist.
type version struct {
	exists     bool
	generation int64
	etag       string
}

func (c *CAS) key(resource string) (string, error) {
	if err := fenced.ValidateResource(resource); err != nil {
		return "", err
	}
	return c.prefix + resource, nil
}

// state reads the object's version and token.
func (c *CAS) state(ctx context.Context, key string) (version, fenced.Token, error) {
	a, err := c.b.Attributes(ctx, key)
	if gcerrors.Code(err) == gcerrors.NotFound {
		return version{}, fenced.Token{}, nil
	}
	if err != nil {
		return version{}, fenced.Token{}, err
	}
	v := version{exists: true, etag: a.ETag}
	if c.kind == gcs {
		var oa storage.ObjectAttrs
		if !a.As(&oa) {
			return version{}, fenced.Token{}, errors.New("gcsblob did not expose the object's attributes")
		}
		v.generation = oa.Generation
	}
	t, err := tokenOf(a.Metadata)
	return v, t, err
}

func tokenOf(md map[string]string) (fenced.Token, error) {
	for k, s := range md {
		if strings.EqualFold(k, MetadataKey) {
			t, err := fenced.ParseToken(s)
			if err != nil {
				return fenced.Token{}, fmt.Errorf("the object's %s metadata %q is not a token", MetadataKey, s)
			}
			return t, nil
		}
	}
	return fenced.Token{}, nil // never fenced: every token is newer
}

// upload writes data and token to key only if the object is still at v.
func (c *CAS) upload(ctx context.Context, key string, v version, token fenced.Token, data []byte) error {
	opts := &gblob.WriterOptions{
		Metadata:                    map[string]string{MetadataKey: token.String()},
		ContentType:                 "application/octet-stream",
		DisableContentTypeDetection: true,
		BeforeWrite: func(as func(any) bool) error {
			if c.unconditional {
				return nil
			}
			switch c.kind {
			case gcs:
				var oh **storage.ObjectHandle
				if !as(&oh) {
					return errors.New("gcsblob did not expose the object handle")
				}
				cond := storage.Conditions{DoesNotExist: true}
				if v.exists {
					cond = storage.Conditions{GenerationMatch: v.generation}
				}
				*oh = (*oh).If(cond)
			case azure:
				var uo *azblob.UploadStreamOptions
				if !as(&uo) {
					return errors.New("azureblob did not expose the upload options")
				}
				mac := &blob.ModifiedAccessConditions{IfNoneMatch: to.Ptr(azcore.ETagAny)}
				if v.exists {
					mac = &blob.ModifiedAccessConditions{IfMatch: to.Ptr(azcore.ETag(v.etag))}
				}
				uo.AccessConditions = &blob.AccessConditions{ModifiedAccessConditions: mac}
			case s3store:
				var in *transfermanager.UploadObjectInput
				if !as(&in) {
					return errors.New("s3blob did not expose the upload input")
				}
				if v.exists {
					in.IfMatch = to.Ptr(v.etag)
				} else {
					in.IfNoneMatch = to.Ptr("*")
				}
			}
			return nil
		},
	}
	return c.b.Upload(ctx, key, bytes.NewReader(data), opts)
}

// conflict reports whether err is the store refusing a condition: someone else wrote first.
func conflict(err error) bool {
	switch gcerrors.Code(err) {
	case gcerrors.FailedPrecondition, gcerrors.AlreadyExists:
		return true
	}
	return false
}

// swap compares and, if the stored token is not newer, uploads conditionally on the version it
// compared; content returns the bytes to upload (Fence keeps the current ones). Its errors do
// not name op and resource: Write's caller sees them named by Write, Fence's by *fenced.FenceError.
func (c *CAS) swap(ctx context.Context, op, resource string, token fenced.Token,
	content func(key string, v version) ([]byte, error)) error {
	key, err := c.key(resource)
	if err != nil {
		return err
	}
	if err := destination.CheckToken(token); err != nil {
		return err
	}
	for range maxAttempts {
		v, cur, err := c.state(ctx, key)
		if err != nil {
			return err
		}
		if cur.Compare(token) > 0 {
			return &destination.StaleError{Resource: resource, Token: token, Current: cur}
		}
		data, err := content(key, v)
		if gcerrors.Code(err) == gcerrors.NotFound {
			continue // deleted since: read again
		}
		if err != nil {
			return err
		}
		if c.hook != nil {
			c.hook(op, resource)
		}
		err = c.upload(ctx, key, v, token, data)
		if conflict(err) {
			continue
		}
		if err != nil {
			return err
		}
		return nil
	}
	return fmt.Errorf("gave up after %d attempts racing with other writers", maxAttempts)
}

// Fence raises the object's token to token if the stored one is not newer
// (*destination.StaleError otherwise, nothing changed), by rewriting its content with the new
// token, conditionally on the version it compared. It implements fenced.Fencer.
func (c *CAS) Fence(ctx context.Context, resource string, token fenced.Token) error {
	return c.swap(ctx, "fence", resource, token, func(key string, v version) ([]byte, error) {
		if !v.exists {
			return nil, nil
		}
		return c.b.ReadAll(ctx, key)
	})
}

// Write replaces the object's content and token if the stored token is not newer
// (*destination.StaleError otherwise, nothing written).
func (c *CAS) Write(ctx context.Context, resource string, token fenced.Token, data []byte) error {
	err := c.swap(ctx, "write", resource, token, func(string, version) ([]byte, error) { return data, nil })
	var stale *destination.StaleError
	if err != nil && !errors.As(err, &stale) { // a StaleError names the resource itself
		return fmt.Errorf("write %q: %w", resource, err)
	}
	return err
}

// Read returns the object's content and the token of its last write or fence. The two come
// from one read, so they belong together.
func (c *CAS) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	key, err := c.key(resource)
	if err != nil {
		return nil, fenced.Token{}, err
	}
	r, err := c.b.NewReader(ctx, key, nil)
	if err != nil {
		return nil, fenced.Token{}, fmt.Errorf("read %q: %w", resource, err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fenced.Token{}, fmt.Errorf("read %q: %w", resource, err)
	}
	t, err := c.tokenOfReader(ctx, key, r)
	return data, t, err
}

// tokenOfReader takes the token from the reader's own response where the store exposes it,
// so that content and token are of one version.
func (c *CAS) tokenOfReader(ctx context.Context, key string, r *gblob.Reader) (fenced.Token, error) {
	switch c.kind {
	case gcs:
		var sr *storage.Reader
		if r.As(&sr) {
			if md := sr.Metadata(); md != nil {
				return tokenOf(md)
			}
		}
	case azure:
		var dr blob.DownloadStreamResponse
		if r.As(&dr) {
			md := make(map[string]string, len(dr.Metadata))
			for k, v := range dr.Metadata {
				if v != nil {
					md[k] = *v
				}
			}
			return tokenOf(md)
		}
	}
	_, t, err := c.state(ctx, key) // advisory: the object may have changed since the read
	return t, err
}
