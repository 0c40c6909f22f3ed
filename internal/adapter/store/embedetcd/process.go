package embedetcd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"time"
)

// memberEnv carries a child's memberSpec (JSON) from StartProcesses to
// MemberMain.
const memberEnv = "TLGATE_EMBEDETCD_MEMBER"

// readyLine is what a child prints once its member is ready.
const readyLine = "embedetcd: ready"

// process is a member running in a child process.
type process struct {
	cmd *exec.Cmd
	// stdin is held open: the child runs while it is.
	stdin io.WriteCloser
	done  chan struct{}
}

// MemberMain runs an etcd member and never returns when this process is a
// child of StartProcesses; otherwise it returns at once. A test binary's
// TestMain calls it first thing. The member runs until its stdin closes
// (the parent is gone) or it is killed.
func MemberMain() {
	raw, ok := os.LookupEnv(memberEnv)
	if !ok {
		return
	}
	var spec memberSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "embedetcd:", err)
		os.Exit(2)
	}
	e, err := spec.run()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(readyLine)
	_, _ = io.Copy(io.Discard, os.Stdin)
	e.Close()
	os.Exit(0)
}

// startProcess starts a child running spec and waits for its ready line.
func startProcess(spec memberSpec) (*process, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), memberEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("embedetcd: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("embedetcd: start %s: %w", spec.Name, err)
	}
	p := &process{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	ready := make(chan bool, 1)
	go func() {
		sc := bufio.NewScanner(out)
		seen := false
		for sc.Scan() {
			if !seen && strings.TrimSpace(sc.Text()) == readyLine {
				seen = true
				ready <- true
			}
		}
		if !seen {
			ready <- false
		}
		_ = cmd.Wait()
		close(p.done)
	}()
	select {
	case ok := <-ready:
		if ok {
			return p, nil
		}
		p.kill()
		return nil, fmt.Errorf("embedetcd: %s exited before it was ready", spec.Name)
	case <-time.After(StartTimeout):
		p.kill()
		return nil, fmt.Errorf("%w: %s after %s", ErrNotReady, spec.Name, StartTimeout)
	}
}

// kill kills the child and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.stdin.Close()
}
