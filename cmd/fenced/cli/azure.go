package cli

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// Azurite's development account, published in its documentation: the default endpoint of
// --azure, and the key used for that account when FENCED_AZURE_KEY is not set.
const (
	azuriteURL     = "http://127.0.0.1:10000/devstoreaccount1"
	azuriteAccount = "devstoreaccount1"
	azuriteKey     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// azureAccount is a Blob service endpoint and the shared key to sign with: an Azurite URL
// (http://host:port/ACCOUNT) or an Azure one (https://ACCOUNT.blob.core.windows.net). The key
// comes from FENCED_AZURE_KEY, or is Azurite's development key for its account.
type azureAccount struct {
	url, name, key string
}

func parseAzure(raw string) (azureAccount, error) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return azureAccount{}, usagef("invalid Azure Blob endpoint %q: want http(s)://host:port/ACCOUNT (Azurite) or https://ACCOUNT.blob.core.windows.net", raw)
	}
	name := strings.Trim(u.Path, "/")
	if name == "" {
		name, _, _ = strings.Cut(u.Hostname(), ".")
	}
	key := os.Getenv("FENCED_AZURE_KEY")
	if key == "" && name == azuriteAccount {
		key = azuriteKey
	}
	if key == "" {
		return azureAccount{}, usagef("no key for the Azure storage account %q: set FENCED_AZURE_KEY", name)
	}
	return azureAccount{url: strings.TrimSuffix(raw, "/") + "/", name: name, key: key}, nil
}

// reachable reports whether the endpoint accepts a TCP connection within two seconds.
func (acc azureAccount) reachable(ctx context.Context) error {
	u, _ := url.Parse(acc.url)
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), map[string]string{"http": "80", "https": "443"}[u.Scheme])
	}
	d := net.Dialer{Timeout: 2 * time.Second}
	c, err := d.DialContext(ctx, "tcp", host)
	if err != nil {
		return err
	}
	return c.Close()
}

func (acc azureAccount) client() (*azblob.Client, error) {
	cred, err := azblob.NewSharedKeyCredential(acc.name, acc.key)
	if err != nil {
		return nil, fmt.Errorf("the key of the Azure storage account %q: %w", acc.name, err)
	}
	return azblob.NewClientWithSharedKeyCredential(acc.url, cred, nil)
}

// container returns a client for an existing container.
func (acc azureAccount) container(name string) (*container.Client, error) {
	c, err := acc.client()
	if err != nil {
		return nil, err
	}
	return c.ServiceClient().NewContainerClient(name), nil
}

// newContainer creates a container with a fresh name; drop deletes it.
func (acc azureAccount) newContainer(ctx context.Context, prefix string) (name string, drop func(), err error) {
	c, err := acc.client()
	if err != nil {
		return "", nil, err
	}
	name = prefix + strings.ToLower(rand.Text()[:16])
	if _, err := c.CreateContainer(ctx, name, nil); err != nil {
		return "", nil, fmt.Errorf("create container %s at %s: %w", name, acc.url, err)
	}
	return name, func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, _ = c.DeleteContainer(ctx, name, nil)
	}, nil
}
