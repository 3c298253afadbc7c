package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/streaming"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blockblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"gocloud.dev/blob/gcsblob"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/azureblob/azuritetest"
	"github.com/fenced-dev/fenced/destination/bucketcas"
)

// azuriteFence creates a container on Azurite and returns it with the gocloud.dev URL
// parameters and the environment that name it for --fence.
func azuriteFence(t *testing.T) (c *container.Client, params string, env []string) {
	t.Helper()
	endpoint := azuritetest.Endpoint(t)
	c = azuritetest.Container(t)
	params = "localemu=true&protocol=" + endpoint.Scheme + "&domain=" + endpoint.Host
	return c, params, []string{"AZURE_STORAGE_ACCOUNT=" + azuritetest.Account, "AZURE_STORAGE_KEY=" + azuritetest.Key}
}

type runOut struct {
	Owner string `json:"owner"`
	Token string `json:"token"`
}

func runFenced(t *testing.T, tg target, env []string, fence, res string) (owner string, token fenced.Token) {
	t.Helper()
	return runFencedCommand(t, tg, env, res, []string{fence}, "true")
}

// runFencedCommand runs argv under res's lease with each of fences and returns the run's owner
// and token.
func runFencedCommand(t *testing.T, tg target, env []string, res string, fences []string, argv ...string) (owner string, token fenced.Token) {
	t.Helper()
	args := []string{"run", res, "--ttl", "30s"}
	for _, f := range fences {
		args = append(args, "--fence", f)
	}
	r := runEnv(t, tg, env, append(append(args, "--"), argv...)...)
	if r.code != 0 {
		t.Fatalf("run --fence %s: exit %d: %s", strings.Join(fences, " --fence "), r.code, r.stderr)
	}
	var out runOut
	if err := json.Unmarshal(r.stdout, &out); err != nil {
		t.Fatal(err)
	}
	tk, err := fenced.ParseToken(out.Token)
	if err != nil {
		t.Fatal(err)
	}
	return out.Owner, tk
}

// run --fence azblob://… takes the blob over for the acquisition before the command runs: the
// blob's metadata holds its token and Azure holds the lease whose ID derives from its owner,
// so the next run's acquisition refuses the earlier owner's writes.
func TestRunFenceAzureBlob(t *testing.T) {
	tg := runTarget(t)
	const res = "nightly job ü; v2"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	c, params, env := azuriteFence(t)
	blob := azureblob.NewLeased(c, &azureblob.Options{Prefix: "reports/"})
	fence := "azblob://" + azuritetest.Name(c) + "?prefix=reports/&" + params
	ctx := context.Background()

	owner1, token1 := runFenced(t, tg, env, fence, res)
	if _, got, err := blob.Read(ctx, res); err != nil || got != token1 {
		t.Fatalf("blob token %s (%v), want the run's %s", got, err, token1)
	}
	if err := blob.Write(ctx, res, owner1, token1, []byte("first\x00run")); err != nil {
		t.Fatalf("the fenced owner's write with its lease ID: %v", err)
	}
	_, token2 := runFenced(t, tg, env, fence, res)
	if err := blob.Write(ctx, res, owner1, token1, []byte("late")); !errors.Is(err, destination.ErrStale) {
		t.Fatalf("the first run's write after the second run fenced: %v, want stale", err)
	}
	if data, got, _ := blob.Read(ctx, res); got != token2 || string(data) != "first\x00run" {
		t.Fatalf("blob %q with token %s, want the first run's data under %s", data, got, token2)
	}
}

// run --fence azblob://… gives the command the blob lease ID it holds, FENCED_AZURE_LEASE_ID, so
// that a write from outside Go (here the test's own Azure client, with the value the command
// printed) is accepted by Azure; after a successor's run, a write presenting the earlier lease
// ID is refused by Azure itself. Two lease-mode destinations share the one value. A run that
// fences no blob in lease mode does not set it, even when fenced run inherited one.
func TestRunFenceAzureBlobLeaseIDForCommand(t *testing.T) {
	tg := runTarget(t)
	const res = "nightly job ü; v2"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	c, params, env := azuriteFence(t)
	env = append(env, "FENCED_AZURE_LEASE_ID=inherited-from-outside")
	ctx := context.Background()
	fenceA := "azblob://" + azuritetest.Name(c) + "?prefix=a/&" + params
	fenceB := "azblob://" + azuritetest.Name(c) + "?prefix=b/&" + params
	// run runs the command under the fences and returns the run's owner and token and what the
	// command printed (its published output).
	run := func(fences ...string) (owner string, token fenced.Token, printed string) {
		t.Helper()
		owner, token = runFencedCommand(t, tg, env, res, fences, "sh", "-c", `printf %s "${FENCED_AZURE_LEASE_ID-unset}"`)
		return owner, token, string(tg.ok(nil, "get", res))
	}
	upload := func(name, leaseID string, token fenced.Token, data string) error {
		_, err := c.NewBlockBlobClient(name).Upload(ctx, streaming.NopCloser(strings.NewReader(data)), &blockblob.UploadOptions{
			Metadata:         map[string]*string{azureblob.MetadataKey: to.Ptr(token.String())},
			AccessConditions: &blob.AccessConditions{LeaseAccessConditions: &blob.LeaseAccessConditions{LeaseID: to.Ptr(leaseID)}}})
		return err
	}

	owner1, token1, id1 := run(fenceA, fenceB)
	if want := azureblob.LeaseID(res, owner1); id1 != want {
		t.Fatalf("the command saw FENCED_AZURE_LEASE_ID %q, want azureblob.LeaseID(resource, owner) %q", id1, want)
	}
	for _, b := range []string{"a/" + res, "b/" + res} {
		if err := upload(b, id1, token1, "first"); err != nil {
			t.Fatalf("an upload of %s with the lease ID the command saw: %v", b, err)
		}
	}
	leased := azureblob.NewLeased(c, &azureblob.Options{Prefix: "a/"})
	if data, got, err := leased.Read(ctx, res); err != nil || string(data) != "first" || got != token1 {
		t.Fatalf("blob %q under %s (%v), want the upload under %s", data, got, err, token1)
	}

	owner2, token2, id2 := run(fenceA)
	if want := azureblob.LeaseID(res, owner2); id2 != want || id2 == id1 {
		t.Fatalf("the successor's command saw %q, want %q (and not the first run's)", id2, want)
	}
	if err := upload("a/"+res, id1, token1, "late"); !bloberror.HasCode(err, bloberror.LeaseIDMismatchWithBlobOperation) {
		t.Fatalf("an upload with the first run's lease ID after the successor fenced: %v, want LeaseIdMismatchWithBlobOperation", err)
	}
	if err := upload("a/"+res, id2, token2, "second"); err != nil {
		t.Fatalf("an upload with the successor's lease ID: %v", err)
	}
	if data, got, err := leased.Read(ctx, res); err != nil || string(data) != "second" || got != token2 {
		t.Fatalf("blob %q under %s (%v), want the successor's upload under %s", data, got, err, token2)
	}

	if _, _, id := run("azblob://" + azuritetest.Name(c) + "?prefix=c/&mode=cas&" + params); id != "unset" {
		t.Fatalf("a run with no lease-mode blob gave the command FENCED_AZURE_LEASE_ID=%q", id)
	}
}

// A container that does not exist stops the run before the command, in one short sentence
// naming Azure's answer, for both modes: not the SDK's framed dump of the request and response.
func TestRunFenceAzureMissingContainer(t *testing.T) {
	tg := runTarget(t)
	_, params, env := azuriteFence(t)
	for _, mode := range []string{"", "&mode=cas"} {
		fence := "azblob://fenced-missing-container?" + params + mode
		r := runEnv(t, tg, env, "run", "job", "--ttl", "30s", "--fence", fence, "--", "sh", "-c", "echo ran")
		if r.code != 1 || len(r.stdout) != 0 {
			t.Fatalf("run --fence %s: exit %d, stdout %q; want 1 and nothing run", fence, r.code, r.stdout)
		}
		checkSentence(t, r.stderr)
		if !strings.Contains(r.stderr, "404 ContainerNotFound") || !strings.Contains(r.stderr, "create it first") ||
			strings.Contains(r.stderr, "-----") || len(r.stderr) > 400 {
			t.Errorf("run --fence %s: %q; want Azure's status and code in one short sentence", fence, r.stderr)
		}
	}
}

// run --fence with mode=cas on Azure, and gs:// on fake-gcs-server: the object's metadata holds
// the acquisition's token before the command runs; an object already fenced by a newer token
// stops the command (exit 5) and releases the lease.
func TestRunFenceCAS(t *testing.T) {
	tg := runTarget(t)
	const res = "nightly job ü; v2"
	tg.ok(nil, "provision", res)
	tg.ok(nil, "epoch", "bump")
	ctx := context.Background()

	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{Scheme: "http", Host: "127.0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop()
	srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: "reports"})
	gcsURL, _ := url.Parse(srv.URL())
	gb, err := gcsblob.OpenBucket(ctx, nil, "reports", &gcsblob.Options{Client: srv.Client()})
	if err != nil {
		t.Fatal(err)
	}
	defer gb.Close()
	gcs, err := bucketcas.New(gb, &bucketcas.Options{Prefix: "p/"})
	if err != nil {
		t.Fatal(err)
	}

	c, params, env := azuriteFence(t)
	env = append(env, "STORAGE_EMULATOR_HOST="+gcsURL.Host)
	for _, fence := range []string{"gs://reports?prefix=p/", "azblob://" + azuritetest.Name(c) + "?mode=cas&" + params} {
		_, token := runFenced(t, tg, env, fence, res)
		if strings.HasPrefix(fence, "gs:") {
			if _, got, err := gcs.Read(ctx, res); err != nil || got != token {
				t.Fatalf("object token %s (%v), want the run's %s", got, err, token)
			}
		}
	}
	ahead := fenced.Token{Epoch: 1 << 62, Generation: 1}
	if err := gcs.Fence(ctx, res, ahead); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(tg.dir, "ran")
	r := runEnv(t, tg, env, "run", res, "--ttl", "30s", "--fence", "gs://reports?prefix=p/", "--", "touch", marker)
	if r.code != 5 || !strings.Contains(r.stderr, "older than the destination's "+ahead.String()) {
		t.Fatalf("run against an object fenced ahead: exit %d, %s", r.code, r.stderr)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("the command ran")
	}
	if st := tg.show(res); st.Held {
		t.Fatal("the lease was kept")
	}
}

// A --fence URL that cannot be fenced is refused before acquiring: exit 2, one sentence, the
// command not run, the lease not taken.
func TestRunFenceBadURL(t *testing.T) {
	tg := runTarget(t)
	marker := filepath.Join(tg.dir, "ran")
	for _, c := range []struct{ url, want string }{
		{"s3://reports", "an S3 object cannot be fenced"},
		{"ftp://host/x", "invalid --fence"},
		{"file:///tmp/x", "invalid --fence"},
		{"https:///no-host", "invalid --fence"},
		{"gs://", "names no container or bucket"},
		{"gs://reports?mode=cas", "gs:// takes no mode"},
		{"azblob://c?mode=weird", "mode=weird"},
		{"azblob://c?colour=blue", "unknown query parameter"},
	} {
		stderr := tg.fails(2, nil, "run", "job", "--ttl", "30s", "--fence", c.url, "--", "touch", marker)
		if !strings.Contains(stderr, c.want) || strings.Count(strings.TrimSpace(stderr), "\n") > 0 {
			t.Errorf("--fence %s: stderr %q, want one line saying %q", c.url, stderr, c.want)
		}
		if _, err := os.Stat(marker); err == nil {
			t.Fatalf("--fence %s: the command ran", c.url)
		}
		if st := tg.show("job"); st.Held || st.Generation != 0 {
			t.Fatalf("--fence %s: the lease was taken: %+v", c.url, st)
		}
	}
}
