package cli

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
	"gocloud.dev/blob"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/azureblob"
	"github.com/fenced-dev/fenced/destination/bucketcas"
)

// fenceURLHelp says which --fence URLs name a destination that can be fenced.
const fenceURLHelp = `http(s)://… (a participating service's fence endpoint), azblob://CONTAINER[?prefix=P][&mode=cas] (the blob P+RESOURCE, by Azure's blob lease, or by ETag compare-and-swap with mode=cas) or gs://BUCKET[?prefix=P] (the object P+RESOURCE, by generation compare-and-swap)`

// maxFenceWait bounds a participating service's answer to a fence (see fenceTimeout).
const maxFenceWait = 30 * time.Second

// fenceTimeout is how long a participating service gets to answer a fence for a lease of ttl:
// half the TTL, at most maxFenceWait. The fence runs before the renewals start, so a service
// that hangs must not hold the holder past its trust window (at least ttl less a tenth of it).
func fenceTimeout(ttl time.Duration) time.Duration { return min(ttl/2, maxFenceWait) }

// openFence opens one --fence URL for a lease of ttl. It checks the URL only: nothing is
// contacted until the fence itself, right after acquiring. azureLease says that f takes an
// Azure blob lease (azblob:// in the default mode), whose ID the command needs for its writes.
// release frees what it opened.
func openFence(ctx context.Context, raw string, ttl time.Duration) (f fenced.Fencer, azureLease bool, release func(), err error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, false, nil, usagef("invalid --fence %q: it does not parse; want %s", raw, fenceURLHelp)
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
		return &destination.Remote{URL: raw, Timeout: fenceTimeout(ttl)}, false, func() {}, nil
	case "s3":
		return nil, false, nil, usagef("--fence %q: an S3 object cannot be fenced: S3's ETag is the MD5 of the content, so a conditional write cannot tell a fence that kept the content from no change (see destination/bucketcas)", raw)
	case "azblob", "gs":
		if u.Host == "" {
			return nil, false, nil, usagef("invalid --fence %q: it names no container or bucket (%s://NAME)", raw, u.Scheme)
		}
		if mode != "" && (u.Scheme != "azblob" || mode != "cas" && mode != "lease") {
			return nil, false, nil, usagef("invalid --fence %q: mode=%s; azblob:// takes mode=lease (the default) or mode=cas, gs:// takes no mode", raw, mode)
		}
		u.RawQuery = q.Encode()
		b, err := blob.OpenBucket(ctx, u.String())
		if err != nil {
			return nil, false, nil, usagef("invalid --fence %q: %v", raw, err)
		}
		closeBucket := func() { _ = b.Close() }
		if u.Scheme == "azblob" && mode != "cas" {
			var c *container.Client
			if !b.As(&c) {
				closeBucket()
				return nil, false, nil, fmt.Errorf("--fence %q: the Azure bucket exposes no container client", raw)
			}
			return newAzureTerseOwner(azureblob.NewLeased(c, &azureblob.Options{Prefix: prefix})), true, closeBucket, nil
		}
		c, err := bucketcas.New(b, &bucketcas.Options{Prefix: prefix})
		if err != nil {
			closeBucket()
			return nil, false, nil, usagef("--fence %q: %v", raw, err)
		}
		if u.Scheme == "azblob" {
			return azureTerse{c}, false, closeBucket, nil
		}
		return c, false, closeBucket, nil
	}
	return nil, false, nil, usagef("invalid --fence %q: want %s", raw, fenceURLHelp)
}

// azureTerse and azureTerseOwner shorten the Azure SDK's errors: an *azcore.ResponseError
// prints the whole request and response in a framed block of many lines, which the command
// would squeeze into one unreadable sentence. The error chain is kept for errors.Is and As.
type azureTerse struct{ f fenced.Fencer }

func (a azureTerse) Fence(ctx context.Context, resource string, token fenced.Token) error {
	return terseAzure(a.f.Fence(ctx, resource, token))
}

type azureTerseOwner struct {
	azureTerse
	o fenced.OwnerFencer
}

func newAzureTerseOwner(f fenced.OwnerFencer) azureTerseOwner {
	return azureTerseOwner{azureTerse{f}, f}
}

func (a azureTerseOwner) FenceOwner(ctx context.Context, resource, owner string, token fenced.Token) error {
	return terseAzure(a.o.FenceOwner(ctx, resource, owner, token))
}

type terseError struct {
	msg string
	err error
}

func (e *terseError) Error() string { return e.msg }
func (e *terseError) Unwrap() error { return e.err }

// terseAzure replaces the text of an Azure response error inside err by its status, its
// error code and the request, with a hint for a container that does not exist.
func terseAzure(err error) error {
	var re *azcore.ResponseError
	if !errors.As(err, &re) {
		return err
	}
	short := fmt.Sprintf("Azure answered %d %s", re.StatusCode, re.ErrorCode)
	if r := re.RawResponse; r != nil && r.Request != nil {
		short += fmt.Sprintf(" to %s %s", r.Request.Method, r.Request.URL.Redacted())
	}
	if re.ErrorCode == "ContainerNotFound" {
		short += " (the container does not exist: create it first)"
	}
	msg := err.Error()
	if full := re.Error(); strings.Contains(msg, full) {
		msg = strings.Replace(msg, full, short, 1)
	} else {
		msg += " (" + short + ")"
	}
	return &terseError{msg: msg, err: err}
}
