// Command pause is the pod sandbox of the realkube test cluster: the process
// that holds a pod's namespaces while its containers come and go. No image
// can be pulled here, so registry.k8s.io/pause is replaced by this static
// binary, packed into an image by realkube.WriteImage.
//
// Like the upstream pause it waits for SIGINT or SIGTERM and exits 0; as
// PID 1 of a pod that shares its process namespace it also reaps the
// zombies that are re-parented to it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			return
		}
		reap()
	}
}

// reap collects every exited child without blocking.
func reap() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
