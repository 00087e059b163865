// Command realkube starts and stops the single-node test cluster of
// internal/realkube outside a test (make kube-up, make kube-down):
//
//	realkube images DIR        build pause.tar and walship.tar into DIR
//	realkube up BIN DIR        start the cluster in DIR, run until SIGTERM
//	realkube wait DIR          wait until `up` in DIR is ready (or failed)
//	realkube down DIR          stop `up` in DIR (by its PID) and wait
//
// `up` writes DIR/up.pid first and DIR/ready (the kubeconfig's path) once
// the node is Ready, or DIR/failed with the error.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/walship/walship/internal/realkube"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "realkube:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: realkube images|up|wait|down ... (see the package doc)")
	}
	switch args[0] {
	case "images":
		paths, err := realkube.BuildImages(context.Background(), ".", args[1])
		for _, p := range paths {
			fmt.Println(p)
		}
		return err
	case "up":
		if len(args) != 3 {
			return errors.New("usage: realkube up BIN DIR")
		}
		return up(args[1], args[2])
	case "wait":
		return wait(args[1])
	case "down":
		return down(args[1])
	}
	return fmt.Errorf("unknown command %q", args[0])
}

func up(bin, dir string) error {
	bin, _ = filepath.Abs(bin)
	dir, _ = filepath.Abs(dir)
	for _, f := range []string{"ready", "failed"} {
		_ = os.Remove(filepath.Join(dir, f))
	}
	if err := os.WriteFile(filepath.Join(dir, "up.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	imgDir := filepath.Join(dir, "images")
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return err
	}
	images, err := realkube.BuildImages(ctx, ".", imgDir)
	if err != nil {
		_ = os.WriteFile(filepath.Join(dir, "failed"), []byte(err.Error()), 0o644)
		return err
	}
	c, err := realkube.Start(ctx, realkube.Config{Bin: bin, Dir: filepath.Join(dir, "cluster"), Images: images})
	if err != nil {
		_ = os.WriteFile(filepath.Join(dir, "failed"), []byte(err.Error()), 0o644)
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "ready"), []byte(c.Kubeconfig+"\n"), 0o644); err != nil {
		c.Close()
		return err
	}
	fmt.Printf("realkube: up; export KUBECONFIG=%s\n", c.Kubeconfig)
	<-ctx.Done()
	c.Close()
	_ = os.Remove(filepath.Join(dir, "ready"))
	_ = os.Remove(filepath.Join(dir, "up.pid"))
	return nil
}

func wait(dir string) error {
	deadline := time.Now().Add(15 * time.Minute)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(filepath.Join(dir, "ready")); err == nil {
			fmt.Printf("export KUBECONFIG=%s", b)
			return nil
		}
		if b, err := os.ReadFile(filepath.Join(dir, "failed")); err == nil {
			return errors.New(string(b))
		}
		time.Sleep(time.Second) // a command-line wait, not a test
	}
	return errors.New("not ready within 15m")
}

func down(dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "up.pid"))
	if errors.Is(err, os.ErrNotExist) {
		return nil // not up
	}
	if err != nil {
		return err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("up.pid: %w", err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	for i := 0; i < 120; i++ {
		if syscall.Kill(pid, 0) != nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return fmt.Errorf("pid %d still running after 2m", pid)
}
