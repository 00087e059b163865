package archive

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"
)

// s3Bucket is a Bucket in an S3-compatible object store, through the AWS
// SDK for Go v2. Credentials come from the SDK's default chain
// (environment, shared config and credentials files, web identity, the
// instance's role), never from walship's flags.
type s3Bucket struct {
	client *s3.Client
	tm     *transfermanager.Client
	// multipartAbove is the size above which an object goes up in parts.
	multipartAbove int64
	bucket         string
	prefix         string // "" or ending in "/"
	desc           string
	// timeout bounds each request (see Config.Timeout).
	timeout time.Duration
}

// DefaultTimeout is Config.Timeout's default.
const DefaultTimeout = 30 * time.Second

// uploadPace is the time an upload's deadline allows per byte on top of
// the timeout: a body sent at 1 MiB/s still makes it.
const uploadPace = time.Second / (1 << 20)

func newS3Bucket(ctx context.Context, c Config, bucket, prefix string) (*s3Bucket, error) {
	var opts []func(*config.LoadOptions) error
	if c.Region != "" {
		opts = append(opts, config.WithRegion(c.Region))
	}
	// No timeout for a whole HTTP exchange: a large snapshot may take
	// longer than any fixed bound to transfer. Each request has a
	// deadline of its own instead, and a download one on its progress
	// (timeout).
	hc := awshttp.NewBuildableClient()
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("--archive-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--archive-ca-file: %s holds no PEM certificate", c.CAFile)
		}
		hc = hc.WithTransportOptions(func(t *http.Transport) {
			t.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		})
	}
	opts = append(opts, config.WithHTTPClient(hc), config.WithRetryMaxAttempts(3))
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("archive: load the AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		// S3-compatible servers ignore it, but requests are signed with it.
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(c.Endpoint)
		}
		o.UsePathStyle = c.PathStyle
		// walship checks every object with its own checksum; the SDK's
		// default trailing checksums are not understood by every
		// S3-compatible server.
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	desc := "s3://" + bucket
	if prefix != "" {
		desc += "/" + strings.TrimSuffix(prefix, "/")
	}
	tm := transfermanager.New(client, func(o *transfermanager.Options) {
		o.PartSizeBytes = multipartPart
		o.Concurrency = 4
		o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
	})
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	return &s3Bucket{client: client, tm: tm, multipartAbove: multipartAbove, bucket: bucket, prefix: prefix, desc: desc, timeout: timeout}, nil
}

// within runs req with a deadline d from now. A store that does not
// answer (or take a body) within it — stopped, or cut off without a
// reset — fails the request with an error that says so, rather than
// holding its caller until the kernel gives up on the connection.
func (b *s3Bucket) within(ctx context.Context, d time.Duration, req func(context.Context) error) error {
	rctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	err := req(rctx)
	if err != nil && ctx.Err() == nil && errors.Is(rctx.Err(), context.DeadlineExceeded) {
		return &timeoutError{d: d, err: err}
	}
	return err
}

// timeoutError is a request the store did not complete within its
// deadline.
type timeoutError struct {
	d   time.Duration
	err error
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("no answer within %v (--archive-timeout): %v", e.d, e.err)
}

func (e *timeoutError) Unwrap() error { return e.err }

func (b *s3Bucket) String() string { return b.desc }

func (b *s3Bucket) key(name string) *string { return aws.String(b.prefix + name) }

// explain turns an SDK error into one that names the bucket and says
// what the server answered.
func (b *s3Bucket) explain(op, name string, err error) error {
	if err == nil {
		return nil
	}
	var nk *types.NoSuchKey
	var nf *types.NotFound
	if errors.As(err, &nk) || errors.As(err, &nf) {
		return fmt.Errorf("%s: %w", name, ErrNotFound)
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		var re *awshttp.ResponseError
		code := 0
		if errors.As(err, &re) {
			code = re.HTTPStatusCode()
		}
		if code == http.StatusNotFound && ae.ErrorCode() == "NotFound" && op != "list" {
			return fmt.Errorf("%s: %w", name, ErrNotFound)
		}
		return &BucketError{Bucket: b.desc, Op: op, Name: name, Code: ae.ErrorCode(), Message: ae.ErrorMessage(), HTTPStatus: code, err: err}
	}
	return &BucketError{Bucket: b.desc, Op: op, Name: name, err: err}
}

// Objects above multipartAbove go up in parts of multipartPart, four at
// a time (S3 takes at most 5 GiB in one PUT; a base snapshot may be
// larger).
const (
	multipartAbove = 64 << 20
	multipartPart  = 16 << 20
)

func (b *s3Bucket) Put(ctx context.Context, name string, body io.ReadSeeker, size int64, meta map[string]string) error {
	err := b.within(ctx, b.timeout+time.Duration(size)*uploadPace, func(ctx context.Context) error {
		if size > b.multipartAbove {
			_, err := b.tm.UploadObject(ctx, &transfermanager.UploadObjectInput{
				Bucket: aws.String(b.bucket), Key: b.key(name), Body: body, ContentLength: aws.Int64(size),
				Metadata: meta, ContentType: aws.String("application/octet-stream"),
			})
			return err
		}
		_, err := b.client.PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String(b.bucket), Key: b.key(name), Body: body, ContentLength: aws.Int64(size),
			Metadata: meta, ContentType: aws.String("application/octet-stream"),
		}, signedAs(payloadSHA256(ctx))...)
		return err
	})
	return b.explain("put", name, err)
}

// payloadKey carries, in a Put's context, the SHA-256 (hex) of exactly
// the bytes it uploads, when the caller already computed it.
type payloadKey struct{}

// withPayloadSHA256 says that sum is the SHA-256 of the body the Put
// under ctx sends (the archive's checksum of the stored bytes).
func withPayloadSHA256(ctx context.Context, sum string) context.Context {
	return context.WithValue(ctx, payloadKey{}, sum)
}

func payloadSHA256(ctx context.Context) string {
	s, _ := ctx.Value(payloadKey{}).(string)
	return s
}

// signedAs has SigV4 sign sum as the payload's SHA-256 (hex) rather than
// the SDK reading and hashing the body once more: the archive's checksum
// of an object is the SHA-256 of exactly the bytes it sends. An empty sum
// changes nothing.
func signedAs(sum string) []func(*s3.Options) {
	if sum == "" {
		return nil
	}
	return []func(*s3.Options){s3.WithAPIOptions(func(st *middleware.Stack) error {
		return st.Finalize.Insert(middleware.FinalizeMiddlewareFunc("walshipPayloadHash",
			func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
				return next.HandleFinalize(v4.SetPayloadHash(ctx, sum), in)
			}), "ComputePayloadHash", middleware.Before)
	})}
}

// Get's body may take any time to read, as long as it makes progress: a
// watchdog ends the request when the store sends nothing for the timeout,
// before the answer or in the middle of the body.
func (b *s3Bucket) Get(ctx context.Context, name string) (io.ReadCloser, Info, error) {
	ctx, cancel := context.WithCancel(ctx)
	body := &watchedBody{timeout: b.timeout, cancel: cancel}
	body.watch = time.AfterFunc(b.timeout, func() {
		body.stalled.Store(true)
		cancel()
	})
	out, err := b.client.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(b.bucket), Key: b.key(name)})
	if err != nil {
		body.watch.Stop()
		cancel()
		if body.stalled.Load() {
			err = &timeoutError{d: b.timeout, err: err}
		}
		return nil, Info{}, b.explain("get", name, err)
	}
	body.rc = out.Body
	return body, Info{Size: aws.ToInt64(out.ContentLength), Meta: lowerKeys(out.Metadata)}, nil
}

// watchedBody is a download whose request ends when no byte arrives for
// timeout. Its reader must read as the bytes come (the archive's callers
// copy a download out, or read it whole, at once): time it spends
// between reads counts as the store's.
type watchedBody struct {
	rc      io.ReadCloser
	timeout time.Duration
	watch   *time.Timer
	stalled atomic.Bool
	cancel  context.CancelFunc
}

func (w *watchedBody) Read(p []byte) (int, error) {
	n, err := w.rc.Read(p)
	if n > 0 {
		w.watch.Reset(w.timeout)
	}
	if err != nil && !errors.Is(err, io.EOF) && w.stalled.Load() {
		err = fmt.Errorf("no data for %v (--archive-timeout): %w", w.timeout, err)
	}
	return n, err
}

func (w *watchedBody) Close() error {
	w.watch.Stop()
	err := w.rc.Close()
	w.cancel()
	return err
}

func (b *s3Bucket) Head(ctx context.Context, name string) (Info, error) {
	var out *s3.HeadObjectOutput
	err := b.within(ctx, b.timeout, func(ctx context.Context) (err error) {
		out, err = b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(b.bucket), Key: b.key(name)})
		return err
	})
	if err != nil {
		return Info{}, b.explain("head", name, err)
	}
	return Info{Size: aws.ToInt64(out.ContentLength), Meta: lowerKeys(out.Metadata)}, nil
}

// lowerKeys: S3 metadata keys are case-insensitive, and servers differ in
// the case they return.
func lowerKeys(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[strings.ToLower(k)] = v
	}
	return out
}

func (b *s3Bucket) List(ctx context.Context, prefix, startAfter string, fn func(Object) bool) error {
	in := &s3.ListObjectsV2Input{Bucket: aws.String(b.bucket), Prefix: aws.String(b.prefix + prefix)}
	if startAfter != "" {
		in.StartAfter = b.key(startAfter)
	}
	p := s3.NewListObjectsV2Paginator(b.client, in)
	for p.HasMorePages() {
		// A deadline per page: a long listing is many requests.
		var page *s3.ListObjectsV2Output
		err := b.within(ctx, b.timeout, func(ctx context.Context) (err error) {
			page, err = p.NextPage(ctx)
			return err
		})
		if err != nil {
			return b.explain("list", prefix, err)
		}
		for _, o := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(o.Key), b.prefix)
			if !fn(Object{Name: name, Size: aws.ToInt64(o.Size)}) {
				return nil
			}
		}
	}
	return nil
}

func (b *s3Bucket) Delete(ctx context.Context, names ...string) error {
	for len(names) > 0 {
		n := min(len(names), 1000) // the most one DeleteObjects takes
		ids := make([]types.ObjectIdentifier, n)
		for i, name := range names[:n] {
			ids[i] = types.ObjectIdentifier{Key: b.key(name)}
		}
		var out *s3.DeleteObjectsOutput
		err := b.within(ctx, b.timeout, func(ctx context.Context) (err error) {
			out, err = b.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{Bucket: aws.String(b.bucket),
				Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)}})
			return err
		})
		if err != nil {
			return b.explain("delete", names[0], err)
		}
		for _, e := range out.Errors {
			if aws.ToString(e.Code) == "NoSuchKey" {
				continue
			}
			return &BucketError{Bucket: b.desc, Op: "delete", Name: strings.TrimPrefix(aws.ToString(e.Key), b.prefix),
				Code: aws.ToString(e.Code), Message: aws.ToString(e.Message)}
		}
		names = names[n:]
	}
	return nil
}

// BucketError is a request the object store refused or could not answer:
// it names the bucket, the operation and the object, and says what the
// server answered (its error code and message).
type BucketError struct {
	Bucket, Op, Name string
	Code, Message    string
	HTTPStatus       int
	err              error
}

func (e *BucketError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s", e.Bucket, e.Op)
	if e.Name != "" {
		fmt.Fprintf(&b, " %s", e.Name)
	}
	switch {
	case e.Code != "":
		fmt.Fprintf(&b, ": the server answered %s", e.Code)
		if e.HTTPStatus != 0 {
			fmt.Fprintf(&b, " (HTTP %d)", e.HTTPStatus)
		}
		if e.Message != "" {
			fmt.Fprintf(&b, ": %s", e.Message)
		}
		if hint := codeHint(e.Code); hint != "" {
			fmt.Fprintf(&b, " (%s)", hint)
		}
	case e.err != nil:
		fmt.Fprintf(&b, ": %v", e.err)
	}
	return b.String()
}

func (e *BucketError) Unwrap() error { return e.err }

func codeHint(code string) string {
	switch code {
	case "NoSuchBucket":
		return "the bucket does not exist: create it, or check --archive"
	case "InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken", "InvalidToken":
		return "check the credentials (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, or the web identity) and the bucket's policy"
	}
	return ""
}
