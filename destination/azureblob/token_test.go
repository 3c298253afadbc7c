package azureblob_test

import (
	"context"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// A token no lease store issues is refused as malformed before anything reaches Azure, by Fence
// and Write of both variants: a blob never fenced is not even created, a fenced one keeps its
// data and token, and a valid fence works afterwards. Before the check, the zero Token was
// accepted on a blob never fenced (whose stored token counts as 0.0) and recorded as "0.0",
// which ParseToken refuses: every later fence failed until the blob was repaired by hand.
func TestMalformedTokenRefused(t *testing.T) {
	t.Parallel()
	for _, v := range []struct {
		name string
		new  func(t *testing.T) readWriter
	}{
		{"leased", func(t *testing.T) readWriter { return asOwners{azureblob.NewLeased(containerForTest(t), nil)} }},
		{"cas", func(t *testing.T) readWriter { return azureblob.NewCAS(containerForTest(t), nil) }},
	} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			d := v.new(t)
			destinationtest.RefuseBadTokens(t, ctx, harness(d), res)
			if _, _, err := d.Read(ctx, res); !bloberror.HasCode(err, bloberror.BlobNotFound) {
				t.Fatalf("the blob after refused calls only: %v, want BlobNotFound", err)
			}
			first := tok(1, 1)
			if err := d.Fence(ctx, res, first); err != nil {
				t.Fatal(err)
			}
			if err := d.Write(ctx, res, first, []byte("first\x00")); err != nil {
				t.Fatal(err)
			}
			destinationtest.RefuseBadTokens(t, ctx, harness(d), res)
			if data, got, err := d.Read(ctx, res); err != nil || got != first || string(data) != "first\x00" {
				t.Fatalf("read %q under %s (%v), want the first holder's data and token %s", data, got, err, first)
			}
			if err := d.Fence(ctx, res, tok(1, 2)); err != nil {
				t.Fatalf("a valid fence after the refused ones: %v", err)
			}
		})
	}
}
