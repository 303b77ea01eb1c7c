//! Where the binaries built by `tests/kube-bin/build.sh` live, and which versions they are.
//!
//! The versions are read from the pinned go.mod files at compile time, so the build script and
//! this harness can never disagree about what `kube-apiserver-v1.N.x` should be called.

use crate::{Error, Result};
use std::path::PathBuf;

const K8S_NEWEST_GOMOD: &str = include_str!("../../kube-bin/k8s-v1.37/go.mod");
const K8S_PREVIOUS_GOMOD: &str = include_str!("../../kube-bin/k8s-v1.36/go.mod");
const K8S_OLDEST_GOMOD: &str = include_str!("../../kube-bin/k8s-v1.35/go.mod");
const ETCD_GOMOD: &str = include_str!("../../kube-bin/etcd/go.mod");
const KWOK_GOMOD: &str = include_str!("../../kube-bin/kwok/go.mod");
const COREDNS_GOMOD: &str = include_str!("../../kube-bin/coredns/go.mod");
const HELM_GOMOD: &str = include_str!("../../kube-bin/helm/go.mod");
const METRICS_SERVER_GOMOD: &str = include_str!("../../kube-bin/metrics-server/go.mod");
const CONTAINERD_GOMOD: &str = include_str!("../../kube-bin/containerd/go.mod");
const CNI_PLUGINS_GOMOD: &str = include_str!("../../kube-bin/cni-plugins/go.mod");
const CRI_TOOLS_GOMOD: &str = include_str!("../../kube-bin/cri-tools/go.mod");
const NETPOL_GOMOD: &str = include_str!("../../kube-bin/kube-network-policies/go.mod");

/// The version a go.mod requires of `module` (a `require` line, single or in a block).
pub fn required_version<'a>(gomod: &'a str, module: &str) -> Option<&'a str> {
    gomod.lines().find_map(|line| {
        let line = line.trim().strip_prefix("require ").unwrap_or(line.trim());
        let mut words = line.split_whitespace();
        (words.next() == Some(module))
            .then(|| words.next())
            .flatten()
    })
}

fn pinned(gomod: &'static str, module: &str) -> &'static str {
    required_version(gomod, module)
        .unwrap_or_else(|| panic!("tests/kube-bin go.mod does not require {module}"))
}

/// Kubernetes releases built for vcp, newest first. The host cluster runs the newest; tenants
/// may run either (and are upgraded from the older to the newer).
pub fn kubernetes_versions() -> [&'static str; 2] {
    [
        pinned(K8S_NEWEST_GOMOD, "k8s.io/kubernetes"),
        pinned(K8S_PREVIOUS_GOMOD, "k8s.io/kubernetes"),
    ]
}

/// Every Kubernetes release built for vcp, newest first: the catalog's three minors, whose
/// kubectl each is tested against tenants.
pub fn supported_kubernetes_versions() -> [&'static str; 3] {
    let [newest, previous] = kubernetes_versions();
    [
        newest,
        previous,
        pinned(K8S_OLDEST_GOMOD, "k8s.io/kubernetes"),
    ]
}

/// The Kubernetes release the host cluster runs.
pub fn host_kubernetes_version() -> &'static str {
    kubernetes_versions()[0]
}

/// The pinned version of a non-Kubernetes component (`etcd`, `kwok`, `coredns`, `helm`,
/// `metrics-server`, and the real node's containerd, CNI plugins and crictl).
pub fn tool_version(component: &str) -> Option<&'static str> {
    Some(match component {
        "etcd" | "etcdctl" | "etcdutl" => pinned(ETCD_GOMOD, "go.etcd.io/etcd/server/v3"),
        "kwok" => pinned(KWOK_GOMOD, "sigs.k8s.io/kwok"),
        "coredns" => pinned(COREDNS_GOMOD, "github.com/coredns/coredns"),
        "helm" => pinned(HELM_GOMOD, "helm.sh/helm/v4"),
        "metrics-server" => pinned(METRICS_SERVER_GOMOD, "sigs.k8s.io/metrics-server"),
        "containerd" | "containerd-shim-runc-v2" | "ctr" => {
            pinned(CONTAINERD_GOMOD, "github.com/containerd/containerd/v2")
        }
        "cni-bridge" | "cni-host-local" | "cni-loopback" | "cni-portmap" => {
            pinned(CNI_PLUGINS_GOMOD, "github.com/containernetworking/plugins")
        }
        "crictl" => pinned(CRI_TOOLS_GOMOD, "sigs.k8s.io/cri-tools"),
        "kube-network-policies" => pinned(NETPOL_GOMOD, "sigs.k8s.io/kube-network-policies"),
        _ => return None,
    })
}

/// The cache that `build.sh` fills: `$VCP_BIN_DIR`, else `~/.cache/vcp/bin`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("VCP_BIN_DIR") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/vcp/bin")
}

/// The path of a built binary, or an error that names the command that builds it.
pub fn binary(component: &str, version: &str) -> Result<PathBuf> {
    let path = bin_dir().join(format!("{component}-{version}"));
    if path.is_file() {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            component: component.to_owned(),
            version: version.to_owned(),
            path,
        })
    }
}

/// A pinned tool's binary (`etcd`, `kwok`, `coredns`, `helm`, `metrics-server`).
pub fn tool(component: &str) -> Result<PathBuf> {
    let version = tool_version(component).unwrap_or("unknown");
    binary(component, version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn required_version_reads_single_and_block_requires() {
        let gomod = "module x\n\nrequire k8s.io/kubernetes v1.37.1\n\nrequire (\n\tgo.etcd.io/etcd/server/v3 v3.6.16 // indirect\n)\n";
        assert_eq!(
            required_version(gomod, "k8s.io/kubernetes"),
            Some("v1.37.1")
        );
        assert_eq!(
            required_version(gomod, "go.etcd.io/etcd/server/v3"),
            Some("v3.6.16")
        );
        assert_eq!(required_version(gomod, "k8s.io/api"), None);
    }

    #[test]
    fn pinned_kubernetes_versions_are_two_consecutive_minors_newest_first() {
        let [newest, previous] = kubernetes_versions();
        let minor = |v: &str| v.split('.').nth(1).unwrap().parse::<u32>().unwrap();
        assert!(newest.starts_with("v1.") && previous.starts_with("v1."));
        assert_eq!(minor(newest), minor(previous) + 1);
    }

    #[test]
    fn the_supported_releases_are_three_consecutive_minors_newest_first() {
        let minor = |v: &str| v.split('.').nth(1).unwrap().parse::<u32>().unwrap();
        let [a, b, c] = supported_kubernetes_versions();
        assert_eq!((minor(a), minor(b)), (minor(b) + 1, minor(c) + 1));
    }

    #[test]
    fn missing_binary_names_the_build_command() {
        let err = binary("kube-apiserver", "v0.0.0-never")
            .unwrap_err()
            .to_string();
        assert!(err.contains("tests/kube-bin/build.sh"), "{err}");
        assert!(err.contains("kube-apiserver-v0.0.0-never"), "{err}");
    }
}
