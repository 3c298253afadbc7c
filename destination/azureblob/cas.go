package azureblob

import (
	"bytes"
	"context"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// CAS fences blobs of one container by compare-and-swap on the ETag alone (see the package
// comment): a high-water mark in the blob's metadata. A CAS is safe for concurrent use by
// multiple goroutines.
type CAS struct{ base }

// NewCAS fences blobs of c.
func NewCAS(c *container.Client, opts *Options) *CAS {
	var o Options
	if opts != nil {
		o = *opts
	}
	return &CAS{base{c: c, prefix: o.Prefix}}
}

// Fence raises the blob's token to token, if the stored one is not newer
// (*destination.StaleError otherwise), by a metadata update conditional on the ETag of the
// token it compared. A missing blob is created empty. It implements fenced.Fencer.
func (c *CAS) Fence(ctx context.Context, resource string, token fenced.Token) error {
	return c.swap(ctx, "fence", resource, token, func(bc *blockblob.Client, at *blob.AccessConditions) error {
		_, err := bc.SetMetadata(ctx, metadata(token), &blob.SetMetadataOptions{AccessConditions: at})
		return err
	})
}

// Write replaces the blob's content and token if the stored token is not newer
// (*destination.StaleError otherwise, nothing written), by an upload conditional on the ETag of
// the token it compared.
func (c *CAS) Write(ctx context.Context, resource string, token fenced.Token, data []byte) error {
	return c.swap(ctx, "write", resource, token, func(bc *blockblob.Client, at *blob.AccessConditions) error {
		_, err := bc.Upload(ctx, streaming.NopCloser(bytes.NewReader(data)), &blockblob.UploadOptions{
			Metadata: metadata(token), AccessConditions: at})
		return err
	})
}

// swap compares the stored token with token and applies do only if the blob still has the
// ETag it compared; a lost race re-reads and compares again.
func (c *CAS) swap(ctx context.Context, op, resource string, token fenced.Token,
	do func(*blockblob.Client, *blob.AccessConditions) error) error {
	bc, err := c.blob(resource)
	if err != nil {
		return err
	}
	if err := destination.CheckToken(token); err != nil {
		return fmt.Errorf("%s %q: %w", op, resource, err)
	}
	for range maxAttempts {
		p, cur, err := c.props(ctx, bc)
		if err != nil {
			return fmt.Errorf("%s %q: %w", op, resource, err)
		}
		if cur.Compare(token) > 0 {
			return stale(resource, token, cur)
		}
		err = do(bc, &blob.AccessConditions{ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: p.ETag}})
		if bloberror.HasCode(err, bloberror.ConditionNotMet) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%s %q: %w", op, resource, err)
		}
		return nil
	}
	return fmt.Errorf("%s %q: gave up after %d attempts racing with other writers", op, resource, maxAttempts)
}

// Read returns the blob's content and the token of its last write or fence.
func (c *CAS) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	return c.base.Read(ctx, resource)
}
