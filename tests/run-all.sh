#!/usr/bin/env bash
# Every check and test of vcp, exactly what CI runs (.ci/run calls this): set-up, formatting,
# lints, unit tests and integration tests against a real dev cluster and Postgres.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$SECONDS
# A clean clone gains nothing from incremental caches, and they are a third of target/.
export CARGO_INCREMENTAL=${CARGO_INCREMENTAL:-0}
step() { printf '\n=== %s (%ss)\n' "$*" "$((SECONDS - start))"; }

step "setup"
# The conformance suite (opt-in in the binary cache) for the CI-sized subset
# (tests/dev/tests/conformance.rs); built in the same Go build as Kubernetes, whose compiled
# packages it shares.
export VCP_KUBE_BIN_EXTRA="conformance,${VCP_KUBE_BIN_EXTRA:-}"
df -h "$repo" | awk 'NR==2 {print "disk: " $4 " free on " $6}'
tests/setup.sh
step "cargo fmt --check"
cargo fmt --all --check
step "import circles (tests/import-circles.py)"
# Modules use each other one way, file by file and folder by folder (docs/architecture.md).
python3 tests/import-circles.py syncer/src orchestrator/src
step "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
# One build for tests and the binaries they start (vcp-devnode, vcp-syncer): a separate
# `cargo build --bins` resolves features without dev-dependencies and so compiles most of
# the dependency tree twice, which doubled target/ and once filled the CI disk.
step "cargo test --no-run (builds test binaries and the binaries they start)"
cargo test --locked --workspace --no-run
step "tests: unit, doc, then integration binaries ${VCP_TEST_JOBS:-2} at a time (tests/run-tests.sh)"
tests/run-tests.sh --locked
# Each benchmark once at a small size, its summary line printed. A run fails only past a
# ratio with a wide margin (about four times the goal), never on time: the tenfold syncer
# regression of 2026-11 would have tripped it (docs/benchmarks.md, "CI's benchmark step").
step "benchmarks (small sizes, ratio limits only)"
# A full disk stops etcd mid-run, which a benchmark sees only as an EOF from etcd.
df -h "$repo" /tmp | awk 'NR>1 {print "disk: " $4 " free on " $6}'
bench() { # log, then the bench arguments; a failing run's log is printed
  local log=target/test-logs/bench-$1.log
  shift
  if ! target/debug/vcp-dev bench "$@" 2>"$log"; then
    tail -n 200 "$log"
    return 1
  fi
}
bench sync sync --pods 300 --latency-pods 100 --rate 50 \
  --max-syncer-share 0.5 --max-kib-per-pod 40 \
  --max-tenant-writes-per-pod 4 --max-host-writes-per-pod 1.5
bench provision provision --tenants 2 --idle-seconds 5
bench upgrade upgrade --simulate --tenants 20 --max-failed 0 --max-vcp-share 1.0
step "done"
