#!/usr/bin/env bash
# vcp's main job on one machine: sets the machine up (first run: builds Kubernetes, containerd
# and the CNI plugins from Go modules, ~30 minutes cold) and starts the dev environment in the
# background: a host Kubernetes cluster (etcd, kube-apiserver, controller-manager, scheduler,
# kwok workers, the process node) with a real node (kubelet, containerd, runc, kube-proxy,
# NetworkPolicy enforced), then vcp installed into it with its Helm chart (`charts/vcp`: two
# replicas and the evaluation Postgres, containers on the real node from images built here),
# which provisions tenant `demo` there and hands out its admin kubeconfig. Last, a demo
# workload in the tenant (a web server and its Service) is reached from a pod of the tenant.
# The API is the chart's Service, a NodePort on the real node's address (printed). State, logs
# and kubeconfigs go to $VCP_DEV_STATE_DIR (default: .vcp-dev).
#
#   [VCP_DEV_TENANT=NAME] tests/dev-up.sh [--workers N] [--local]
#   source .vcp-dev/env && vcp tenant list
#   kubectl --kubeconfig .vcp-dev/demo.kubeconfig get ns
#   target/debug/vcp-dev down --state-dir .vcp-dev
#
# --local runs `vcp serve` as a local process on the process node instead of the chart on the
# real node (quicker to iterate on vcp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
state_dir=${VCP_DEV_STATE_DIR:-$repo/.vcp-dev}
export VCP_DEV_TENANT=${VCP_DEV_TENANT:-demo}

tests/setup.sh
# The real node's images hold the workspace's vcp, vcp-syncer and vcp-devnode-postgres, so
# every binary is built before `up`.
cargo build --locked --workspace --bins
real_node=(--real-node)
for a in "$@"; do [[ $a == --local ]] && real_node=(); done
target/debug/vcp-dev up --state-dir "$state_dir" "${real_node[@]}" "$@"
echo
source "$state_dir/env"
kubectl get nodes
# Without vcp (--no-platform) there is no API and no tenant to show.
if grep -q "^export VCP_API_URL=" "$state_dir/env"; then
  vcp tenant list
  tk=(kubectl --kubeconfig "$state_dir/$VCP_DEV_TENANT.kubeconfig")
  "${tk[@]}" get namespaces
  if ((${#real_node[@]})); then
    # The demo workload: a web server behind a Service, fetched from another pod by the
    # Service's name (busybox's nslookup asks the tenant's CoreDNS; its nc connects).
    "${tk[@]}" apply -f - >/dev/null <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: hello, namespace: default}
spec:
  selector: {matchLabels: {app: hello}}
  template:
    metadata: {labels: {app: hello}}
    spec:
      containers:
        - name: web
          image: vcp.dev/busybox:1.35
          command: [sh, -c, "mkdir -p /www && echo hello from the demo tenant > /www/index.html && exec httpd -f -p 8080 -h /www"]
          readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: hello, namespace: default}
spec:
  selector: {app: hello}
  ports: [{port: 80, targetPort: 8080}]
YAML
    "${tk[@]}" rollout status deployment/hello --timeout=120s >/dev/null
    "${tk[@]}" delete pod hello-client --ignore-not-found >/dev/null
    "${tk[@]}" run hello-client --image=vcp.dev/busybox:1.35 --restart=Never --command -- sh -c \
      'ip=$(nslookup hello.default.svc.cluster.local | awk "/^Address: /{print \$2}" | tail -n1); printf "GET / HTTP/1.0\r\n\r\n" | nc -w 5 "$ip" 80 | tail -n1' >/dev/null
    for _ in $(seq 60); do
      phase=$("${tk[@]}" get pod hello-client -o jsonpath='{.status.phase}')
      [[ $phase == Succeeded || $phase == Failed ]] && break
      sleep 1
    done
    answer=$("${tk[@]}" logs hello-client)
    echo "demo workload, through its Service: $answer"
    [[ $answer == "hello from the demo tenant" ]]
  fi
fi
