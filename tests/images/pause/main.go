// pause: the sandbox ("pause") container of the local cluster's pods. It holds the pod's namespaces
// by doing nothing: it waits for SIGTERM or SIGINT and exits 0, and as PID 1 it reaps the zombies of
// processes that die in the pod's PID namespace.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			return
		}
		reapChildren()
	}
}

// reapChildren collects every exited child without blocking (one SIGCHLD may stand for several).
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
