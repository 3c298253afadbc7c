package azureblob_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/azureblob/azuritetest"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// containerForTest is a container of the test's own on Azurite.
func containerForTest(t testing.TB) *container.Client { return azuritetest.Container(t) }

type readWriter interface {
	fenced.Fencer
	Write(ctx context.Context, resource string, token fenced.Token, data []byte) error
	Read(ctx context.Context, resource string) ([]byte, fenced.Token, error)
}

func harness(d readWriter) destinationtest.Harness {
	return destinationtest.Harness{
		Fencer: d,
		Write:  d.Write,
		Read: func(ctx context.Context, resource string) ([]byte, error) {
			b, _, err := d.Read(ctx, resource)
			return b, err
		},
	}
}

// ownerOf is the fenced owner of the acquisition that was issued token, in these tests.
func ownerOf(t fenced.Token) string { return "owner-of-" + t.String() }

// asOwners runs a Leased as the acquisitions ownerOf names: the suite deals in tokens.
type asOwners struct{ l *azureblob.Leased }

func (a asOwners) Fence(ctx context.Context, resource string, t fenced.Token) error {
	return a.l.FenceOwner(ctx, resource, ownerOf(t), t)
}

func (a asOwners) Write(ctx context.Context, resource string, t fenced.Token, data []byte) error {
	return a.l.Write(ctx, resource, ownerOf(t), t, data)
}

func (a asOwners) Read(ctx context.Context, resource string) ([]byte, fenced.Token, error) {
	return a.l.Read(ctx, resource)
}

func TestLeasedSuite(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
		return harness(asOwners{azureblob.NewLeased(containerForTest(t), &azureblob.Options{Prefix: "reports/"})})
	})
}

func TestCASSuite(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
		return harness(azureblob.NewCAS(containerForTest(t), nil))
	})
}

func tok(e, g int64) fenced.Token {
	return fenced.Token{Epoch: destinationtest.Epoch + e, Generation: g}
}

const res = "rapport nº 7; ü"

// Once B's Fence has taken the blob lease, Azure itself refuses an upload carrying A's lease
// ID, and one carrying no lease ID: the refusal does not depend on this package's code.
func TestLeasedAzureRefusesTheSupersededHolder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := containerForTest(t)
	l := azureblob.NewLeased(c, nil)
	a, b := tok(1, 5), tok(1, 6)
	if err := l.FenceOwner(ctx, res, "A", a); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(ctx, res, "A", a, []byte("A\x00")); err != nil {
		t.Fatal(err)
	}
	if err := l.FenceOwner(ctx, res, "B", b); err != nil { // B writes nothing
		t.Fatal(err)
	}
	bc := c.NewBlockBlobClient(res)
	upload := func(leaseID *string) error {
		var lc *blob.LeaseAccessConditions
		if leaseID != nil {
			lc = &blob.LeaseAccessConditions{LeaseID: leaseID}
		}
		_, err := bc.Upload(ctx, streaming.NopCloser(bytes.NewReader([]byte("raw A"))),
			&blockblob.UploadOptions{AccessConditions: &blob.AccessConditions{LeaseAccessConditions: lc}})
		return err
	}
	if err := upload(to.Ptr(azureblob.LeaseID(res, "A"))); !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation) {
		t.Fatalf("A's raw upload with its lease ID: %v, want LeaseIdMismatchWithBlobOperation", err)
	}
	if err := upload(nil); !bloberror.HasCode(err, bloberror.LeaseIDMissing) {
		t.Fatalf("an upload without a lease ID: %v, want LeaseIdMissing", err)
	}
	err := l.Write(ctx, res, "A", a, []byte("late A"))
	var stale *destination.StaleError
	if !errors.As(err, &stale) || stale.Current != b || !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation) {
		t.Fatalf("A's write: %v, want stale with current %s, Azure's LeaseIdMismatchWithBlobOperation", err, b)
	}
	if !strings.Contains(err.Error(), "Azure answered 412 LeaseIdMismatchWithBlobOperation") {
		t.Errorf("the refusal does not say that Azure refused: %v", err)
	}
	data, written, err := l.Read(ctx, res)
	if err != nil || string(data) != "A\x00" || written != b {
		t.Fatalf("read %q %s %v", data, written, err)
	}
}

// A second Leased (another process of the same holder) writes with the lease ID it derives
// from the owner; a write whose ETag is out of date is refused with ErrETagChanged.
func TestLeasedETag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := containerForTest(t)
	one, two := azureblob.NewLeased(c, nil), azureblob.NewLeased(c, nil)
	a := tok(2, 3)
	if err := one.FenceOwner(ctx, res, "A", a); err != nil {
		t.Fatal(err)
	}
	if err := two.Write(ctx, res, "A", a, []byte("from two")); err != nil {
		t.Fatalf("write from a second instance of the holder: %v", err)
	}
	if err := one.Write(ctx, res, "A", a, []byte("from one")); !errors.Is(err, azureblob.ErrETagChanged) {
		t.Fatalf("write with an out-of-date ETag: %v", err)
	}
	if data, _, _ := one.Read(ctx, res); string(data) != "from two" {
		t.Fatalf("data %q", data)
	}
	if err := one.Write(ctx, res, "A", a, []byte("from one again")); err != nil {
		t.Fatalf("after re-reading the ETag: %v", err)
	}
}

// The lease ID belongs to the acquisition, not to its token: when a token is issued twice (a
// lease store rebuilt on a clock set back, README), the second acquisition takes the blob
// over and Azure refuses the first one's writes, which present the same token with another
// owner. A lease ID derived from the token would let them through (TestSuiteCatchesMutants,
// token-lease-id). Leased.Fence, which is not given the owner, refuses.
func TestLeasedSameTokenAnotherOwner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := containerForTest(t)
	l := azureblob.NewLeased(c, nil)
	twice := tok(3, 2)
	if err := l.FenceOwner(ctx, res, "first-owner", twice); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(ctx, res, "first-owner", twice, []byte("first\x00")); err != nil {
		t.Fatal(err)
	}
	if err := l.FenceOwner(ctx, res, "second-owner", twice); err != nil {
		t.Fatalf("the second acquisition of %s: %v", twice, err)
	}
	err := l.Write(ctx, res, "first-owner", twice, []byte("first, late"))
	if !errors.Is(err, destination.ErrStale) {
		t.Fatalf("the first acquisition's write after the second fenced: %v, want stale", err)
	}
	_, err = c.NewBlockBlobClient(res).Upload(ctx, streaming.NopCloser(bytes.NewReader([]byte("raw"))), &blockblob.UploadOptions{
		AccessConditions: &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(azureblob.LeaseID(res, "first-owner"))}}})
	if !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation) {
		t.Fatalf("a raw upload with the first acquisition's lease ID: %v, want LeaseIdMismatchWithBlobOperation", err)
	}
	if err := l.Write(ctx, res, "second-owner", twice, []byte("second")); err != nil {
		t.Fatal(err)
	}
	if data, _, _ := l.Read(ctx, res); string(data) != "second" {
		t.Fatalf("data %q", data)
	}
	if err := l.Fence(ctx, res, tok(3, 3)); !errors.Is(err, azureblob.ErrNeedsOwner) {
		t.Fatalf("Fence without the owner: %v", err)
	}
	if err := l.FenceOwner(ctx, res, "bad\towner", tok(3, 3)); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("an owner with a control character: %v", err)
	}
}

func TestLeaseID(t *testing.T) {
	a := azureblob.LeaseID(res, "A")
	if a != azureblob.LeaseID(res, "A") {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{azureblob.LeaseID(res, "B"), azureblob.LeaseID("other", "A"), azureblob.LeaseID(res+"\x00", "A")} {
		if other == a {
			t.Fatal("two acquisitions share a lease ID")
		}
	}
	if len(a) != 36 || a[14] != '8' || !strings.ContainsAny(a[19:20], "89ab") {
		t.Fatalf("%s is not a version 8 UUID", a)
	}
}

func TestBadResource(t *testing.T) {
	l := azureblob.NewLeased(nil, nil)
	if err := l.FenceOwner(context.Background(), "", "A", tok(1, 1)); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("empty resource: %v", err)
	}
}
