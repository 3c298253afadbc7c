package cli

import (
	"context"
	"fmt"
	"net/url"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"gocloud.dev/blob"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/bucketcas"
)

// fenceURLHelp says which --fence URLs name a destination that can be fenced.
const fenceURLHelp = `http(s)://… (a participating service's fence endpoint), azblob://CONTAINER[?prefix=P][&mode=cas] (the blob P+RESOURCE, by Azure's blob lease, or by ETag compare-and-swap with mode=cas) or gs://BUCKET[?prefix=P] (the object P+RESOURCE, by generation compare-and-swap)`

// openFence opens one --fence URL. It checks the URL only: nothing is contacted until the
// fence itself, right after acquiring. release frees what it opened.
func openFence(ctx context.Context, raw string) (f fenced.Fencer, release func(), err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, nil, usagef("invalid --fence %q: it does not parse; want %s", raw, fenceURLHelp)
	}
	q := u.Query()
	prefix, mode := q.Get("prefix"), q.Get("mode")
	q.Del("prefix")
	q.Del("mode")
	switch u.Scheme {
	case "http", "https":
		if u.Host == "" {
			break
		}
		return &destination.Remote{URL: raw}, func() {}, nil
	case "s3":
		return nil, nil, usagef("--fence %q: an S3 object cannot be fenced: S3's ETag is the MD5 of the content, so a conditional write cannot tell a fence that kept the content from no change (see destination/bucketcas)", raw)
	case "azblob", "gs":
		if u.Host == "" {
			return nil, nil, usagef("invalid --fence %q: it names no container or bucket (%s://NAME)", raw, u.Scheme)
		}
		if mode != "" && (u.Scheme != "azblob" || mode != "cas" && mode != "lease") {
			return nil, nil, usagef("invalid --fence %q: mode=%s; azblob:// takes mode=lease (the default) or mode=cas, gs:// takes no mode", raw, mode)
		}
		u.RawQuery = q.Encode()
		b, err := blob.OpenBucket(ctx, u.String())
		if err != nil {
			return nil, nil, usagef("invalid --fence %q: %v", raw, err)
		}
		closeBucket := func() { _ = b.Close() }
		if u.Scheme == "azblob" && mode != "cas" {
			var c *container.Client
			if !b.As(&c) {
				closeBucket()
				return nil, nil, fmt.Errorf("--fence %q: the Azure bucket exposes no container client", raw)
			}
			return azureblob.NewLeased(c, &azureblob.Options{Prefix: prefix}), closeBucket, nil
		}
		c, err := bucketcas.New(b, &bucketcas.Options{Prefix: prefix})
		if err != nil {
			closeBucket()
			return nil, nil, usagef("--fence %q: %v", raw, err)
		}
		return c, closeBucket, nil
	}
	return nil, nil, usagef("invalid --fence %q: want %s", raw, fenceURLHelp)
}
