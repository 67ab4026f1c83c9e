//go:build !unix

package bench

import (
	"os"
	"os/exec"
)

// ownProcessGroup leaves cmd as it is where process groups do not exist.
func ownProcessGroup(*exec.Cmd) {}

// terminate kills the process where it cannot be asked to stop.
func terminate(p *os.Process) error { return p.Kill() }
