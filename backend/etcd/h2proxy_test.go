package etcd

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// txnProxy is a TCP proxy between a gRPC client and one etcd member that, once armed, loses the
// reply to the next conditional Txn after etcd has committed it: the proxy reads the HTTP/2
// frames in both directions, recognises the next call to /etcdserverpb.KV/Txn whose request
// carries compares (every mutation of the driver; its reads are Txns without compares), and
// when the server starts answering that call (the response's HEADERS frame, which grpc-go
// sends only after the handler returned, and etcd's handler returns after the Txn was applied)
// it discards the frame and closes both sides.
//
// Why not drivertest.Proxy: it discards whatever bytes the server sends next. grpc-go's server
// answers a request's DATA frame with a BDP-estimation PING (and sometimes a WINDOW_UPDATE)
// before the reply, so those would be the lost bytes, and the connection would close while etcd
// may not have proposed the Txn yet: the test would not know whether the mutation happened.
// Control frames and replies to other calls pass here, so the loss is always after the commit.
//
// It is safe for concurrent use.
type txnProxy struct {
	ln       net.Listener
	upstream string

	mu      sync.Mutex
	armed   bool
	target  net.Conn // the server connection and stream whose reply is lost
	stream  uint32
	dropped chan struct{}
	conns   map[net.Conn]struct{}
	wg      sync.WaitGroup
}

const (
	frameData         = 0x0
	frameHeaders      = 0x1
	frameContinuation = 0x9

	flagEndHeaders = 0x4
	flagPadded     = 0x8
	flagPriority   = 0x20
)

const clientPreface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

func startTxnProxy(t testing.TB, upstream string) *txnProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &txnProxy{ln: ln, upstream: upstream, conns: map[net.Conn]struct{}{}, dropped: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

func (p *txnProxy) addr() string { return p.ln.Addr().String() }

// arm makes the next conditional Txn lose its reply.
func (p *txnProxy) arm() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed, p.target, p.dropped = true, nil, make(chan struct{})
}

func (p *txnProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *txnProxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", p.upstream, 5*time.Second)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			defer server.Close()
			_ = p.requests(client, server)
		}()
		go func() {
			defer p.wg.Done()
			defer client.Close()
			defer server.Close()
			_ = p.replies(server, client)
		}()
	}
}

// readFrame reads one HTTP/2 frame and returns it raw, with its header fields.
func readFrame(r io.Reader) (raw []byte, typ, flags byte, stream uint32, err error) {
	var h [9]byte
	if _, err = io.ReadFull(r, h[:]); err != nil {
		return nil, 0, 0, 0, err
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	raw = make([]byte, 9+n)
	copy(raw, h[:])
	if _, err = io.ReadFull(r, raw[9:]); err != nil {
		return nil, 0, 0, 0, err
	}
	return raw, h[3], h[4], binary.BigEndian.Uint32(h[5:9]) & 0x7fffffff, nil
}

// unpad strips a HEADERS or DATA frame's padding and priority fields.
func unpad(payload []byte, typ, flags byte) ([]byte, error) {
	if typ == frameContinuation {
		return payload, nil
	}
	if flags&flagPadded != 0 {
		if len(payload) < 1 || int(payload[0]) > len(payload)-1 {
			return nil, errors.New("bad padding")
		}
		payload = payload[1 : len(payload)-int(payload[0])]
	}
	if typ == frameHeaders && flags&flagPriority != 0 {
		if len(payload) < 5 {
			return nil, errors.New("bad priority")
		}
		payload = payload[5:]
	}
	return payload, nil
}

// requests copies the client's frames to the server, decoding just enough to find the armed
// call: the :path of each stream's headers and the first gRPC message of each Txn stream. The
// target is set before the frame that completes the request is forwarded, so it is always set
// before the server can answer.
func (p *txnProxy) requests(client, server net.Conn) error {
	preface := make([]byte, len(clientPreface))
	if _, err := io.ReadFull(client, preface); err != nil {
		return err
	}
	if _, err := server.Write(preface); err != nil {
		return err
	}
	var path string
	paths := map[uint32]string{}
	bodies := map[uint32][]byte{}
	dec := hpack.NewDecoder(4096, func(f hpack.HeaderField) {
		if f.Name == ":path" {
			path = f.Value
		}
	})
	dec.SetAllowedMaxDynamicTableSize(1 << 20)
	for {
		raw, typ, flags, stream, err := readFrame(client)
		if err != nil {
			return err
		}
		switch typ {
		case frameHeaders, frameContinuation:
			frag, err := unpad(raw[9:], typ, flags)
			if err != nil {
				return err
			}
			if _, err := dec.Write(frag); err != nil {
				return err
			}
			if flags&flagEndHeaders != 0 {
				if err := dec.Close(); err != nil {
					return err
				}
				if path != "" {
					paths[stream], path = path, ""
				}
			}
		case frameData:
			if paths[stream] == "/etcdserverpb.KV/Txn" {
				data, err := unpad(raw[9:], typ, flags)
				if err != nil {
					return err
				}
				bodies[stream] = append(bodies[stream], data...)
				if b := bodies[stream]; len(b) >= 5 && len(b) >= 5+int(binary.BigEndian.Uint32(b[1:5])) {
					p.sawTxn(server, stream, b)
					delete(paths, stream)
					delete(bodies, stream)
				}
			}
		}
		if _, err := server.Write(raw); err != nil {
			return err
		}
	}
}

// sawTxn targets this call if the proxy is armed and the request carries compares.
func (p *txnProxy) sawTxn(server net.Conn, stream uint32, msg []byte) {
	var req pb.TxnRequest
	if msg[0] != 0 || proto.Unmarshal(msg[5:5+binary.BigEndian.Uint32(msg[1:5])], &req) != nil || len(req.Compare) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.armed {
		p.armed, p.target, p.stream = false, server, stream
	}
}

// replies copies the server's frames to the client, until the targeted call's reply starts.
func (p *txnProxy) replies(server, client net.Conn) error {
	for {
		raw, typ, _, stream, err := readFrame(server)
		if err != nil {
			return err
		}
		if typ == frameHeaders && p.takeTarget(server, stream) {
			return nil // the callers close both connections: the reply is gone
		}
		if _, err := client.Write(raw); err != nil {
			return err
		}
	}
}

func (p *txnProxy) takeTarget(server net.Conn, stream uint32) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.target == nil || p.target != server || p.stream != stream {
		return false
	}
	p.target = nil
	close(p.dropped)
	return true
}

// TestTxnProxyPassesReads: an armed proxy lets reads (Txns without compares) through.
func TestTxnProxyPassesReads(t *testing.T) {
	t.Parallel()
	p := startTxnProxy(t, cluster.endpoints()[0])
	d := New(newClientWith(t, []string{p.addr()}), &Options{Prefix: newPrefix()})
	ctx := testCtx(t)
	if err := d.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	p.arm()
	if _, err := d.ReadOperation(ctx, "x"); err != nil {
		t.Fatalf("a read through an armed proxy: %v", err)
	}
	if _, err := d.ResolveOperation(ctx, "x"); err == nil {
		t.Fatal("the armed proxy let a conditional Txn's reply through")
	}
	<-p.dropped
	if op, err := d.ReadOperation(ctx, "x"); err != nil || op.Outcome != "aborted" {
		t.Fatalf("after the lost reply: %+v, %v", op, err)
	}
}
