package torture

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/fenced-dev/fenced/driver"
)

// answering is a driver whose Publish gives the answer it is set to.
type answering struct {
	driver.Driver
	ok  bool
	err error
}

func (d *answering) Publish(context.Context, driver.LeaseRef, driver.Publication) (bool, error) {
	return d.ok, d.err
}

// A reply that drop-reply throws away bounds the operation's interval only when the database
// had answered; a call that failed in transport (a reset, a timeout) stays unknown until the
// end of the history, since its effect may land after its RETURN.
func TestDropReplyBoundsOnlyAnswers(t *testing.T) {
	errReset := errors.New("read tcp 127.0.0.1:5432: connection reset by peer")
	for _, tc := range []struct {
		name    string
		ok      bool
		err     error
		bounded bool
	}{
		{"accepted", true, nil, true},
		{"refused", false, nil, true},
		{"not applied", false, driver.ErrNotApplied, true},
		{"transport error", false, errReset, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			rec, err := NewRecorder(dir+"/w1.jsonl", "w1")
			if err != nil {
				t.Fatal(err)
			}
			drop := &dropper{Driver: &answering{ok: tc.ok, err: tc.err}, rng: rand.New(rand.NewPCG(1, 2)), p: 1, rec: rec}
			rd := &recording{Driver: drop, rec: rec}
			l := driver.LeaseRef{Resource: "r", Owner: "a1", Epoch: 1, Generation: 1}
			if _, err := rd.Publish(context.Background(), l, driver.Publication{Payload: []byte("p")}); err == nil {
				t.Fatal("publish returned no error")
			}
			// A later operation, so that the history's end lies past the publication's RETURN.
			if _, err := rec.Call(Record{Op: OpShow, Resource: "r"}); err != nil {
				t.Fatal(err)
			}
			_ = rec.Close()
			h, err := Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			op := h.Ops[0]
			if op.Kind != OpPublish || !op.Unknown() {
				t.Fatalf("first operation %s %s, want an unknown publish", op.Kind, op.Out)
			}
			if bounded := op.Return != h.End; bounded != tc.bounded || (op.Note != "") != tc.bounded {
				t.Errorf("return %d (end %d), note %q: bounded %v, want %v", op.Return, h.End, op.Note, bounded, tc.bounded)
			}
		})
	}
}
