package torture

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
)

// Operations on a participating service's gate (fenced torture --gate).
const (
	OpFence     = "fence"      // install the lease's token at the gate right after acquiring
	OpGateWrite = "gate_write" // the build's result sent to the service with the lease's token
)

// GateConfig makes each worker also write its build's result to a participating service,
// with the lease's Fencing-Token, and, when Fence is set, fence the service right after
// acquiring (before the build), as fenced.Run with RunOptions.Fence does.
type GateConfig struct {
	URL   string // the service: POST URL/fence, PUT URL/write
	Fence bool
	// Dest, when set, replaces the service at URL: the workers fence and write there (an Azure
	// blob per resource, fenced by its lease or by ETag compare-and-swap, --azure). Its
	// operations are recorded and checked as the service's are.
	Dest Destination
}

// Destination is a place other than a participating service that checks tokens itself.
// Fence is called right after acquiring when GateConfig.Fence is set; Write sends the build's
// result, and returns an error matching destination.ErrStale when the destination refused it.
type Destination interface {
	Fence(ctx context.Context, lease *fenced.Lease) error
	Write(ctx context.Context, lease *fenced.Lease, payload []byte) error
}

// Gate reports whether the operation went to the gate rather than the lease store.
func (o *Op) Gate() bool { return o.Kind == OpFence || o.Kind == OpGateWrite }

var gateClient = &http.Client{Timeout: 10 * time.Second}

// gateFence fences the gate for lease and records it; false means the build must not start.
func gateFence(ctx context.Context, cfg *GateConfig, rd *recording, lease *fenced.Lease) bool {
	if cfg == nil || !cfg.Fence {
		return true
	}
	id, err := rd.call(gateRecord(OpFence, lease))
	if err != nil {
		return false
	}
	if cfg.Dest != nil {
		err = cfg.Dest.Fence(ctx, lease)
	} else {
		err = (&destination.Remote{URL: cfg.URL + "/fence", Client: gateClient}).Fence(ctx, lease.Resource(), lease.Token())
	}
	_ = rd.ret(id, Record{Out: gateOutcome(err)}, err)
	return err == nil
}

// gateWrite sends payload to the service as lease's holder and records the answer: 204 ok,
// 409 refused; anything else, after the request may have arrived, unknown.
func gateWrite(ctx context.Context, cfg *GateConfig, rd *recording, lease *fenced.Lease, payload []byte) {
	if cfg == nil {
		return
	}
	r := gateRecord(OpGateWrite, lease)
	r.Payload = string(payload)
	id, err := rd.call(r)
	if err != nil {
		return
	}
	if cfg.Dest != nil {
		err = cfg.Dest.Write(ctx, lease, payload)
		_ = rd.ret(id, Record{Out: gateOutcome(err)}, err)
		return
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, cfg.URL+"/write", bytes.NewReader(payload))
	if err == nil {
		c := &http.Client{Transport: &destination.Transport{Holder: lease}, Timeout: gateClient.Timeout}
		var resp *http.Response
		if resp, err = c.Do(req); err == nil {
			_ = resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusNoContent:
			case http.StatusConflict:
				err = &destination.StaleError{Resource: lease.Resource(), Token: lease.Token()}
			default:
				err = fmt.Errorf("the service answered %s", resp.Status)
			}
		}
	}
	_ = rd.ret(id, Record{Out: gateOutcome(err)}, err)
}

func gateRecord(op string, lease *fenced.Lease) Record {
	return Record{Op: op, Resource: lease.Resource(), Owner: lease.Owner(), Epoch: lease.Epoch(), Gen: lease.Generation()}
}

func gateOutcome(err error) string {
	switch {
	case err == nil:
		return OutOK
	case errors.Is(err, destination.ErrStale):
		return OutRefused
	}
	return "" // ret records it as unknown
}

// gateTokens checks the fence at the gate on one resource: no write the gate accepted carries
// a token older than one whose holder was ready before the write was sent. A holder is ready
// when its fence returned (fencing workers) or, when no worker fences (the gate's high-water
// mark alone), when its acquisition returned.
func (c *checker) gateTokens(res string, ops []*Op, fencing bool) {
	type ready struct {
		at  int64
		tok fenced.Token
		op  *Op
	}
	var readies []ready
	for _, op := range ops {
		if op.Out != OutOK {
			continue
		}
		if (fencing && op.Kind == OpFence) || (!fencing && op.Kind == OpAcquire) {
			readies = append(readies, ready{op.Return, fenced.Token{Epoch: op.Epoch, Generation: op.Gen}, op})
		}
	}
	// Sweep the writes in call order (ops are), knowing the largest token ready before each.
	sort.Slice(readies, func(i, j int) bool { return readies[i].at < readies[j].at })
	var top *ready
	k := 0
	for _, w := range ops {
		if w.Kind != OpGateWrite || w.Out != OutOK {
			continue
		}
		for ; k < len(readies) && readies[k].at < w.Call; k++ {
			if top == nil || readies[k].tok.Compare(top.tok) > 0 {
				top = &readies[k]
			}
		}
		c.res[InvGate].Checked++
		tok := fenced.Token{Epoch: w.Epoch, Generation: w.Gen}
		if top != nil && top.tok.Compare(tok) > 0 {
			c.violate(InvGate, res, fmt.Sprintf("the gate accepted a write with token %s after the holder of %s was ready",
				tok, top.tok), top.op, w)
		}
	}
}
