//go:build unix

package bench

import (
	"os"
	"os/exec"
	"syscall"
)

// ownProcessGroup starts cmd in a process group of its own, so that a
// Ctrl-C in the terminal reaches the benchmark only, which stops the
// server itself once its keys are cleaned up.
func ownProcessGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// terminate asks the process to stop (SIGTERM: redis-server exits at once,
// saving nothing with --save "").
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
