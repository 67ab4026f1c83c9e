//go:build !unix

package bench

import (
	"os"
	"os/exec"
)

// runAsUser leaves cmd as it is where process groups and credentials do
// not exist; lookupRunAs never returns a user there (no root).
func runAsUser(*exec.Cmd, *osUser) {}

// fastShutdown kills the process where it cannot be signalled.
func fastShutdown(p *os.Process) error { return p.Kill() }

// processRunning reports false: fastShutdown killed the process already.
func processRunning(int) bool { return false }
