// Command walship runs the walship services: a primary that commits
// transactions and ships its WAL, replicas that apply it, and log stores that
// keep it. See `walship help`.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/walship/walship/app/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
