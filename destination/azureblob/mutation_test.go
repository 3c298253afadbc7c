package azureblob_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/destinationtest"
)

// The destination suite must be able to fail on Azure too. TestSuiteCatchesMutants runs it, in
// a child process, against blobs fenced wrongly on purpose, and requires the takeover schedule
// to catch each by the stale write it accepted.

const mutantEnv = "FENCED_AZURE_MUTANT"

func init() {
	if os.Getenv(mutantEnv) == "token-lease-id" { // the derivation before the lease ID came from the owner
		azureblob.DeriveLeaseIDFromToken()
	}
}

// firstOnly fences a blob once: a successor does not take the blob lease over, so the first
// holder keeps writing.
type firstOnly struct {
	asOwners
	mu   sync.Mutex
	done map[string]bool
}

func (f *firstOnly) Fence(ctx context.Context, resource string, token fenced.Token) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.done[resource] {
		return nil
	}
	f.done[resource] = true
	return f.asOwners.Fence(ctx, resource, token)
}

func TestMutantSuite(t *testing.T) {
	m := os.Getenv(mutantEnv)
	if m == "" {
		t.Skip("run by TestSuiteCatchesMutants with " + mutantEnv + " set")
	}
	destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
		c := containerForTest(t)
		switch m {
		case "no-takeover":
			return harness(&firstOnly{asOwners: asOwners{azureblob.NewLeased(c, nil)}, done: map[string]bool{}})
		case "blind-write": // CAS whose writes neither compare the token nor present the ETag
			h := harness(azureblob.NewCAS(c, nil))
			h.Write = func(ctx context.Context, resource string, token fenced.Token, data []byte) error {
				_, err := c.NewBlockBlobClient(resource).Upload(ctx, streaming.NopCloser(bytes.NewReader(data)),
					&blockblob.UploadOptions{Metadata: map[string]*string{azureblob.MetadataKey: to.Ptr(token.String())}})
				return err
			}
			return h
		}
		t.Fatalf("unknown mutant %q", m)
		return destinationtest.Harness{}
	})
}

func TestSuiteCatchesMutants(t *testing.T) {
	containerForTest(t) // skip (or fail under CI) here, not in the child, without Azurite
	for _, m := range []string{"no-takeover", "blind-write"} {
		t.Run(m, func(t *testing.T) {
			cmd := exec.Command(os.Args[0], "-test.run", "^TestMutantSuite$", "-test.v", "-test.count=1")
			cmd.Env = append(os.Environ(), mutantEnv+"="+m)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed the %s mutant:\n%s", m, out)
			}
			if want := "A's write after B fenced: got <nil>"; !strings.Contains(string(out), want) {
				t.Fatalf("the takeover schedule did not catch the %s mutant:\n%s", m, out)
			}
		})
	}
	// A lease ID derived from the token lets an earlier acquisition that was issued the same
	// token keep writing after the later one fenced.
	t.Run("token-lease-id", func(t *testing.T) {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestLeasedSameTokenAnotherOwner$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), mutantEnv+"=token-lease-id")
		out, err := cmd.CombinedOutput()
		if want := "the first acquisition's write after the second fenced: <nil>"; err == nil || !strings.Contains(string(out), want) {
			t.Fatalf("TestLeasedSameTokenAnotherOwner did not catch a lease ID derived from the token:\n%s", out)
		}
	})
}
