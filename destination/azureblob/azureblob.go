// Package azureblob fences one Azure blob that readers read in place, with Azure Blob
// Storage's own controls, so that a superseded holder's write is refused by Azure itself.
//
// Leased is the strong variant. Right after acquiring its fenced lease, a holder calls Fence:
// it breaks the previous holder's blob lease, acquires the blob lease with a lease ID derived
// from its fenced owner (LeaseID), and records its token in the blob's metadata. Every write
// then presents that lease ID and the ETag the holder last saw (If-Match). Because the lease
// ID derives from the owner, Leased is a fenced.OwnerFencer: fenced.Lease.Fence and
// fenced.RunOptions.Fence give it the owner; its plain Fence refuses (ErrNeedsOwner). From the moment the
// successor's Fence has taken the blob lease, Azure refuses the superseded holder's writes
// (412, lease ID mismatch), even though the successor has written nothing. Without Fence, the
// previous holder keeps the blob lease and its writes are accepted: that is the gap.
//
// CAS is the portable variant for stores that only have conditional writes (Azure ETags; S3
// If-Match and GCS generation preconditions would work the same way, but only Azure is
// implemented and tested here): the token lives in the blob's metadata,
// and a write or a fence is accepted only if the stored token is not newer, by
// compare-and-swap on the ETag. Any holder can write when its token is at least the stored
// one, so a superseded holder is refused only once the successor has fenced or written.
//
// What is protected: that blob, through these types. No other object, and no write made with
// the storage account's credentials without them (anyone holding the key can break a lease).
// Do not mix the two variants on one blob. Both refuse a token no lease store issues (an epoch
// or a generation below 1) before sending anything, with an error matching
// destination.ErrMalformed.
//
// # The Azure lease duration
//
// Leased acquires an infinite lease (duration -1) and breaks with a break period of 0. The
// fenced lease store decides who owns the resource and when ownership ends; the blob lease only
// records it at the destination. A finite Azure lease (15 to 60 s) would need a second renewal
// loop, and when it ran out during a holder's pause the blob would accept writes that present
// no lease ID at all, from anyone. An infinite lease stays until the successor breaks it, and
// breaking with period 0 is safe because the successor's fenced acquisition already means the
// store let the previous lease go.
package azureblob

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// MetadataKey is the blob metadata entry that holds the token, as "<epoch>.<generation>".
const MetadataKey = "fencedtoken"

// maxAttempts bounds the retries of a fence or a write that lost a race on the ETag; each
// retry follows a change someone else made, so the loop makes progress.
const maxAttempts = 50

// ErrETagChanged means the blob changed since this holder last saw it although the holder still
// has the lease: another writer using the same lease ID (two goroutines of one holder). Nothing
// was written.
var ErrETagChanged = errors.New("the blob changed since this holder last saw it")

// Options tunes both variants. A nil *Options means the defaults.
type Options struct {
	// Prefix is prepended to the resource name to make the blob name. Default "".
	Prefix string
}

// LeaseID is the Azure lease ID of the acquisition whose fenced owner is owner: a UUID
// (version 8, RFC 9562) derived from resource and owner by SHA-256. The owner is a fresh
// random identity per acquisition, so no two acquisitions share a lease ID, and only the
// holder, who knows its owner, can present it; a holder's other processes find it again from
// FENCED_OWNER without storing it. The owner is the lease store's credential: only its hash
// leaves for the blob store. A lease ID derived from the token instead would be public (the
// token is in the blob's metadata) and shared by two acquisitions if a token were ever issued
// twice (a store rebuilt on a clock set back, README).
func LeaseID(resource, owner string) string {
	h := sha256.Sum256([]byte("fenced azure blob lease\x00" + resource + "\x00" + owner))
	b := h[:16]
	b[6] = b[6]&0x0f | 0x80 // version 8
	b[8] = b[8]&0x3f | 0x80 // RFC 9562 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func tokenOf(md map[string]*string) (fenced.Token, error) {
	for k, v := range md {
		if strings.EqualFold(k, MetadataKey) && v != nil {
			t, err := fenced.ParseToken(*v)
			if err != nil {
				return fenced.Token{}, fmt.Errorf("the blob's %s metadata %q is not a token", MetadataKey, *v)
			}
			return t, nil
		}
	}
	return fenced.Token{}, nil // never fenced: every token is newer
}

func metadata(t fenced.Token) map[string]*string {
	return map[string]*string{MetadataKey: to.Ptr(t.String())}
}

type base struct {
	c      *container.Client
	prefix string
}

func (b base) blob(resource string) (*blockblob.Client, error) {
	if err := fenced.ValidateResource(resource); err != nil {
		return nil, err
	}
	return b.c.NewBlockBlobClient(b.prefix + resource), nil
}

// create makes an empty blob carrying no token if there is none, so that it can be leased.
func (b base) create(ctx context.Context, bc *blockblob.Client) error {
	_, err := bc.Upload(ctx, streaming.NopCloser(bytes.NewReader(nil)), &blockblob.UploadOptions{
		AccessConditions: &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfNoneMatch: to.Ptr(azcore.ETagAny)}},
	})
	if err != nil && !bloberror.HasCode(err, bloberror.BlobAlreadyExists, bloberror.ConditionNotMet, bloberror.LeaseIDMissing) {
		return err
	}
	return nil
}

// props reads the blob's ETag and token, creating the blob if it does not exist.
func (b base) props(ctx context.Context, bc *blockblob.Client) (blob.GetPropertiesResponse, fenced.Token, error) {
	for range 3 {
		p, err := bc.GetProperties(ctx, nil)
		if bloberror.HasCode(err, bloberror.BlobNotFound) {
			if err := b.create(ctx, bc); err != nil {
				return p, fenced.Token{}, err
			}
			continue
		}
		if err != nil {
			return p, fenced.Token{}, err
		}
		t, err := tokenOf(p.Metadata)
		return p, t, err
	}
	return blob.GetPropertiesResponse{}, fenced.Token{}, errors.New("the blob keeps disappearing")
}

// Read returns the blob's content and the token of its last write or fence (a fence rewrites
// the metadata and keeps the content).
func (b base) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	bc, err := b.blob(resource)
	if err != nil {
		return nil, fenced.Token{}, err
	}
	r, err := bc.DownloadStream(ctx, nil)
	if err != nil {
		return nil, fenced.Token{}, fmt.Errorf("read %q: %w", resource, err)
	}
	defer r.Body.Close()
	data, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, fenced.Token{}, fmt.Errorf("read %q: %w", resource, err)
	}
	t, err := tokenOf(r.Metadata)
	return data, t, err
}

func stale(resource string, token, current fenced.Token) error {
	return &destination.StaleError{Resource: resource, Token: token, Current: current}
}
