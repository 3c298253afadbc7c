// Package gatetest runs the destination suite and the gate's own tests against one database
// engine. The gate's tests for each engine call Run; the MySQL ones live in backend/mysql's
// module, which has the driver.
package gatetest

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fenced-dev/fenced"
	"github.com/fenced-dev/fenced/destination"
	"github.com/fenced-dev/fenced/destination/destinationtest"
	"github.com/fenced-dev/fenced/destination/gate"
	"github.com/fenced-dev/fenced/internal/benchstat"
)

// Engine opens an empty database of its own for each call, closed when t ends.
type Engine struct {
	Dialect gate.Dialect
	Open    func(t testing.TB) *sql.DB
	// Config, if set, is given to gate.New (a test of a mutated statement sets it).
	Config *gate.Config
}

func upsert(d gate.Dialect) string {
	if d == gate.MySQL {
		return `INSERT INTO gate_data (resource, data) VALUES (?, ?) ON DUPLICATE KEY UPDATE data = VALUES(data)`
	}
	if d == gate.Postgres {
		return `INSERT INTO gate_data (resource, data) VALUES ($1, $2) ON CONFLICT (resource) DO UPDATE SET data = excluded.data`
	}
	return `INSERT INTO gate_data (resource, data) VALUES (?1, ?2) ON CONFLICT (resource) DO UPDATE SET data = excluded.data`
}

func selectData(d gate.Dialect) string {
	if d == gate.Postgres {
		return `SELECT data FROM gate_data WHERE resource = $1`
	}
	return `SELECT data FROM gate_data WHERE resource = ?`
}

// Service is a minimal participating service: a gate and one data table written under it.
type Service struct {
	Gate *gate.Gate
	DB   *sql.DB
	// Checker, if set, checks the token of RaiseWaitsForTheCheck's first transaction and of
	// CheckWaitsForTheRaiseOf's second in place of Gate: a mutation test sets a broken check
	// there to show the schedule catches it.
	Checker Checker
	d       gate.Dialect
}

// NewService opens a database of e, migrates the gate and creates the data table.
func NewService(t testing.TB, e Engine) *Service {
	t.Helper()
	db := e.Open(t)
	g, err := gate.New(db, e.Dialect, e.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := g.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	blob := map[gate.Dialect]string{gate.Postgres: "bytea", gate.SQLite: "BLOB", gate.MySQL: "LONGBLOB"}[e.Dialect]
	key := map[gate.Dialect]string{gate.Postgres: "text", gate.SQLite: "TEXT", gate.MySQL: "VARBINARY(255)"}[e.Dialect]
	if _, err := db.ExecContext(ctx, `CREATE TABLE gate_data (resource `+key+` PRIMARY KEY, data `+blob+` NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &Service{Gate: g, DB: db, d: e.Dialect}
}

// WriteTx writes data for resource in tx, after the caller's Check.
func (s *Service) WriteTx(ctx context.Context, tx *sql.Tx, resource string, data []byte) error {
	_, err := tx.ExecContext(ctx, upsert(s.d), resource, data)
	return err
}

// Write checks token and writes data in one transaction.
func (s *Service) Write(ctx context.Context, resource string, token fenced.Token, data []byte) error {
	return s.Gate.Do(ctx, resource, token, func(tx *sql.Tx) error { return s.WriteTx(ctx, tx, resource, data) })
}

// WriteExec checks token and writes data with Gate.Exec (one statement on PostgreSQL), in a
// transaction rolled back on any error.
func (s *Service) WriteExec(ctx context.Context, resource string, token fenced.Token, data []byte) (err error) {
	tx, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback()
		}
	}()
	if err := s.Gate.Exec(ctx, tx, resource, token, upsert(s.d), resource, data); err != nil {
		return err
	}
	return tx.Commit()
}

// Read returns resource's data, nil if none.
func (s *Service) Read(ctx context.Context, resource string) ([]byte, error) {
	var b []byte
	err := s.DB.QueryRowContext(ctx, selectData(s.d), resource).Scan(&b)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	return b, err
}

// Harness adapts a service to the destination suite.
func (s *Service) Harness() destinationtest.Harness {
	return destinationtest.Harness{Fencer: s.Gate, Provision: s.Gate.Add, Write: s.Write, Read: s.Read}
}

type holder struct {
	resource string
	token    fenced.Token
}

func (h holder) Resource() string    { return h.resource }
func (h holder) Token() fenced.Token { return h.token }

// HTTPHarness serves the service (writes behind Handler at /write, fences behind FenceHandler
// at /fence) and adapts it to the suite as a remote holder sees it: destination.Remote fences,
// writes go through destination.Transport.
func (s *Service) HTTPHarness(t *testing.T) destinationtest.Harness {
	mux := http.NewServeMux()
	mux.Handle("POST /fence", s.Gate.FenceHandler())
	mux.Handle("PUT /write", s.Gate.Handler(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		resource, _, _ := gate.TokenFrom(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		return s.WriteTx(r.Context(), tx, resource, body)
	}))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return destinationtest.Harness{
		Fencer:    &destination.Remote{URL: srv.URL + "/fence"},
		Provision: s.Gate.Add,
		Write: func(ctx context.Context, resource string, token fenced.Token, data []byte) error {
			c := &http.Client{Transport: &destination.Transport{Holder: holder{resource, token}}}
			req, _ := http.NewRequestWithContext(ctx, "PUT", srv.URL+"/write", bytes.NewReader(data))
			resp, err := c.Do(req)
			if err != nil {
				return err
			}
			defer resp.Body.Close()
			var p gate.Problem
			_ = json.NewDecoder(resp.Body).Decode(&p)
			switch resp.StatusCode {
			case http.StatusNoContent:
				return nil
			case http.StatusConflict:
				return &destination.StaleError{Resource: resource, Token: token}
			case http.StatusBadRequest:
				if p.Type == gate.ProblemMalformed {
					return fmt.Errorf("write: %s: %w", p.Detail, destination.ErrMalformed)
				}
			}
			return fmt.Errorf("write: %s %+v", resp.Status, p)
		},
		Read: s.Read,
	}
}

// Run runs the destination suite and the gate's tests on e.
func Run(t *testing.T, e Engine) {
	t.Run("Suite", func(t *testing.T) {
		destinationtest.Run(t, func(t *testing.T) destinationtest.Harness { return NewService(t, e).Harness() })
	})
	t.Run("SuiteExec", func(t *testing.T) {
		destinationtest.Run(t, func(t *testing.T) destinationtest.Harness {
			s := NewService(t, e)
			h := s.Harness()
			h.Write = s.WriteExec
			return h
		})
	})
	t.Run("SuiteOverHTTP", func(t *testing.T) {
		destinationtest.Run(t, func(t *testing.T) destinationtest.Harness { return NewService(t, e).HTTPHarness(t) })
	})
	t.Run("BadInputLeavesTheMark", func(t *testing.T) { testBadInput(t, e) })
	t.Run("RollbackUndoesTheRaise", func(t *testing.T) { testRollback(t, e) })
	t.Run("PanicReleasesTheMark", func(t *testing.T) { testPanic(t, e) })
	t.Run("HTTP", func(t *testing.T) { testHTTP(t, e) })
	t.Run("ConcurrentWritersOneResource", func(t *testing.T) { testConcurrent(t, e) })
}

var res = "rapport nº 7; ü"

// Tok is a token of the suite's epoch plus e, generation g.
func Tok(e, g int64) fenced.Token { return tok(e, g) }

func tok(e, g int64) fenced.Token {
	return fenced.Token{Epoch: destinationtest.Epoch + e, Generation: g}
}

func mark(t *testing.T, s *Service, r string) fenced.Token {
	t.Helper()
	m, err := s.Gate.Mark(context.Background(), r)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func testBadInput(t *testing.T, e Engine) {
	ctx := context.Background()
	s := NewService(t, e)
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	cur := tok(1, 7)
	if err := s.Write(ctx, res, cur, []byte("kept")); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		resource string
		token    fenced.Token
		want     error
	}{
		{"negative epoch", res, fenced.Token{Epoch: -1, Generation: 9}, destination.ErrMalformed},
		{"negative generation", res, fenced.Token{Epoch: destinationtest.Epoch + 9, Generation: -1}, destination.ErrMalformed},
		{"older epoch, larger generation", res, tok(0, 99), destination.ErrStale},
		{"older generation", res, tok(1, 6), destination.ErrStale},
		{"unknown resource", "no such resource", tok(9, 9), destination.ErrUnknownResource},
	} {
		err := s.Write(ctx, c.resource, c.token, []byte("written"))
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if err := s.Gate.Fence(ctx, c.resource, c.token); !errors.Is(err, c.want) {
			t.Errorf("%s: fence: got %v, want %v", c.name, err, c.want)
		}
		if m := mark(t, s, res); m != cur {
			t.Errorf("%s: the mark moved to %s", c.name, m)
		}
	}
	if _, err := s.Gate.Mark(ctx, "no such resource"); !errors.Is(err, destination.ErrUnknownResource) {
		t.Errorf("the unknown resource got a mark: %v", err)
	}
	if b, _ := s.Read(ctx, res); string(b) != "kept" {
		t.Errorf("data = %q", b)
	}
	if err := s.Gate.Add(ctx, ""); !errors.Is(err, fenced.ErrInvalid) {
		t.Errorf("empty resource name: %v", err)
	}
	if err := s.Gate.Add(ctx, res); err != nil || mark(t, s, res) != cur {
		t.Errorf("a second Add changed the mark or failed: %v", err)
	}
}

// The raise commits with the service's write or not at all.
func testRollback(t *testing.T, e Engine) {
	ctx := context.Background()
	s := NewService(t, e)
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	if err := s.Gate.Fence(ctx, res, tok(1, 1)); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("the service's write failed")
	err := s.Gate.Do(ctx, res, tok(1, 2), func(tx *sql.Tx) error {
		if err := s.WriteTx(ctx, tx, res, []byte("lost")); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do: %v", err)
	}
	if m := mark(t, s, res); m != tok(1, 1) {
		t.Fatalf("the mark is %s after the rollback, want %s", m, tok(1, 1))
	}
	if b, _ := s.Read(ctx, res); b != nil {
		t.Fatalf("data %q survived the rollback", b)
	}
}

// A panic in Do's fn rolls the transaction back before it goes on, so that the mark's row lock
// (PostgreSQL, MySQL) or the database's write lock (SQLite) is not kept by a transaction whose
// context never ends: the successor's fence then succeeds at once.
func testPanic(t *testing.T, e Engine) {
	s := NewService(t, e)
	if err := s.Gate.Add(context.Background(), res); err != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if r := recover(); r != "the service's handler panicked" {
				t.Fatalf("recovered %v", r)
			}
		}()
		_ = s.Gate.Do(context.Background(), res, tok(1, 1), func(tx *sql.Tx) error {
			if err := s.WriteTx(context.Background(), tx, res, []byte("lost")); err != nil {
				return err
			}
			panic("the service's handler panicked")
		})
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := s.Gate.Fence(ctx, res, tok(2, 1)); err != nil {
		t.Fatalf("the successor's fence after a panic in Do: %v", err)
	}
	if b, _ := s.Read(ctx, res); b != nil {
		t.Fatalf("data %q survived the panic", b)
	}
}

// Writers of one resource run at once, released by a barrier; each accepted write's token is
// at least every token accepted before it committed, so the data is the newest accepted one's.
func testConcurrent(t *testing.T, e Engine) {
	ctx := context.Background()
	s := NewService(t, e)
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	const n = 6
	start := make(chan struct{})
	var wg sync.WaitGroup
	accepted := make([]bool, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for attempt := 0; ; attempt++ { // SQLite may answer busy; a real service retries too
				err := s.Write(ctx, res, tok(1, int64(i+1)), []byte{byte(i)})
				if err != nil && !errors.Is(err, destination.ErrStale) && attempt < 50 {
					continue
				}
				if err != nil && !errors.Is(err, destination.ErrStale) {
					t.Errorf("writer %d: %v", i, err)
				}
				accepted[i] = err == nil
				return
			}
		}()
	}
	close(start)
	wg.Wait()
	last := -1
	for i, ok := range accepted {
		if ok {
			last = i
		}
	}
	if !accepted[n-1] {
		t.Fatalf("the newest writer was refused: %v", accepted)
	}
	if b, _ := s.Read(ctx, res); len(b) != 1 || int(b[0]) != last {
		t.Fatalf("data %v, want the newest accepted writer %d", b, last)
	}
	if m := mark(t, s, res); m != tok(1, n) {
		t.Fatalf("mark %s", m)
	}
}

func testHTTP(t *testing.T, e Engine) {
	ctx := context.Background()
	s := NewService(t, e)
	if err := s.Gate.Add(ctx, res); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Gate.Handler(func(w http.ResponseWriter, r *http.Request, tx *sql.Tx) error {
		resource, _, _ := gate.TokenFrom(r.Context())
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return err
		}
		if string(body) == "fail" {
			w.WriteHeader(http.StatusTeapot)
			return errors.New("refused by the service")
		}
		if err := s.WriteTx(r.Context(), tx, resource, body); err != nil {
			return err
		}
		w.WriteHeader(http.StatusCreated)
		return nil
	}))
	defer srv.Close()
	send := func(header []string, body string) (int, gate.Problem) {
		t.Helper()
		req, _ := http.NewRequest("PUT", srv.URL, strings.NewReader(body))
		for _, h := range header {
			req.Header.Add(destination.Header, h)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var p gate.Problem
		if resp.StatusCode >= 400 && resp.StatusCode != http.StatusTeapot {
			if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("content type %q", ct)
			}
			if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
				t.Fatal(err)
			}
			if p.Status != resp.StatusCode || p.Type == "" || p.Detail == "" {
				t.Errorf("incomplete problem %+v", p)
			}
		}
		return resp.StatusCode, p
	}
	cur := tok(1, 3)
	h := func(t fenced.Token) string { return destination.FormatHeader(res, t) }
	escaped, _, _ := strings.Cut(h(cur), ";")
	if code, _ := send([]string{h(cur)}, "v1\x00"); code != http.StatusCreated {
		t.Fatalf("accepted write: %d", code)
	}
	for _, c := range []struct {
		name   string
		header []string
		code   int
	}{
		{"missing", nil, 400},
		{"malformed", []string{"rapport; 3"}, 400},
		{"negative", []string{escaped + "; -1.4"}, 400},
		{"huge", []string{escaped + "; 1.99999999999999999999"}, 400},
		{"unescaped space", []string{"rapport nº 7; 1.1"}, 400},
		{"two headers", []string{h(cur), h(cur)}, 400},
		{"unknown resource", []string{destination.FormatHeader("nobody", tok(5, 5))}, 422},
		{"older epoch", []string{h(tok(0, 900))}, 409},
		{"older generation", []string{h(tok(1, 2))}, 409},
	} {
		code, p := send(c.header, "bad")
		if code != c.code {
			t.Errorf("%s: status %d, want %d", c.name, code, c.code)
		}
		if c.code == 409 && (p.Resource != res || p.Current != cur.String() || p.Type != gate.ProblemStale) {
			t.Errorf("%s: problem %+v does not name the resource and the mark %s", c.name, p, cur)
		}
		if m := mark(t, s, res); m != cur {
			t.Errorf("%s: the mark moved to %s", c.name, m)
		}
	}
	if code, _ := send([]string{h(tok(1, 4))}, "fail"); code != http.StatusTeapot {
		t.Errorf("a handler's own error status: %d", code)
	}
	if m := mark(t, s, res); m != cur {
		t.Errorf("a failed handler raised the mark to %s", m)
	}
	if b, _ := s.Read(ctx, res); string(b) != "v1\x00" {
		t.Errorf("data %q", b)
	}
}

// CheckWaitsForTheRaise forces the schedule behind Check's promise that a check waiting for an
// uncommitted raise is decided on the raised mark (CheckWaitsForTheRaiseOf), from three
// starts: from the mark 0.0 a token older than the raise must be refused and the raised token
// itself accepted (the check reads the raised row, not its snapshot); and from a committed mark
// of 1.5, the superseded holder's own token 1.5, which the committed mark alone would accept,
// must be refused once the raise to 1.6 commits. For engines with row locks (PostgreSQL,
// MySQL).
func CheckWaitsForTheRaise(t *testing.T, e Engine, interval time.Duration, waiting func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool) {
	for _, c := range []struct {
		name    string
		from, a fenced.Token
		want    error
	}{
		{"older", fenced.Token{}, tok(1, 5), destination.ErrStale},
		{"equal", fenced.Token{}, tok(1, 6), nil},
		{"superseded equal to the committed mark", tok(1, 5), tok(1, 5), destination.ErrStale},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := CheckWaitsForTheRaiseOf(context.Background(), NewService(t, e), c.from, c.a, c.want, interval, waiting); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// CheckWaitsForTheRaiseOf runs one schedule on s: the mark is fenced to from (if not zero);
// tx1 raises it to 1.6 and holds its transaction open; tx2 checks a and waits on the row
// lock, which waiting (given tx2, to find its session) reports from the server, polled every
// interval; tx1 commits; tx2's check must then end in want (nil: accepted) and the mark be
// 1.6. tx2's check is s.Checker's if set, so that a mutation test can show the schedule
// catches a broken check. It returns what went wrong.
func CheckWaitsForTheRaiseOf(ctx context.Context, s *Service, from, a fenced.Token, want error, interval time.Duration, waiting func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool) error {
	if err := s.Gate.Add(ctx, res); err != nil {
		return err
	}
	if from != (fenced.Token{}) {
		if err := s.Gate.Fence(ctx, res, from); err != nil {
			return err
		}
	}
	b := tok(1, 6)
	tx1, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx1.Rollback() }()
	if err := s.Gate.Check(ctx, tx1, res, b); err != nil {
		return fmt.Errorf("tx1's raise to %s: %w", b, err)
	}
	tx2, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx2.Rollback() }()
	var check Checker = s.Gate
	if s.Checker != nil {
		check = s.Checker
	}
	isWaiting := waiting(ctx, s.DB, tx2)
	done := make(chan error, 1)
	go func() { done <- check.Check(ctx, tx2, res, a) }()
	for deadline := time.Now().Add(time.Minute); !isWaiting(); time.Sleep(interval) {
		select {
		case err := <-done:
			return fmt.Errorf("tx2's check of %s (mark %s) finished while tx1 held the row raised to %s: %v", a, from, b, err)
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for tx2 to wait on the row lock")
		}
	}
	if err := tx1.Commit(); err != nil {
		return err
	}
	if err := <-done; !errors.Is(err, want) || (want == nil && err != nil) {
		return fmt.Errorf("tx2's check of %s after tx1 committed %s: %v, want %v", a, b, err, want)
	}
	if err := tx2.Rollback(); err != nil {
		return err
	}
	if m, err := s.Gate.Mark(ctx, res); err != nil || m != b {
		return fmt.Errorf("mark %s (%v), want %s", m, err, b)
	}
	return nil
}

// RaiseWaitsForTheCheck forces the schedule behind Check's promise that the mark is not raised
// while a transaction that checked a token equal to it is open, although that check wrote
// nothing: the holder of b has fenced and its write tx1 has checked b and is still writing;
// tx2, the next holder's fence, raises the mark to c and must wait (waiting reports tx2's
// session waiting on the row, polled every interval) until tx1 commits. Were it not to wait, the next holder would
// be told it was fenced while a write under b was still to commit. When shared, a second check
// of b in tx3 meanwhile must not wait for tx1 (PostgreSQL's share lock). It returns what
// went wrong, so that a mutation test can expect it; for engines with row locks.
func RaiseWaitsForTheCheck(ctx context.Context, s *Service, shared bool, interval time.Duration, waiting func(ctx context.Context, db *sql.DB, tx2 *sql.Tx) func() bool) error {
	if err := s.Gate.Add(ctx, res); err != nil {
		return err
	}
	b, c := tok(1, 6), tok(2, 1)
	if err := s.Gate.Fence(ctx, res, b); err != nil {
		return err
	}
	tx1, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx1.Rollback() }()
	var check Checker = s.Gate
	if s.Checker != nil {
		check = s.Checker
	}
	if err := check.Check(ctx, tx1, res, b); err != nil {
		return fmt.Errorf("tx1's check of the mark's own token: %w", err)
	}
	if shared {
		if err := s.Write(ctx, res, b, []byte("tx3 \x00")); err != nil {
			return fmt.Errorf("tx3, a second write under %s while tx1 is open: %w", b, err)
		}
	}
	tx2, err := s.DB.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx2.Rollback() }()
	isWaiting := waiting(ctx, s.DB, tx2)
	done := make(chan error, 1)
	go func() {
		err := s.Gate.Check(ctx, tx2, res, c)
		if err == nil {
			err = tx2.Commit()
		}
		done <- err
	}()
	for deadline := time.Now().Add(time.Minute); !isWaiting(); time.Sleep(interval) {
		select {
		case err := <-done:
			_ = tx1.Rollback()
			return fmt.Errorf("the raise to %s finished (%v) while tx1, which checked %s, was open", c, err, b)
		default:
		}
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for the raise to wait on the row lock")
		}
	}
	if err := s.WriteTx(ctx, tx1, res, []byte("tx1 \x00")); err != nil {
		return err
	}
	if err := tx1.Commit(); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return fmt.Errorf("the raise after tx1 committed: %w", err)
	}
	if m, err := s.Gate.Mark(ctx, res); err != nil || m != c {
		return fmt.Errorf("mark %s (%v), want %s", m, err, c)
	}
	if err := s.Write(ctx, res, b, []byte("late")); !errors.Is(err, destination.ErrStale) {
		return fmt.Errorf("a write under %s after the raise: %v, want stale", b, err)
	}
	return nil
}

// Bench measures a service's write transaction (BEGIN, upsert, COMMIT) with the gate's check
// inside (impl=gate) beside the same transaction without it (impl=raw), on one database in the
// same run. Compare with benchstat -col /impl.
func Bench(b *testing.B, e Engine) { BenchAgainst(b, e, nil) }

// Checker is what the benchmark runs of a gate: *gate.Gate, or the check of a former version.
type Checker interface {
	Check(ctx context.Context, tx *sql.Tx, resource string, token fenced.Token) error
	Exec(ctx context.Context, tx *sql.Tx, resource string, token fenced.Token, write string, args ...any) error
}

// txns are the service's write transactions that the benchmarks and Counts run on one service:
// raw (BEGIN, upsert, COMMIT), and the same with a Checker's Check before the upsert or its
// Exec in place of it. Every write changes the data: an upsert of identical bytes is skipped
// by MySQL and would make the baseline a transaction that writes nothing.
type txns struct {
	s     *Service
	token fenced.Token
	data  []byte
	n     uint64
}

func newTxns(tb testing.TB, s *Service) *txns {
	if err := s.Gate.Add(context.Background(), res); err != nil {
		tb.Fatal(err)
	}
	return &txns{s: s, token: tok(1, 2), data: []byte(strings.Repeat("report\x00", 8))}
}

func (x *txns) next() []byte {
	x.n++
	binary.BigEndian.PutUint64(x.data, x.n)
	return x.data
}

// run runs one transaction: BEGIN, body, COMMIT.
func (x *txns) run(tb testing.TB, body func(ctx context.Context, tx *sql.Tx) error) {
	ctx := context.Background()
	tx, err := x.s.DB.BeginTx(ctx, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if err := body(ctx, tx); err != nil {
		_ = tx.Rollback()
		tb.Fatal(err)
	}
	if err := tx.Commit(); err != nil {
		tb.Fatal(err)
	}
}

func (x *txns) raw(tb testing.TB) {
	x.run(tb, func(ctx context.Context, tx *sql.Tx) error { return x.s.WriteTx(ctx, tx, res, x.next()) })
}

func (x *txns) checkedBy(g Checker) func(testing.TB) {
	return func(tb testing.TB) {
		x.run(tb, func(ctx context.Context, tx *sql.Tx) error {
			if err := g.Check(ctx, tx, res, x.token); err != nil {
				return err
			}
			return x.s.WriteTx(ctx, tx, res, x.next())
		})
	}
}

// execBy: on PostgreSQL the check and the write in one statement.
func (x *txns) execBy(g Checker) func(testing.TB) {
	return func(tb testing.TB) {
		x.run(tb, func(ctx context.Context, tx *sql.Tx) error {
			return g.Exec(ctx, tx, res, x.token, upsert(x.s.d), res, x.next())
		})
	}
}

// BenchAgainst is Bench, and when earlier is not nil also "earlier": the same rounds with the
// check of a former version that earlier returns for the service (gate.Legacy in the gate's
// tests), so that the two are compared in one process on one database.
func BenchAgainst(b *testing.B, e Engine, earlier func(context.Context, *Service) (Checker, error)) {
	s := NewService(b, e)
	x := newTxns(b, s)
	raw := x.raw
	gated, execd := x.checkedBy(s.Gate), x.execBy(s.Gate)
	b.Run("impl=raw", func(b *testing.B) {
		for b.Loop() {
			raw(b)
		}
	})
	b.Run("impl=gate", func(b *testing.B) {
		for b.Loop() {
			gated(b)
		}
	})
	b.Run("impl=exec", func(b *testing.B) {
		for b.Loop() {
			execd(b)
		}
	})
	// Interleaved runs the three in alternation, so that the load of a shared machine falls on
	// all alike, and reports each one's mean, the ratios of the means to the raw transaction,
	// and the medians of the per-round ratios (a round is one of each, in an order that changes),
	// which a burst of load on a shared machine moves less.
	b.Run("interleaved", func(b *testing.B) {
		var tRaw, tGate, tExec time.Duration
		var rGate, rExec []float64
		for round := 0; b.Loop(); round++ {
			d := rotated(b, round, raw, gated, execd)
			tRaw, tGate, tExec = tRaw+d[0], tGate+d[1], tExec+d[2]
			rGate = append(rGate, float64(d[1])/float64(d[0]))
			rExec = append(rExec, float64(d[2])/float64(d[0]))
		}
		b.ReportMetric(benchstat.Median(rGate), "gate/raw-median")
		b.ReportMetric(benchstat.Median(rExec), "exec/raw-median")
		b.ReportMetric(float64(tRaw.Nanoseconds())/float64(b.N), "raw-ns/tx")
		b.ReportMetric(float64(tGate.Nanoseconds())/float64(b.N), "gate-ns/tx")
		b.ReportMetric(float64(tExec.Nanoseconds())/float64(b.N), "exec-ns/tx")
		b.ReportMetric(float64(tGate)/float64(tRaw), "gate/raw")
		b.ReportMetric(float64(tExec)/float64(tRaw), "exec/raw")
	})
	if earlier != nil {
		beside(b, x, "earlier", "old", earlier)
	}
}

// BenchFloor runs the service's transactions with the gate beside the same transactions with
// floor's Checker, a statement that touches one row of another table without any condition:
// what any second row costs the transaction, whatever decides on it. Its sub-benchmark
// "floor" reports gate/floor-gate-median and exec/floor-exec-median.
func BenchFloor(b *testing.B, e Engine, floor func(context.Context, *Service) (Checker, error)) {
	BenchBeside(b, e, "floor", floor)
}

// BenchBeside runs the service's transactions with the gate beside the same transactions with
// other's Checker, in a sub-benchmark called name that reports gate/name-gate-median and
// exec/name-exec-median: a candidate for a cheaper check, measured in the same rounds.
func BenchBeside(b *testing.B, e Engine, name string, other func(context.Context, *Service) (Checker, error)) {
	s := NewService(b, e)
	beside(b, newTxns(b, s), name, name, other)
}

// beside runs, in each round, the raw transaction, the gate's Check and Exec transactions and
// those of other's Checker, and reports the medians of the per-round ratios.
func beside(b *testing.B, x *txns, name, short string, other func(context.Context, *Service) (Checker, error)) {
	old, err := other(context.Background(), x.s)
	if err != nil {
		b.Fatal(err)
	}
	b.Run(name, func(b *testing.B) {
		fns := []func(testing.TB){x.raw, x.checkedBy(x.s.Gate), x.checkedBy(old), x.execBy(x.s.Gate), x.execBy(old)}
		names := []string{"raw", "gate", short + "-gate", "exec", short + "-exec"}
		rounds := make([][]float64, len(fns))
		for round := 0; b.Loop(); round++ {
			d := rotated(b, round, fns...)
			for k := range fns {
				rounds[k] = append(rounds[k], float64(d[k]))
			}
		}
		ratio := func(x, y int) float64 {
			r := make([]float64, len(rounds[x]))
			for k := range r {
				r[k] = rounds[x][k] / rounds[y][k]
			}
			return benchstat.Median(r)
		}
		for k := 1; k < len(fns); k++ {
			b.ReportMetric(ratio(k, 0), names[k]+"/raw-median")
		}
		b.ReportMetric(ratio(1, 2), "gate/"+names[2]+"-median")
		b.ReportMetric(ratio(3, 4), "exec/"+names[4]+"-median")
	})
}

// rotated runs fns once each, in the order Order(round, len(fns)), and returns each one's
// time. The order changes from round to round so that each transaction runs as often in each
// place of a round: in a fixed order, the same Check measured in the second and in the third
// place differed by 3-15 % on a loaded machine. It also changes which transaction runs just
// before each one: with a rotation (session 8), the gate's Check always followed the raw
// transaction and a candidate always followed the gate, and a candidate that only moved
// behind the gate changed its ratio to the gate by about 3 % (docs/BENCHMARKS.md, session 9).
func rotated(b *testing.B, round int, fns ...func(testing.TB)) []time.Duration {
	d := make([]time.Duration, len(fns))
	for _, k := range Order(round, len(fns)) {
		t0 := time.Now()
		fns[k](b)
		d[k] = time.Since(t0)
	}
	return d
}

// Order is the order of the round-th round of n transactions: the permutations of 0..n-1 in
// lexicographic order, one per round, over and over. Over n! consecutive rounds each
// transaction runs equally often in each place and right after each other one (and first,
// after the previous round's last).
func Order(round, n int) []int {
	left := make([]int, n)
	for i := range left {
		left[i] = i
	}
	f := 1 // (n-1)!, then the factorials below it
	for i := 2; i < n; i++ {
		f *= i
	}
	idx := round
	if n > 0 {
		idx %= f * n
	}
	order := make([]int, 0, n)
	for i := n - 1; i >= 0; i-- {
		k := idx / f
		idx %= f
		order = append(order, left[k])
		left = append(left[:k], left[k+1:]...)
		if i > 0 {
			f /= i
		}
	}
	return order
}

// Wire counts what a client sends its database: each request (a statement, a BEGIN, a COMMIT,
// a batch) is one write of the connection, answered before the next, so Writes counts round
// trips. Conn wraps a connection that a test's dialer returns.
type Wire struct{ writes, bytes, reads atomic.Int64 }

func (w *Wire) Conn(c net.Conn) net.Conn { return wireConn{c, w} }

// Writes is the number of requests sent so far.
func (w *Wire) Writes() int64 { return w.writes.Load() }

type wireConn struct {
	net.Conn
	w *Wire
}

// Read counts the reads that returned data: a reply that arrives in pieces (the results of a
// batch written one by one) takes more than one.
func (c wireConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.w.reads.Add(1)
	}
	return n, err
}

func (c wireConn) Write(p []byte) (int, error) {
	c.w.writes.Add(1)
	c.w.bytes.Add(int64(len(p)))
	return c.Conn.Write(p)
}

// Counts runs each of the service's transactions n times on s, whose pool must hold one
// connection (so that status reads the session that ran them), and returns per transaction
// the round trips and bytes sent (wire) and the deltas of the counters status reads, less the
// deltas of reading status alone. Variants: raw, gate (Check), exec, and the same with the
// Checker that each of others returns for s.
//
// The times (elapsed, this process's CPU, and the server's CPU for the connection that
// serverCPU reads, if not nil) are taken in n further rounds that run every transaction once
// each, in the order Order gives, so that the load of a shared machine falls on all alike.
func Counts(t testing.TB, s *Service, wire *Wire, n int, status func(context.Context) (map[string]int64, error), serverCPU func() time.Duration, others map[string]func(context.Context, *Service) (Checker, error)) []CountRow {
	x := newTxns(t, s)
	ctx := context.Background()
	type variant struct {
		name string
		fn   func(testing.TB)
	}
	vs := []variant{{"raw", x.raw}, {"gate", x.checkedBy(s.Gate)}, {"exec", x.execBy(s.Gate)}}
	for _, name := range slices.Sorted(maps.Keys(others)) {
		c, err := others[name](ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		vs = append(vs, variant{name + "-gate", x.checkedBy(c)}, variant{name + "-exec", x.execBy(c)})
	}
	measure := func(fn func(testing.TB), n int) (CountRow, error) {
		fn(t) // once first, so that statements are prepared and plans cached
		before, err := status(ctx)
		if err != nil {
			return CountRow{}, err
		}
		w0, b0, r0 := wire.writes.Load(), wire.bytes.Load(), wire.reads.Load()
		for range n {
			fn(t)
		}
		w1, b1, r1 := wire.writes.Load(), wire.bytes.Load(), wire.reads.Load()
		after, err := status(ctx)
		if err != nil {
			return CountRow{}, err
		}
		r := CountRow{RoundTrips: float64(w1-w0) / float64(n), Bytes: float64(b1-b0) / float64(n), Reads: float64(r1-r0) / float64(n),
			Status: map[string]float64{}}
		for k, v := range after {
			r.Status[k] = float64(v-before[k]) / float64(n)
		}
		return r, nil
	}
	// What reading status costs by itself, taken off every row.
	zero, err := measure(func(testing.TB) {}, 1)
	if err != nil {
		t.Fatal(err)
	}
	var rows []CountRow
	for _, v := range vs {
		r, err := measure(v.fn, n)
		if err != nil {
			t.Fatal(err)
		}
		r.Name = v.name
		r.RoundTrips -= zero.RoundTrips / float64(n)
		for k := range r.Status {
			r.Status[k] -= zero.Status[k] / float64(n)
		}
		rows = append(rows, r)
	}
	if serverCPU == nil {
		serverCPU = func() time.Duration { return 0 }
	}
	for round := range n {
		for _, k := range Order(round, len(vs)) {
			c0, s0, t0 := selfCPU(), serverCPU(), time.Now()
			vs[k].fn(t)
			elapsed, server, client := time.Since(t0), serverCPU()-s0, selfCPU()-c0
			rows[k].Micros += float64(elapsed.Nanoseconds()) / 1e3 / float64(n)
			rows[k].ServerCPU += float64(server.Nanoseconds()) / 1e3 / float64(n)
			rows[k].ClientCPU += float64(client.Nanoseconds()) / 1e3 / float64(n)
		}
	}
	return rows
}

// CountRow is one transaction's counts (per transaction, averaged over Counts' n).
type CountRow struct {
	Name       string
	RoundTrips float64 // requests the client sent
	Bytes      float64 // bytes the client sent
	Reads      float64 // reads of the replies that returned data
	Micros     float64 // elapsed µs, indicative only on a loaded machine
	ClientCPU  float64 // µs of this process's CPU (user and system)
	ServerCPU  float64 // µs of CPU of the server's process or thread for the connection
	Status     map[string]float64
}

func (r CountRow) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-17s round trips %4.2f  bytes sent %4.0f  reads %4.2f  µs %5.0f  CPU µs client %4.0f server %4.0f",
		r.Name, r.RoundTrips, r.Bytes, r.Reads, r.Micros, r.ClientCPU, r.ServerCPU)
	for _, k := range slices.Sorted(maps.Keys(r.Status)) {
		if v := r.Status[k]; v > 0.005 || v < -0.005 {
			fmt.Fprintf(&b, "  %s %.2f", k, v)
		}
	}
	return b.String()
}
