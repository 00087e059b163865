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
// certificate, and a client that knows what it dials also checks the
// server's class (PeerCredentials). Both are TLS 1.3 only. The peer's identity is its
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
	// CRL, optional, holds certificate revocation lists (PEM, or one DER
	// list) of CAs of the bundle: a peer whose certificate one lists
	// fails the handshake.
	CRL string
}

// Set reports whether any file is named.
func (f Files) Set() bool { return f.Cert != "" || f.Key != "" || f.CA != "" || f.CRL != "" }

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

// generation is one consistent read of the files.
type generation struct {
	cert tls.Certificate
	leaf *x509.Certificate
	pool *x509.CertPool
	// revoked holds the CRL's entries, nil without --tls-crl;
	// crlNextUpdate is when the CRL's issuers promise the next (the
	// earliest of them; zero: none promised, or no CRL).
	revoked       map[revokedKey]struct{}
	crlNextUpdate time.Time
	// caNotAfter is when the first CA of the bundle expires.
	caNotAfter time.Time
	sum        [sha256.Size]byte
}

// revokedKey is a revoked certificate: its issuer's raw subject and its
// serial number.
type revokedKey struct{ issuer, serial string }

func revokedKeyOf(c *x509.Certificate) revokedKey {
	return revokedKey{string(c.RawIssuer), c.SerialNumber.Text(16)}
}

// contents are what a generation's files hold.
type contents struct{ cert, key, ca, crl []byte }

func (f contents) equal(g contents) bool {
	return bytes.Equal(f.cert, g.cert) && bytes.Equal(f.key, g.key) && bytes.Equal(f.ca, g.ca) && bytes.Equal(f.crl, g.crl)
}

// sum identifies the contents of a generation's files.
func (f contents) sum() [sha256.Size]byte {
	return sha256.Sum256(bytes.Join([][]byte{f.cert, f.key, f.ca, f.crl}, []byte{0}))
}

// Source holds the current generation.
type Source struct {
	files  Files
	logger *slog.Logger
	now    func() time.Time
	gen    atomic.Pointer[generation]

	reloads  *prometheus.CounterVec
	reloadOK prometheus.Gauge
	expiry   prometheus.GaugeFunc
	caExpiry prometheus.GaugeFunc
	crlNext  prometheus.GaugeFunc
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
	s.reloadOK = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "walship_tls_last_reload_success",
		Help: "1 if the last read of the TLS files found them unchanged or swapped them in, 0 if they changed but did not check out (the last good generation is kept): a later good read sets it back to 1.",
	})
	s.reloadOK.Set(1)
	s.caExpiry = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_tls_ca_expiry_timestamp_seconds",
		Help: "When the first CA certificate of the bundle in use (--tls-ca) expires (Unix seconds): past it, no certificate it issued verifies.",
	}, func() float64 { return float64(s.gen.Load().caNotAfter.Unix()) })
	s.crlNext = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_tls_crl_next_update_timestamp_seconds",
		Help: "When the revocation list in use (--tls-crl) says the next is due (Unix seconds; the earliest of its issuers'); 0 without one.",
	}, func() float64 {
		if t := s.gen.Load().crlNextUpdate; !t.IsZero() {
			return float64(t.Unix())
		}
		return 0
	})
	for _, r := range []string{"ok", "error"} {
		s.reloads.WithLabelValues(r) // exported at 0 from the start
	}
	g, err := s.read()
	if err != nil {
		return nil, err
	}
	s.gen.Store(g)
	if g.selfRevoked() {
		logger.Error("this process's certificate is revoked by --tls-crl: peers that read the same list refuse it", "identity", s.Identity(), "crl", files.CRL)
	}
	return s, nil
}

// Register adds the reload and expiry metrics to reg.
func (s *Source) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{s.reloads, s.reloadOK, s.expiry, s.caExpiry, s.crlNext} {
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

// read loads the files and checks them as one generation: the key
// matches the certificate, the certificate is valid now and chains to the
// bundle (so a rotation that swaps CA and certificate in the wrong order
// is caught here, not at the first handshake), and the CRL, if any, is
// signed by a CA of the bundle. A list that revokes this process's own
// certificate is taken all the same (refusing it would keep every
// revocation it brings out), and said (selfRevoked).
func (s *Source) read() (*generation, error) {
	// Read until two reads in a row agree, so that files replaced while
	// they were read (one by one, or by a Secret volume's symlink swap
	// between two of them) are never taken as a mixed generation.
	var f contents
	for tries := 0; ; tries++ {
		g, err := s.readFiles()
		if err != nil {
			return nil, err
		}
		if tries > 0 && g.equal(f) {
			break
		}
		if tries == 5 {
			return nil, errors.New("the TLS files kept changing while they were read")
		}
		f = g
	}
	cert, err := tls.X509KeyPair(f.cert, f.key)
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
	pool, cas, err := parseBundle(f.ca)
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
	g := &generation{cert: cert, leaf: leaf, pool: pool, sum: f.sum()}
	for _, ca := range cas {
		if g.caNotAfter.IsZero() || ca.NotAfter.Before(g.caNotAfter) {
			g.caNotAfter = ca.NotAfter
		}
	}
	if s.files.CRL != "" {
		if g.revoked, g.crlNextUpdate, err = parseCRLs(f.crl, cas); err != nil {
			return nil, fmt.Errorf("--tls-crl %s: %w", s.files.CRL, err)
		}
	}
	return g, nil
}

func (s *Source) readFiles() (f contents, err error) {
	if f.cert, err = os.ReadFile(s.files.Cert); err != nil {
		return contents{}, fmt.Errorf("--tls-cert: %w", err)
	}
	if f.key, err = os.ReadFile(s.files.Key); err != nil {
		return contents{}, fmt.Errorf("--tls-key: %w", err)
	}
	if f.ca, err = os.ReadFile(s.files.CA); err != nil {
		return contents{}, fmt.Errorf("--tls-ca: %w", err)
	}
	if s.files.CRL != "" {
		if f.crl, err = os.ReadFile(s.files.CRL); err != nil {
			return contents{}, fmt.Errorf("--tls-crl: %w", err)
		}
	}
	return f, nil
}

// parseBundle parses every certificate of a PEM bundle: one that does not
// parse fails the bundle, rather than being dropped (which would leave a
// CA rotation's new CA out without a word).
func parseBundle(b []byte) (*x509.CertPool, []*x509.Certificate, error) {
	pool := x509.NewCertPool()
	var cas []*x509.Certificate
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, nil, fmt.Errorf("a %q block in a CA bundle", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, nil, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(c)
		cas = append(cas, c)
		n++
	}
	if len(bytes.TrimSpace(b)) > 0 {
		return nil, nil, fmt.Errorf("%d bytes after certificate %d are not PEM", len(bytes.TrimSpace(b)), n)
	}
	if n == 0 {
		return nil, nil, errors.New("no PEM certificate in it")
	}
	return pool, cas, nil
}

// parseCRLs parses the revocation lists of b (PEM "X509 CRL" blocks, or
// one DER list) and checks that a CA of cas signed each: a list nobody
// trusted could sign would let anyone cut peers off. It returns the
// revoked certificates and the earliest next update promised. Whether a
// list is past its next update is not checked: a stale list still revokes
// what it lists, and refusing it would only keep an older one.
func parseCRLs(b []byte, cas []*x509.Certificate) (map[revokedKey]struct{}, time.Time, error) {
	var ders [][]byte
	rest := b
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "X509 CRL" {
			return nil, time.Time{}, fmt.Errorf("a %q block, want X509 CRL", blk.Type)
		}
		ders = append(ders, blk.Bytes)
	}
	switch {
	case len(ders) == 0 && len(bytes.TrimSpace(b)) == 0:
		return nil, time.Time{}, errors.New("no revocation list in it (empty)")
	case len(ders) == 0:
		ders = [][]byte{b} // DER
	case len(bytes.TrimSpace(rest)) > 0:
		return nil, time.Time{}, fmt.Errorf("%d bytes after list %d are not PEM", len(bytes.TrimSpace(rest)), len(ders))
	}
	revoked := map[revokedKey]struct{}{}
	var next time.Time
	for i, der := range ders {
		l, err := x509.ParseRevocationList(der)
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("list %d: %w", i+1, err)
		}
		signed := false
		for _, ca := range cas {
			if bytes.Equal(ca.RawSubject, l.RawIssuer) && l.CheckSignatureFrom(ca) == nil {
				signed = true
				break
			}
		}
		if !signed {
			return nil, time.Time{}, fmt.Errorf("list %d (issuer %s) is not signed by a CA of --tls-ca", i+1, l.Issuer)
		}
		for _, e := range l.RevokedCertificateEntries {
			revoked[revokedKey{string(l.RawIssuer), e.SerialNumber.Text(16)}] = struct{}{}
		}
		if !l.NextUpdate.IsZero() && (next.IsZero() || l.NextUpdate.Before(next)) {
			next = l.NextUpdate
		}
	}
	return revoked, next, nil
}

// selfRevoked reports whether the generation's CRL lists its own
// certificate: peers that read the same list refuse it.
func (g *generation) selfRevoked() bool {
	_, ok := g.revoked[revokedKeyOf(g.leaf)]
	return ok
}

// checkRevoked is a tls.Config's VerifyConnection: under a CRL, the
// peer's certificate is refused if every chain it was verified by holds
// a revoked certificate.
func (g *generation) checkRevoked(cs tls.ConnectionState) error {
	if g.revoked == nil {
		return nil
	}
	var hit *x509.Certificate
	for _, chain := range cs.VerifiedChains {
		ok := true
		for _, c := range chain {
			if _, r := g.revoked[revokedKeyOf(c)]; r {
				ok, hit = false, c
				break
			}
		}
		if ok {
			return nil
		}
	}
	if hit == nil {
		return errors.New("tlsid: no verified chain to check against the revocation list")
	}
	return fmt.Errorf("tlsid: certificate %s (serial %s) is revoked (--tls-crl)", Principal(hit), hit.SerialNumber.Text(16))
}

// Reload reads the files again and swaps in a new generation if they
// changed and check out; on an error the current one stays. It reports
// whether it swapped.
func (s *Source) Reload() (bool, error) {
	swapped, err := s.reload()
	// The files as they are now: a later good read (files fixed, or put
	// back as they were) ends a failure, so that its alert clears.
	if err != nil {
		s.reloadOK.Set(0)
	} else {
		s.reloadOK.Set(1)
	}
	return swapped, err
}

func (s *Source) reload() (bool, error) {
	// Unchanged files, the usual case, cost one read: no second read, no
	// parsing, no chain verification.
	if f, err := s.readFiles(); err == nil && f.sum() == s.gen.Load().sum {
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
			if s.gen.Load().selfRevoked() {
				s.logger.Error("this process's certificate is revoked by --tls-crl: peers that read the same list refuse it", "identity", s.Identity(), "crl", s.files.CRL)
			}
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
				MinVersion:       tls.VersionTLS13,
				Certificates:     []tls.Certificate{g.cert},
				ClientAuth:       tls.RequireAndVerifyClientCert,
				ClientCAs:        g.pool,
				VerifyConnection: g.checkRevoked,
				NextProtos:       []string{"h2"}, // gRPC requires ALPN
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
		MinVersion:       tls.VersionTLS13,
		Certificates:     []tls.Certificate{g.cert},
		RootCAs:          g.pool,
		VerifyConnection: g.checkRevoked,
	}
}

// Credentials are gRPC transport credentials that handshake with the
// generation current at each handshake (so a rotated certificate or CA
// bundle applies to the next connection), verifying the server as
// ClientConfig does; gRPC sets the name to verify from the target.
func (s *Source) Credentials() credentials.TransportCredentials { return clientCreds{s: s} }

type clientCreds struct {
	s *Source
	// class, if set, is the server's class check beyond its chain and
	// name (PeerCredentials). A pointer keeps the credentials comparable.
	class *classCheck
}

func (c clientCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return credentials.NewTLS(c.clientConfig()).ClientHandshake(ctx, authority, conn)
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
