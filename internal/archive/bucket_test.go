package archive

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/s3test"
)

// buckets are the Bucket implementations every conformance test runs
// against: a directory, and a real S3-compatible server (SeaweedFS; the
// S3 case skips with a message when weed is not built).
func buckets(t *testing.T) map[string]func(t *testing.T) Bucket {
	return map[string]func(t *testing.T) Bucket{
		"file": func(t *testing.T) Bucket {
			b, err := newFileBucket(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"s3": func(t *testing.T) Bucket {
			srv := s3test.Start(t, "walship")
			return s3BucketOf(t, srv, "s3://walship/some/prefix")
		},
	}
}

// s3BucketOf opens url on srv with the test server's credentials.
func s3BucketOf(t *testing.T, srv *s3test.Server, url string) *s3Bucket {
	t.Helper()
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	_, bucket, prefix, err := parseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	b, err := newS3Bucket(context.Background(), Config{URL: url, Endpoint: srv.Endpoint, PathStyle: true}, bucket, prefix)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBucketConformance: what the archive needs of a store, on each.
func TestBucketConformance(t *testing.T) {
	for name, open := range buckets(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			b := open(t)
			if _, err := b.Head(ctx, "wal/none"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Head of a missing object: %v", err)
			}
			if _, _, err := b.Get(ctx, "wal/none"); !errors.Is(err, ErrNotFound) {
				t.Fatalf("Get of a missing object: %v", err)
			}
			meta := map[string]string{"walship-sha256": "abc", "walship-format": "1"}
			body := []byte("hello archive")
			if err := b.Put(ctx, "wal/0001", bytes.NewReader(body), int64(len(body)), meta); err != nil {
				t.Fatal(err)
			}
			info, err := b.Head(ctx, "wal/0001")
			if err != nil || info.Size != int64(len(body)) || info.Meta["walship-sha256"] != "abc" || info.Meta["walship-format"] != "1" {
				t.Fatalf("Head: %+v, %v", info, err)
			}
			rc, info, err := b.Get(ctx, "wal/0001")
			if err != nil {
				t.Fatal(err)
			}
			got, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(got, body) || info.Meta["walship-sha256"] != "abc" {
				t.Fatalf("Get: %q %+v", got, info)
			}
			// Replacing an object.
			if err := b.Put(ctx, "wal/0001", bytes.NewReader([]byte("x")), 1, meta); err != nil {
				t.Fatal(err)
			}
			if info, err := b.Head(ctx, "wal/0001"); err != nil || info.Size != 1 {
				t.Fatalf("after a replace: %+v %v", info, err)
			}
			// Listing: order, prefix, start-after, more than one page.
			var want []string
			for i := 0; i < 1100; i += 37 {
				want = append(want, fmt.Sprintf("wal/%04d", i+2))
			}
			want = append(want, "wal/0001")
			for _, n := range want[:len(want)-1] {
				if err := b.Put(ctx, n, bytes.NewReader([]byte(n)), int64(len(n)), meta); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Put(ctx, "snapshots/a", bytes.NewReader(nil), 0, meta); err != nil {
				t.Fatal(err)
			}
			var names []string
			if err := b.List(ctx, "wal/", "", func(o Object) bool { names = append(names, o.Name); return true }); err != nil {
				t.Fatal(err)
			}
			if len(names) != len(want) || names[0] != "wal/0001" || names[1] != "wal/0002" {
				t.Fatalf("List: %d names %v", len(names), names[:min(3, len(names))])
			}
			for i := 1; i < len(names); i++ {
				if names[i-1] >= names[i] {
					t.Fatalf("List out of order at %d: %s, %s", i, names[i-1], names[i])
				}
			}
			var after []string
			b.List(ctx, "wal/", "wal/0002", func(o Object) bool { after = append(after, o.Name); return len(after) < 2 })
			if fmt.Sprint(after) != "[wal/0039 wal/0076]" {
				t.Fatalf("List after wal/0002, two: %v", after)
			}
			var all []string
			b.List(ctx, "", "", func(o Object) bool { all = append(all, o.Name); return true })
			if len(all) != len(want)+1 || all[0] != "snapshots/a" {
				t.Fatalf("List of everything: %d, first %v", len(all), all[:1])
			}
			if err := b.Delete(ctx, append(names, "wal/never")...); err != nil {
				t.Fatal(err)
			}
			names = nil
			b.List(ctx, "wal/", "", func(o Object) bool { names = append(names, o.Name); return true })
			if len(names) != 0 {
				t.Fatalf("after Delete: %v", names)
			}
		})
	}
}

// TestS3Errors: wrong credentials and a missing bucket are errors naming
// the bucket and saying what the server answered.
func TestS3Errors(t *testing.T) {
	srv := s3test.Start(t, "walship")
	ctx := context.Background()
	b := s3BucketOf(t, srv, "s3://nosuchbucket/p")
	err := b.Put(ctx, "x", bytes.NewReader(nil), 0, nil)
	var be *BucketError
	if !errors.As(err, &be) || be.Code != "NoSuchBucket" || !strings.Contains(err.Error(), "s3://nosuchbucket/p") || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing bucket: %v", err)
	}
	t.Setenv("AWS_SECRET_ACCESS_KEY", "wrong")
	_, bucket, prefix, _ := parseURL("s3://walship/p")
	wrong, err := newS3Bucket(ctx, Config{URL: "s3://walship/p", Endpoint: srv.Endpoint, PathStyle: true}, bucket, prefix)
	if err != nil {
		t.Fatal(err)
	}
	err = wrong.Put(ctx, "x", bytes.NewReader(nil), 0, nil)
	if !errors.As(err, &be) || !strings.Contains(err.Error(), "s3://walship/p") || !strings.Contains(err.Error(), "credentials") {
		t.Fatalf("wrong credentials: %v", err)
	}
}

// TestS3Multipart: a large object goes up in parts and comes back whole.
func TestS3Multipart(t *testing.T) {
	srv := s3test.Start(t, "walship")
	ctx := context.Background()
	b := s3BucketOf(t, srv, "s3://walship/mp")
	b.multipartAbove = 6 << 20
	big := bytes.Repeat([]byte("0123456789abcdef"), (12<<20)/16+3)
	if err := b.Put(ctx, "snapshots/big", bytes.NewReader(big), int64(len(big)), map[string]string{"walship-format": "1"}); err != nil {
		t.Fatal(err)
	}
	rc, info, err := b.Get(ctx, "snapshots/big")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, big) || info.Meta["walship-format"] != "1" {
		t.Fatalf("a multipart object came back as %d bytes (want %d), meta %v", len(got), len(big), info.Meta)
	}
}

// TestS3StalledServer: a server that stops answering (SIGSTOP: its
// connections open, nothing read or sent) fails every request after the
// timeout with an error naming the bucket and --archive-timeout — a
// download that stalls in the middle of its body too — instead of
// holding its caller for the HTTP client's minutes; once it answers
// again, requests succeed.
func TestS3StalledServer(t *testing.T) {
	srv := s3test.Start(t, "walship")
	ctx := context.Background()
	b := s3BucketOf(t, srv, "s3://walship/stall")
	b.timeout = 500 * time.Millisecond
	// More than the loopback's socket buffers hold, so that the body
	// stalls when the server stops.
	big := bytes.Repeat([]byte("walship archive "), (40<<20)/16)
	if err := b.Put(ctx, "snapshots/big", bytes.NewReader(big), int64(len(big)), nil); err != nil {
		t.Fatal(err)
	}
	small := []byte("small")
	if err := b.Put(ctx, "wal/small", bytes.NewReader(small), int64(len(small)), nil); err != nil {
		t.Fatal(err)
	}
	rc, _, err := b.Get(ctx, "snapshots/big")
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	if _, err := io.ReadFull(rc, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	// Without a deadline of its own each of these would wait for the
	// kernel or the HTTP client's timeout, minutes; a minute is plenty for
	// a 500 ms one on a loaded machine.
	stalled := func(what string, req func() error) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- req() }()
		select {
		case err := <-done:
			if err == nil || !strings.Contains(err.Error(), "--archive-timeout") {
				t.Errorf("%s from a stopped server: %v; want an error naming --archive-timeout", what, err)
			}
			if what != "the rest of a download" && !strings.Contains(err.Error(), "s3://walship/stall") {
				t.Errorf("%s from a stopped server: %v does not name the bucket", what, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("%s from a stopped server still waits after a minute", what)
		}
	}
	stalled("the rest of a download", func() error {
		n, err := io.Copy(io.Discard, rc)
		if err == nil {
			return fmt.Errorf("read the whole %d bytes", n+1<<20)
		}
		return err
	})
	stalled("put", func() error { return b.Put(ctx, "wal/new", bytes.NewReader(small), int64(len(small)), nil) })
	stalled("get", func() error {
		rc, _, err := b.Get(ctx, "wal/small")
		if err == nil {
			rc.Close()
		}
		return err
	})
	stalled("head", func() error { _, err := b.Head(ctx, "wal/small"); return err })
	stalled("list", func() error { return b.List(ctx, "wal/", "", func(Object) bool { return true }) })
	stalled("delete", func() error { return b.Delete(ctx, "wal/small") })

	srv.Resume()
	if err := b.Put(ctx, "wal/after", bytes.NewReader(small), int64(len(small)), nil); err != nil {
		t.Fatalf("put once the server answers again: %v", err)
	}
}
