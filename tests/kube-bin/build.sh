#!/usr/bin/env bash
# Builds every third-party binary the dev cluster and the tests need, from Go
# modules pinned in this folder, into a cache outside the repository:
#
#   $VCP_BIN_DIR (default ~/.cache/vcp/bin)/<component>-<version>
#
# Anything already in the cache is skipped, so a warm run takes a second.
# Nothing prebuilt is downloaded: every binary is compiled here from source
# fetched through the Go module proxy. Versions come from the go.mod files
# beside this script (one module per tool, so their dependency graphs never
# have to agree with each other).
#
#   tests/kube-bin/build.sh            build everything missing
#   tests/kube-bin/build.sh --list     print "<component> <version> <path> <built|missing>"
#
# Groups marked `optin=NAME` are built only when VCP_KUBE_BIN_EXTRA (a comma-separated list)
# names them: the conformance suite takes about 20 minutes cold and only `vcp-dev conformance`
# uses it, so neither setup nor CI builds it (`--list` shows them all, with `optional`).
set -euo pipefail
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
here=$(cd "$(dirname "$0")" && pwd)
bin_dir=${VCP_BIN_DIR:-$HOME/.cache/vcp/bin}
mkdir -p "$bin_dir"

# Order: what the host cluster needs first.
# module-dir | module whose version names the binaries | packages (component=package)
#   [| build options: NAME=VALUE environment for go build, tags=a,b for -tags, test=a,b for
#      components that are a package's test binary (go test -c), optin=NAME (see above),
#      strays=ok where the module dir pins a package of another module on purpose]
groups=(
  "etcd|go.etcd.io/etcd/server/v3|etcd=go.etcd.io/etcd/server/v3 etcdctl=go.etcd.io/etcd/etcdctl/v3 etcdutl=go.etcd.io/etcd/etcdutl/v3"
  "kwok|sigs.k8s.io/kwok|kwok=sigs.k8s.io/kwok/cmd/kwok"
  "k8s-v1.37|k8s.io/kubernetes|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubectl=k8s.io/kubernetes/cmd/kubectl kubelet=k8s.io/kubernetes/cmd/kubelet kube-proxy=k8s.io/kubernetes/cmd/kube-proxy agnhost=k8s.io/kubernetes/test/images/agnhost"
  "k8s-v1.36|k8s.io/kubernetes|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kubectl=k8s.io/kubernetes/cmd/kubectl"
  "k8s-v1.35|k8s.io/kubernetes|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kubectl=k8s.io/kubernetes/cmd/kubectl"
  "coredns|github.com/coredns/coredns|coredns=github.com/coredns/coredns"
  "helm|helm.sh/helm/v4|helm=helm.sh/helm/v4/cmd/helm"
  # The host's resource metrics (kubectl top), which tenant syncers serve translated.
  "metrics-server|sigs.k8s.io/metrics-server|metrics-server=sigs.k8s.io/metrics-server/cmd/metrics-server"
  # The real node (docs/dev-cluster.md): containerd and its runc shim without cgo (no
  # btrfs, devmapper or zfs snapshotters: overlayfs and native only), the CNI plugins of a
  # bridge network, crictl.
  "containerd|github.com/containerd/containerd/v2|containerd=github.com/containerd/containerd/v2/cmd/containerd containerd-shim-runc-v2=github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 ctr=github.com/containerd/containerd/v2/cmd/ctr|CGO_ENABLED=0 tags=no_btrfs,no_devmapper,no_zfs"
  "cni-plugins|github.com/containernetworking/plugins|cni-bridge=github.com/containernetworking/plugins/plugins/main/bridge cni-host-local=github.com/containernetworking/plugins/plugins/ipam/host-local cni-loopback=github.com/containernetworking/plugins/plugins/main/loopback cni-portmap=github.com/containernetworking/plugins/plugins/meta/portmap|CGO_ENABLED=0"
  "cri-tools|sigs.k8s.io/cri-tools|crictl=sigs.k8s.io/cri-tools/cmd/crictl|CGO_ENABLED=0"
  # NetworkPolicy on the real node: the policies are evaluated in user space, first packet of
  # each connection, by kube-network-policies (docs/dev-cluster.md says why this one).
  "kube-network-policies|sigs.k8s.io/kube-network-policies|kube-network-policies=sigs.k8s.io/kube-network-policies/cmd|CGO_ENABLED=0"
  # Our own module (module "local"): named by a hash of its source, and linked as
  # <bin_dir>/devnode-streams, where the devnode looks for it.
  "devnode-streams|local|devnode-streams=vcp.dev/devnode-streams"
  # The conformance suite of the default minor and the ginkgo runner built against the same
  # ginkgo release (docs/conformance.md). Opt-in: VCP_KUBE_BIN_EXTRA=conformance.
  "conformance-v1.37|k8s.io/kubernetes|e2e.test=k8s.io/kubernetes/test/e2e ginkgo=github.com/onsi/ginkgo/v2/ginkgo|test=e2e.test optin=conformance strays=ok"
  # The suite of the oldest supported minor, for tenants of that release
  # (`vcp-dev conformance --minor 1.35`). Opt-in apart: VCP_KUBE_BIN_EXTRA=conformance-oldest.
  "conformance-v1.35|k8s.io/kubernetes|e2e.test=k8s.io/kubernetes/test/e2e ginkgo=github.com/onsi/ginkgo/v2/ginkgo|test=e2e.test optin=conformance-oldest strays=ok"
  # The middle minor's (`vcp-dev conformance --minor 1.36`). VCP_KUBE_BIN_EXTRA=conformance-v1.36.
  "conformance-v1.36|k8s.io/kubernetes|e2e.test=k8s.io/kubernetes/test/e2e ginkgo=github.com/onsi/ginkgo/v2/ginkgo|test=e2e.test optin=conformance-v1.36 strays=ok"
)
extra=",${VCP_KUBE_BIN_EXTRA:-},"

module_version() { # dir module
  if [[ $2 == local ]]; then
    (cd "$here/$1" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-12 | sed 's/^/src-/')
    return
  fi
  (cd "$here/$1" && go list -m -f '{{.Version}}' "$2")
}

# What `go build -o dir/` calls a main package's executable: its last path element, or the
# one before a major-version suffix (go.etcd.io/etcd/etcdctl/v3 -> etcdctl).
exe_name() { # package
  local last=${1##*/}
  if [[ $last =~ ^v[0-9]+$ ]]; then
    local rest=${1%/*}
    last=${rest##*/}
  fi
  echo "$last"
}

# Kubernetes' own build stamps the release into two packages; without it every
# component reports v0.0.0 and version negotiation (and vcp's upgrades) break.
ldflags_for() { # module version
  local flags="-s -w"
  case $1 in
    k8s.io/kubernetes)
      local v=$2 minor; minor=$(echo "$v" | cut -d. -f2)
      local date; date=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["Time"])' \
        "$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$v.info" 2>/dev/null || echo 1970-01-01T00:00:00Z)
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$v -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
      done ;;
    helm.sh/helm/v4) flags+=" -X helm.sh/helm/v4/internal/version.version=$2" ;;
  esac
  echo "$flags"
}

list=false
case ${1:-} in
  --list) list=true ;;
  "") ;;
  *) echo "usage: build.sh [--list]" >&2; exit 2 ;;
esac

if ! command -v go >/dev/null; then
  echo "error: go is not installed; vcp builds Kubernetes from Go modules and needs Go >= 1.26" >&2
  exit 1
fi

# One build at a time per cache: parallel test binaries may all call this.
exec 9>"$bin_dir/.lock"
flock 9

# The binaries are the cache; Go's compile cache for them is 9 GB that no later run reads
# unless a pin changes. Build with a private one and drop it afterwards (VCP_KEEP_GOCACHE=1
# keeps it, for someone iterating on the Go modules).
export GOCACHE=${VCP_GOCACHE:-$bin_dir/.gocache}
cleanup_gocache() { [[ ${VCP_KEEP_GOCACHE:-0} == 1 ]] || rm -rf "$GOCACHE"; }
$list || trap cleanup_gocache EXIT

start_all=$SECONDS
total=0 built=0
for g in "${groups[@]}"; do
  IFS='|' read -r dir module pkgs opts <<<"$g"
  build_env=() tags="" tests="" optin="" strays=""
  for o in $opts; do
    case $o in
      tags=*) tags=${o#tags=} ;;
      test=*) tests=",${o#test=}," ;;
      optin=*) optin=${o#optin=} ;;
      strays=*) strays=${o#strays=} ;;
      *=*) build_env+=("$o") ;;
    esac
  done
  wanted=true
  [[ -n $optin && $extra != *",$optin,"* ]] && wanted=false
  version=$(module_version "$dir" "$module")
  missing=() names=()
  for cp in $pkgs; do
    comp=${cp%%=*} pkg=${cp#*=}
    total=$((total + 1))
    out="$bin_dir/$comp-$version"
    if $list; then
      [[ -x $out ]] && s=built || s=missing
      $wanted || s="$s optional"
      echo "$comp $version $out $s"
    elif ! $wanted; then
      total=$((total - 1))
    elif [[ -x $out ]]; then
      echo "cached   $comp $version"
    else
      missing+=("$pkg"); names+=("$comp")
    fi
  done
  $list && continue
  # A local module's unversioned name points at the build of this checkout's source.
  if ! ((${#missing[@]})); then
    if [[ $module == local ]]; then ln -sfn "$dir-$version" "$bin_dir/$dir"; fi
    continue
  fi

  # Every binary is named by $module's version, so a group whose packages come from several
  # modules (etcd's server, etcdctl, etcdutl) must pin them all at that one release.
  if [[ $module != local && $strays != ok ]] && stray=$(cd "$here/$dir" && go list -f '{{.ImportPath}} {{.Module.Path}}@{{.Module.Version}}' "${missing[@]}" |
    awk -v v="$version" '{ split($2, m, "@"); if (m[2] != v) print }') && [[ -n $stray ]]; then
    echo "error: tests/kube-bin/$dir pins these packages at another release than $module@$version:" >&2
    echo "$stray" >&2
    exit 1
  fi

  echo "building ${names[*]} $version (module $module@$version) ..."
  tmp=$(mktemp -d "$bin_dir/.build.XXXXXX")
  log="$bin_dir/build-$dir.log"
  t0=$SECONDS
  # Main packages in one `go build`; a test binary each with `go test -c`, named after its
  # component.
  builds=() tested=()
  for i in "${!missing[@]}"; do
    if [[ $tests == *",${names[$i]},"* ]]; then tested+=("$i"); else builds+=("${missing[$i]}"); fi
  done
  ldflags=$(ldflags_for "$module" "$version")
  (
    cd "$here/$dir"
    if ((${#builds[@]})); then
      env "${build_env[@]}" go build -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$tmp/" "${builds[@]}"
    fi
    for i in "${tested[@]}"; do
      env "${build_env[@]}" go test -c -trimpath ${tags:+-tags "$tags"} -ldflags "$ldflags" -o "$tmp/${names[$i]}" "${missing[$i]}"
    done
  ) >"$log" 2>&1 &
  pid=$!
  # go build is silent for minutes on a cold cache; a heartbeat shows it is alive.
  while kill -0 "$pid" 2>/dev/null; do
    sleep 5
    (( (SECONDS - t0) % 60 < 5 && SECONDS - t0 >= 60 )) && echo "  ... still building ${names[*]} ($((SECONDS - t0))s)"
  done
  if ! wait "$pid"; then
    rm -rf "$tmp"
    echo "error: building ${names[*]} from Go module $module@$version failed (module dir tests/kube-bin/$dir); last lines of $log:" >&2
    tail -n 20 "$log" >&2
    exit 1
  fi
  for i in "${!missing[@]}"; do
    if [[ $tests == *",${names[$i]},"* ]]; then built_as=${names[$i]}; else built_as=$(exe_name "${missing[$i]}"); fi
    mv "$tmp/$built_as" "$bin_dir/${names[$i]}-$version"
    built=$((built + 1))
  done
  rm -rf "$tmp"
  if [[ $module == local ]]; then ln -sfn "$dir-$version" "$bin_dir/$dir"; fi
  echo "built    ${names[*]} $version in $((SECONDS - t0))s"
done
# The pod sandbox's `pause` (the real node's images, docs/dev-cluster.md), compiled from the C
# source in the Kubernetes module of the default minor as that module's own image build does,
# statically linked so its image needs no other file. Named by the tag its Makefile gives.
k8s_src=$(cd "$here/k8s-v1.37" && go mod download -json k8s.io/kubernetes | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
pause_tag=$(sed -n 's/^TAG ?= //p' "$k8s_src/build/pause/Makefile")
out="$bin_dir/pause-$pause_tag"
total=$((total + 1))
if $list; then
  [[ -x $out ]] && s=built || s=missing
  echo "pause $pause_tag $out $s"
elif [[ -x $out ]]; then
  echo "cached   pause $pause_tag"
else
  command -v gcc >/dev/null || { echo "error: building pause needs gcc (Debian package gcc)" >&2; exit 1; }
  gcc -static -Os -Wall -DVERSION="v$pause_tag-vcp" -o "$out.tmp" "$k8s_src/build/pause/linux/pause.c"
  mv "$out.tmp" "$out"
  built=$((built + 1))
  echo "built    pause $pause_tag"
fi
$list || echo "kube-bin: $total components in $bin_dir ($built built, $((total - built)) cached) in $((SECONDS - start_all))s"
