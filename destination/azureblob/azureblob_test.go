package azureblob_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/destinationtest"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// Azurite's well-known development account.
const (
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// containerForTest creates a container with a random name on the Azurite server named by
// FENCED_TEST_AZURITE (.ci/run starts one), deleted when the test ends.
func containerForTest(t testing.TB) *container.Client {
	t.Helper()
	raw := drivertest.ServerURL(t, "FENCED_TEST_AZURITE", "http://127.0.0.1:10000/"+azuriteAccount, func(raw string) error {
		u, err := url.Parse(raw)
		if err != nil {
			return err
		}
		c, err := net.DialTimeout("tcp", u.Host, 2*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
	cred, err := azblob.NewSharedKeyCredential(azuriteAccount, azuriteKey)
	if err != nil {
		t.Fatal(err)
	}
	client, err := azblob.NewClientWithSharedKeyCredential(strings.TrimSuffix(raw, "/")+"/", cred, nil)
	if err != nil {
		t.Fatal(err)
	}
	name := "fenced-" + strings.ToLower(rand.Text()[:20])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := client.CreateContainer(ctx, name, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := client.DeleteContainer(ctx, name, nil); err != nil {
			t.Errorf("delete container %s: %v", name, err)
		}
	})
	return client.ServiceClient().NewContainerClient(name)
}

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

func TestLeasedSuite(t *testing.T) {
	t.Parallel()
	destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
		return harness(azureblob.NewLeased(containerForTest(t), &azureblob.Options{Prefix: "reports/"}))
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
	if err := l.Fence(ctx, res, a); err != nil {
		t.Fatal(err)
	}
	if err := l.Write(ctx, res, a, []byte("A\x00")); err != nil {
		t.Fatal(err)
	}
	if err := l.Fence(ctx, res, b); err != nil { // B writes nothing
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
	if err := upload(to.Ptr(azureblob.LeaseID(res, a))); !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation) {
		t.Fatalf("A's raw upload with its lease ID: %v, want LeaseIdMismatchWithBlobOperation", err)
	}
	if err := upload(nil); !bloberror.HasCode(err, bloberror.LeaseIDMissing) {
		t.Fatalf("an upload without a lease ID: %v, want LeaseIdMissing", err)
	}
	err := l.Write(ctx, res, a, []byte("late A"))
	var stale *destination.StaleError
	if !errors.As(err, &stale) || stale.Current != b {
		t.Fatalf("A's write: %v, want stale with current %s", err, b)
	}
	data, written, err := l.Read(ctx, res)
	if err != nil || string(data) != "A\x00" || written != b {
		t.Fatalf("read %q %s %v", data, written, err)
	}
}

// A second Leased (another process of the same holder) writes with the lease ID it derives
// from the token; a write whose ETag is out of date is refused with ErrETagChanged.
func TestLeasedETag(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := containerForTest(t)
	one, two := azureblob.NewLeased(c, nil), azureblob.NewLeased(c, nil)
	a := tok(2, 3)
	if err := one.Fence(ctx, res, a); err != nil {
		t.Fatal(err)
	}
	if err := two.Write(ctx, res, a, []byte("from two")); err != nil {
		t.Fatalf("write from a second instance of the holder: %v", err)
	}
	if err := one.Write(ctx, res, a, []byte("from one")); !errors.Is(err, azureblob.ErrETagChanged) {
		t.Fatalf("write with an out-of-date ETag: %v", err)
	}
	if data, _, _ := one.Read(ctx, res); string(data) != "from two" {
		t.Fatalf("data %q", data)
	}
	if err := one.Write(ctx, res, a, []byte("from one again")); err != nil {
		t.Fatalf("after re-reading the ETag: %v", err)
	}
}

func TestLeaseID(t *testing.T) {
	a := azureblob.LeaseID(res, tok(1, 5))
	if a != azureblob.LeaseID(res, tok(1, 5)) {
		t.Fatal("not deterministic")
	}
	for _, other := range []string{azureblob.LeaseID(res, tok(1, 6)), azureblob.LeaseID(res, tok(2, 5)), azureblob.LeaseID("other", tok(1, 5))} {
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
	if err := l.Fence(context.Background(), "", tok(1, 1)); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("empty resource: %v", err)
	}
}
