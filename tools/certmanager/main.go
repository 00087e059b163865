// Command cert-manager-controller runs cert-manager's controllers (Apache-2.0,
// github.com/cert-manager/cert-manager) out of cluster for internal/realkube:
// the Issuers, the Certificates and the CertificateRequests of the
// self-signed and CA issuers, which is what deploy/k8s/components/tls uses.
//
// Upstream's own main lives in a nested module (cmd/controller) that the
// module proxy does not serve (its go.mod replaces the root module with a
// relative path, and it is not tagged on its own), so this is the same
// wiring built from the root module's public packages: one controller
// ContextFactory, every selected controller built from pkg/controller's
// registry and run until SIGTERM, no leader election, no webhook.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	controllerpkg "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"k8s.io/klog/v2"

	// The controllers, each registered by its package's init.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"

	// The issuers the Issuers controller checks and the CertificateRequest
	// controllers sign with.
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "cert-manager-controller:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	namespace := flag.String("namespace", "", "the only namespace to watch (empty: all)")
	clusterNS := flag.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuers' secrets")
	workers := flag.Int("workers", 5, "workers per controller")
	verbosity := flag.Int("v", 0, "log verbosity (klog)")
	flag.Parse()
	if *kubeconfig == "" {
		return fmt.Errorf("--kubeconfig is required")
	}
	klogFlags := flag.NewFlagSet("klog", flag.ContinueOnError)
	klog.InitFlags(klogFlags)
	if err := klogFlags.Set("v", fmt.Sprint(*verbosity)); err != nil {
		return err
	}
	logf.InitLogs()
	defer logf.FlushLogs()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx = logf.NewContext(ctx, klog.Background(), "cert-manager-controller")
	log := logf.FromContext(ctx)

	factory, err := controllerpkg.NewContextFactory(ctx, controllerpkg.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		Namespace:          *namespace,
		IssuerOptions:      controllerpkg.IssuerOptions{ClusterResourceNamespace: *clusterNS},
		CertificateOptions: controllerpkg.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: time.Hour,
			CertificateRequestMaximumBackoffDuration: 32 * time.Hour,
		},
	})
	if err != nil {
		return fmt.Errorf("controller context: %w", err)
	}

	known := controllerpkg.Known()
	names := make([]string, 0, len(known))
	for n := range known {
		names = append(names, n)
	}
	sort.Strings(names)
	ctrls := make([]controllerpkg.Interface, 0, len(names))
	for _, n := range names {
		c, err := known[n](factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", n, err)
		}
		ctrls = append(ctrls, c)
	}
	log.Info("starting controllers", "controllers", strings.Join(names, ","))

	// The informers every controller registered with, started once all
	// have registered (as upstream does).
	built, err := factory.Build()
	if err != nil {
		return err
	}
	built.SharedInformerFactory.Start(ctx.Done())
	built.KubeSharedInformerFactory.Start(ctx.Done())
	built.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	var wg sync.WaitGroup
	errs := make(chan error, len(ctrls))
	for i, c := range ctrls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(*workers, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", names[i], err)
				stop()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	log.Info("controllers stopped")
	return nil
}
