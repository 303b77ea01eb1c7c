// devnode-streams serves the streaming half of the devnode's kubelet API: exec and
// port-forward, in the SPDY and WebSocket protocols the apiserver speaks to kubelets, through
// k8s.io/cri-streaming (as kwok does). The devnode terminates TLS, checks the call and passes
// the request on, byte for byte, over a Unix socket, adding what it knows about the pod:
//
//	Vcp-Pid     a process of the container: exec enters its network and mount namespaces,
//	            working directory and environment (nsenter), as `kubectl exec` enters a container
//	Vcp-Pod-Ip  the pod's IP: port-forward dials it
//
// `kubectl exec -t` gets a pseudo-terminal (creack/pty) sized and resized as kubectl asks.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/creack/pty"
	"k8s.io/cri-streaming/pkg/streaming/portforward"
	"k8s.io/cri-streaming/pkg/streaming/remotecommand"
	utilexec "k8s.io/utils/exec"
)

const (
	idleTimeout           = 4 * time.Hour
	streamCreationTimeout = 30 * time.Second
)

type executor struct{ pid int }

func (e executor) ExecInContainer(ctx context.Context, name, uid, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan remotecommand.TerminalSize, timeout time.Duration) error {
	if len(cmd) == 0 {
		return errors.New("no command")
	}
	proc := fmt.Sprintf("/proc/%d", e.pid)
	env, err := os.ReadFile(proc + "/environ")
	if err != nil {
		return fmt.Errorf("container process %d of %s/%s is gone: %w", e.pid, name, container, err)
	}
	args := []string{"--target", strconv.Itoa(e.pid), "--net", "--mount"}
	if cwd, err := os.Readlink(proc + "/cwd"); err == nil && filepath.IsAbs(cwd) {
		args = append(args, "--wd="+cwd)
	}
	args = append(args, "--")
	args = append(args, cmd...)
	c := exec.CommandContext(ctx, "nsenter", args...)
	for _, kv := range strings.Split(string(env), "\x00") {
		if kv != "" {
			c.Env = append(c.Env, kv)
		}
	}
	if tty {
		err = runWithTTY(c, in, out, resize)
	} else {
		if in != nil {
			c.Stdin = in
		}
		c.Stdout, c.Stderr = out, errOut
		err = c.Run()
	}
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) && exitErr.Exited() {
		return utilexec.CodeExitError{Err: err, Code: exitErr.ExitCode()}
	}
	return err
}

// runWithTTY runs c on a new pseudo-terminal: in is typed into it, what it shows goes to out
// (a terminal has no separate stderr), and resize events set its size.
func runWithTTY(c *exec.Cmd, in io.Reader, out io.WriteCloser, resize <-chan remotecommand.TerminalSize) error {
	c.Env = append(c.Env, "TERM=xterm")
	f, err := pty.Start(c)
	if err != nil {
		return err
	}
	defer f.Close()
	go func() {
		for size := range resize {
			if size.Width > 0 && size.Height > 0 {
				_ = pty.Setsize(f, &pty.Winsize{Rows: size.Height, Cols: size.Width})
			}
		}
	}()
	if in != nil {
		go func() { _, _ = io.Copy(f, in) }()
	}
	copied := make(chan struct{})
	go func() {
		// Ends with EIO once the process and its children have closed the terminal.
		_, _ = io.Copy(out, f)
		close(copied)
	}()
	err = c.Wait()
	select {
	case <-copied:
	case <-time.After(time.Second):
	}
	return err
}

type forwarder struct{ ip string }

func (f forwarder) PortForward(ctx context.Context, name, uid string, port int32, stream io.ReadWriteCloser) error {
	defer stream.Close()
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", net.JoinHostPort(f.ip, strconv.Itoa(int(port))))
	if err != nil {
		return fmt.Errorf("pod %s port %d: %w", name, port, err)
	}
	defer conn.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, stream); done <- struct{}{} }()
	go func() { _, _ = io.Copy(stream, conn); done <- struct{}{} }()
	<-done
	return nil
}

// parts splits /<kind>/<ns>/<pod>[/<uid>]/<container>.
func parts(path string) []string { return strings.Split(strings.Trim(path, "/"), "/") }

func serveExec(w http.ResponseWriter, r *http.Request) {
	p := parts(r.URL.Path)
	pid, err := strconv.Atoi(r.Header.Get("Vcp-Pid"))
	if err != nil || len(p) < 4 {
		http.Error(w, "bad exec call", http.StatusBadRequest)
		return
	}
	opts, err := remotecommand.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	container := p[len(p)-1]
	remotecommand.ServeExec(w, r, executor{pid}, p[1]+"/"+p[2], "", container, r.URL.Query()["command"], opts, idleTimeout, streamCreationTimeout, remotecommand.SupportedStreamingProtocols)
}

func servePortForward(w http.ResponseWriter, r *http.Request) {
	p := parts(r.URL.Path)
	ip := r.Header.Get("Vcp-Pod-Ip")
	if net.ParseIP(ip) == nil || len(p) < 3 {
		http.Error(w, "bad port-forward call", http.StatusBadRequest)
		return
	}
	opts, err := portforward.NewV4Options(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	portforward.ServePortForward(w, r, forwarder{ip}, p[1]+"/"+p[2], "", opts, idleTimeout, streamCreationTimeout, portforward.SupportedProtocols)
}

func main() {
	socket := flag.String("socket", "", "Unix socket to serve on")
	flag.Parse()
	if *socket == "" {
		log.Fatal("--socket is required")
	}
	_ = os.Remove(*socket)
	l, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/exec/", serveExec)
	mux.HandleFunc("/portForward/", servePortForward)
	log.Printf("devnode-streams: serving on %s", *socket)
	log.Fatal(http.Serve(l, mux))
}
