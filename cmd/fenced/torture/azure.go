package torture

import (
	"context"
	"fmt"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination/azureblob"
)

// Azure blob modes of fenced torture --azure.
const (
	AzureLeased = "leased" // azureblob.Leased: Azure's blob lease, taken over on fencing
	AzureCAS    = "cas"    // azureblob.CAS: a token in the metadata, ETag compare-and-swap
)

// NewAzureDestination writes each resource to a blob of c through mode's fencing. With
// fenceOnAcquire false (--unfenced), Leased workers still need the blob lease to write at all,
// so each takes it over just before its write, not on acquisition: the gap that fencing on
// acquisition closes, which the checker must then find.
func NewAzureDestination(c *container.Client, mode string, fenceOnAcquire bool) (Destination, error) {
	switch mode {
	case AzureLeased:
		return &azureLeased{l: azureblob.NewLeased(c, nil), lazy: !fenceOnAcquire}, nil
	case AzureCAS:
		return &azureCAS{c: azureblob.NewCAS(c, nil)}, nil
	}
	return nil, fmt.Errorf("unknown Azure blob mode %q: want %s or %s", mode, AzureLeased, AzureCAS)
}

type azureLeased struct {
	l    *azureblob.Leased
	lazy bool
}

func (a *azureLeased) Fence(ctx context.Context, lease *fenced.Lease) error {
	return lease.Fence(ctx, a.l)
}

func (a *azureLeased) Write(ctx context.Context, lease *fenced.Lease, payload []byte) error {
	if a.lazy {
		if err := a.l.FenceOwner(ctx, lease.Resource(), lease.Owner(), lease.Token()); err != nil {
			return err
		}
	}
	return a.l.Write(ctx, lease.Resource(), lease.Owner(), lease.Token(), payload)
}

type azureCAS struct{ c *azureblob.CAS }

func (a *azureCAS) Fence(ctx context.Context, lease *fenced.Lease) error {
	return lease.Fence(ctx, a.c)
}

func (a *azureCAS) Write(ctx context.Context, lease *fenced.Lease, payload []byte) error {
	return a.c.Write(ctx, lease.Resource(), lease.Token(), payload)
}
