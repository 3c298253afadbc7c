package azureblob

import (
	"bytes"
	"context"
	"errors"
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
	"github.com/fenced-dev/fenced/destination"
)

// Leased fences blobs of one container with Azure's blob lease (see the package comment). It
// remembers the ETag each holder last saw, per blob and lease ID. A Leased is safe for
// concurrent use by multiple goroutines.
type Leased struct {
	base
	mu    sync.Mutex
	etags map[etagKey]azcore.ETag
	// hook, if set (tests only), is called at each step of a fence, so that a test can hold a
	// fence between its steps and force the schedule it describes.
	hook func(step fenceStep)
}

type etagKey struct {
	blob, leaseID string
	token         fenced.Token
}

// fenceStep names the moments of a fence between its requests to Azure.
type fenceStep string

const (
	stepRead     fenceStep = "read"     // the blob's token, ETag and lease state were read
	stepBroken   fenceStep = "broken"   // the previous lease was broken, ours not yet acquired
	stepAcquired fenceStep = "acquired" // our lease was acquired, the token not yet recorded
)

func (l *Leased) step(s fenceStep) {
	if l.hook != nil {
		l.hook(s)
	}
}

// ErrNeedsOwner is returned by Leased.Fence, which is not given the holder's owner: the lease
// ID derives from it. Fence a Leased through fenced.Lease.Fence or fenced.RunOptions.Fence
// (which call FenceOwner), or call FenceOwner.
var ErrNeedsOwner = errors.New("azureblob.Leased derives the blob lease ID from the holder's owner: fence it through Lease.Fence, RunOptions.Fence or FenceOwner")

// deriveLeaseID is LeaseID; a test swaps it for a mutant that ignores the owner.
var deriveLeaseID = func(resource, owner string, _ fenced.Token) string { return LeaseID(resource, owner) }

// NewLeased fences blobs of c.
func NewLeased(c *container.Client, opts *Options) *Leased {
	var o Options
	if opts != nil {
		o = *opts
	}
	return &Leased{base: base{c: c, prefix: o.Prefix}, etags: map[etagKey]azcore.ETag{}}
}

func (l *Leased) remember(k etagKey, e *azcore.ETag) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e == nil {
		delete(l.etags, k)
		return
	}
	l.etags[k] = *e
}

func (l *Leased) recall(k etagKey) (azcore.ETag, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.etags[k]
	return e, ok
}

// Fence refuses: the lease ID derives from the holder's owner, which Fence is not given
// (ErrNeedsOwner). fenced.Lease.Fence and fenced.RunOptions.Fence call FenceOwner instead.
func (l *Leased) Fence(_ context.Context, resource string, _ fenced.Token) error {
	return ErrNeedsOwner
}

// FenceOwner takes the blob over for the acquisition (owner, token): it breaks any other blob
// lease, acquires the lease with LeaseID(resource, owner) and records token in the metadata.
// A fence whose token is older than the recorded one is refused (*destination.StaleError); an
// equal token with another owner takes the blob over, as a newer one does, so that an
// acquisition is never locked out by an earlier one that was issued the same token. Each step
// is conditional on the ETag read at the start of the attempt (lease operations do not change
// it, recording a token does), so a fence that raced with a newer one finds the newer token on
// its next attempt and is refused; the newest fence ends up holding the blob. A missing blob
// is created empty. It implements fenced.OwnerFencer.
func (l *Leased) FenceOwner(ctx context.Context, resource, owner string, token fenced.Token) error {
	bc, err := l.blob(resource)
	if err != nil {
		return err
	}
	if err := fenced.ValidateOwner(owner); err != nil {
		return err
	}
	if err := destination.CheckToken(token); err != nil {
		return err
	}
	id := deriveLeaseID(resource, owner, token)
	key := etagKey{bc.URL(), id, token}
	lc, err := lease.NewBlobClient(bc, &lease.BlobClientOptions{LeaseID: to.Ptr(id)})
	if err != nil {
		return err
	}
	for range maxAttempts {
		p, cur, err := l.props(ctx, bc)
		if err != nil {
			return err
		}
		if cur.Compare(token) > 0 {
			return stale(resource, token, cur)
		}
		l.step(stepRead)
		at := &blob.ModifiedAccessConditions{IfMatch: p.ETag}
		if p.LeaseState != nil && (*p.LeaseState == lease.StateTypeLeased || *p.LeaseState == lease.StateTypeBreaking) {
			if cur == token { // ours already, unless someone broke and took it meanwhile
				if r, err := bc.SetMetadata(ctx, metadata(token), &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
					LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}, ModifiedAccessConditions: at}}); err == nil {
					l.remember(key, r.ETag)
					return nil
				}
			}
			_, err := lc.BreakLease(ctx, &lease.BlobBreakOptions{BreakPeriod: to.Ptr(int32(0)), ModifiedAccessConditions: at})
			if retryable(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("break the blob lease: %w", err)
			}
			l.step(stepBroken)
		}
		_, err = lc.AcquireLease(ctx, -1, &lease.BlobAcquireOptions{ModifiedAccessConditions: at})
		if retryable(err) {
			continue
		}
		if err != nil {
			return fmt.Errorf("acquire the blob lease: %w", err)
		}
		l.step(stepAcquired)
		// The acquisition was conditional on the ETag of the token we compared, so the metadata
		// is still that older token; from here only the lease guards the blob.
		r, err := bc.SetMetadata(ctx, metadata(token), &blob.SetMetadataOptions{AccessConditions: &blob.AccessConditions{
			LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}}})
		if retryable(err) {
			continue // a newer fence broke our lease in between
		}
		if err != nil {
			return fmt.Errorf("record the token: %w", err)
		}
		l.remember(key, r.ETag)
		return nil
	}
	return fmt.Errorf("gave up after %d attempts racing with other fences", maxAttempts)
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

// Write replaces the blob's content as the acquisition (owner, token): the upload presents the
// lease ID derived from owner and, as If-Match, the ETag the holder last saw, so Azure refuses
// it once another acquisition has taken the blob lease (*destination.StaleError, nothing
// written) and when the blob changed under this holder's own lease (ErrETagChanged). token
// is recorded in the metadata with the data.
func (l *Leased) Write(ctx context.Context, resource, owner string, token fenced.Token, data []byte) error {
	bc, err := l.blob(resource)
	if err != nil {
		return err
	}
	if err := fenced.ValidateOwner(owner); err != nil {
		return fmt.Errorf("write %q: %w", resource, err)
	}
	if err := destination.CheckToken(token); err != nil {
		return fmt.Errorf("write %q: %w", resource, err)
	}
	id := deriveLeaseID(resource, owner, token)
	key := etagKey{bc.URL(), id, token}
	leaseCond := &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}
	etag, ok := l.recall(key)
	if !ok { // another process of this holder fenced: read the ETag under the lease
		p, err := bc.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: &blob.AccessConditions{LeaseAccessConditions: leaseCond}})
		if err != nil {
			return l.writeError(ctx, bc, resource, id, token, err)
		}
		etag = *p.ETag
	}
	r, err := bc.Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{
		Metadata: metadata(token),
		AccessConditions: &blob.AccessConditions{LeaseAccessConditions: leaseCond,
			ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag}},
	})
	if err != nil {
		l.remember(key, nil)
		return l.writeError(ctx, bc, resource, id, token, err)
	}
	l.remember(key, r.ETag)
	return nil
}

func (l *Leased) writeError(ctx context.Context, bc *blockblob.Client, resource, id string, token fenced.Token, err error) error {
	switch {
	case superseded(err), bloberror.HasCode(err, bloberror.LeaseIDMissing):
		_, cur, _ := l.props(ctx, bc) // advisory: Azure refused on the lease
		return refusedByAzure(stale(resource, token, cur), err)
	case bloberror.HasCode(err, bloberror.ConditionNotMet):
		// Azure may check If-Match before the lease: ask whether the lease is still ours.
		_, perr := bc.GetProperties(ctx, &blob.GetPropertiesOptions{AccessConditions: &blob.AccessConditions{
			LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(id)}}})
		if superseded(perr) {
			_, cur, _ := l.props(ctx, bc)
			return refusedByAzure(stale(resource, token, cur), perr)
		}
		return fmt.Errorf("write %q: %w", resource, ErrETagChanged)
	}
	return fmt.Errorf("write %q: %w", resource, err)
}

// Read returns the blob's content and the token of its last write or fence: after a fence the
// metadata holds the fencing holder's token over the previous holder's bytes. Reads need no
// lease.
func (l *Leased) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	return l.base.Read(ctx, resource)
}

// azureRefusal is a *destination.StaleError that Azure itself decided; it also unwraps to
// Azure's answer, whose status and code its message names.
type azureRefusal struct {
	stale error
	azure *azcore.ResponseError
}

func refusedByAzure(staleErr, azure error) error {
	var re *azcore.ResponseError
	if errors.As(azure, &re) {
		return &azureRefusal{staleErr, re}
	}
	return staleErr
}

func (e *azureRefusal) Error() string {
	return fmt.Sprintf("%v (Azure answered %d %s)", e.stale, e.azure.StatusCode, e.azure.ErrorCode)
}

func (e *azureRefusal) Unwrap() []error { return []error{e.stale, e.azure} }
