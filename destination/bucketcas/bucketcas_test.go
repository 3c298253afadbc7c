package bucketcas_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
	gblob "gocloud.dev/blob"
	"gocloud.dev/blob/azureblob"
	"gocloud.dev/blob/gcsblob"
	"gocloud.dev/blob/memblob"
	"gocloud.dev/blob/s3blob"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob/azuritetest"
	"github.com/fenced-dev/fenced/destination/bucketcas"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// gcsBucket is a bucket of fake-gcs-server, run in this process: it enforces ifGenerationMatch
// on uploads, under the lock that serializes its writes.
func gcsBucket(t testing.TB) *gblob.Bucket {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "reports"})
	b, err := gcsblob.OpenBucket(context.Background(), nil, "reports", &gcsblob.Options{Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// azureBucket is a container of the test's own on Azurite, through gocloud.dev/blob.
func azureBucket(t testing.TB) *gblob.Bucket {
	t.Helper()
	b, err := azureblob.OpenBucket(context.Background(), azuritetest.Container(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

// s3Bucket is a bucket of gofakes3 v1.2.0 on loopback, which enforces If-Match and
// If-None-Match on PutObject.
func s3Bucket(t testing.TB) *gblob.Bucket {
	t.Helper()
	backend := s3mem.New()
	if err := backend.CreateBucket("reports"); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gofakes3.New(backend).Server())
	t.Cleanup(srv.Close)
	client := s3.New(s3.Options{
		BaseEndpoint:               aws.String(srv.URL),
		UsePathStyle:               true,
		Region:                     "us-east-1",
		Credentials:                credentials.NewStaticCredentialsProvider("test", "test", ""),
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
	b, err := s3blob.OpenBucket(context.Background(), client, "reports", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return b
}

var stores = []struct {
	name string
	open func(testing.TB) *gblob.Bucket
}{{"gcs", gcsBucket}, {"azure", azureBucket}}

func newCAS(t testing.TB, b *gblob.Bucket, opts *bucketcas.Options) *bucketcas.CAS {
	t.Helper()
	c, err := bucketcas.New(b, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func tok(e, g int64) fenced.Token {
	return fenced.Token{Epoch: destinationtest.Epoch + e, Generation: g}
}

const res = "rapport nº 7; ü"

func TestSuite(t *testing.T) {
	t.Parallel()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
				c := newCAS(t, s.open(t), &bucketcas.Options{Prefix: "reports/"})
				return destinationtest.Harness{
					Fencer: c,
					Write:  c.Write,
					Read: func(ctx context.Context, resource string) ([]byte, error) {
						b, _, err := c.Read(ctx, resource)
						return b, err
					},
				}
			})
		})
	}
}

// staleWriteAfterFence forces the schedule the version condition exists for: A compares its
// token (still the newest) and is held before its upload; B fences (or, with bWrites, writes
// its own bytes); A's upload then reaches the store, conditioned on the version A compared. It
// returns the object's content and token afterwards, and A's error.
func staleWriteAfterFence(t *testing.T, ctx context.Context, c *bucketcas.CAS, bWrites bool) (data []byte, written fenced.Token, errA error) {
	t.Helper()
	a, b := tok(2, 5), tok(2, 6)
	if err := c.Fence(ctx, res, a); err != nil {
		t.Fatal(err)
	}
	if err := c.Write(ctx, res, a, []byte("A\x00first")); err != nil {
		t.Fatal(err)
	}
	compared, resume := make(chan struct{}), make(chan struct{})
	held := false // read and written only on A's goroutine: B's fence does not get past op
	bucketcas.SetHook(c, func(op, _ string) {
		if op == "write" && !held {
			held = true
			close(compared)
			<-resume
		}
	})
	done := make(chan error)
	go func() { done <- c.Write(ctx, res, a, []byte("A\x00late")) }()
	<-compared
	if bWrites {
		if err := c.Write(ctx, res, b, []byte("B")); err != nil {
			t.Fatal(err)
		}
	} else if err := c.Fence(ctx, res, b); err != nil { // B writes nothing
		t.Fatal(err)
	}
	close(resume)
	errA = <-done
	data, written, err := c.Read(ctx, res)
	if err != nil {
		t.Fatal(err)
	}
	return data, written, errA
}

// Once B's fence is in, A's write, whose token compared as the newest before the fence, is
// refused: the store finds the object at another version, and A's retry finds B's token.
func TestFenceBetweenCompareAndUpload(t *testing.T) {
	t.Parallel()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := newCAS(t, s.open(t), nil)
			data, written, errA := staleWriteAfterFence(t, ctx, c, false)
			var stale *destination.StaleError
			if !errors.As(errA, &stale) || stale.Current != tok(2, 6) {
				t.Fatalf("A's write after B's fence: %v, want stale with current %s", errA, tok(2, 6))
			}
			if string(data) != "A\x00first" || written != tok(2, 6) {
				t.Fatalf("object %q with token %s, want A's first write fenced by B", data, written)
			}
		})
	}
}

// The same schedule must be able to fail: with the condition left off the upload, A's stale
// write lands after B's fence and overwrites B's token.
func TestFenceBetweenCompareAndUploadCatchesUnconditional(t *testing.T) {
	t.Parallel()
	for _, s := range stores {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			c := newCAS(t, s.open(t), nil)
			bucketcas.Unconditional(c)
			data, written, errA := staleWriteAfterFence(t, ctx, c, false)
			if errA != nil || string(data) != "A\x00late" || written != tok(2, 5) {
				t.Fatalf("unconditional uploads: A's write %v, object %q with %s; want the stale write accepted", errA, data, written)
			}
		})
	}
}

// Why New refuses S3: its ETag is the MD5 of the content. gofakes3 v1.2.0 enforces If-Match
// on PutObject (when B writes other bytes, A's upload is refused), yet in the schedule above
// it accepts A's stale write, because B's fence rewrote the same bytes and so left the ETag
// that A compared unchanged. Real S3 computes the ETag of a single-part upload the same way.
func TestS3ETagIsContentHash(t *testing.T) {
	t.Parallel()
	b := s3Bucket(t)
	if _, err := bucketcas.New(b, nil); !errors.Is(err, bucketcas.ErrUnsupported) {
		t.Fatalf("New on S3: %v, want ErrUnsupported", err)
	}
	ctx := context.Background()
	s3CAS := func(t *testing.T, prefix string) *bucketcas.CAS {
		c, err := bucketcas.NewAllowingS3(b, &bucketcas.Options{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	t.Run("SuccessorWrites", func(t *testing.T) {
		data, written, errA := staleWriteAfterFence(t, ctx, s3CAS(t, "writes/"), true)
		if !errors.Is(errA, destination.ErrStale) || string(data) != "B" || written != tok(2, 6) {
			t.Fatalf("S3, B writes: A's write %v, object %q with %s; want If-Match to refuse A", errA, data, written)
		}
	})
	t.Run("SuccessorFences", func(t *testing.T) {
		data, written, errA := staleWriteAfterFence(t, ctx, s3CAS(t, "fences/"), false)
		if errA != nil || string(data) != "A\x00late" || written != tok(2, 5) {
			t.Fatalf("S3, B fences: A's write %v, object %q with %s; the A-B-A this test documents did not happen", errA, data, written)
		}
	})
}

func TestUnsupportedStore(t *testing.T) {
	b := memblob.OpenBucket(nil)
	defer b.Close()
	_, err := bucketcas.New(b, nil)
	if !errors.Is(err, bucketcas.ErrUnsupported) {
		t.Fatalf("New on a memory bucket: %v", err)
	}
}

func TestBadResource(t *testing.T) {
	c := newCAS(t, gcsBucket(t), nil)
	if err := c.Fence(context.Background(), "", tok(1, 1)); !errors.Is(err, fenced.ErrInvalid) {
		t.Fatalf("empty resource: %v", err)
	}
}
