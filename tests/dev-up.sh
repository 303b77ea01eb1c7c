#!/usr/bin/env bash
# vcp's main job on one machine: sets the machine up (first run: builds Kubernetes from Go
# modules, ~25 minutes cold) and starts the dev environment in the background: a host
# Kubernetes cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok workers, a
# process node), Postgres and `vcp serve`, which provisions tenant `demo` and hands out its
# admin kubeconfig. State, logs and kubeconfigs go to $VCP_DEV_STATE_DIR (default: .vcp-dev).
#
#   [VCP_DEV_TENANT=NAME] tests/dev-up.sh [--workers N]
#   source .vcp-dev/env && kubectl --kubeconfig .vcp-dev/demo.kubeconfig get ns
#   target/debug/vcp-dev down --state-dir .vcp-dev
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
state_dir=${VCP_DEV_STATE_DIR:-$repo/.vcp-dev}
export VCP_DEV_TENANT=${VCP_DEV_TENANT:-demo}

tests/setup.sh
cargo build --locked --workspace --bins
target/debug/vcp-dev up --state-dir "$state_dir" "$@"
echo
source "$state_dir/env"
kubectl get nodes
kubectl --kubeconfig "$state_dir/$VCP_DEV_TENANT.kubeconfig" get namespaces
