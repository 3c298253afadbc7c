package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/spf13/cobra"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
)

// demoAzureEndpoint is the demo's Azure Blob endpoint: --azure, else $FENCED_AZURE, else
// Azurite's default; explicit is false for the default.
func demoAzureEndpoint(flag string) (url string, explicit bool) {
	if flag != "" {
		return flag, true
	}
	if env := os.Getenv("FENCED_AZURE"); env != "" {
		return env, true
	}
	return azuriteURL, false
}

// demoAzure runs the paused-writer schedule against an Azure blob that readers read in place:
// once with the workers taking the blob over on acquisition (azureblob.Leased: Azure's blob
// lease with an ID derived from the owner, and If-Match), once with plain uploads under the
// lock alone. Without an endpoint given and no Azurite on its default address, it says so and
// skips.
func (a *app) demoAzure(ctx context.Context, endpoint string) error {
	raw, explicit := demoAzureEndpoint(endpoint)
	acc, err := parseAzure(raw)
	if err != nil {
		return err
	}
	if err := acc.reachable(ctx); err != nil {
		if explicit {
			return fmt.Errorf("reach the Azure Blob endpoint %s: %w", raw, err)
		}
		fmt.Fprintf(a.stdout, "fenced demo --destination azure: skipped: no Azure Blob endpoint answers at %s (start Azurite, or name one with --azure URL or FENCED_AZURE).\n", raw)
		return nil
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	dir, err := os.MkdirTemp("", "fenced-demo-")
	if err != nil {
		return fmt.Errorf("create temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	name, drop, err := acc.newContainer(ctx, "fenced-demo-")
	if err != nil {
		return err
	}
	defer drop()
	c, err := acc.container(name)
	if err != nil {
		return err
	}

	fmt.Fprintf(a.stdout, "fenced demo --destination azure: two worker processes write resource %q to the blob of\n", demoResource)
	fmt.Fprintf(a.stdout, "that name in container %s at %s, which readers read in place.\n", name, raw)
	fmt.Fprintf(a.stdout, "Worker A is paused with SIGSTOP past its %s lease; meanwhile worker B takes over and builds.\n", demoTTLA)
	var accepted [2]bool
	for i, fence := range []bool{true, false} {
		if fence {
			fmt.Fprintf(a.stdout, "\n== Run 1: the workers take the blob over right after acquiring (azureblob.Leased) ==\n")
		} else {
			fmt.Fprintf(a.stdout, "\n== Run 2: the same schedule without fencing: plain uploads under the lock alone ==\n")
		}
		prefix := fmt.Sprintf("run%d/", i+1)
		blob := azureblob.NewLeased(c, &azureblob.Options{Prefix: prefix})
		run := filepath.Join(dir, fmt.Sprintf("run%d", i+1))
		if err := os.MkdirAll(run, 0o700); err != nil {
			return err
		}
		accepted[i], err = a.demoDestinationRun(ctx, exe, run, fence, demoTarget{
			args: []string{"--azure", raw, "--azure-container", name, "--azure-prefix", prefix},
			fenced: func(tok string) string {
				return "took the blob over: a blob lease whose ID derives from its owner (any other broken), token " + tok + " in the metadata"
			},
			unfenced: func(tok string) string { return "does not fence: the blob has not heard of token " + tok },
			accepted: "Azure ACCEPTED A's upload",
			refused:  "Azure REFUSED A's upload (%s)",
			wrote:    "(201)",
			readers:  "readers of the blob",
			read: func(ctx context.Context) (string, string) {
				data, tok, err := blob.Read(ctx, demoResource)
				if err != nil || tok == (fenced.Token{}) {
					return string(data), "(none recorded)"
				}
				return string(data), tok.String()
			},
		})
		if err != nil {
			return fmt.Errorf("run %d failed: %w", i+1, err)
		}
	}
	fmt.Fprintln(a.stdout)
	switch {
	case accepted[0]:
		return errors.New("the stale upload was accepted by Azure although B had taken the blob over")
	case !accepted[1]:
		return errors.New("without fencing Azure refused A's stale upload, so the schedule did not show the loss")
	}
	fmt.Fprintln(a.stdout, "Result: fenced on acquisition, Azure itself refused the stale upload (the blob's lease is B's); without")
	fmt.Fprintln(a.stdout, "it, a worker that no longer owned the resource wrote the blob, and readers saw its report.")
	return nil
}

// demoAzureWorkerFlags are the demo worker's flags for the Azure blob.
type demoAzureWorkerFlags struct{ url, container, prefix string }

func (f *demoAzureWorkerFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "azure", "", "write to a blob at this Azure Blob endpoint instead of publishing")
	cmd.Flags().StringVar(&f.container, "azure-container", "", "the blob's container")
	cmd.Flags().StringVar(&f.prefix, "azure-prefix", "", "prefix of the blob's name")
}

// demoAzureWorker acquires, takes the blob over if asked (Lease.Fence, which gives Leased the
// owner), waits for "go" (its build) and uploads its payload: through Leased when fencing,
// plainly otherwise. Each step is a JSON line.
func (a *app) demoAzureWorker(cmd *cobra.Command, f demoAzureWorkerFlags, ttl time.Duration, payload []byte, fence, wait bool) error {
	acc, err := parseAzure(f.url)
	if err != nil {
		return err
	}
	c, err := acc.container(f.container)
	if err != nil {
		return err
	}
	blob := azureblob.NewLeased(c, &azureblob.Options{Prefix: f.prefix})
	return a.demoDestinationWorker(cmd, ttl, blob, fence, wait, func(ctx context.Context, lease *fenced.Lease) error {
		var err error
		if fence {
			err = blob.Write(ctx, demoResource, lease.Owner(), lease.Token(), payload)
		} else {
			_, err = c.NewBlockBlobClient(f.prefix+demoResource).Upload(ctx, streaming.NopCloser(bytes.NewReader(payload)), nil)
		}
		if errors.Is(err, destination.ErrStale) {
			_ = a.print(workerEvent{Event: "refused", Generation: lease.Generation(), Reason: err.Error()})
			return err
		}
		if err != nil {
			return fmt.Errorf("write the blob: %w", err)
		}
		return a.print(workerEvent{Event: "written", Generation: lease.Generation(), Token: lease.Token().String()})
	})
}
