//! Hand-written Endpoints and EndpointSlices (pure): which of their addresses may reach the host.
//!
//! A Service without a selector routes to whatever addresses its Endpoints and EndpointSlices
//! name, and the tenant writes those by hand (the syncer's endpoints translation). Copied as they are, a
//! tenant could point a host Service (a NodePort one, reachable from outside) at anything the
//! host can reach: a control-plane pod (its own etcd, or another tenant's), another tenant's
//! pod, a node, the host apiserver. So an address goes down only if it is
//! - the address of one of this tenant's own pods ([`TenantPods`]: the `status.podIPs` of its
//!   running host pods, as the engine's host pod cache shows them), or
//! - outside the cluster: inside one of the plan's `endpoints.external_cidrs` and inside none
//!   of `network.cluster_cidrs` (where pods, Services and nodes live).
//!
//! Everything else is dropped and told to the tenant as a [`Refusal`]. Addresses are compared
//! in canonical form (`::ffff:10.0.0.1` is `10.0.0.1`), so an IPv4-mapped spelling cannot slip
//! a cluster address past the ranges. Loopback, link-local, multicast and unspecified
//! addresses are never allowed (the host apiserver refuses them anyway, and one would fail the
//! whole object).
//!
//! Around the addresses:
//! - a subset (Endpoints) or endpoint (EndpointSlice) left without any address is dropped;
//! - a `targetRef` stays only if it names a Pod of the object's own namespace that holds every
//!   remaining address of its endpoint; otherwise it is dropped (the address stays) with a
//!   refusal: on the host it would claim a pod the address does not belong to;
//! - `nodeName`, `hostname` and a slice's `deprecatedTopology` are dropped silently: they name
//!   host nodes (or serve DNS, which the tenant's own CoreDNS does from the tenant apiserver),
//!   and the host's proxies would take them for topology facts.
//!
//! The property (tested with random objects below): every address a filtered object keeps is
//! one of the tenant's pod addresses, or lies in `external_cidrs` and in no cluster CIDR; every
//! kept `targetRef` names a tenant pod holding its addresses.

use super::{Error, Refusal, TenantPolicy};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{self as v1, EndpointAddress, ObjectReference};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use vcp_core::host_pod::HostPod;
use vcp_core::naming::{self, TenantKey};

const RULE: &str = "plan: endpoints";

/// Which addresses outside the cluster hand-written endpoints may name: the `endpoints`
/// section of a plan's policy. The tenant's own pods may always be named.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Endpoints {
    /// Outside addresses a hand-written Endpoints or EndpointSlice may name (a database
    /// outside the cluster, say). Never reaches into `network.cluster_cidrs`, whatever is
    /// listed. Default: none.
    pub external_cidrs: Vec<IpNet>,
    /// DNS names an `ExternalName` Service may point at (see
    /// [`crate::services::refused_external_name`]): a name (`db.example.com`) or all names
    /// under a domain (`*.example.com`, not the domain itself). Default: none. An
    /// `ExternalName` that is an IPv4 address is an address, judged as by `external_cidrs`.
    // Left out of the rendered policy when empty, so a plan without it renders as before and
    // upgrading vcp does not roll every tenant's syncer for it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub external_names: Vec<String>,
}

impl Endpoints {
    /// Checks what types alone cannot (called by `TenantPolicy::validate`): a listed range
    /// inside a cluster CIDR would allow nothing, and is refused rather than ignored.
    pub fn validate(&self, cluster_cidrs: &[IpNet]) -> Result<(), Error> {
        let mapped: IpNet = "::ffff:0:0/96".parse().expect("a valid CIDR");
        for c in &self.external_cidrs {
            if let Some(inside) = cluster_cidrs.iter().find(|k| k.contains(c)) {
                return Err(Error::InvalidPolicy(format!(
                    "endpoints.external_cidrs: {c} lies inside the cluster range {inside}, where only the tenant's own pods may be named, so it would allow nothing"
                )));
            }
            if mapped.contains(c) {
                return Err(Error::InvalidPolicy(format!(
                    "endpoints.external_cidrs: {c} is IPv4-mapped IPv6; list the IPv4 range itself"
                )));
            }
        }
        for n in &self.external_names {
            let name = n.strip_prefix("*.").unwrap_or(n);
            if !is_dns_name(name) {
                return Err(Error::InvalidPolicy(format!(
                    "endpoints.external_names: {n:?} is not a lowercase DNS name of at least two labels (optionally after \"*.\"), with a last label that is not a number"
                )));
            }
        }
        Ok(())
    }

    /// Whether `name` (lowercase, without a trailing dot) is one of `external_names`, or under
    /// one of their `*.` domains.
    pub fn allows_name(&self, name: &str) -> bool {
        self.external_names
            .iter()
            .any(|n| match n.strip_prefix('*') {
                Some(suffix) => name.len() > suffix.len() && name.ends_with(suffix),
                None => name == n,
            })
    }
}

/// Whether `name` is a lowercase DNS name (RFC 1123 labels, 253 characters at most) of at
/// least two labels, the last not all digits. One label is resolved through the resolver's
/// search path (on the host: a host Service of that name, in the resolver's namespace), and a
/// numeric last label makes many resolvers read the name as an IPv4 address (`127.1`).
pub fn is_dns_name(name: &str) -> bool {
    let labels: Vec<&str> = name.split('.').collect();
    let label_ok = |l: &&str| {
        (1..=63).contains(&l.len())
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    name.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(label_ok)
        && !labels
            .last()
            .is_some_and(|l| l.bytes().all(|b| b.is_ascii_digit()))
}

/// This tenant's pods by address: which tenant pods (namespace, name) hold each IP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantPods {
    by_ip: BTreeMap<IpAddr, BTreeSet<(String, String)>>,
}

impl TenantPods {
    /// Records that tenant pod `ns/name` holds `ip`.
    pub fn insert(&mut self, ip: IpAddr, ns: &str, name: &str) {
        self.by_ip
            .entry(ip.to_canonical())
            .or_default()
            .insert((ns.to_owned(), name.to_owned()));
    }

    /// The pods of tenant `key` among host pods, by their `status.podIPs`. Only pods that hold
    /// their address count: not finished (`Succeeded`, `Failed`) or terminating ones, whose
    /// address the host may give to another pod (another tenant's) any moment, nor
    /// `hostNetwork` ones, whose address is their node's. A host pod counts only with this
    /// tenant's markers, in the host namespace its markers name.
    pub fn from_host_pods<'a>(
        key: &TenantKey,
        pods: impl IntoIterator<Item = &'a HostPod>,
    ) -> Self {
        let mut out = TenantPods::default();
        for held in pods.into_iter().filter_map(|p| Held::of(key, p)) {
            for ip in &held.ips {
                out.insert(*ip, &held.namespace, &held.name);
            }
        }
        out
    }

    /// Records that tenant pod `ns/name` no longer holds `ip`.
    fn remove(&mut self, ip: IpAddr, ns: &str, name: &str) {
        let ip = ip.to_canonical();
        if let Some(holders) = self.by_ip.get_mut(&ip) {
            holders.remove(&(ns.to_owned(), name.to_owned()));
            if holders.is_empty() {
                self.by_ip.remove(&ip);
            }
        }
    }

    /// Whether one of the tenant's pods holds `ip`.
    pub fn owns(&self, ip: IpAddr) -> bool {
        self.by_ip.contains_key(&ip.to_canonical())
    }

    /// Whether tenant pod `ns/name` holds `ip`.
    pub fn holds(&self, ip: IpAddr, ns: &str, name: &str) -> bool {
        self.by_ip
            .get(&ip.to_canonical())
            .is_some_and(|p| p.contains(&(ns.to_owned(), name.to_owned())))
    }

    /// Every address, in order (what the engine compares to notice a change).
    pub fn ips(&self) -> impl Iterator<Item = &IpAddr> {
        self.by_ip.keys()
    }
}

/// The addresses one host pod holds for its tenant pod (see [`TenantPods::from_host_pods`]
/// for which count).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    namespace: String,
    name: String,
    ips: Vec<IpAddr>,
}

impl Held {
    /// What host pod `p` holds for tenant `key`; `None` if it holds nothing.
    fn of(key: &TenantKey, p: &HostPod) -> Option<Held> {
        let empty = BTreeMap::new();
        let r = naming::tenant_ref(
            key,
            p.metadata.labels.as_ref().unwrap_or(&empty),
            p.metadata.annotations.as_ref().unwrap_or(&empty),
        )?;
        let ns = r.namespace?;
        if p.metadata.namespace.as_deref() != Some(naming::host_namespace(key, &ns).as_str()) {
            return None;
        }
        let host_network = p
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false);
        let status = p.status.as_ref()?;
        let finished = matches!(status.phase.as_deref(), Some("Succeeded" | "Failed"));
        if host_network || finished || p.metadata.deletion_timestamp.is_some() {
            return None;
        }
        let ips: Vec<IpAddr> = status
            .pod_ips
            .iter()
            .flatten()
            .map(|i| i.ip.as_str())
            .chain(status.pod_ip.as_deref())
            .filter_map(|i| i.parse::<IpAddr>().ok())
            .collect();
        (!ips.is_empty()).then_some(Held {
            namespace: ns,
            name: r.name,
            ips,
        })
    }
}

/// [`TenantPods`] kept up to date one host pod event at a time, so that noticing a change
/// walks no pod: each event costs the addresses of one pod, and the generation moves whenever
/// a pod's addresses do.
#[derive(Debug, Clone, Default)]
pub struct TenantPodIndex {
    pods: TenantPods,
    /// What each host pod (`namespace/name` on the host) holds now.
    held: std::collections::HashMap<String, Held>,
    generation: u64,
}

impl TenantPodIndex {
    /// Host pod `p` of tenant `key` was listed, changed, or (`present == false`) deleted.
    pub fn observe(&mut self, key: &TenantKey, p: &HostPod, present: bool) {
        let host = format!(
            "{}/{}",
            p.metadata.namespace.as_deref().unwrap_or_default(),
            p.metadata.name.as_deref().unwrap_or_default()
        );
        let now = present.then(|| Held::of(key, p)).flatten();
        if self.held.get(&host) == now.as_ref() {
            return;
        }
        if let Some(before) = self.held.remove(&host) {
            for ip in &before.ips {
                self.pods.remove(*ip, &before.namespace, &before.name);
            }
        }
        if let Some(now) = now {
            for ip in &now.ips {
                self.pods.insert(*ip, &now.namespace, &now.name);
            }
            self.held.insert(host, now);
        }
        self.generation += 1;
    }

    /// The tenant's pods by address, as the events so far say.
    pub fn pods(&self) -> &TenantPods {
        &self.pods
    }

    /// Moves whenever a pod's addresses change; stays while nothing of them does.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// Addresses no endpoint may name: the host apiserver refuses them in Endpoints, and they
/// mean the node itself.
fn special(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_unspecified()
                || v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_unspecified()
                || v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
        }
    }
}

/// Why address `addr` may not go down, or `None` if it may.
pub fn refused_address(addr: &str, pods: &TenantPods, policy: &TenantPolicy) -> Option<String> {
    let Ok(ip) = addr.parse::<IpAddr>() else {
        return Some(format!("{addr:?} is not an IP address"));
    };
    let ip = ip.to_canonical();
    if special(ip) {
        return Some(format!(
            "{addr} is a loopback, link-local, multicast or unspecified address"
        ));
    }
    if pods.owns(ip) {
        return None;
    }
    if let Some(c) = policy
        .network
        .cluster_cidrs
        .iter()
        .find(|c| c.contains(&ip))
    {
        return Some(format!(
            "{addr} lies in the cluster range {c} and is not the address of one of this tenant's pods"
        ));
    }
    if policy
        .endpoints
        .external_cidrs
        .iter()
        .any(|c| c.contains(&ip))
    {
        return None;
    }
    Some(format!(
        "{addr} is neither the address of one of this tenant's pods nor in the plan's endpoints.external_cidrs"
    ))
}

/// Why `target` may not stay on an endpoint of namespace `ns` with addresses `ips`, or `None`.
fn refused_target(
    target: &ObjectReference,
    ns: &str,
    ips: &[&str],
    pods: &TenantPods,
) -> Option<String> {
    let kind = target.kind.as_deref().unwrap_or("");
    if kind != "Pod" {
        return Some(format!(
            "targetRef names a {kind:?}, not a pod of this tenant"
        ));
    }
    let Some(name) = target.name.as_deref() else {
        return Some("targetRef names no pod".into());
    };
    if let Some(other) = target.namespace.as_deref().filter(|n| *n != ns) {
        return Some(format!(
            "targetRef names pod {other}/{name}, outside the object's namespace {ns}"
        ));
    }
    for ip in ips {
        let holds = ip.parse::<IpAddr>().is_ok_and(|i| pods.holds(i, ns, name));
        if !holds {
            return Some(format!(
                "targetRef names pod {ns}/{name}, which does not hold {ip}"
            ));
        }
    }
    None
}

/// Keeps the allowed addresses of one Endpoints address list (`path` is its field path).
fn filter_addresses(
    list: Option<&Vec<EndpointAddress>>,
    path: &str,
    ns: &str,
    pods: &TenantPods,
    policy: &TenantPolicy,
    refusals: &mut Vec<Refusal>,
) -> Option<Vec<EndpointAddress>> {
    let mut kept = Vec::new();
    for (j, a) in list.into_iter().flatten().enumerate() {
        if let Some(why) = refused_address(&a.ip, pods, policy) {
            refusals.push(Refusal::new(format!("{path}[{j}].ip"), RULE, why));
            continue;
        }
        let mut a = a.clone();
        a.node_name = None;
        a.hostname = None;
        if let Some(why) = a
            .target_ref
            .as_ref()
            .and_then(|r| refused_target(r, ns, &[&a.ip], pods))
        {
            refusals.push(Refusal::new(format!("{path}[{j}].targetRef"), RULE, why));
            a.target_ref = None;
        }
        kept.push(a);
    }
    (!kept.is_empty()).then_some(kept)
}

/// Tenant Endpoints `ep` with only what may reach the host (still tenant-side: namespaces
/// untranslated), and what was dropped.
pub fn filter_endpoints(
    ep: &v1::Endpoints,
    pods: &TenantPods,
    policy: &TenantPolicy,
) -> (v1::Endpoints, Vec<Refusal>) {
    let ns = ep.metadata.namespace.as_deref().unwrap_or_default();
    let mut refusals = Vec::new();
    let mut subsets = Vec::new();
    for (i, s) in ep.subsets.iter().flatten().enumerate() {
        let addresses = filter_addresses(
            s.addresses.as_ref(),
            &format!("subsets[{i}].addresses"),
            ns,
            pods,
            policy,
            &mut refusals,
        );
        let not_ready = filter_addresses(
            s.not_ready_addresses.as_ref(),
            &format!("subsets[{i}].notReadyAddresses"),
            ns,
            pods,
            policy,
            &mut refusals,
        );
        if addresses.is_some() || not_ready.is_some() {
            subsets.push(v1::EndpointSubset {
                addresses,
                not_ready_addresses: not_ready,
                ports: s.ports.clone(),
            });
        }
    }
    let filtered = v1::Endpoints {
        metadata: ep.metadata.clone(),
        subsets: ep.subsets.as_ref().map(|_| subsets),
    };
    (filtered, refusals)
}

/// Tenant EndpointSlice `slice` with only what may reach the host (still tenant-side), and
/// what was dropped.
pub fn filter_slice(
    slice: &EndpointSlice,
    pods: &TenantPods,
    policy: &TenantPolicy,
) -> (EndpointSlice, Vec<Refusal>) {
    let ns = slice.metadata.namespace.as_deref().unwrap_or_default();
    let mut refusals = Vec::new();
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().flatten().enumerate() {
        let mut addresses = Vec::new();
        for (j, a) in e.addresses.iter().enumerate() {
            match refused_address(a, pods, policy) {
                Some(why) => refusals.push(Refusal::new(
                    format!("endpoints[{i}].addresses[{j}]"),
                    RULE,
                    why,
                )),
                None => addresses.push(a.clone()),
            }
        }
        if addresses.is_empty() {
            continue;
        }
        let ips: Vec<&str> = addresses.iter().map(String::as_str).collect();
        let target_ref = match &e.target_ref {
            Some(r) => match refused_target(r, ns, &ips, pods) {
                Some(why) => {
                    refusals.push(Refusal::new(format!("endpoints[{i}].targetRef"), RULE, why));
                    None
                }
                None => Some(r.clone()),
            },
            None => None,
        };
        endpoints.push(Endpoint {
            addresses,
            target_ref,
            node_name: None,
            hostname: None,
            deprecated_topology: None,
            ..e.clone()
        });
    }
    let filtered = EndpointSlice {
        metadata: slice.metadata.clone(),
        address_type: slice.address_type.clone(),
        endpoints: slice.endpoints.as_ref().map(|_| endpoints),
        ports: slice.ports.clone(),
    };
    (filtered, refusals)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn pods(entries: &[(&str, &str, &str)]) -> TenantPods {
        let mut p = TenantPods::default();
        for (i, ns, name) in entries {
            p.insert(ip(i), ns, name);
        }
        p
    }

    fn policy(yaml: &str) -> TenantPolicy {
        TenantPolicy::from_yaml(yaml).unwrap()
    }

    fn endpoints(v: serde_json::Value) -> v1::Endpoints {
        serde_json::from_value(v).unwrap()
    }

    fn slice(v: serde_json::Value) -> EndpointSlice {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn own_pods_and_plan_external_ranges_go_down_and_nothing_else() {
        let pods = pods(&[("10.244.1.5", "apps", "db-0"), ("fd00::5", "apps", "db-0")]);
        let p = policy("endpoints: {external_cidrs: [203.0.113.0/24, 0.0.0.0/0]}");
        let ok = |a: &str| refused_address(a, &pods, &p).is_none();
        assert!(ok("10.244.1.5"), "the tenant's own pod");
        assert!(ok("fd00::5"), "its IPv6 address too");
        assert!(ok("::ffff:10.244.1.5"), "the same pod, spelled IPv4-mapped");
        assert!(ok("203.0.113.7"), "listed outside range");
        assert!(
            ok("198.51.100.1"),
            "0.0.0.0/0 is outside the cluster ranges only"
        );
        for bad in [
            "10.244.2.9",        // another tenant's pod, a control-plane pod
            "10.96.0.1",         // the host apiserver's ClusterIP
            "172.18.0.2",        // a node
            "::ffff:10.244.2.9", // the same, IPv4-mapped
            "169.254.169.254",   // cloud metadata
            "127.0.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "fd00::9",
            "db.example.com",
            "10.244.1.5/32",
        ] {
            assert!(!ok(bad), "{bad} went down");
        }
    }

    #[test]
    fn by_default_only_the_tenants_own_pods_may_be_named() {
        let pods = pods(&[("10.244.1.5", "apps", "db-0")]);
        let p = TenantPolicy::default();
        assert!(refused_address("10.244.1.5", &pods, &p).is_none());
        let why = refused_address("192.0.2.10", &pods, &p).unwrap();
        assert!(
            why.contains("192.0.2.10") && why.contains("external_cidrs"),
            "{why}"
        );
        let why = refused_address("10.244.2.9", &pods, &p).unwrap();
        assert!(why.contains("cluster range 10.0.0.0/8"), "{why}");
    }

    #[test]
    fn endpoints_keep_allowed_addresses_and_lose_the_rest_subsets_included() {
        let pods = pods(&[
            ("10.244.1.5", "apps", "db-0"),
            ("10.244.1.6", "apps", "db-1"),
        ]);
        let ep = endpoints(serde_json::json!({
            "metadata": {"name": "db", "namespace": "apps"},
            "subsets": [
                {"addresses": [
                    {"ip": "10.244.9.9"},
                    {"ip": "10.244.1.5", "nodeName": "control-plane-0", "hostname": "db-0",
                        "targetRef": {"kind": "Pod", "namespace": "apps", "name": "db-0", "uid": "u"}}],
                 "notReadyAddresses": [
                    {"ip": "10.244.1.6", "targetRef": {"kind": "Pod", "name": "db-0"}}],
                 "ports": [{"port": 5432}]},
                {"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 80}]},
            ],
        }));
        let (out, refusals) = filter_endpoints(&ep, &pods, &TenantPolicy::default());
        let subsets = out.subsets.unwrap();
        assert_eq!(subsets.len(), 1, "a subset without addresses is dropped");
        let kept = subsets[0].addresses.as_ref().unwrap();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].ip, "10.244.1.5");
        assert_eq!(kept[0].node_name, None);
        assert_eq!(kept[0].hostname, None);
        assert_eq!(
            kept[0].target_ref.as_ref().unwrap().name.as_deref(),
            Some("db-0")
        );
        let not_ready = subsets[0].not_ready_addresses.as_ref().unwrap();
        assert_eq!(not_ready[0].ip, "10.244.1.6", "the address stays");
        assert_eq!(
            not_ready[0].target_ref, None,
            "db-0 does not hold 10.244.1.6"
        );
        let fields: Vec<&str> = refusals.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "subsets[0].addresses[0].ip",
                "subsets[0].notReadyAddresses[0].targetRef",
                "subsets[1].addresses[0].ip"
            ]
        );
        assert!(refusals.iter().all(|r| r.rule == "plan: endpoints"));
        assert!(refusals[0].message.contains("10.244.9.9"));
        assert!(refusals[2].message.contains("192.0.2.10"));
    }

    #[test]
    fn slices_keep_allowed_addresses_and_drop_node_names_and_foreign_target_refs() {
        let pods = pods(&[("10.244.1.5", "apps", "db-0"), ("10.244.3.3", "other", "x")]);
        let s = slice(serde_json::json!({
            "metadata": {"name": "db-1", "namespace": "apps"},
            "addressType": "IPv4",
            "endpoints": [
                {"addresses": ["172.18.0.2"], "nodeName": "n"},
                {"addresses": ["10.244.1.5"], "nodeName": "control-plane-0", "hostname": "h",
                    "deprecatedTopology": {"kubernetes.io/hostname": "control-plane-0"},
                    "zone": "a", "conditions": {"ready": true},
                    "targetRef": {"kind": "Pod", "namespace": "apps", "name": "db-0"}},
                {"addresses": ["10.244.3.3"],
                    "targetRef": {"kind": "Pod", "namespace": "other", "name": "x"}},
                {"addresses": ["10.244.1.5"], "targetRef": {"kind": "Node", "name": "control-plane-0"}},
            ],
            "ports": [{"port": 5432}],
        }));
        let (out, refusals) = filter_slice(&s, &pods, &TenantPolicy::default());
        let eps = out.endpoints.unwrap();
        assert_eq!(eps.len(), 3, "the node's endpoint is dropped");
        assert!(eps.iter().all(|e| e.node_name.is_none()
            && e.hostname.is_none()
            && e.deprecated_topology.is_none()));
        assert_eq!(eps[0].addresses, ["10.244.1.5"]);
        assert_eq!(eps[0].zone.as_deref(), Some("a"));
        assert!(eps[0].target_ref.is_some());
        assert_eq!(
            eps[1].addresses,
            ["10.244.3.3"],
            "the tenant's pod, another namespace"
        );
        assert_eq!(
            eps[1].target_ref, None,
            "a targetRef stays in its namespace"
        );
        assert_eq!(eps[2].target_ref, None, "a Node is not a tenant pod");
        let fields: Vec<&str> = refusals.iter().map(|r| r.field.as_str()).collect();
        assert_eq!(
            fields,
            [
                "endpoints[0].addresses[0]",
                "endpoints[2].targetRef",
                "endpoints[3].targetRef"
            ]
        );
        assert!(refusals[0].message.contains("172.18.0.2"));
    }

    #[test]
    fn only_running_host_pods_of_the_tenant_count() {
        let key = TenantKey::new("demo").unwrap();
        let pod = |name: &str, ns: &str, tenant: &str, extra: serde_json::Value| -> HostPod {
            let mut v = serde_json::json!({
                "metadata": {"name": name, "namespace": ns,
                    "labels": {(naming::LABEL_TENANT): tenant},
                    "annotations": {(naming::ANN_NAME): name, (naming::ANN_NAMESPACE): "apps"}},
                "spec": {"containers": []},
                "status": {"phase": "Running", "podIP": "10.244.0.1",
                    "podIPs": [{"ip": "10.244.0.1"}, {"ip": "fd00::1"}]},
            });
            json_merge(&mut v, extra);
            serde_json::from_value(v).unwrap()
        };
        let p = |name, ip: &str, extra| {
            let mut extra: serde_json::Value = extra;
            json_merge(
                &mut extra,
                serde_json::json!({"status": {"podIP": ip, "podIPs": [{"ip": ip}]}}),
            );
            pod(name, "demo-apps", "demo", extra)
        };
        let all = [
            pod("web", "demo-apps", "demo", serde_json::json!({})),
            p(
                "other",
                "10.244.0.2",
                serde_json::json!({"metadata": {"labels": {(naming::LABEL_TENANT): "else"}}}),
            ),
            pod(
                "moved",
                "demo-elsewhere",
                "demo",
                serde_json::json!({"status": {"podIP": "10.244.0.3", "podIPs": [{"ip": "10.244.0.3"}]}}),
            ),
            p(
                "done",
                "10.244.0.4",
                serde_json::json!({"status": {"phase": "Succeeded"}}),
            ),
            p(
                "going",
                "10.244.0.5",
                serde_json::json!({"metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}),
            ),
            p(
                "hostnet",
                "172.18.0.2",
                serde_json::json!({"spec": {"hostNetwork": true}}),
            ),
        ];
        let pods = TenantPods::from_host_pods(&key, &all);
        let ips: Vec<String> = pods.ips().map(IpAddr::to_string).collect();
        assert_eq!(ips, ["10.244.0.1", "fd00::1"]);
        assert!(pods.holds(ip("10.244.0.1"), "apps", "web"));
        assert!(!pods.holds(ip("10.244.0.1"), "apps", "db"));
    }

    proptest! {
        /// Whatever order host pods come, change and go in, the index holds what a walk over
        /// the pods left standing finds, and its generation stays put on events that change
        /// no address.
        #[test]
        fn the_index_equals_a_walk_over_the_pods_standing(
            events in proptest::collection::vec((0usize..4, 0u8..4, 0u8..3, proptest::bool::weighted(0.8)), 1..40)
        ) {
            let key = TenantKey::new("demo").unwrap();
            let pod = |i: usize, ip: u8, phase: u8| -> HostPod {
                let phase = ["Running", "Pending", "Succeeded"][usize::from(phase)];
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": format!("p{i}"), "namespace": "demo-apps",
                        "labels": {(naming::LABEL_TENANT): "demo"},
                        "annotations": {(naming::ANN_NAME): format!("p{i}"), (naming::ANN_NAMESPACE): "apps"}},
                    "status": {"phase": phase, "podIP": format!("10.0.0.{ip}")},
                })).unwrap()
            };
            let mut index = TenantPodIndex::default();
            let mut standing: BTreeMap<usize, HostPod> = BTreeMap::new();
            for (i, ip, phase, present) in events {
                let p = pod(i, ip, phase);
                let before = (index.pods().clone(), index.generation());
                index.observe(&key, &p, present);
                if present { standing.insert(i, p.clone()); } else { standing.remove(&i); }
                prop_assert_eq!(index.pods(), &TenantPods::from_host_pods(&key, standing.values()));
                if before.0 != *index.pods() {
                    prop_assert!(index.generation() > before.1, "a change moves the generation");
                }
                // The same event again (a resync, a relist) changes nothing and moves nothing.
                let settled = index.generation();
                index.observe(&key, &p, present);
                prop_assert_eq!(index.generation(), settled);
            }
        }
    }

    fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
        match (a, b) {
            (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
                for (k, v) in b {
                    json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
                }
            }
            (a, b) => *a = b,
        }
    }

    #[test]
    fn external_ranges_inside_the_cluster_are_refused_when_the_policy_loads() {
        let err = |y: &str| TenantPolicy::from_yaml(y).unwrap_err().to_string();
        assert!(err("endpoints: {external_cidrs: [10.1.0.0/16]}").contains("cluster range"));
        assert!(
            err("endpoints: {external_cidrs: ['::ffff:203.0.113.0/120']}").contains("IPv4-mapped")
        );
        assert!(err("endpoints: {external_cidr: []}").contains("unknown field"));
        let p = policy("endpoints: {external_cidrs: [203.0.113.0/24]}");
        assert_eq!(p.endpoints.external_cidrs.len(), 1);
        assert!(TenantPolicy::default().endpoints.external_cidrs.is_empty());
    }

    /// Addresses from every kind of range: the tenant's (drawn below), the cluster's, the
    /// plan's outside ones, elsewhere, special, IPv4-mapped and not addresses at all.
    fn arb_address() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u8..4, any::<u8>()).prop_map(|(a, b)| format!("10.244.{a}.{b}")),
            (0u8..4, any::<u8>()).prop_map(|(a, b)| format!("203.0.113.{}", a * 64 + b % 64)),
            any::<[u8; 4]>().prop_map(|o| std::net::Ipv4Addr::from(o).to_string()),
            (0u8..4, any::<u8>()).prop_map(|(a, b)| format!("::ffff:10.244.{a}.{b}")),
            any::<u8>().prop_map(|b| format!("fd00::{b:x}")),
            any::<u8>().prop_map(|b| format!("2001:db8::{b:x}")),
            Just("127.0.0.1".to_owned()),
            Just("db.example.com".to_owned()),
        ]
    }

    const EXTERNAL: [&str; 5] = [
        "203.0.113.0/25",
        "0.0.0.0/0",
        "2001:db8::/32",
        "10.244.0.0/16", // inside the cluster: refused by validation, and ignored regardless
        "::/0",
    ];

    fn arb_target() -> impl Strategy<Value = Option<serde_json::Value>> {
        proptest::option::of(
            (
                proptest::sample::select(&["Pod", "Node", "Service"][..]),
                proptest::sample::select(&["apps", "other"][..]),
                proptest::sample::select(&["p0", "p1", "p2"][..]),
            )
                .prop_map(|(k, ns, n)| serde_json::json!({"kind": k, "namespace": ns, "name": n})),
        )
    }

    /// The property of the module doc for one kept address.
    fn allowed(a: &str, pods: &TenantPods, p: &TenantPolicy) -> bool {
        let Ok(ip) = a.parse::<IpAddr>().map(|i| i.to_canonical()) else {
            return false;
        };
        !special(ip)
            && (pods.owns(ip)
                || (p.endpoints.external_cidrs.iter().any(|c| c.contains(&ip))
                    && !p.network.cluster_cidrs.iter().any(|c| c.contains(&ip))))
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn no_kept_address_is_outside_the_tenants_pods_and_allowed_outside_ranges(
            addresses in proptest::collection::vec((arb_address(), arb_target(), any::<bool>()), 0..12),
            owners in proptest::collection::vec((any::<bool>(), 0usize..3, any::<bool>()), 12),
            external in proptest::sample::subsequence(&EXTERNAL[..], 0..=EXTERNAL.len()),
        ) {
            // Some of the drawn addresses are the tenant's pods (p0..p2 of apps or other).
            let mut pods = TenantPods::default();
            for ((a, _, _), (owned, n, in_apps)) in addresses.iter().zip(&owners) {
                if let (true, Ok(i)) = (*owned, a.parse::<IpAddr>()) {
                    pods.insert(i, if *in_apps { "apps" } else { "other" }, &format!("p{n}"));
                }
            }
            let mut p = TenantPolicy::default();
            p.endpoints.external_cidrs = external.iter().map(|c| c.parse().unwrap()).collect();

            let ep = endpoints(serde_json::json!({
                "metadata": {"name": "db", "namespace": "apps"},
                "subsets": addresses.chunks(3).map(|c| serde_json::json!({
                    "addresses": c.iter().filter(|a| a.2).map(|(ip, t, _)| serde_json::json!({"ip": ip, "targetRef": t, "nodeName": "n"})).collect::<Vec<_>>(),
                    "notReadyAddresses": c.iter().filter(|a| !a.2).map(|(ip, t, _)| serde_json::json!({"ip": ip, "targetRef": t, "hostname": "h"})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            }));
            let (out, refusals) = filter_endpoints(&ep, &pods, &p);
            let mut kept = 0;
            for s in out.subsets.iter().flatten() {
                let all: Vec<&EndpointAddress> = s.addresses.iter().flatten().chain(s.not_ready_addresses.iter().flatten()).collect();
                prop_assert!(!all.is_empty(), "an empty subset went down");
                for a in all {
                    kept += 1;
                    prop_assert!(allowed(&a.ip, &pods, &p), "{} went down", a.ip);
                    prop_assert!(a.node_name.is_none() && a.hostname.is_none());
                    if let Some(r) = &a.target_ref {
                        prop_assert_eq!(r.kind.as_deref(), Some("Pod"));
                        prop_assert_eq!(r.namespace.as_deref(), Some("apps"));
                        prop_assert!(pods.holds(ip(&a.ip), "apps", r.name.as_deref().unwrap()));
                    }
                }
            }
            // Nothing allowed is lost, and every dropped address is told.
            let allowed_in = addresses.iter().filter(|a| allowed(&a.0, &pods, &p)).count();
            prop_assert_eq!(kept, allowed_in);
            let told = refusals.iter().filter(|r| r.field.ends_with(".ip")).count();
            prop_assert_eq!(told, addresses.len() - kept);

            let s = slice(serde_json::json!({
                "metadata": {"name": "db-1", "namespace": "apps"},
                "addressType": "IPv4",
                "endpoints": addresses.chunks(2).map(|c| serde_json::json!({
                    "addresses": c.iter().map(|a| &a.0).collect::<Vec<_>>(),
                    "targetRef": c[0].1, "nodeName": "n", "hostname": "h",
                })).collect::<Vec<_>>(),
            }));
            let (out, _) = filter_slice(&s, &pods, &p);
            for e in out.endpoints.iter().flatten() {
                prop_assert!(!e.addresses.is_empty(), "an endpoint without addresses went down");
                prop_assert!(e.node_name.is_none() && e.hostname.is_none());
                for a in &e.addresses {
                    prop_assert!(allowed(a, &pods, &p), "{} went down", a);
                }
                if let Some(r) = &e.target_ref {
                    prop_assert_eq!(r.kind.as_deref(), Some("Pod"));
                    prop_assert_eq!(r.namespace.as_deref(), Some("apps"));
                    for a in &e.addresses {
                        prop_assert!(pods.holds(ip(a), "apps", r.name.as_deref().unwrap()));
                    }
                }
            }
        }
    }
}
