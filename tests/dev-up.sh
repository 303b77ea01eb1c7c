#!/usr/bin/env bash
# vcp's main job on one machine: sets the machine up (first run: builds Kubernetes from Go
# modules, ~25 minutes cold) and starts the dev environment in the background: a host
# Kubernetes cluster (etcd, kube-apiserver, controller-manager, scheduler, kwok workers, a
# process node), then vcp installed into it with its Helm chart (`charts/vcp`: two replicas and
# the evaluation Postgres, run as real processes by the process node), which provisions tenant
# `demo` and hands out its admin kubeconfig. The API is the chart's Service, as a NodePort on
# 127.0.0.1 (printed). State, logs and kubeconfigs go to $VCP_DEV_STATE_DIR (default: .vcp-dev).
#
#   [VCP_DEV_TENANT=NAME] tests/dev-up.sh [--workers N] [--local]
#   source .vcp-dev/env && vcp tenant list
#   kubectl --kubeconfig .vcp-dev/demo.kubeconfig get ns
#   target/debug/vcp-dev down --state-dir .vcp-dev
#
# --local runs `vcp serve` as a local process instead of the chart (quicker to iterate on vcp).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
state_dir=${VCP_DEV_STATE_DIR:-$repo/.vcp-dev}
export VCP_DEV_TENANT=${VCP_DEV_TENANT:-demo}

tests/setup.sh
# The process node runs the workspace's vcp, vcp-syncer and vcp-devnode-postgres for the
# chart's images, so every binary is built before `up`.
cargo build --locked --workspace --bins
target/debug/vcp-dev up --state-dir "$state_dir" "$@"
echo
source "$state_dir/env"
kubectl get nodes
# Without vcp (--no-platform) there is no API and no tenant to show.
if grep -q "^export VCP_API_URL=" "$state_dir/env"; then
  vcp tenant list
  kubectl --kubeconfig "$state_dir/$VCP_DEV_TENANT.kubeconfig" get namespaces
fi
