package hostile

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"
)

// h2conn is a raw HTTP/2 client connection speaking gRPC's framing, for
// what a well-behaved gRPC client never does: send part of a message and
// stall, announce a message larger than it sends, open streams and send
// nothing, never read what the server sends. It obeys flow control (a
// server would otherwise end the connection at once, which is no attack).
type h2conn struct {
	conn net.Conn
	fr   *http2.Framer
	wmu  sync.Mutex // the framer's writes and the hpack encoder
	henc *hpack.Encoder
	hbuf bytes.Buffer
	// readWindow: when false, the connection never returns the server's
	// DATA to its flow-control windows (a reader that stopped reading).
	readWindow bool

	mu       sync.Mutex
	gone     chan struct{} // closed once the connection is gone (err set)
	nextID   uint32
	connSend int64 // the server's connection window for our DATA
	initSend int64 // its initial stream window (SETTINGS)
	streams  map[uint32]*h2stream
	err      error // set once the connection is gone
	recvData int64 // DATA bytes received from the server
}

// h2stream is one stream's state as the client sees it. Each stream
// waits on channels of its own: with a thousand streams on a connection,
// one condition broadcast per frame would wake them all.
type h2stream struct {
	send   int64         // the server's window for our DATA on this stream
	status string        // grpc-status of the trailers, when they came
	msg    string        // grpc-message
	reset  bool          // RST_STREAM received
	ended  bool          // the server ended the stream (trailers or reset)
	done   chan struct{} // closed when ended
	window chan struct{} // a window grew (buffered, 1)
}

func newStream(send int64) *h2stream {
	return &h2stream{send: send, done: make(chan struct{}), window: make(chan struct{}, 1)}
}

// end marks s ended; called with the connection's mu held.
func (s *h2stream) end() {
	if !s.ended {
		s.ended = true
		close(s.done)
	}
}

// grew tells s's sender that a window grew.
func (s *h2stream) grew() {
	select {
	case s.window <- struct{}{}:
	default:
	}
}

// dialH2 connects to addr with cfg (TLS; ALPN h2 is added), sends the
// preface and settings: window is the initial stream window the client
// gives the server for its responses.
func dialH2(ctx context.Context, addr string, cfg *tls.Config, window uint32, readWindow bool) (*h2conn, error) {
	cfg = cfg.Clone()
	cfg.NextProtos = []string{"h2"}
	d := tls.Dialer{Config: cfg}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c := &h2conn{conn: nc, fr: http2.NewFramer(nc, nc), nextID: 1, connSend: 65535, initSend: 65535,
		streams: map[uint32]*h2stream{}, readWindow: readWindow, gone: make(chan struct{})}
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.MaxHeaderListSize = 1 << 20
	if _, err := io.WriteString(nc, http2.ClientPreface); err != nil {
		nc.Close()
		return nil, err
	}
	if err := c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: window}); err != nil {
		nc.Close()
		return nil, err
	}
	go c.readLoop()
	return c, nil
}

func (c *h2conn) fail(err error) {
	c.mu.Lock()
	if c.err == nil {
		c.err = err
		close(c.gone)
	}
	c.mu.Unlock()
}

// readLoop answers settings and pings, tracks the server's windows and the
// streams' ends, and (with readWindow) returns what it reads to the
// server's windows.
func (c *h2conn) readLoop() {
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			c.fail(err)
			c.conn.Close()
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if f.IsAck() {
				continue
			}
			c.mu.Lock()
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok {
				delta := int64(v) - c.initSend
				c.initSend = int64(v)
				for _, s := range c.streams {
					s.send += delta
					s.grew()
				}
			}
			c.mu.Unlock()
			c.write(func() error { return c.fr.WriteSettingsAck() })
		case *http2.PingFrame:
			if !f.IsAck() {
				c.write(func() error { return c.fr.WritePing(true, f.Data) })
			}
		case *http2.WindowUpdateFrame:
			c.mu.Lock()
			if f.StreamID == 0 {
				c.connSend += int64(f.Increment)
				for _, s := range c.streams {
					if s.send > 0 {
						s.grew()
					}
				}
			} else if s := c.streams[f.StreamID]; s != nil {
				s.send += int64(f.Increment)
				s.grew()
			}
			c.mu.Unlock()
		case *http2.RSTStreamFrame:
			c.mu.Lock()
			if s := c.streams[f.StreamID]; s != nil {
				s.reset = true
				if s.status == "" {
					s.msg = f.ErrCode.String()
				}
				s.end()
			}
			c.mu.Unlock()
		case *http2.MetaHeadersFrame:
			c.mu.Lock()
			if s := c.streams[f.StreamID]; s != nil {
				for _, hf := range f.Fields {
					switch hf.Name {
					case "grpc-status":
						s.status = hf.Value
					case "grpc-message":
						s.msg = hf.Value
					}
				}
				if f.StreamEnded() {
					s.end()
				}
			}
			c.mu.Unlock()
		case *http2.DataFrame:
			n := len(f.Data())
			c.mu.Lock()
			c.recvData += int64(n)
			if s := c.streams[f.StreamID]; s != nil && f.StreamEnded() {
				s.end()
			}
			c.mu.Unlock()
			if c.readWindow && n > 0 {
				id := f.StreamID
				c.write(func() error {
					if err := c.fr.WriteWindowUpdate(0, uint32(n)); err != nil {
						return err
					}
					return c.fr.WriteWindowUpdate(id, uint32(n))
				})
			}
		case *http2.GoAwayFrame:
			c.fail(fmt.Errorf("GOAWAY %v", f.ErrCode))
		}
	}
}

func (c *h2conn) write(fn func() error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := fn(); err != nil {
		c.fail(err)
	}
}

// open starts a gRPC call of method (HEADERS without END_STREAM) and
// returns its stream id.
func (c *h2conn) open(method string) (uint32, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return 0, c.err
	}
	id := c.nextID
	c.nextID += 2
	c.streams[id] = newStream(c.initSend)
	c.mu.Unlock()
	c.hbuf.Reset()
	for _, hf := range [][2]string{{":method", "POST"}, {":scheme", "https"}, {":path", method}, {":authority", "walship"},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		if err := c.henc.WriteField(hpack.HeaderField{Name: hf[0], Value: hf[1]}); err != nil {
			return 0, err
		}
	}
	err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	if err != nil {
		c.fail(err)
	}
	return id, err
}

// send writes b as DATA on stream id, waiting for flow control, and ends
// the stream after it if end. It gives up when ctx ends, the stream ends or
// the connection fails.
func (c *h2conn) send(ctx context.Context, id uint32, b []byte, end bool) error {
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s == nil {
		return fmt.Errorf("stream %d forgotten", id)
	}
	for len(b) > 0 || end {
		c.mu.Lock()
		for c.err == nil && !s.ended && len(b) > 0 && (c.connSend <= 0 || s.send <= 0) {
			c.mu.Unlock()
			select {
			case <-s.window:
			case <-s.done:
			case <-c.gone:
			case <-ctx.Done():
				return ctx.Err()
			}
			c.mu.Lock()
		}
		switch {
		case c.err != nil:
			c.mu.Unlock()
			return c.err
		case s.ended:
			c.mu.Unlock()
			return fmt.Errorf("stream %d ended: %s %s", id, s.status, s.msg)
		}
		n := int64(min(len(b), 16384))
		n = min(n, c.connSend, s.send)
		c.connSend -= n
		s.send -= n
		c.mu.Unlock()
		chunk := b[:n]
		b = b[n:]
		last := end && len(b) == 0
		var err error
		c.write(func() error { err = c.fr.WriteData(id, last, chunk); return err })
		if err != nil {
			return err
		}
		if last {
			return nil
		}
	}
	return nil
}

// wait waits until stream id ends and returns its grpc-status and message.
func (c *h2conn) wait(ctx context.Context, id uint32) (string, string, error) {
	c.mu.Lock()
	s := c.streams[id]
	c.mu.Unlock()
	if s == nil {
		return "", "", fmt.Errorf("stream %d forgotten", id)
	}
	select {
	case <-s.done:
	case <-c.gone:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !s.ended {
		if c.err != nil {
			return "", "", c.err
		}
		return "", "", ctx.Err()
	}
	return s.status, s.msg, nil
}

// forget drops an ended stream's state (a long attack opens many).
func (c *h2conn) forget(id uint32) {
	c.mu.Lock()
	delete(c.streams, id)
	c.mu.Unlock()
}

// ended counts the streams the server has ended.
func (c *h2conn) ended() (n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.streams {
		if s.ended {
			n++
		}
	}
	return n
}

func (c *h2conn) broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *h2conn) Close() error { return c.conn.Close() }

// grpcFrame is m as one gRPC message: flag, length, bytes.
func grpcFrame(m proto.Message) []byte {
	b, err := proto.Marshal(m)
	if err != nil {
		panic(err)
	}
	return grpcPrefix(len(b), b)
}

// grpcPrefix is the message prefix announcing n bytes, then body (which
// may be shorter: the rest never comes).
func grpcPrefix(n int, body []byte) []byte {
	out := make([]byte, 5, 5+len(body))
	binary.BigEndian.PutUint32(out[1:], uint32(n))
	return append(out, body...)
}

var errNoStatus = errors.New("no grpc-status")

// unaryStatus sends m whole on a new stream of method, ends it, and
// returns the call's status.
func (c *h2conn) unaryStatus(ctx context.Context, method string, m proto.Message) (string, string, error) {
	id, err := c.open(method)
	if err != nil {
		return "", "", err
	}
	if err := c.send(ctx, id, grpcFrame(m), true); err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	st, msg, err := c.wait(ctx, id)
	if err == nil && st == "" {
		err = errNoStatus
	}
	return st, msg, err
}
