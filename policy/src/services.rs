//! Which tenant Services may take host resources (pure).
//!
//! A Service's ClusterIP is free, but a NodePort opens a port on every host node, a
//! LoadBalancer asks the host's cloud for an address, and `externalIPs` make every node
//! answer for an address the tenant picked (the traffic-hijack pattern of CVE-2020-8554). So:
//! - `externalIPs` never reach the host ([`EXTERNAL_IPS_NOTE`] tells the tenant);
//! - NodePort and LoadBalancer Services are admitted in creation order while the plan's
//!   counts and NodePort total last ([`admitted`]): the same Services are admitted on every
//!   pass and by a restarted syncer, and two Services created at once can never both take the
//!   last slot;
//! - a LoadBalancer's class and source ranges must be ones the plan allows;
//! - a ClusterIP the tenant asked for inside a host-reserved range is not requested on the
//!   host ([`reserved_ip`]): the host allocates one and the tenant Service is recreated with it;
//! - an `ExternalName` Service goes down only if its name is one the plan allows, as
//!   hand-written endpoints go down only with addresses the plan allows
//!   ([`refused_external_name`]): host ingress controllers and meshes follow an ExternalName,
//!   and one naming `etcd.vcp-<key>.svc`, another tenant's Service or the host apiserver
//!   would point them inside the cluster.

use super::{Refusal, Services, TenantPolicy, endpoints};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use kube_core::ResourceExt;
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Tenant Services the tenant's control plane serves itself, never synced to the host and
/// never counted: the tenant apiserver's own `default/kubernetes` (its endpoints are the
/// tenant apiserver, which owns it), and `kube-system/vcp-metrics`, which the syncer keeps to
/// name its own metrics API for the tenant apiserver (a reserved name).
pub const LOCAL_SERVICES: [(&str, &str); 2] = [("default", "kubernetes"), METRICS_SERVICE];

/// The tenant Service (namespace, name) that names the syncer's metrics API.
pub const METRICS_SERVICE: (&str, &str) = ("kube-system", "vcp-metrics");

/// Whether `svc` is one of [`LOCAL_SERVICES`].
pub fn is_local_service(svc: &Service) -> bool {
    let (ns, name) = (svc.namespace().unwrap_or_default(), svc.name_any());
    LOCAL_SERVICES.iter().any(|(n, m)| *n == ns && *m == name)
}

/// Told to a tenant whose Service had `externalIPs`.
pub const EXTERNAL_IPS_NOTE: &str =
    "spec.externalIPs were not copied to the host: nodes never answer for tenant-chosen addresses";

fn kind(svc: &Service) -> &str {
    svc.spec
        .as_ref()
        .and_then(|s| s.type_.as_deref())
        .unwrap_or("ClusterIP")
}

/// Whether a Service takes host NodePorts (NodePort and LoadBalancer Services do).
pub fn takes_node_ports(svc: &Service) -> bool {
    matches!(kind(svc), "NodePort" | "LoadBalancer")
}

fn ports(svc: &Service) -> u32 {
    svc.spec
        .as_ref()
        .and_then(|s| s.ports.as_ref())
        .map_or(0, |p| u32::try_from(p.len()).unwrap_or(u32::MAX))
}

/// What is wrong with a Service on its own (class, source ranges, counts it could never fit).
pub fn check(svc: &Service, p: &Services) -> Vec<Refusal> {
    let mut out = Vec::new();
    if !takes_node_ports(svc) {
        return out;
    }
    let lb = kind(svc) == "LoadBalancer";
    if p.node_port_services == 0 {
        out.push(Refusal::new(
            "spec.type",
            "plan: services",
            format!(
                "{} Services are not allowed by the tenant's plan",
                kind(svc)
            ),
        ));
        return out;
    }
    if lb && p.load_balancers == 0 {
        out.push(Refusal::new(
            "spec.type",
            "plan: services",
            "LoadBalancer Services are not allowed by the tenant's plan",
        ));
        return out;
    }
    if ports(svc) > p.node_ports {
        out.push(Refusal::new(
            "spec.ports",
            "plan: services",
            format!(
                "{} ports would take more host NodePorts than the plan's {} in all",
                ports(svc),
                p.node_ports
            ),
        ));
    }
    let spec = svc.spec.clone().unwrap_or_default();
    if let Some(class) = &spec.load_balancer_class
        && !p.load_balancer_classes.contains(class)
    {
        out.push(Refusal::new(
            "spec.loadBalancerClass",
            "plan: services",
            format!("loadBalancerClass {class} is not one the tenant's plan allows"),
        ));
    }
    if !p.load_balancer_source_ranges.is_empty() {
        for (i, r) in spec
            .load_balancer_source_ranges
            .iter()
            .flatten()
            .enumerate()
        {
            let inside = r.parse::<IpNet>().is_ok_and(|net| {
                p.load_balancer_source_ranges
                    .iter()
                    .any(|a| a.contains(&net))
            });
            if !inside {
                out.push(Refusal::new(
                    format!("spec.loadBalancerSourceRanges[{i}]"),
                    "plan: services",
                    format!("source range {r} is not inside the ranges the tenant's plan allows"),
                ));
            }
        }
    }
    out
}

/// Host resources admitted Services hold together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub node_port_services: u32,
    pub load_balancers: u32,
    pub node_ports: u32,
}

/// Every tenant Service's verdict: NodePort and LoadBalancer Services in creation order
/// (then namespace and name), each admitted if it is valid on its own and still fits what the
/// earlier admitted ones left; refused ones take nothing. Other Services are always admitted
/// here (`check` has nothing against them). Keys are `(namespace, name)`.
pub fn admitted<'a>(
    services: impl IntoIterator<Item = &'a Service>,
    p: &Services,
) -> (BTreeMap<(String, String), Vec<Refusal>>, Usage) {
    let mut ordered: Vec<&Service> = services
        .into_iter()
        .filter(|s| takes_node_ports(s) && s.metadata.deletion_timestamp.is_none())
        .collect();
    ordered.sort_by_key(|s| {
        (
            s.metadata.creation_timestamp.clone().map(|t| t.0),
            s.namespace(),
            s.name_any(),
        )
    });
    let mut used = Usage::default();
    let mut verdicts = BTreeMap::new();
    for s in ordered {
        let mut refusals = check(s, p);
        let lb = u32::from(kind(s) == "LoadBalancer");
        if refusals.is_empty() {
            if used.node_port_services + 1 > p.node_port_services {
                refusals.push(Refusal::new(
                    "spec.type",
                    "plan: services",
                    format!(
                        "the tenant holds {} NodePort/LoadBalancer Services already, the plan's limit",
                        used.node_port_services
                    ),
                ));
            } else if used.load_balancers + lb > p.load_balancers {
                refusals.push(Refusal::new(
                    "spec.type",
                    "plan: services",
                    format!(
                        "the tenant holds {} LoadBalancer Services already, the plan's limit",
                        used.load_balancers
                    ),
                ));
            } else if used.node_ports + ports(s) > p.node_ports {
                refusals.push(Refusal::new(
                    "spec.ports",
                    "plan: services",
                    format!(
                        "{} more host NodePorts would exceed the plan's {} ({} taken)",
                        ports(s),
                        p.node_ports,
                        used.node_ports
                    ),
                ));
            }
        }
        if refusals.is_empty() {
            used.node_port_services += 1;
            used.load_balancers += lb;
            used.node_ports += ports(s);
        }
        verdicts.insert((s.namespace().unwrap_or_default(), s.name_any()), refusals);
    }
    (verdicts, used)
}

/// Why `svc`, an `ExternalName` Service, may not go down to the host, or `None` if it may
/// (or is of another type). Its name (lowercase, a trailing dot ignored) must be one of the
/// plan's `endpoints.external_names`, or under one of their `*.` domains, and a DNS name of at
/// least two labels whose last is not a number ([`endpoints::is_dns_name`]). A name that is
/// an IPv4 address is judged as a hand-written endpoint's address outside the tenant's pods
/// ([`endpoints::refused_address`]: in `endpoints.external_cidrs`, never in a cluster range).
pub fn refused_external_name(svc: &Service, policy: &TenantPolicy) -> Option<Refusal> {
    if kind(svc) != "ExternalName" {
        return None;
    }
    let given = svc
        .spec
        .as_ref()
        .and_then(|s| s.external_name.as_deref())
        .unwrap_or_default();
    let name = given
        .strip_suffix('.')
        .unwrap_or(given)
        .to_ascii_lowercase();
    let refuse = |why: String| {
        Some(Refusal::new(
            "spec.externalName",
            "plan: endpoints",
            format!("{why}; the Service is not copied to the host"),
        ))
    };
    if let Ok(ip) = name.parse::<IpAddr>() {
        return endpoints::refused_address(
            &ip.to_string(),
            &endpoints::TenantPods::default(),
            policy,
        )
        .and_then(refuse);
    }
    if !endpoints::is_dns_name(&name) {
        return refuse(format!(
            "externalName {given:?} is not a DNS name of at least two labels"
        ));
    }
    if policy.endpoints.allows_name(&name) {
        return None;
    }
    refuse(format!(
        "externalName {given} is not a name the tenant's plan allows (endpoints.external_names)"
    ))
}

/// The first ClusterIP a Service asks for inside a host-reserved range, if any.
pub fn reserved_ip(svc: &Service, policy: &TenantPolicy) -> Option<String> {
    let spec = svc.spec.as_ref()?;
    spec.cluster_ip
        .iter()
        .chain(spec.cluster_ips.iter().flatten())
        .find(|ip| {
            ip.parse::<IpAddr>().is_ok_and(|a| {
                policy
                    .services
                    .reserved_cluster_ips
                    .iter()
                    .any(|r| r.contains(&a))
            })
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(ns: &str, name: &str, type_: &str, ports: usize, created: &str) -> Service {
        let ports: Vec<_> = (0..ports)
            .map(|i| serde_json::json!({"name": format!("p{i}"), "port": 80 + i}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns, "creationTimestamp": created},
            "spec": {"type": type_, "ports": ports},
        }))
        .unwrap()
    }

    fn plan(y: &str) -> Services {
        TenantPolicy::from_yaml(y).unwrap().services
    }

    #[test]
    fn by_default_no_service_takes_host_ports() {
        let np = svc("a", "web", "NodePort", 1, "2026-01-01T00:00:00Z");
        let r = check(&np, &Services::default());
        assert_eq!(r[0].field, "spec.type");
        let cip = svc("a", "db", "ClusterIP", 1, "2026-01-01T00:00:00Z");
        assert!(check(&cip, &Services::default()).is_empty());
    }

    #[test]
    fn services_are_admitted_in_creation_order_while_the_plan_lasts() {
        let p = plan("services: {node_port_services: 3, load_balancers: 1, node_ports: 4}");
        let s = [
            svc("a", "third", "NodePort", 1, "2026-01-03T00:00:00Z"),
            svc("a", "first", "NodePort", 2, "2026-01-01T00:00:00Z"),
            svc("b", "lb1", "LoadBalancer", 1, "2026-01-02T00:00:00Z"),
            svc("b", "lb2", "LoadBalancer", 1, "2026-01-02T12:00:00Z"),
            svc("a", "fifty", "NodePort", 50, "2025-12-31T00:00:00Z"),
            svc("a", "plain", "ClusterIP", 9, "2026-01-01T00:00:00Z"),
        ];
        let (v, used) = admitted(&s, &p);
        let ok = |ns: &str, n: &str| v[&(ns.to_owned(), n.to_owned())].is_empty();
        assert!(!ok("a", "fifty"), "50 ports never fit 4");
        assert!(ok("a", "first") && ok("b", "lb1") && ok("a", "third"));
        assert!(!ok("b", "lb2"), "one LoadBalancer only");
        assert!(!v.contains_key(&("a".to_owned(), "plain".to_owned())));
        assert_eq!(
            used,
            Usage {
                node_port_services: 3,
                load_balancers: 1,
                node_ports: 4
            }
        );
        // Deleting the first frees its slot for the next in line, on every syncer alike.
        let (v, used) = admitted(s.iter().filter(|x| x.name_any() != "first"), &p);
        assert!(
            !v[&("b".to_owned(), "lb2".to_owned())].is_empty(),
            "still one LoadBalancer"
        );
        assert!(v[&("a".to_owned(), "third".to_owned())].is_empty());
        assert_eq!(used.node_ports, 2);
    }

    #[test]
    fn load_balancer_classes_and_source_ranges_follow_the_plan() {
        let p = plan(
            "services: {node_port_services: 2, load_balancers: 2, node_ports: 4, load_balancer_classes: [example.com/internal], load_balancer_source_ranges: [203.0.113.0/24]}",
        );
        let mut lb = svc("a", "lb", "LoadBalancer", 1, "2026-01-01T00:00:00Z");
        let spec = lb.spec.as_mut().unwrap();
        spec.load_balancer_class = Some("example.com/public".into());
        spec.load_balancer_source_ranges = Some(vec!["203.0.113.8/29".into(), "0.0.0.0/0".into()]);
        let fields: Vec<String> = check(&lb, &p).into_iter().map(|r| r.field).collect();
        assert_eq!(
            fields,
            ["spec.loadBalancerClass", "spec.loadBalancerSourceRanges[1]"]
        );
    }

    fn external(name: &str) -> Service {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "db", "namespace": "a"},
            "spec": {"type": "ExternalName", "externalName": name},
        }))
        .unwrap()
    }

    #[test]
    fn external_names_go_down_only_as_the_plan_allows() {
        let none = TenantPolicy::default();
        let plan = TenantPolicy::from_yaml(
            "endpoints: {external_names: [db.example.com, '*.partner.example'], external_cidrs: [203.0.113.0/24]}",
        )
        .unwrap();
        let refused = |name: &str, p: &TenantPolicy| refused_external_name(&external(name), p);
        // Nothing by default, not even an outside name.
        let r = refused("db.example.com", &none).unwrap();
        assert_eq!(r.field, "spec.externalName");
        assert!(r.message.contains("not copied to the host"), "{r}");
        // What the plan lists, any case, with or without the root's dot.
        for ok in [
            "db.example.com",
            "DB.Example.com.",
            "a.partner.example",
            "x.y.partner.example",
            "203.0.113.9",
        ] {
            assert_eq!(refused(ok, &plan), None, "{ok}");
        }
        // And nothing else: the domain of a wildcard itself, look-alikes, names inside the
        // cluster (vcp's, another tenant's, the host apiserver), single labels that a
        // resolver's search path completes, numeric forms of addresses, cluster addresses.
        for no in [
            "partner.example",
            "evilpartner.example",
            "db.example.com.evil.io",
            "example.com",
            "etcd.vcp-abc.svc.cluster.local",
            "web.def-apps.svc",
            "kubernetes.default",
            "kubernetes",
            "127.1",
            "10.0.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "0x7f000001",
            "",
        ] {
            assert!(refused(no, &plan).is_some(), "{no}");
        }
        // Other types are not this rule's business.
        let mut svc = external("anything");
        svc.spec.as_mut().unwrap().type_ = Some("ClusterIP".into());
        assert_eq!(refused_external_name(&svc, &none), None);
    }

    #[test]
    fn plans_list_external_names_as_dns_names() {
        for bad in [
            "'*'",
            "'*.com.'",
            "db",
            "'1.2.3.4'",
            "'Db.example.com'",
            "'a..b'",
            "'*.*.x.y'",
        ] {
            let y = format!("endpoints: {{external_names: [{bad}]}}");
            assert!(TenantPolicy::from_yaml(&y).is_err(), "{bad}");
        }
        let y = "endpoints: {external_names: [db.example.com, '*.example.org']}";
        assert!(TenantPolicy::from_yaml(y).is_ok());
    }

    #[test]
    fn reserved_cluster_ips_are_found() {
        let policy =
            TenantPolicy::from_yaml("services: {reserved_cluster_ips: [10.96.0.0/28]}").unwrap();
        let mut s = svc("a", "dns", "ClusterIP", 1, "2026-01-01T00:00:00Z");
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.0.10".into());
        assert_eq!(reserved_ip(&s, &policy).as_deref(), Some("10.96.0.10"));
        s.spec.as_mut().unwrap().cluster_ip = Some("10.96.4.4".into());
        assert_eq!(reserved_ip(&s, &policy), None);
        s.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        assert_eq!(reserved_ip(&s, &policy), None);
    }
}
