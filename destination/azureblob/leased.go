package azureblob

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/lease"
	"github.com/fenced-dev/fenced"
)

// Leased fences blobs of one container with Azure's blob lease (see the package comment). It
// remembers the ETag each holder last saw, per blob and token. A Leased is safe for
// concurrent use by multiple goroutines.
type Leased struct {
	base
	mu    sync.Mutex
	etags map[etagKey]azcore.ETag
}

type etagKey struct {
	blob  string
	token fenced.Token
}

// NewLeased fences blobs of c.
func NewLeased(c *container.Client, opts *Options) *Leased {
	var o Options
	if opts != nil {
		o = *opts
	}
	return &Leased{base: base{c: c, prefix: o.Prefix}, etags: map[etagKey]azcore.ETag{}}
}

func (l *Leased) remember(name string, t fenced.Token, e *azcore.ETag) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e == nil {
		delete(l.etags, etagKey{name, t})
		return
	}
	l.etags[etagKey{name, t}] = *e
}

func (l *Leased) recall(name string, t fenced.Token) (azcore.ETag, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.etags[etagKey{name, t}]
	return e, ok
}

// Fence takes the blob over for token: it breaks any other blob lease, acquires the lease with
// LeaseID(resource, token) and records token in the metadata. Each step is conditional on the
// ETag read at the start of the attempt, so a fence that raced with a newer one finds the newer
// token on its next attempt and fails with *destination.StaleError; the newest fence always
// ends up holding the blob. A missing blob is created empty. It implements fenced.Fencer.
func (l *Leased) Fence(ctx context.Context, resource string, token fenced.Token) error {
	bc, err := l.blob(resource)
	if err != nil {
		return err
	}
	id := LeaseID(resource, token)
	lc, err := lease.NewBlobClient(bc, &lease.BlobClientOptions{LeaseID: to.Ptr(id)})
	if err != nil {
		return err
	}
	for range maxAttempts {
		p, cur, err := l.props(ctx, bc)
		if err != nil {
			return fmt.Errorf("fence %q: %w", resource, err)
		}
		if cur.Compare(token) > 0 {
			return stale(resource, token, cur)
		}
		at := &blob.ModifiedAccessConditions{IfMatch: p.ETag}
		if p.LeaseState != nil && (*p.LeaseState == lease.StateTypeLeased || *p.LeaseState == lease.StateTypeBreaking) {
			if cur == token { // ours already, unless someone broke and took it meanwhile
				if r, err := bc.SetMetadata(ctx, metadata(token), &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
					LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}, ModifiedAccessConditions: at}}); err == nil {
					l.remember(bc.URL(), token, r.ETag)
					return nil
				}
			}
			_, err := lc.BreakLease(ctx, &lease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0)), ModifiedAccessConditions: at})
			if retryable(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("fence %q: break the blob lease: %w", resource, err)
			}
		}
		_, err = lc.AcquireLease(ctx, -1, &lease.BlobAcquireOptions{ModifiedAccessConditions: at})
		if retryable(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("fence %q: acquire the blob lease: %w", resource, err)
		}
		// The acquisition was conditional on the ETag of the token we compared, so the metadata
		// is still that older token; from here only the lease guards the blob.
		r, err := bc.SetMetadata(ctx, metadata(token), &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
			LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}}})
		if retryable(err) {
			continue // a newer fence broke our lease in between
		}
		if err != nil {
			return fmt.Errorf("fence %q: record the token: %w", resource, err)
		}
		l.remember(bc.URL(), token, r.ETag)
		return nil
	}
	return fmt.Errorf("fence %q: gave up after %d attempts racing with other fences", resource, maxAttempts)
}

func retryable(err error) bool {
	return bloberror.HasCode(err, bloberror.ConditionNotMet, bloberror.LeaseAlreadyPresent, bloberror.LeaseLost,
		bloberror.LeaseNotPresentWithBlobOperation, bloberror.LeaseIDMismatchWithBlobOperation,
		bloberror.LeaseNotPresentWithLeaseOperation, bloberror.LeaseIsBrokenAndCannotBeRenewed, bloberror.BlobNotFound)
}

func superseded(err error) bool {
	return bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation, bloberror.LeaseLost,
		bloberror.LeaseNotPresentWithBlobOperation)
}

// Write replaces the blob's content as the holder of token: the upload presents the holder's
// lease ID and, as If-Match, the ETag the holder last saw, so Azure refuses it once another
// holder has taken the blob lease (*destination.StaleError, nothing written) and when the blob
// changed under this holder's own lease (ErrETagChanged).
func (l *Leased) Write(ctx context.Context, resource string, token fenced.Token, data []byte) error {
	bc, err := l.blob(resource)
	if err != nil {
		return err
	}
	id := LeaseID(resource, token)
	leaseCond := &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}
	etag, ok := l.recall(bc.URL(), token)
	if !ok { // another process of this holder fenced: read the ETag under the lease
		p, err := bc.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: &blob.AccessConditions{LeaseAccessConditions: leaseCond}})
		if err != nil {
			return l.writeError(ctx, bc, resource, token, err)
		}
		etag = *p.ETag
	}
	r, err := bc.Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{
		Metadata: metadata(token),
		AccessConditions: &blob.AccessConditions{LeaseAccessConditions: leaseCond,
			ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag}},
	})
	if err != nil {
		l.remember(bc.URL(), token, nil)
		return l.writeError(ctx, bc, resource, token, err)
	}
	l.remember(bc.URL(), token, r.ETag)
	return nil
}

func (l *Leased) writeError(ctx context.Context, bc *blockblob.Client, resource string, token fenced.Token, err error) error {
	switch {
	case superseded(err), bloberror.HasCode(err, bloberror.LeaseIDMissing):
		_, cur, _ := l.props(ctx, bc) // advisory: Azure refused on the lease
		return stale(resource, token, cur)
	case bloberror.HasCode(err, bloberror.ConditionNotMet):
		// Azure may check If-Match before the lease: ask whether the lease is still ours.
		_, perr := bc.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: &blob.AccessConditions{
			LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(LeaseID(resource, token))}}})
		if superseded(perr) {
			_, cur, _ := l.props(ctx, bc)
			return stale(resource, token, cur)
		}
		return fmt.Errorf("write %q: %w", resource, ErrETagChanged)
	}
	return fmt.Errorf("write %q: %w", resource, err)
}

// Read returns the blob's content (and the token of its last write). Reads need no lease.
func (l *Leased) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	return l.base.Read(ctx, resource)
}
