// Package tlsid is a walship process's transport identity: a certificate,
// its key and the CA bundle it trusts, read from files as one generation,
// checked, and swapped atomically when the files change — so certificates
// and CA bundles rotate without a restart (etcd reloads leaf certificates
// but not CA bundles, etcd-io/etcd#11555). A bad update, or one whose
// certificate names another identity, keeps the last good generation,
// logged and counted.
//
// Servers require a client certificate from the current bundle; clients
// verify the server against the current bundle and present the current
// certificate. Both are TLS 1.3 only. The peer's identity is its
// certificate's first URI SAN (SPIFFE style, spiffe://TRUST-DOMAIN/...),
// else its first DNS SAN: the principal grpc's authz policies match.
package tlsid

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Files names the PEM files of one identity: in Kubernetes, files of a
// whole Secret volume (never a subPath mount: those never update).
type Files struct {
	Cert string // certificate chain, leaf first
	Key  string // its private key
	CA   string // the bundle of CAs trusted for peers (old and new during a CA rotation)
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check says which file is missing, naming its flag.
func (f Files) Check() error {
	switch {
	case f.Cert == "":
		return errors.New("--tls-cert: required with --tls-key and --tls-ca")
	case f.Key == "":
		return errors.New("--tls-key: required with --tls-cert and --tls-ca")
	case f.CA == "":
		return errors.New("--tls-ca: required with --tls-cert and --tls-key")
	}
	return nil
}

// generation is one consistent read of the three files.
type generation struct {
	cert tls.Certificate
	leaf *x509.Certificate
	pool *x509.CertPool
	sum  [sha256.Size]byte
}

// Source holds the current generation.
type Source struct {
	files  Files
	logger *slog.Logger
	now    func() time.Time
	gen    atomic.Pointer[generation]

	reloads *prometheus.CounterVec
	expiry  prometheus.GaugeFunc
}

// Load reads and checks the files; the first generation must be good.
func Load(files Files, logger *slog.Logger) (*Source, error) {
	if err := files.Check(); err != nil {
		return nil, err
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, logger: logger, now: time.Now}
	s.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_tls_reloads_total",
		Help: "Reads of changed TLS certificate, key and CA files, by result: ok (swapped in) or error (the last good generation kept).",
	}, []string{"result"})
	s.expiry = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_tls_cert_expiry_timestamp_seconds",
		Help: "When the certificate in use expires (Unix seconds).",
	}, func() float64 { return float64(s.NotAfter().Unix()) })
	for _, r := range []string{"ok", "error"} {
		s.reloads.WithLabelValues(r) // exported at 0 from the start
	}
	g, err := s.read()
	if err != nil {
		return nil, err
	}
	s.gen.Store(g)
	return s, nil
}

// Register adds the reload and expiry metrics to reg.
func (s *Source) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.reloads, s.expiry} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// NotAfter is when the certificate in use expires.
func (s *Source) NotAfter() time.Time { return s.gen.Load().leaf.NotAfter }

// Identity is the certificate in use's principal (URI SAN, else DNS SAN).
func (s *Source) Identity() string { return Principal(s.gen.Load().leaf) }

// read loads the three files and checks them as one generation: the key
// matches the certificate, the certificate is valid now and chains to the
// bundle (so a rotation that swaps CA and certificate in the wrong order
// is caught here, not at the first handshake).
func (s *Source) read() (*generation, error) {
	// Read until two reads in a row agree, so that files replaced while
	// they were read (one by one, or by a Secret volume's symlink swap
	// between two of them) are never taken as a mixed generation.
	var certPEM, keyPEM, caPEM []byte
	for tries := 0; ; tries++ {
		c, k, a, err := s.readFiles()
		if err != nil {
			return nil, err
		}
		if bytes.Equal(c, certPEM) && bytes.Equal(k, keyPEM) && bytes.Equal(a, caPEM) {
			break
		}
		if tries == 5 {
			return nil, errors.New("the TLS files kept changing while they were read")
		}
		certPEM, keyPEM, caPEM = c, k, a
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert and --tls-key: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s: %w", s.files.Cert, err)
	}
	now := s.now()
	if now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("--tls-cert %s: not valid now (valid %s to %s)", s.files.Cert, leaf.NotBefore.Format(time.RFC3339), leaf.NotAfter.Format(time.RFC3339))
	}
	pool, err := parseBundle(caPEM)
	if err != nil {
		return nil, fmt.Errorf("--tls-ca %s: %w", s.files.CA, err)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("--tls-cert %s does not chain to --tls-ca %s: %w", s.files.Cert, s.files.CA, err)
	}
	cert.Leaf = leaf
	return &generation{cert: cert, leaf: leaf, pool: pool, sum: sumOf(certPEM, keyPEM, caPEM)}, nil
}

// sumOf identifies the contents of a generation's three files.
func sumOf(certPEM, keyPEM, caPEM []byte) [sha256.Size]byte {
	return sha256.Sum256(bytes.Join([][]byte{certPEM, keyPEM, caPEM}, []byte{0}))
}

func (s *Source) readFiles() (certPEM, keyPEM, caPEM []byte, err error) {
	if certPEM, err = os.ReadFile(s.files.Cert); err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-cert: %w", err)
	}
	if keyPEM, err = os.ReadFile(s.files.Key); err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-key: %w", err)
	}
	if caPEM, err = os.ReadFile(s.files.CA); err != nil {
		return nil, nil, nil, fmt.Errorf("--tls-ca: %w", err)
	}
	return certPEM, keyPEM, caPEM, nil
}

// parseBundle parses every certificate of a PEM bundle: one that does not
// parse fails the bundle, rather than being dropped (which would leave a
// CA rotation's new CA out without a word).
func parseBundle(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a %q block in a CA bundle", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if len(bytes.TrimSpace(b)) > 0 {
		return nil, fmt.Errorf("%d bytes after certificate %d are not PEM", len(bytes.TrimSpace(b)), n)
	}
	if n == 0 {
		return nil, errors.New("no PEM certificate in it")
	}
	return pool, nil
}

// Reload reads the files again and swaps in a new generation if they
// changed and check out; on an error the current one stays. It reports
// whether it swapped.
func (s *Source) Reload() (bool, error) {
	// Unchanged files, the usual case, cost one read: no second read, no
	// parsing, no chain verification.
	if c, k, a, err := s.readFiles(); err == nil && sumOf(c, k, a) == s.gen.Load().sum {
		return false, nil
	}
	g, err := s.read()
	if err != nil {
		s.reloads.WithLabelValues("error").Inc()
		return false, err
	}
	cur := s.gen.Load()
	if g.sum == cur.sum {
		return false, nil
	}
	// A process keeps its identity: peers know it by it (a replica's
	// primary, the policy's class), and a node turned client would be
	// refused at every call and go on trying. Changing it takes a restart.
	if was, is := identityOf(cur.leaf), identityOf(g.leaf); is != was {
		s.reloads.WithLabelValues("error").Inc()
		return false, fmt.Errorf("--tls-cert %s: identity %s, but this process runs as %s: a reload may not change it (restart to)", s.files.Cert, is, was)
	}
	s.gen.Store(g)
	s.reloads.WithLabelValues("ok").Inc()
	return true, nil
}

// Watch reloads every interval until ctx ends (files in a Kubernetes
// Secret volume change by a symlink swap, which polling sees).
func (s *Source) Watch(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	var lastErr string
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		swapped, err := s.Reload()
		switch {
		case err != nil && err.Error() != lastErr:
			s.logger.Error("TLS files changed but do not check out; keeping the last good certificate", "err", err, "not_after", s.NotAfter())
			lastErr = err.Error()
		case err == nil && swapped:
			s.logger.Info("TLS certificate reloaded", "identity", s.Identity(), "not_after", s.NotAfter())
			lastErr = ""
		case err == nil:
			lastErr = ""
		}
	}
}

// ServerConfig requires and verifies a client certificate from the
// current bundle and presents the current certificate, per handshake.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			g := s.gen.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{g.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    g.pool,
				NextProtos:   []string{"h2"}, // gRPC requires ALPN
			}, nil
		},
	}
}

// ClientConfig is a client config of the current generation: its
// certificate, its bundle as the roots, standard verification of the
// server's chain and of the name dialled (a DNS name, or an IP address,
// which must be in the server's SANs). For a connection made now; gRPC
// dialers use Credentials, which takes a fresh one at every handshake.
func (s *Source) ClientConfig() *tls.Config {
	g := s.gen.Load()
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{g.cert},
		RootCAs:      g.pool,
	}
}

// Credentials are gRPC transport credentials that handshake with the
// generation current at each handshake (so a rotated certificate or CA
// bundle applies to the next connection), verifying the server as
// ClientConfig does; gRPC sets the name to verify from the target.
func (s *Source) Credentials() credentials.TransportCredentials { return clientCreds{s} }

type clientCreds struct{ s *Source }

func (c clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.s.ClientConfig()).ClientHandshake(ctx, authority, conn)
}

func (c clientCreds) ServerHandshake(net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("tlsid: client credentials cannot serve")
}

func (c clientCreds) Info() credentials.ProtocolInfo {
	return credentials.NewTLS(c.s.ClientConfig()).Info()
}

func (c clientCreds) Clone() credentials.TransportCredentials { return c }

//nolint:staticcheck // part of the interface
func (c clientCreds) OverrideServerName(string) error { return nil }

// identityOf is what a reload must keep of a certificate: its URI SANs
// (one SPIFFE ID, for walship's identities), else its first DNS SAN, else
// its common name — each tagged with its kind, so that a DNS name spelled
// as the SPIFFE ID it replaces is another identity.
func identityOf(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		ids := make([]string, len(c.URIs))
		for i, u := range c.URIs {
			ids[i] = "URI:" + u.String()
		}
		return strings.Join(ids, ",")
	case len(c.DNSNames) > 0:
		return "DNS:" + c.DNSNames[0]
	}
	return "CN:" + c.Subject.CommonName
}

// Principal is a certificate's identity: its first URI SAN, else its
// first DNS SAN, else its subject's common name.
func Principal(c *x509.Certificate) string {
	switch {
	case len(c.URIs) > 0:
		return c.URIs[0].String()
	case len(c.DNSNames) > 0:
		return c.DNSNames[0]
	}
	return c.Subject.CommonName
}

// Peer is the identity of a call's peer, or "" over plaintext.
func Peer(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return ""
	}
	return Principal(ti.State.PeerCertificates[0])
}
