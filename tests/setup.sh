#!/usr/bin/env bash
# Prepares a machine for vcp's dev environment and tests: installs the Debian packages they
# need if missing, checks the toolchains, installs schemathesis from PyPI into a virtualenv
# (~/.cache/vcp/schemathesis) and builds the Kubernetes binaries from Go modules into
# ~/.cache/vcp/bin (skipping what is already there), and the S3 server of the dev cluster's
# backups from crates.io into the same cache. Safe to run any number of times; warm,
# it takes a couple of seconds.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

say() { printf '[setup] %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# Debian packages: the Postgres server (ephemeral databases), setpriv (util-linux: runs
# postgres unprivileged and ties test processes to their parent), iproute2 (network
# namespaces for the process-running node), Python with venv (schemathesis, below), curl and
# script, Chromium and chromedriver.
missing=()
[[ -x /usr/lib/postgresql/15/bin/postgres ]] || missing+=(postgresql-15)
command -v setpriv >/dev/null || missing+=(util-linux)
command -v ip >/dev/null || missing+=(iproute2)
# curl (the kubelet endpoint test knocks with and without certificates) and script (util-linux,
# a pty for an interactive kubectl exec).
command -v curl >/dev/null || missing+=(curl)
command -v script >/dev/null || missing+=(bsdutils)
# The real node (docs/dev-cluster.md): runc under containerd, iptables and nftables for the
# CNI plugins, kube-proxy and the node's own rules, and a static busybox for its test image.
[[ -x /usr/sbin/runc ]] || missing+=(runc)
command -v iptables >/dev/null || missing+=(iptables)
command -v nft >/dev/null || missing+=(nftables)
# (Debian's dynamic busybox also installs /bin/busybox: ask for the static package by name.)
dpkg -s busybox-static >/dev/null 2>&1 || missing+=(busybox-static)
# socat: the real node reaches the apiserver (on the host's loopback) through it.
command -v socat >/dev/null || missing+=(socat)
# dig and OpenBSD's nc for the real node's agnhost image, which the conformance suite runs them
# in (tests/dev/src/images.rs, AGNHOST_TOOLS; curl is above).
[[ -x /usr/bin/dig ]] || missing+=(bind9-dnsutils)
[[ -x /usr/bin/nc.openbsd ]] || missing+=(netcat-openbsd)
python3 -c 'import ensurepip, venv' 2>/dev/null || missing+=(python3 python3-venv)
# Headless Chromium and its WebDriver server: the web console's browser test drives them
# (orchestrator/tests/fleet.rs, docs/console.md), and fails without them.
[[ -x /usr/bin/chromium ]] || missing+=(chromium)
[[ -x /usr/bin/chromedriver ]] || missing+=(chromium-driver)
if ((${#missing[@]})); then
  sudo=""
  [[ $(id -u) -eq 0 ]] || sudo=sudo
  say "installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v go >/dev/null || die "Go is not installed; vcp builds Kubernetes from Go modules and needs Go >= 1.26"
gov=$(go env GOVERSION | sed 's/^go//')
[[ $(printf '%s\n1.26\n' "$gov" | sort -V | head -n1) == 1.26 ]] || die "Go $gov is too old; Kubernetes 1.37 needs Go >= 1.26"
command -v cargo >/dev/null || die "Rust (cargo) is not installed"
cargo fmt --version >/dev/null 2>&1 || die "rustfmt is missing (rustup component add rustfmt)"
cargo clippy --version >/dev/null 2>&1 || die "clippy is missing (rustup component add clippy)"

# Schemathesis for the API contract test (orchestrator/tests/contract.rs), from PyPI into its
# own virtualenv, every package pinned by tests/contract/requirements.txt; rebuilt when that
# file changes.
venv=${VCP_SCHEMATHESIS_VENV:-$HOME/.cache/vcp/schemathesis}
req="$repo/tests/contract/requirements.txt"
if ! cmp -s "$req" "$venv/requirements.txt"; then
  say "installing schemathesis into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r "$req"
  cp "$req" "$venv/requirements.txt"
fi

# The dev cluster's S3-compatible server for backups (tests/dev/src/s3.rs, which pins the
# version): s3s-fs (Apache-2.0) built from crates.io with its own lock file, into the binary
# cache beside the Kubernetes binaries. MinIO would be the obvious one, but it is AGPL. Built
# in the background while the Go build runs (cold, about 2.5 min of its own; much of the Go
# build waits on module downloads, so the two share the cores rather than queue).
s3s_version=$(sed -n 's/^pub const VERSION: &str = "\(.*\)";$/\1/p' "$repo/tests/dev/src/s3.rs")
[[ -n $s3s_version ]] || die "tests/dev/src/s3.rs pins no s3s-fs version"
bin_dir=${VCP_BIN_DIR:-$HOME/.cache/vcp/bin}
s3s_pid=""
if [[ ! -x $bin_dir/s3s-fs-$s3s_version ]]; then
  say "building s3s-fs $s3s_version from crates.io in the background"
  mkdir -p "$bin_dir"
  s3s_log=$(mktemp)
  (
    root=$(mktemp -d)
    cargo install --quiet --locked --root "$root" --version "$s3s_version" --features binary s3s-fs
    install -m 0755 "$root/bin/s3s-fs" "$bin_dir/s3s-fs-$s3s_version"
    rm -rf "$root"
  ) >"$s3s_log" 2>&1 &
  s3s_pid=$!
fi

"$repo/tests/kube-bin/build.sh"

if [[ -n $s3s_pid ]]; then
  wait "$s3s_pid" || { cat "$s3s_log" >&2; die "building s3s-fs $s3s_version failed"; }
  rm -f "$s3s_log"
  say "s3s-fs $s3s_version built"
fi
