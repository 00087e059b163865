package serve

import (
	"context"
	"io"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// explainUnary is the client interceptor of every walship dial
// (Dialer.Options): a call that failed because nothing of gRPC was said
// keeps its code, and its message says which mistake it was, so that a
// plaintext-versus-TLS mismatch (refused at once) is told apart from a
// process that does not answer (a timeout) and from a port nothing
// listens on. Dialled with TLS or not is the Dialer's.
func explainUnary(dialsTLS bool) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		start := time.Now()
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil {
			return nil
		}
		return explain(cc.Target(), dialsTLS, time.Since(start), err)
	}
}

// explainStream is explainUnary for streams: the connection's failure
// shows at the stream's creation or at its first message.
func explainStream(dialsTLS bool) grpc.StreamClientInterceptor {
	return func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		start := time.Now()
		s, err := streamer(ctx, desc, cc, method, opts...)
		if err != nil {
			return nil, explain(cc.Target(), dialsTLS, time.Since(start), err)
		}
		return &explainedStream{ClientStream: s, addr: cc.Target(), dialsTLS: dialsTLS, start: start}, nil
	}
}

type explainedStream struct {
	grpc.ClientStream
	addr     string
	dialsTLS bool
	start    time.Time
}

func (s *explainedStream) RecvMsg(m any) error {
	err := s.ClientStream.RecvMsg(m)
	if err == nil || err == io.EOF {
		return err
	}
	return explain(s.addr, s.dialsTLS, time.Since(s.start), err)
}

// explain is err with what it means for a call to addr, or err itself
// when it is not a connection failure it knows.
func explain(addr string, dialsTLS bool, took time.Duration, err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	msg := st.Message()
	var why string
	switch {
	case st.Code() == codes.Unavailable && strings.Contains(msg, "first record does not look like a TLS handshake"):
		why = addr + " serves plaintext, but this process dials it with TLS (--tls-cert, --tls-key, --tls-ca): drop those flags, or give that process its TLS flags"
	case st.Code() == codes.Unavailable && !dialsTLS && strings.Contains(msg, "error reading server preface"):
		why = addr + " closed the connection before answering gRPC: it serves TLS (or is not a gRPC server), and this process dials plaintext: give it --tls-cert, --tls-key and --tls-ca"
	case st.Code() == codes.Unavailable && strings.Contains(msg, "connection refused"):
		why = "nothing listens at " + addr + " (connection refused): a wrong address or port, or the process is down"
	case st.Code() == codes.DeadlineExceeded && strings.Contains(msg, "waiting for connections to become ready"):
		why = addr + " did not answer within " + took.Round(time.Millisecond).String() + ": the process is stopped or overloaded, or the network drops its packets (a TLS or plaintext mismatch would have been refused at once)"
	default:
		return err
	}
	return status.Error(st.Code(), why+": "+msg)
}
