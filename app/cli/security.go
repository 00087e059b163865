package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
)

// metricsListenHelp is --metrics-listen's help, the same for every server.
const metricsListenHelp = "HTTP listen address of /metrics, /healthz and /readyz: plain HTTP even with TLS, so loopback by default (bind what Prometheus and probes need, e.g. :9401); empty disables"

// securityFlags are the TLS and authorization flags of every walship
// command that serves or dials.
type securityFlags struct {
	files      tlsid.Files
	plaintext  bool
	trust      string
	policy     string
	reflection tlsid.Reflection
	reload     time.Duration
	maxAge     time.Duration
	pprof      bool
	// pprofPublic allows --pprof on a metrics listener beyond loopback.
	pprofPublic bool
	peerCalls   int
	peerConns   int
}

// addSecurityFlags registers the flags; server says whether the command
// serves (authorization and connection limits apply to servers only).
func addSecurityFlags(fs *flag.FlagSet, server bool) *securityFlags {
	sf := &securityFlags{reflection: tlsid.ReflectionAll}
	fs.StringVar(&sf.files.Cert, "tls-cert", "", "PEM certificate chain of this process's identity (TLS 1.3, reloaded when it changes)")
	fs.StringVar(&sf.files.Key, "tls-key", "", "PEM private key of --tls-cert")
	fs.StringVar(&sf.files.CA, "tls-ca", "", "PEM bundle of the CAs whose certificates peers must present (old and new together while rotating)")
	fs.StringVar(&sf.files.CRL, "tls-crl", "", "optional certificate revocation lists (PEM, or one DER list) signed by CAs of --tls-ca, reloaded with them: a peer whose certificate one lists fails the handshake")
	fs.DurationVar(&sf.reload, "tls-reload-interval", 10*time.Second, "how often the TLS files are checked for changes")
	if !server {
		return sf
	}
	fs.BoolVar(&sf.plaintext, "plaintext", false, "serve without TLS on a non-loopback address: anyone who reaches the port can read the log and write (loopback needs no flag)")
	fs.StringVar(&sf.trust, "trust-domain", "walship.local", "SPIFFE trust domain of the default authorization policy: identities spiffe://DOMAIN/walship/{node,logstore,client,admin}/NAME")
	fs.StringVar(&sf.policy, "authz-policy", "", "gRPC authorization policy file (A43 JSON, checked every --tls-reload-interval; a bad edit keeps the policy in force) instead of the default policy")
	fs.Var(&sf.reflection, "reflection", "who may use server reflection under TLS: all, admin or off")
	fs.BoolVar(&sf.pprof, "pprof", false, "serve Go's CPU, heap and goroutine profiles at /debug/pprof/ on --metrics-listen, which must be loopback unless --pprof-public")
	fs.BoolVar(&sf.pprofPublic, "pprof-public", false, "allow --pprof on a --metrics-listen beyond loopback: anyone who reaches that port can read the profiles and spend the process's CPU on them")
	fs.DurationVar(&sf.maxAge, "max-connection-age", time.Hour, "with TLS, close connections this old so they re-handshake with rotated certificates (streams resume); 0 = never")
	fs.IntVar(&sf.peerCalls, "max-peer-calls", serve.DefaultPeerCalls, "with TLS, most calls one identity that is not a data node may have in progress on this server (each may hold about twice the message limit); more fail RESOURCE_EXHAUSTED")
	fs.IntVar(&sf.peerConns, "max-peer-conns", serve.DefaultPeerConns, "with TLS, most connections one identity may hold to this server (about 55 KiB each); more are closed after the handshake")
	return sf
}

// dial returns the tool's dialer (walship ctl, check, restore): TLS from
// the files, or plaintext. It starts the reload loop. Tools
// address whichever node the operator names, of any class: they check
// the server's name and chain, not its class.
func (sf *securityFlags) dial(ctx context.Context, logger *slog.Logger) (serve.Dialer, error) {
	if sf.reload <= 0 {
		return serve.Dialer{}, fmt.Errorf("--tls-reload-interval: %v is not positive", sf.reload)
	}
	if !sf.files.Set() {
		return serve.Dialer{}, nil
	}
	src, err := tlsid.Load(sf.files, logger)
	if err != nil {
		return serve.Dialer{}, err
	}
	go src.Watch(ctx, sf.reload)
	return serve.NewDialer(src, ""), nil
}

// serve is the server's security for listen, with its dialer: TLS with the
// authorization policy, or plaintext — refused on a non-loopback address
// unless --plaintext asks for it, and logged. Profiles go on the metrics
// listener (plain HTTP, TLS or not) only on loopback unless --pprof-public
// asks for more.
func (sf *securityFlags) serve(ctx context.Context, logger *slog.Logger, listen, metricsListen string) (serve.Security, error) {
	if sf.reload <= 0 {
		return serve.Security{}, fmt.Errorf("--tls-reload-interval: %v is not positive", sf.reload)
	}
	if sf.maxAge < 0 {
		return serve.Security{}, fmt.Errorf("--max-connection-age: %v is negative (0 = never)", sf.maxAge)
	}
	if err := sf.checkPprof(logger, metricsListen); err != nil {
		return serve.Security{}, err
	}
	if !sf.files.Set() {
		if !sf.plaintext && !loopback(listen) {
			return serve.Security{}, fmt.Errorf("--listen %s: serving plaintext beyond loopback needs --plaintext (or give --tls-cert, --tls-key and --tls-ca)", listen)
		}
		logger.Warn("serving plaintext: no TLS, no authentication, no authorization; anyone who reaches the port can read the log and write", "listen", listen)
		return serve.Security{Pprof: sf.pprof}, nil
	}
	if sf.plaintext {
		return serve.Security{}, errors.New("--plaintext: not with --tls-cert, --tls-key and --tls-ca")
	}
	if sf.peerCalls < 1 || sf.peerConns < 1 {
		return serve.Security{}, fmt.Errorf("--max-peer-calls %d, --max-peer-conns %d: both must be positive", sf.peerCalls, sf.peerConns)
	}
	src, err := tlsid.Load(sf.files, logger)
	if err != nil {
		return serve.Security{}, err
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: sf.trust, Reflection: sf.reflection, PolicyFile: sf.policy, Logger: logger})
	if err != nil {
		return serve.Security{}, err
	}
	go az.Watch(ctx, sf.reload)
	go src.Watch(ctx, sf.reload)
	// Under the default policy identities follow its scheme, so a server
	// dialled for a purpose (a replica's primary, a log store) must be of
	// the class it needs; a custom policy's need not.
	classTrust := sf.trust
	if sf.policy != "" {
		classTrust = ""
	}
	logger.Info("serving TLS 1.3 with client certificates", "identity", src.Identity(), "not_after", src.NotAfter(), "policy", policyName(sf.policy, sf.trust))
	return serve.Security{TLS: src, Dialer: serve.NewDialer(src, classTrust), Authz: az, MaxConnectionAge: sf.maxAge, Pprof: sf.pprof, MaxPeerCalls: sf.peerCalls, MaxPeerConns: sf.peerConns}, nil
}

// checkPprof refuses --pprof where its profiles would reach beyond
// loopback, unless --pprof-public says so (and then it is logged).
func (sf *securityFlags) checkPprof(logger *slog.Logger, metricsListen string) error {
	switch {
	case sf.pprofPublic && !sf.pprof:
		return errors.New("--pprof-public: only with --pprof")
	case !sf.pprof:
		return nil
	case metricsListen == "":
		return errors.New("--pprof: needs --metrics-listen (the profiles are served there)")
	case !loopback(metricsListen) && !sf.pprofPublic:
		return fmt.Errorf("--pprof: --metrics-listen %s is not loopback, and the profiles would be open to anyone who reaches it (plain HTTP): bind it to loopback, or add --pprof-public", metricsListen)
	case !loopback(metricsListen):
		logger.Warn("serving Go profiles beyond loopback (--pprof-public): anyone who reaches the metrics port can read them", "metrics_listen", metricsListen)
	}
	return nil
}

func policyName(file, trust string) string {
	if file != "" {
		return file
	}
	return "default for spiffe://" + trust
}

// loopback reports whether listen binds only a loopback address.
func loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
