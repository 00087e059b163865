package tlsid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a throwaway certificate authority: `walship dev --tls` makes one
// for its nodes, and tests make them to rotate, expire and mistrust. Not
// for production (use cert-manager or your own PKI).
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

// NewCA makes a self-signed CA named name, valid for validity from now.
func NewCA(name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             now.Add(-time.Minute),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// PEM is the CA's certificate.
func (ca *CA) PEM() []byte { return ca.pem }

// Leaf describes a certificate to issue.
type Leaf struct {
	URI       string   // the identity, e.g. spiffe://walship.local/walship/node/n1
	AlsoURIs  []string // more URI SANs (the default policy refuses such a certificate)
	DNS       []string // names it is reached at
	IPs       []net.IP // addresses it is reached at
	NotBefore time.Time
	NotAfter  time.Time // zero: a year from now
}

// Issue signs a certificate for both server and client use and returns
// its PEM chain and key.
func (ca *CA) Issue(l Leaf) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	if l.NotBefore.IsZero() {
		l.NotBefore = time.Now().Add(-time.Minute)
	}
	if l.NotAfter.IsZero() {
		l.NotAfter = time.Now().Add(365 * 24 * time.Hour)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: l.URI},
		NotBefore:    l.NotBefore,
		NotAfter:     l.NotAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:     l.DNS,
		IPAddresses:  l.IPs,
	}
	if l.URI != "" {
		u, err := url.Parse(l.URI)
		if err != nil {
			return nil, nil, fmt.Errorf("uri %q: %w", l.URI, err)
		}
		tmpl.URIs = []*url.URL{u}
	}
	for _, a := range l.AlsoURIs {
		u, err := url.Parse(a)
		if err != nil {
			return nil, nil, fmt.Errorf("uri %q: %w", a, err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), nil
}

// WriteFiles issues l and writes dir/name.crt, dir/name.key and dir/ca.crt
// (with extraCA appended to the bundle: a CA rotation's old and new).
func (ca *CA) WriteFiles(dir, name string, l Leaf, extraCA ...[]byte) (Files, error) {
	certPEM, keyPEM, err := ca.Issue(l)
	if err != nil {
		return Files{}, err
	}
	f := Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.crt")}
	bundle := append([]byte(nil), ca.pem...)
	for _, e := range extraCA {
		bundle = append(bundle, e...)
	}
	for _, w := range []struct {
		path string
		b    []byte
		mode os.FileMode
	}{{f.Cert, certPEM, 0o644}, {f.Key, keyPEM, 0o600}, {f.CA, bundle, 0o644}} {
		if err := os.WriteFile(w.path, w.b, w.mode); err != nil {
			return Files{}, err
		}
	}
	return f, nil
}

// CRL signs a revocation list of revoked, certificates the CA issued,
// promising the next at nextUpdate, and returns it as PEM.
func (ca *CA) CRL(nextUpdate time.Time, revoked ...*x509.Certificate) ([]byte, error) {
	tmpl := &x509.RevocationList{Number: serial(), ThisUpdate: time.Now().Add(-time.Minute), NextUpdate: nextUpdate}
	for _, c := range revoked {
		tmpl.RevokedCertificateEntries = append(tmpl.RevokedCertificateEntries, x509.RevocationListEntry{SerialNumber: c.SerialNumber, RevocationTime: time.Now()})
	}
	der, err := x509.CreateRevocationList(rand.Reader, tmpl, ca.cert, ca.key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "X509 CRL", Bytes: der}), nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}
