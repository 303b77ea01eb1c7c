//! Service names for the processes the devnode runs, as a hosts file (pure).
//!
//! There is no cluster DNS on the host (and ClusterIPs are not routable here), so each pod gets
//! a hosts file naming every Service that has ready endpoints *on this devnode's pod network*:
//! `<svc>.<ns>.svc`, `<svc>.<ns>.svc.cluster.local`, `<svc>.<ns>`, plain `<svc>` within the
//! pod's own namespace, and per-endpoint names `<hostname>.<svc>.<ns>.svc[.cluster.local]` for
//! endpoints with a hostname (StatefulSet pods behind a headless Service). Endpoints elsewhere
//! (kwok pod IPs) are data, never destinations, and are left out.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Every pod's resolv.conf: its own loopback, where nothing answers, once.
pub const RESOLV_CONF: &str = "# Managed by vcp-devnode: names resolve through /etc/hosts only.\nnameserver 127.0.0.1\noptions timeout:1 attempts:1\n";

/// The cluster domain the devnode serves names under.
pub const CLUSTER_DOMAIN: &str = "cluster.local";

/// The pod a hosts file is for.
#[derive(Debug, Clone)]
pub struct PodIdentity {
    pub namespace: String,
    pub ip: Option<IpAddr>,
    pub hostname: String,
    pub subdomain: Option<String>,
}

/// Renders the hosts file for `pod`. `reachable` tells which endpoint IPs may be dialled.
pub fn hosts_file(
    pod: &PodIdentity,
    services: &[Service],
    slices: &[EndpointSlice],
    reachable: impl Fn(IpAddr) -> bool,
) -> String {
    let known: BTreeSet<(String, String)> = services
        .iter()
        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    // name -> addresses; BTree keeps the file stable, so rewrites happen only on change.
    let mut names: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    for slice in slices {
        let ns = slice.namespace().unwrap_or_default();
        let Some(svc) = slice.labels().get("kubernetes.io/service-name") else {
            continue;
        };
        if !known.contains(&(ns.clone(), svc.clone())) {
            continue;
        }
        for ep in slice.endpoints.iter().flatten() {
            // Absent "ready" means ready (EndpointSlice API semantics).
            let ready = ep.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let ips: Vec<IpAddr> = ep
                .addresses
                .iter()
                .filter_map(|a| a.parse().ok())
                .filter(|ip| reachable(*ip))
                .collect();
            for ip in &ips {
                if let Some(host) = &ep.hostname {
                    // Per-pod names resolve even before the pod is ready: etcd peers must find
                    // each other to become ready at all (publishNotReadyAddresses semantics).
                    for name in service_names(host, svc, &ns) {
                        names.entry(name).or_default().insert(*ip);
                    }
                }
                if ready {
                    for name in service_names("", svc, &ns) {
                        names.entry(name).or_default().insert(*ip);
                    }
                    if ns == pod.namespace {
                        names.entry(svc.clone()).or_default().insert(*ip);
                    }
                }
            }
        }
    }
    let mut out = String::from(
        "# Managed by vcp-devnode.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n",
    );
    if let Some(ip) = pod.ip {
        let mut own = vec![pod.hostname.clone()];
        if let Some(sub) = &pod.subdomain {
            own.extend(service_names(&pod.hostname, sub, &pod.namespace));
        }
        out.push_str(&format!("{ip}\t{}\n", own.join(" ")));
    }
    for (name, ips) in names {
        for ip in ips {
            out.push_str(&format!("{ip}\t{name}\n"));
        }
    }
    out
}

/// `[host.]svc.ns`, `[host.]svc.ns.svc` and `[host.]svc.ns.svc.<domain>`; `<svc>.<ns>` only
/// for the service itself.
fn service_names(host: &str, svc: &str, ns: &str) -> Vec<String> {
    let prefix = if host.is_empty() {
        String::new()
    } else {
        format!("{host}.")
    };
    let mut v = vec![
        format!("{prefix}{svc}.{ns}.svc"),
        format!("{prefix}{svc}.{ns}.svc.{CLUSTER_DOMAIN}"),
    ];
    if host.is_empty() {
        v.push(format!("{svc}.{ns}"));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str) -> Service {
        serde_json::from_value(serde_json::json!({"metadata": {"name": name, "namespace": ns}}))
            .unwrap()
    }

    fn slice(ns: &str, svc: &str, eps: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("{svc}-x"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": eps,
        }))
        .unwrap()
    }

    fn pod(ns: &str) -> PodIdentity {
        PodIdentity {
            namespace: ns.into(),
            ip: Some("10.245.0.9".parse().unwrap()),
            hostname: "etcd-1".into(),
            subdomain: Some("etcd".into()),
        }
    }

    fn ours(ip: IpAddr) -> bool {
        ip.to_string().starts_with("10.245.")
    }

    #[test]
    fn ready_endpoints_resolve_under_every_service_name() {
        let hosts = hosts_file(
            &pod("cp"),
            &[svc("cp", "apiserver")],
            &[slice(
                "cp",
                "apiserver",
                serde_json::json!([
                    {"addresses": ["10.245.0.5"], "conditions": {"ready": true}},
                    {"addresses": ["10.245.0.6"], "conditions": {"ready": false}},
                ]),
            )],
            ours,
        );
        for name in [
            "apiserver.cp.svc",
            "apiserver.cp.svc.cluster.local",
            "apiserver.cp",
            "apiserver",
        ] {
            assert!(
                hosts.contains(&format!("10.245.0.5\t{name}\n")),
                "{name}:\n{hosts}"
            );
        }
        assert!(
            !hosts.contains("10.245.0.6"),
            "not-ready endpoint listed:\n{hosts}"
        );
    }

    #[test]
    fn statefulset_pods_resolve_by_hostname_even_before_ready() {
        let hosts = hosts_file(
            &pod("cp"),
            &[svc("cp", "etcd")],
            &[slice(
                "cp",
                "etcd",
                serde_json::json!([
                    {"addresses": ["10.245.0.7"], "hostname": "etcd-0", "conditions": {"ready": false}},
                ]),
            )],
            ours,
        );
        assert!(
            hosts.contains("10.245.0.7\tetcd-0.etcd.cp.svc\n"),
            "{hosts}"
        );
        assert!(
            hosts.contains("10.245.0.7\tetcd-0.etcd.cp.svc.cluster.local\n"),
            "{hosts}"
        );
        assert!(!hosts.contains("\tetcd.cp.svc\n"), "{hosts}");
        assert!(
            hosts.contains("10.245.0.9\tetcd-1 etcd-1.etcd.cp.svc"),
            "own name missing:\n{hosts}"
        );
    }

    #[test]
    fn kwok_ips_and_other_namespaces_short_names_are_left_out() {
        let hosts = hosts_file(
            &pod("a"),
            &[svc("b", "web"), svc("b", "db")],
            &[
                slice(
                    "b",
                    "web",
                    serde_json::json!([{"addresses": ["10.244.0.3"]}]),
                ),
                slice(
                    "b",
                    "db",
                    serde_json::json!([{"addresses": ["10.245.0.3"]}]),
                ),
                slice(
                    "b",
                    "gone",
                    serde_json::json!([{"addresses": ["10.245.0.4"]}]),
                ),
            ],
            ours,
        );
        assert!(
            !hosts.contains("10.244.0.3"),
            "a kwok IP became a destination:\n{hosts}"
        );
        assert!(hosts.contains("10.245.0.3\tdb.b.svc\n"));
        assert!(
            !hosts.contains("\tdb\n"),
            "short name outside the pod's namespace:\n{hosts}"
        );
        assert!(
            !hosts.contains("10.245.0.4"),
            "slice of a missing service:\n{hosts}"
        );
    }
}
