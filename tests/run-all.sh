#!/usr/bin/env bash
# Every check and test of vcp, exactly what CI runs (.ci/run calls this): set-up, formatting,
# lints, unit tests and integration tests against a real dev cluster and Postgres.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
start=$SECONDS
step() { printf '\n=== %s (%ss)\n' "$*" "$((SECONDS - start))"; }

step "setup"
tests/setup.sh
step "cargo fmt --check"
cargo fmt --all --check
step "cargo clippy"
cargo clippy --locked --workspace --all-targets -- -D warnings
step "cargo build (binaries the integration tests start: vcp-devnode, vcp-syncer)"
cargo build --locked --workspace --bins
step "cargo test"
cargo test --locked --workspace
step "done"
