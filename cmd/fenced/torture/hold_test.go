package torture

import (
	"bufio"
	"context"
	"io"
	"testing"
)

// holdPipes is a Hold read from a pipe. Each line sent is read whole before send returns, and
// the reader handles a line before it reads the next, so that a line sent after another is a
// barrier: the first has taken effect.
func holdPipes(t *testing.T) (*Hold, func(string), *io.PipeWriter) {
	t.Helper()
	r, w := io.Pipe()
	t.Cleanup(func() { _ = w.Close() })
	send := func(line string) {
		t.Helper()
		if _, err := io.WriteString(w, line+"\n"); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(w, "sync\n"); err != nil { // ignored; the barrier
			t.Fatal(err)
		}
	}
	return NewHold(r), send, w
}

// TestHoldStopsBeforePublication: armed, the worker reports the hold with its lease and waits
// for "go"; "go" sent before the publication disarms it; the stream's end lets a held worker go.
func TestHoldStopsBeforePublication(t *testing.T) {
	h, send, w := holdPipes(t)
	pr, pw := io.Pipe()
	phase := bufio.NewScanner(pr)
	hold := func() chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.at(context.Background(), pw, "r1", 7)
		}()
		return done
	}

	// Not armed: no hold, nothing reported.
	<-hold()

	send("hold publish")
	done := hold()
	if !phase.Scan() || phase.Text() != "held publish r1 7" {
		t.Fatalf("phase %q, want the hold reported with the resource and generation", phase.Text())
	}
	select {
	case <-done:
		t.Fatal("the worker went on before go")
	default:
	}
	send("go")
	<-done

	// Armed, then disarmed by go before the publication: no hold.
	send("hold publish")
	send("go")
	<-hold()

	// Held, then the nemesis is gone.
	send("hold publish")
	done = hold()
	if !phase.Scan() {
		t.Fatal("no hold reported")
	}
	_ = w.Close()
	<-done

	var none *Hold
	none.at(context.Background(), pw, "r1", 1) // a worker without --hold never holds
}
