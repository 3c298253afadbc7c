// Package azuritetest gives tests a container of their own on an Azurite server: the one named
// by FENCED_TEST_AZURITE (.ci/run starts one), or Azurite's default endpoint. Without a server
// the test is skipped, loudly, and fails under CI=true.
package azuritetest

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/url"
	"path"
	"strings"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fenced-dev/fenced/driver/drivertest"
)

// Azurite's well-known development account, published in its documentation.
const (
	Account = "devstoreaccount1"
	Key     = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Endpoint is the Blob service endpoint of the Azurite server, http://HOST:PORT/ACCOUNT.
func Endpoint(t testing.TB) *url.URL {
	t.Helper()
	raw := drivertest.ServerURL(t, "FENCED_TEST_AZURITE", "http://127.0.0.1:10000/"+Account, drivertest.DialURL)
	u, err := url.Parse(strings.TrimSuffix(raw, "/"))
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// Container creates a container with a random name, deleted when the test ends.
func Container(t testing.TB) *container.Client {
	t.Helper()
	cred, err := azblob.NewSharedKeyCredential(Account, Key)
	if err != nil {
		t.Fatal(err)
	}
	// A transport of the test's own, whose idle connections are closed when the test ends
	// (after the container is deleted), so that no goroutine outlives it for goleak to find.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	client, err := azblob.NewClientWithSharedKeyCredential(Endpoint(t).String()+"/", cred,
		&azblob.ClientOptions{ClientOptions: azcore.ClientOptions{Transport: &http.Client{Transport: tr}}})
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

// Name is the name of the container c.
func Name(c *container.Client) string {
	u, err := url.Parse(c.URL())
	if err != nil {
		return ""
	}
	return path.Base(u.Path)
}
