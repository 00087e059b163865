package e2e

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/s3test"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
)

// TestArchiveBucketUnreachable: the bucket's server stops answering
// (SIGSTOP) for several upload timeouts while sync commits go on. Commits
// are not held up; the uploader's requests time out and it retries rather
// than hanging (walship_archive_upload_errors_total grows, Status says
// why); the primary's walship_archive_lag_seconds grows; no log store's
// retention cuts what was never archived, though its log grows past
// --retention-bytes with snapshots to cut at. Once the server answers
// again the archive catches up, verifies, and restores to the primary's
// last LSN and state digest.
func TestArchiveBucketUnreachable(t *testing.T) {
	needLinux(t)
	srv := s3test.Start(t, "walship")
	url := "s3://walship/unreachable"
	const timeout = time.Second
	c := newArchiveCluster(t, srv, url, archiveOpts{logstoreArgs: []string{"--archive-timeout", timeout.String()}})
	load := startLoad(t, walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr)), "unreachable/", 2)
	testkit.UntilWithin(t, 30*time.Second, "something archived", func() bool { return c.status(t).GetArchive().GetArchivedLsn() > 0 })

	srv.Pause()
	paused := time.Now()
	uploader := -1
	for i, ls := range c.logstores {
		if ls.addr == c.status(t).GetArchive().GetUploaderAddr() {
			uploader = i
		}
	}
	if uploader < 0 {
		t.Fatalf("no uploader among the log stores: %v", c.status(t).GetArchive())
	}
	// The uploader does not hang on a request the server never answers:
	// each times out, is counted and retried.
	up := c.logstores[uploader]
	testkit.UntilWithin(t, 10*timeout+5*time.Second, "the uploader's requests to time out", func() bool {
		return scrape(t, up.metrics, "walship_archive_upload_errors_total") >= 2
	})
	e := c.logstoreStatus(t, uploader).GetArchive().GetError()
	if !strings.Contains(e, "s3://walship/unreachable") || !strings.Contains(e, "--archive-timeout") {
		t.Fatalf("the uploader's Status.archive.error while the bucket is unreachable: %q", e)
	}
	t.Logf("the uploader's Status.archive.error: %s", e)
	// The archive falls behind by more than several upload timeouts.
	const behind = 6.0
	testkit.UntilWithin(t, time.Minute, fmt.Sprintf("walship_archive_lag_seconds above %v", behind), func() bool {
		return scrape(t, c.primary().metrics, "walship_archive_lag_seconds") > behind
	})
	// The log stores keep everything after the archived LSN, though their
	// logs grow past --retention-bytes and hold snapshots after it.
	cut := func(i int) bool {
		archived := c.status(t).GetArchive().GetArchivedLsn()
		if first := scrape(t, c.logstores[i].metrics, "walship_logstore_first_lsn"); first > float64(archived+1) {
			t.Errorf("%s: walship_logstore_first_lsn %v: retention cut what the archive lacks (archived up to %d)", c.logstores[i].name, first, archived)
			return true
		}
		return false
	}
	testkit.UntilWithin(t, time.Minute, "every log store to hold more than --retention-bytes, and a snapshot after the archived LSN", func() bool {
		archived := c.status(t).GetArchive().GetArchivedLsn()
		ready := true
		for i, ls := range c.logstores {
			if cut(i) {
				t.FailNow()
			}
			snaps := c.logstoreStatus(t, i).GetSnapshots()
			ready = ready && scrape(t, ls.metrics, "walship_logstore_stored_bytes") > 131072 &&
				len(snaps) > 0 && snaps[len(snaps)-1].GetLsn() > archived
		}
		return ready
	})
	for i, ls := range c.logstores {
		if held := scrape(t, ls.metrics, "walship_logstore_retention_held_bytes"); held <= 0 {
			t.Errorf("%s: walship_logstore_retention_held_bytes = %v while the archive is behind", ls.name, held)
		}
		cut(i)
	}
	if n, err := load.failed(); n > 0 {
		t.Fatalf("%d commits failed while the bucket was unreachable; first: %v", n, err)
	}
	t.Logf("bucket paused %v: %d commits meanwhile, archive lag %.1fs, %v upload errors on the uploader",
		time.Since(paused).Round(time.Millisecond), len(load.writes()), scrape(t, c.primary().metrics, "walship_archive_lag_seconds"),
		scrape(t, up.metrics, "walship_archive_upload_errors_total"))

	srv.Resume()
	load.stop()
	resumed := time.Now()
	final := c.waitArchived(t, 2*time.Minute)
	t.Logf("the archive caught up to LSN %d %v after the bucket came back", final.GetDurableLsn(), time.Since(resumed).Round(time.Millisecond))
	if out, code := verifyArchive(t, srv, url); code != 0 {
		t.Fatalf("ctl verify --archive after the outage: exit %d\n%s", code, out)
	}
	r := restoreArchive(t, srv, url, filepath.Join(t.TempDir(), "restored"), "--latest")
	if r.lsn != final.GetVisibleLsn() || r.digest != final.GetStateDigest() {
		t.Fatalf("restore --latest after the outage: LSN %d, digest %s; the primary at LSN %d, digest %s", r.lsn, r.digest, final.GetVisibleLsn(), final.GetStateDigest())
	}
}

// TestArchiveFaults: what goes wrong in or with the bucket, one server for
// all (each case on a prefix of its own).
func TestArchiveFaults(t *testing.T) {
	needLinux(t)
	srv := s3test.Start(t, "walship")
	t.Run("damaged objects", func(t *testing.T) { damagedObjects(t, srv) })
	t.Run("two clusters on one prefix", func(t *testing.T) { twoClusters(t, srv) })
	t.Run("uploader killed", func(t *testing.T) { uploaderKilled(t, srv) })
	// These two mostly wait out a backoff: side by side, once the others
	// are done.
	t.Run("wrong credentials", func(t *testing.T) {
		t.Parallel()
		refusedBucket(t, srv, "s3://walship/creds", []string{"AWS_SECRET_ACCESS_KEY=not-the-secret"}, "check the credentials")
	})
	t.Run("missing bucket", func(t *testing.T) {
		t.Parallel()
		refusedBucket(t, srv, "s3://nosuchbucket/x", nil, "NoSuchBucket")
	})
}

// refusedBucket: log stores whose bucket refuses them (env: their
// environment) log an error naming the bucket and the server's answer
// (want), say it in Status.archive.error, and retry with backoff — at
// most 1+log2(T+1) failures in T seconds, the schedule 1 s, 2 s, 4 s...
// allows, not a storm — while sync commits go on unaffected.
func refusedBucket(t *testing.T, srv *s3test.Server, url string, env []string, want string) {
	started := time.Now()
	c := newArchiveCluster(t, srv, url, archiveOpts{logstores: 1, env: env})
	load := startLoad(t, walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr)), "refused/", 2)
	ls := c.logstores[0]
	testkit.UntilWithin(t, 30*time.Second, "an upload error", func() bool {
		return scrape(t, ls.metrics, "walship_archive_upload_errors_total") >= 1
	})
	bucket, _, _ := strings.Cut(strings.TrimPrefix(url, "s3://"), "/")
	st := c.logstoreStatus(t, 0).GetArchive()
	for _, w := range []string{"s3://" + bucket, "the server answered", want} {
		if !strings.Contains(st.GetError(), w) {
			t.Fatalf("Status.archive.error %q does not say %q", st.GetError(), w)
		}
	}
	if st.GetArchivedLsn() != 0 {
		t.Fatalf("Status.archive says LSN %d archived in a bucket that refuses every request", st.GetArchivedLsn())
	}
	logged := false
	for _, line := range strings.Split(ls.p.logs(), "\n") {
		logged = logged || (strings.Contains(line, `"msg":"archive: upload failed; retrying with backoff"`) &&
			strings.Contains(line, "s3://"+bucket) && strings.Contains(line, want))
	}
	if !logged {
		t.Fatalf("the log store logged no upload error naming s3://%s and %q:\n%s", bucket, want, ls.p.logs())
	}
	t.Logf("Status.archive.error: %s", st.GetError())
	// Seconds of commits meanwhile: the window the failures are counted in.
	<-time.After(4 * time.Second)
	load.stop()
	errs := scrape(t, ls.metrics, "walship_archive_upload_errors_total")
	window := time.Since(started).Seconds()
	if bound := 1 + math.Floor(math.Log2(window+1)); errs > bound || errs < 2 {
		t.Fatalf("%v upload errors in the %.1fs since the log store started; the backoff allows 2..%v", errs, window, bound)
	}
	if n, err := load.failed(); n > 0 || len(load.writes()) == 0 {
		t.Fatalf("commits with a refused bucket: %d acknowledged, %d failed (first: %v)", len(load.writes()), n, err)
	}
	t.Logf("%v upload errors in %.1fs; %d commits meanwhile, none failed", errs, window, len(load.writes()))
}

// openArchive opens url on srv from the test, with the server's credentials.
func openArchive(t *testing.T, srv *s3test.Server, url string) *archive.Archive {
	t.Helper()
	for _, kv := range srv.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	a, err := archive.Open(t.Context(), archive.Config{URL: url, Endpoint: srv.Endpoint, PathStyle: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// damagedObjects: a chunk flipped, truncated or deleted in the bucket, or
// a snapshot flipped, makes `walship ctl verify --archive` exit 1 naming
// the object and its LSNs, and `walship restore` through it fail closed —
// DATA_LOSS, or OUT_OF_RANGE for what is gone — never another state.
func damagedObjects(t *testing.T, srv *s3test.Server) {
	url := "s3://walship/damaged"
	c := newArchiveCluster(t, srv, url, archiveOpts{logstores: 1})
	load := startLoad(t, walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr)), "damaged/", 2)
	// Commits until the archive holds a snapshot (the primary takes one
	// every 64 KiB of WAL and uploads it on its own; on a loaded machine
	// two seconds of commits did not always get one there), then two
	// seconds more: chunks after it.
	arch := openArchive(t, srv, url)
	testkit.UntilWithin(t, 2*time.Minute, "a snapshot in the archive", func() bool {
		cat, err := arch.Catalog(t.Context(), "")
		return err == nil && len(cat.Snapshots) > 0
	})
	<-time.After(2 * time.Second)
	load.stop()
	c.waitArchived(t, time.Minute)
	c.destroy(t)
	if out, code := verifyArchive(t, srv, url); code != 0 {
		t.Fatalf("ctl verify --archive before any damage: exit %d\n%s", code, out)
	}
	cat, err := arch.Catalog(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	// A chunk no snapshot ends inside, so that a restore to its end must
	// read it, and a snapshot a restore to its LSN starts from.
	var victim archive.Chunk
	for _, ch := range cat.Chunks[len(cat.Chunks)/2:] {
		inside := false
		for _, sn := range cat.Snapshots {
			inside = inside || (sn.LSN >= ch.FirstLSN && sn.LSN <= ch.LastLSN)
		}
		if !inside {
			victim = ch
			break
		}
	}
	if victim.FirstLSN == 0 || len(cat.Snapshots) == 0 {
		t.Fatalf("no chunk to damage without a snapshot in it, or no snapshot: %d chunks, snapshots %+v", len(cat.Chunks), cat.Snapshots)
	}
	snap := cat.Snapshots[len(cat.Snapshots)-1]
	s3c := srv.Client()
	key := func(name string) *string { return aws.String("damaged/" + name) }
	get := func(name string) ([]byte, map[string]string) {
		out, err := s3c.GetObject(t.Context(), &s3.GetObjectInput{Bucket: aws.String("walship"), Key: key(name)})
		if err != nil {
			t.Fatal(err)
		}
		defer out.Body.Close()
		b, err := io.ReadAll(out.Body)
		if err != nil {
			t.Fatal(err)
		}
		return b, out.Metadata
	}
	put := func(name string, b []byte, meta map[string]string) {
		if _, err := s3c.PutObject(t.Context(), &s3.PutObjectInput{Bucket: aws.String("walship"), Key: key(name), Body: bytes.NewReader(b),
			ContentLength: aws.Int64(int64(len(b))), Metadata: meta}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name   string
		object string
		lsns   string // what verify says of where it is
		target uint64
		damage func(b []byte, meta map[string]string)
		code   codes.Code
	}{
		{"chunk flipped", archive.ChunkName(victim), fmt.Sprint(victim.FirstLSN), victim.LastLSN, func(b []byte, meta map[string]string) {
			d := append([]byte(nil), b...)
			d[len(d)/2] ^= 0x10
			put(archive.ChunkName(victim), d, meta)
		}, codes.DataLoss},
		{"chunk truncated", archive.ChunkName(victim), fmt.Sprint(victim.FirstLSN), victim.LastLSN, func(b []byte, meta map[string]string) {
			put(archive.ChunkName(victim), b[:len(b)-40], meta)
		}, codes.DataLoss},
		{"chunk deleted", "", fmt.Sprintf("LSNs %d..%d", victim.FirstLSN, victim.LastLSN), victim.LastLSN, func([]byte, map[string]string) {
			if _, err := s3c.DeleteObject(t.Context(), &s3.DeleteObjectInput{Bucket: aws.String("walship"), Key: key(archive.ChunkName(victim))}); err != nil {
				t.Fatal(err)
			}
		}, codes.OutOfRange},
		{"snapshot flipped", archive.SnapshotName(snap), fmt.Sprint(snap.LSN), snap.LSN, func(b []byte, meta map[string]string) {
			d := append([]byte(nil), b...)
			d[len(d)/3] ^= 0x01
			put(archive.SnapshotName(snap), d, meta)
		}, codes.DataLoss},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := archive.ChunkName(victim)
			if strings.HasPrefix(tc.name, "snapshot") {
				name = archive.SnapshotName(snap)
			}
			orig, meta := get(name)
			tc.damage(orig, meta)
			defer put(name, orig, meta)
			out, code := verifyArchive(t, srv, url)
			if code != 1 || !strings.Contains(out, tc.object) || !strings.Contains(out, tc.lsns) {
				t.Fatalf("ctl verify --archive: exit %d, want 1 naming %q and %q:\n%s", code, tc.object, tc.lsns, out)
			}
			dir := filepath.Join(t.TempDir(), "restored")
			out, code = walshipCmd(t, srv, append(append([]string{"restore"}, archiveFlags(srv, url)...), "--data-dir", dir, "--lsn", fmt.Sprint(tc.target))...)
			if code == 0 || errCode(out) != tc.code || !strings.Contains(out, fmt.Sprint(tc.target)) {
				t.Fatalf("restore --lsn %d through a %s: exit %d, want %v naming the LSN:\n%s", tc.target, tc.name, code, tc.code, out)
			}
			t.Logf("%s: restore: %s", tc.name, errLine(out))
			if entries, _ := os.ReadDir(dir); len(entries) > 0 {
				t.Fatalf("a failed restore left %d entries in %s", len(entries), dir)
			}
		})
	}
	if out, code := verifyArchive(t, srv, url); code != 0 {
		t.Fatalf("ctl verify --archive with every object put back: exit %d\n%s", code, out)
	}
}

// errLine is the line of a command's output that logs its failure.
func errLine(out string) string {
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "level=ERROR") {
			return line
		}
	}
	return ""
}

// twoClusters: a second cluster's log store pointed at the prefix of a
// first refuses to upload — the cluster ids mismatch, in its log, its
// Status.archive.error and walship_cluster_mismatch_total — and nothing
// of it lands: every object under the prefix is the first cluster's, and
// its archive verifies.
func twoClusters(t *testing.T, srv *s3test.Server) {
	url := "s3://walship/shared"
	a := newArchiveCluster(t, srv, url, archiveOpts{logstores: 1})
	loadA := startLoad(t, walshipv1.NewKVServiceClient(a.conn(t, a.primary().addr)), "a/", 1)
	testkit.UntilWithin(t, 30*time.Second, "the first cluster to archive", func() bool { return a.status(t).GetArchive().GetArchivedLsn() > 0 })
	idA := a.status(t).GetClusterId()

	b := newArchiveCluster(t, srv, url, archiveOpts{logstores: 1})
	idB := b.status(t).GetClusterId()
	if idA == idB || idB == "" {
		t.Fatalf("cluster ids %q and %q: want two", idA, idB)
	}
	loadB := startLoad(t, walshipv1.NewKVServiceClient(b.conn(t, b.primary().addr)), "b/", 1)
	ls := b.logstores[0]
	testkit.UntilWithin(t, 30*time.Second, "the second cluster's log store to refuse the archive", func() bool {
		return scrape(t, ls.metrics, "walship_cluster_mismatch_total") >= 1
	})
	st := b.logstoreStatus(t, 0).GetArchive()
	if !strings.Contains(st.GetError(), "belongs to cluster "+idA) || !strings.Contains(st.GetError(), idB) || st.GetArchivedLsn() != 0 {
		t.Fatalf("the second cluster's Status.archive: %v; want an error naming clusters %s and %s, nothing archived", st, idA, idB)
	}
	if !strings.Contains(ls.p.logs(), "refusing to mix two clusters") {
		t.Fatalf("the second cluster's log store did not log the refusal:\n%s", ls.p.logs())
	}
	testkit.UntilWithin(t, 30*time.Second, "the second cluster to commit", func() bool { return len(loadB.writes()) >= 50 })
	loadB.stop()
	loadA.stop()
	if n, err := loadB.failed(); n > 0 || len(loadB.writes()) == 0 {
		t.Fatalf("the second cluster's commits: %d acknowledged, %d failed (first: %v)", len(loadB.writes()), n, err)
	}
	a.waitArchived(t, time.Minute)
	out, code := walshipCmd(t, srv, append(append([]string{"ctl", "verify"}, archiveFlags(srv, url)...), "--cluster-id", idA)...)
	if code != 0 {
		t.Fatalf("ctl verify --archive --cluster-id %s: exit %d\n%s", idA, code, out)
	}
	s3c := srv.Client()
	objects := 0
	p := s3.NewListObjectsV2Paginator(s3c, &s3.ListObjectsV2Input{Bucket: aws.String("walship"), Prefix: aws.String("shared/")})
	for p.HasMorePages() {
		page, err := p.NextPage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range page.Contents {
			h, err := s3c.HeadObject(t.Context(), &s3.HeadObjectInput{Bucket: aws.String("walship"), Key: o.Key})
			if err != nil {
				t.Fatal(err)
			}
			if got := h.Metadata["walship-cluster"]; got != idA {
				t.Errorf("object %s is of cluster %q; the prefix is %s's", aws.ToString(o.Key), got, idA)
			}
			objects++
		}
	}
	t.Logf("%d objects under the prefix, all of cluster %s; cluster %s refused: %s", objects, idA, idB, st.GetError())
}

// uploaderKilled: the log store uploading is killed (kill -9) while its
// request hangs on a stopped server. The primary moves the job to another
// log store, which continues from the archive's end: nothing partial is
// listed, the archive verifies without a gap, the archived LSN reported
// at the kill is in it, and a restore reaches the primary's last LSN.
func uploaderKilled(t *testing.T, srv *s3test.Server) {
	url := "s3://walship/killed"
	c := newArchiveCluster(t, srv, url, archiveOpts{logstoreArgs: []string{"--archive-timeout", "20s"}})
	load := startLoad(t, walshipv1.NewKVServiceClient(c.conn(t, c.primary().addr)), "killed/", 2)
	testkit.UntilWithin(t, 30*time.Second, "LSN 300 archived", func() bool { return c.status(t).GetArchive().GetArchivedLsn() >= 300 })
	uploader := c.status(t).GetArchive().GetUploaderAddr()
	srv.Pause()
	// The uploader steps every 20 ms: once the archive is a second behind
	// it is waiting on a request the stopped server holds.
	testkit.UntilWithin(t, 30*time.Second, "the archive to fall a second behind", func() bool {
		return scrape(t, c.primary().metrics, "walship_archive_lag_seconds") > 1
	})
	reported := c.status(t).GetArchive().GetArchivedLsn()
	killed := -1
	for i, ls := range c.logstores {
		if ls.addr == uploader {
			killed = i
			ls.p.kill()
		}
	}
	if killed < 0 {
		t.Fatalf("the uploader %s is none of the log stores", uploader)
	}
	srv.Resume()
	testkit.UntilWithin(t, 30*time.Second, "the primary to move the upload job", func() bool {
		a := c.status(t).GetArchive()
		return a.GetUploaderAddr() != "" && a.GetUploaderAddr() != uploader
	})
	if tail := openArchiveTail(t, srv, url); tail < reported {
		t.Fatalf("the primary reported LSN %d archived when the uploader was killed; the archive holds up to %d", reported, tail)
	}
	<-time.After(time.Second) // more commits for the new uploader
	load.stop()
	if n, err := load.failed(); n > 0 {
		t.Fatalf("%d commits failed; first: %v", n, err)
	}
	final := c.waitArchived(t, time.Minute)
	t.Logf("uploader %s killed at archived LSN %d; %s took over and archived up to %d", uploader, reported, final.GetArchive().GetUploaderAddr(), final.GetArchive().GetArchivedLsn())
	if out, code := verifyArchive(t, srv, url); code != 0 {
		t.Fatalf("ctl verify --archive after the uploader's kill: exit %d\n%s", code, out)
	}
	r := restoreArchive(t, srv, url, filepath.Join(t.TempDir(), "restored"), "--latest")
	if r.lsn != final.GetVisibleLsn() || r.digest != final.GetStateDigest() {
		t.Fatalf("restore --latest: LSN %d, digest %s; the primary at LSN %d, digest %s", r.lsn, r.digest, final.GetVisibleLsn(), final.GetStateDigest())
	}
}

// openArchiveTail is the end of the archive's chunks of its lineage.
func openArchiveTail(t *testing.T, srv *s3test.Server, url string) uint64 {
	t.Helper()
	cat, err := openArchive(t, srv, url).Catalog(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	return cat.Tail()
}
