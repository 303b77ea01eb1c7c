module vcp.dev/devnode-streams

go 1.26.0

require (
	github.com/creack/pty v1.1.24
	k8s.io/cri-streaming v0.36.1
	k8s.io/utils v0.0.0-20260210185600-b8788abfbbc2
)

require (
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/moby/spdystream v0.5.1 // indirect
	golang.org/x/net v0.49.0 // indirect
	k8s.io/klog/v2 v2.140.0 // indirect
	k8s.io/streaming v0.36.1 // indirect
)
