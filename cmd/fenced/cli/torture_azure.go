package cli

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"

	"github.com/fenced-dev/fenced/cmd/fenced/torture"
)

// tortureAzure is fenced torture --azure: the workers also write each resource to an Azure
// blob, fenced by its lease (--azure-mode leased) or by ETag compare-and-swap (cas).
type tortureAzure struct {
	url, mode string
}

func (t *tortureAzure) flags(f *pflag.FlagSet) {
	f.StringVar(&t.url, "azure", "", "also write each resource to a blob at this Azure Blob endpoint (Azurite: "+azuriteURL+"), fenced on acquisition (with --unfenced: just before writing)")
	f.StringVar(&t.mode, "azure-mode", torture.AzureLeased, "how the blob is fenced: leased (Azure's blob lease and If-Match) or cas (ETag compare-and-swap)")
}

// validate checks the options before anything is created.
func (t *tortureAzure) validate(o tortureOptions) error {
	if t.url == "" {
		return nil
	}
	if o.gate {
		return usagef("--azure and --gate cannot be combined: choose one destination")
	}
	if t.mode != torture.AzureLeased && t.mode != torture.AzureCAS {
		return usagef("invalid --azure-mode %q: want %s or %s", t.mode, torture.AzureLeased, torture.AzureCAS)
	}
	_, err := parseAzure(t.url)
	return err
}

// start creates the run's container; it returns the workers' extra arguments and a function
// that deletes the container.
func (t *tortureAzure) start(ctx context.Context) (args []string, drop func(), err error) {
	if t.url == "" {
		return nil, func() {}, nil
	}
	acc, err := parseAzure(t.url)
	if err != nil {
		return nil, nil, err
	}
	if err := acc.reachable(ctx); err != nil {
		return nil, nil, fmt.Errorf("reach the Azure Blob endpoint %s: %w", t.url, err)
	}
	name, drop, err := acc.newContainer(ctx, "fenced-torture-")
	if err != nil {
		return nil, nil, err
	}
	return []string{"--azure", t.url, "--azure-container", name, "--azure-mode", t.mode}, drop, nil
}

// how says what the workers do with the blobs.
func (t *tortureAzure) how(unfenced bool) string {
	switch {
	case !unfenced:
		return "fence them on acquisition"
	case t.mode == torture.AzureLeased:
		return "take the blob lease over just before writing, not on acquisition"
	}
	return "do not fence them (the ETag compare-and-swap alone)"
}

// tortureAzureWorker is the worker's side: the flags the parent passes and the destination.
type tortureAzureWorker struct {
	url, container, mode string
}

func (w *tortureAzureWorker) flags(f *pflag.FlagSet) {
	f.StringVar(&w.url, "azure", "", "Azure Blob endpoint to write through")
	f.StringVar(&w.container, "azure-container", "", "the run's container")
	f.StringVar(&w.mode, "azure-mode", torture.AzureLeased, "leased or cas")
}

// config returns the worker's destination, or nil without --azure.
func (w *tortureAzureWorker) config(fence bool) (*torture.GateConfig, error) {
	if w.url == "" {
		return nil, nil
	}
	acc, err := parseAzure(w.url)
	if err != nil {
		return nil, err
	}
	c, err := acc.container(w.container)
	if err != nil {
		return nil, err
	}
	d, err := torture.NewAzureDestination(c, w.mode, fence)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return &torture.GateConfig{Dest: d, Fence: fence}, nil
}
