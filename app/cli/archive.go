package cli

import (
	"flag"

	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/services/logstore"
)

// addArchiveFlags adds the flags that say where an archive is and how to
// reach it (walship logstore, restore, ctl verify, dev, and the data
// nodes, which only read it). Credentials are
// never flags: the AWS SDK's default chain reads them (AWS_ACCESS_KEY_ID
// and AWS_SECRET_ACCESS_KEY, AWS_PROFILE and the shared files, a web
// identity token, the instance's role).
func addArchiveFlags(fs *flag.FlagSet, c *archive.Config) {
	fs.StringVar(&c.URL, "archive", "", "the archive: s3://BUCKET/PREFIX, or file:///DIRECTORY (credentials come from the AWS SDK's chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE, web identity)")
	fs.StringVar(&c.Endpoint, "archive-endpoint", "", "S3 endpoint URL of an S3-compatible store (empty: AWS)")
	fs.StringVar(&c.Region, "archive-region", "", "S3 region (empty: the SDK's configuration, else us-east-1)")
	fs.BoolVar(&c.PathStyle, "archive-path-style", false, "address the bucket in the URL path (most S3-compatible stores) rather than the host name")
	fs.StringVar(&c.CAFile, "archive-ca-file", "", "PEM file of CAs to trust for --archive-endpoint, besides the system's")
	fs.DurationVar(&c.Timeout, "archive-timeout", archive.DefaultTimeout, "fail a request to the S3 store that gets no answer (or a download no data) within this, an upload given a second more per MiB of it: an unreachable store shows as errors, which a log store retries with backoff, not as a hang")
	fs.StringVar(&c.KeyFile, "archive-key-file", "", "encrypt the archive on the client (AES-256-GCM) with the keys in this file: lines of \"ID BASE64-32-BYTE-KEY\", the last one encrypts, all decrypt")
}

// addArchiveUploadFlags adds the flags of a log store's uploads.
func addArchiveUploadFlags(fs *flag.FlagSet, o *logstore.ArchiveOptions) {
	addArchiveFlags(fs, &o.Config)
	fs.IntVar(&o.ChunkBytes, "archive-chunk-bytes", logstore.DefaultArchiveChunkBytes, "close a WAL chunk of the archive at this size")
	fs.DurationVar(&o.Interval, "archive-interval", o.Interval, "upload what is new at least this often (0 = 1s)")
	fs.DurationVar(&o.Window, "archive-retention", 0, "keep every point of this recovery window restorable from the archive, deleting what is older (0 = keep everything)")
	fs.IntVar(&o.KeepSnapshots, "archive-keep-snapshots", 0, "keep at least this many base snapshots in the archive, with everything after the oldest (0 = as --archive-retention needs)")
}
