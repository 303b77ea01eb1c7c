//! Where the tenant apiserver may dial: the pure decision of the egress proxy.
//!
//! Data flow: the host pod and Service watches tell [`Allowed`] of every host object of this
//! tenant they touch ([`Allowed::set_pod`], [`Allowed::set_service`]), so it always holds the
//! addresses the tenant owns on the host: the IPs of its running pods and the ClusterIPs and
//! ports of its Services. A CONNECT target (`host:port`, as the apiserver sends it) is read by
//! [`Target::parse`] and judged by [`Allowed::decide`] with two hash lookups, whatever the
//! number of objects: the cost of a dial never grows with the tenant's size.
//!
//! What is allowed, and nothing else:
//! - the syncer's own endpoint, by the exact `address:port` virtual nodes give for it (kubelet
//!   calls, the revocation webhook, the metrics API's ExternalName);
//! - an IP of one of the tenant's running host pods, on any port (the pod is the tenant's own:
//!   every port on it is its own process); never a pod on the host's network, whose IP is a
//!   node's;
//! - a ClusterIP of one of the tenant's host Services, on one of its ports;
//! - a Service name as webhooks with a `service` reference are dialled,
//!   `<name>.<namespace>.svc[.<cluster domain>]:<port>`, when that tenant Service has a host
//!   copy with that port: dialled at its ClusterIP.
//!
//! Names are never resolved through DNS: a tenant's webhook URL naming anything else is
//! refused without a lookup, so no answer depends on what exists outside the tenant.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

/// A CONNECT target as the apiserver sends it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An address: a pod's, a Service's ClusterIP, a node's.
    Ip(SocketAddr),
    /// A host name and port: a Service's DNS name, a node's Hostname, a webhook URL's host.
    Name(String, u16),
}

impl Target {
    /// Reads `host:port` (`[v6]:port` for IPv6); `None` for anything else.
    pub fn parse(authority: &str) -> Option<Target> {
        if let Ok(addr) = authority.parse::<SocketAddr>() {
            return Some(Target::Ip(addr));
        }
        let (host, port) = authority.rsplit_once(':')?;
        let port: u16 = port.parse().ok()?;
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let valid = !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        valid.then_some(Target::Name(host, port))
    }
}

/// Why a target was refused: for the log line and the metric's label, never for the answer
/// (which is the same for every refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not `host:port`.
    Malformed,
    /// An address that is none of the tenant's pods or Services.
    Address,
    /// A Service of the tenant's, but not on that port.
    Port,
    /// A name that is neither the syncer's endpoint nor one of the tenant's Services.
    Name,
}

impl Refusal {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::Address => "address",
            Refusal::Port => "port",
            Refusal::Name => "name",
        }
    }
}

/// Where an allowed target is dialled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dial {
    /// The syncer's own endpoint, at the address it listens on.
    Own,
    /// This address.
    To(SocketAddr),
}

/// A host Service of the tenant, as the proxy needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAddr {
    pub ip: IpAddr,
    pub ports: Vec<u16>,
}

/// The tenant's addresses on the host, kept up to date by the watches (see the module docs).
///
/// Pods and Services are keyed by their host `namespace/name`; addresses are counted, so two
/// objects that briefly share one (a pod replaced under the same IP) leave it allowed until
/// both are gone.
#[derive(Debug, Default, Clone)]
pub struct Allowed {
    pods: HashMap<String, IpAddr>,
    pod_ips: HashMap<IpAddr, u32>,
    services: HashMap<String, ServiceAddr>,
    service_ports: HashMap<(IpAddr, u16), u32>,
}

fn count_up<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u32>, k: K) {
    *m.entry(k).or_default() += 1;
}

fn count_down<K: std::hash::Hash + Eq>(m: &mut HashMap<K, u32>, k: &K) {
    if let Some(n) = m.get_mut(k) {
        *n -= 1;
        if *n == 0 {
            m.remove(k);
        }
    }
}

impl Allowed {
    /// Host pod `key` (`namespace/name`) now has `ip` (`None`: gone, not running, on the
    /// host's network, or no address yet).
    pub fn set_pod(&mut self, key: &str, ip: Option<IpAddr>) {
        if self.pods.get(key) == ip.as_ref() {
            return;
        }
        if let Some(old) = self.pods.remove(key) {
            count_down(&mut self.pod_ips, &old);
        }
        if let Some(ip) = ip {
            self.pods.insert(key.to_owned(), ip);
            count_up(&mut self.pod_ips, ip);
        }
    }

    /// Host Service `key` (`namespace/name`) now has `addr` (`None`: gone, headless, or an
    /// ExternalName).
    pub fn set_service(&mut self, key: &str, addr: Option<ServiceAddr>) {
        if self.services.get(key) == addr.as_ref() {
            return;
        }
        if let Some(old) = self.services.remove(key) {
            for p in &old.ports {
                count_down(&mut self.service_ports, &(old.ip, *p));
            }
        }
        if let Some(addr) = addr {
            for p in &addr.ports {
                count_up(&mut self.service_ports, (addr.ip, *p));
            }
            self.services.insert(key.to_owned(), addr);
        }
    }

    /// How many pod and Service addresses are allowed (for the log and tests).
    pub fn len(&self) -> usize {
        self.pod_ips.len() + self.service_ports.len()
    }

    /// Whether nothing of the tenant's is known yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Judges one CONNECT target. `own` is the syncer's endpoint as virtual nodes give it
    /// (`address`, `port`); `host_namespace` maps a tenant namespace to its host namespace;
    /// `cluster_domain` is the tenant's.
    pub fn decide(
        &self,
        authority: &str,
        own: (&str, u16),
        host_namespace: impl Fn(&str) -> Option<String>,
        cluster_domain: &str,
    ) -> Result<Dial, Refusal> {
        let target = Target::parse(authority).ok_or(Refusal::Malformed)?;
        let own_target = Target::parse(&join(own.0, own.1));
        if own_target.as_ref() == Some(&target) {
            return Ok(Dial::Own);
        }
        match target {
            Target::Ip(addr) => {
                let ip = canonical(addr.ip());
                if self.pod_ips.contains_key(&ip)
                    || self.service_ports.contains_key(&(ip, addr.port()))
                {
                    Ok(Dial::To(SocketAddr::new(ip, addr.port())))
                } else {
                    Err(Refusal::Address)
                }
            }
            Target::Name(host, port) => {
                let (name, ns) = service_name(&host, cluster_domain).ok_or(Refusal::Name)?;
                let host_ns = host_namespace(ns).ok_or(Refusal::Name)?;
                let svc = self
                    .services
                    .get(&format!("{host_ns}/{name}"))
                    .ok_or(Refusal::Name)?;
                if svc.ports.contains(&port) {
                    Ok(Dial::To(SocketAddr::new(svc.ip, port)))
                } else {
                    Err(Refusal::Port)
                }
            }
        }
    }
}

/// `host:port`, bracketing an IPv6 address.
fn join(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// An IPv4-mapped IPv6 address as the IPv4 address it is, so `[::ffff:10.0.0.1]` is judged
/// (and dialled) as `10.0.0.1`.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// `(name, namespace)` of `<name>.<namespace>.svc` or `<name>.<namespace>.svc.<domain>`.
fn service_name<'a>(host: &'a str, cluster_domain: &str) -> Option<(&'a str, &'a str)> {
    let domain = cluster_domain.trim_end_matches('.').to_ascii_lowercase();
    let rest = host
        .strip_suffix(".svc")
        .or_else(|| host.strip_suffix(&format!(".svc.{domain}")))?;
    let (name, ns) = rest.split_once('.')?;
    (!name.is_empty() && !ns.is_empty() && !ns.contains('.')).then_some((name, ns))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const OWN: (&str, u16) = ("vcp-syncer.vcp-t1.svc", 10250);

    fn host_ns(ns: &str) -> Option<String> {
        Some(format!("t1-{ns}"))
    }

    fn decide(a: &Allowed, target: &str) -> Result<Dial, Refusal> {
        a.decide(target, OWN, host_ns, "cluster.local")
    }

    fn svc(ip: &str, ports: &[u16]) -> Option<ServiceAddr> {
        Some(ServiceAddr {
            ip: ip.parse().unwrap(),
            ports: ports.to_vec(),
        })
    }

    fn tenant() -> Allowed {
        let mut a = Allowed::default();
        a.set_pod("t1-apps/web", Some("10.244.1.7".parse().unwrap()));
        a.set_service("t1-apps/web", svc("10.96.3.4", &[80, 443]));
        a
    }

    fn to(s: &str) -> Result<Dial, Refusal> {
        Ok(Dial::To(s.parse().unwrap()))
    }

    #[test]
    fn the_tenants_own_pods_and_services_are_allowed() {
        let a = tenant();
        assert_eq!(decide(&a, "10.244.1.7:8080"), to("10.244.1.7:8080"));
        assert_eq!(decide(&a, "10.244.1.7:1"), to("10.244.1.7:1"));
        assert_eq!(decide(&a, "10.96.3.4:443"), to("10.96.3.4:443"));
        assert_eq!(decide(&a, "[::ffff:10.244.1.7]:80"), to("10.244.1.7:80"));
    }

    #[test]
    fn a_service_on_a_port_it_does_not_serve_is_refused() {
        assert_eq!(decide(&tenant(), "10.96.3.4:22"), Err(Refusal::Address));
        assert_eq!(decide(&tenant(), "web.apps.svc:22"), Err(Refusal::Port));
    }

    #[test]
    fn the_syncers_own_endpoint_is_allowed_by_its_exact_name_and_port() {
        let a = Allowed::default();
        assert_eq!(decide(&a, "vcp-syncer.vcp-t1.svc:10250"), Ok(Dial::Own));
        assert_eq!(decide(&a, "VCP-SYNCER.vcp-t1.svc.:10250"), Ok(Dial::Own));
        assert_eq!(
            decide(&a, "vcp-syncer.vcp-t1.svc:8080"),
            Err(Refusal::Name),
            "its metrics port is not the endpoint"
        );
        assert_eq!(
            decide(&a, "vcp-syncer.vcp-t2.svc:10250"),
            Err(Refusal::Name),
            "another tenant's syncer"
        );
    }

    #[test]
    fn service_names_as_webhooks_dial_them_resolve_to_the_host_copy() {
        let a = tenant();
        assert_eq!(decide(&a, "web.apps.svc:443"), to("10.96.3.4:443"));
        assert_eq!(
            decide(&a, "web.apps.svc.cluster.local:80"),
            to("10.96.3.4:80")
        );
        assert_eq!(decide(&a, "web.other.svc:443"), Err(Refusal::Name));
        assert_eq!(decide(&a, "db.apps.svc:443"), Err(Refusal::Name));
        assert_eq!(
            decide(&a, "web.apps.svc.evil.example:443"),
            Err(Refusal::Name)
        );
        assert_eq!(decide(&a, "x.web.apps.svc:443"), Err(Refusal::Name));
    }

    #[test]
    fn everything_else_is_refused_without_a_lookup() {
        let a = tenant();
        for target in [
            // vcp's API, another syncer's and etcd's metrics, Postgres, the host apiserver.
            "10.244.0.5:8080",
            "10.244.0.9:2381",
            "10.244.0.12:5432",
            "192.0.2.1:6443",
            "127.0.0.1:8080",
            "[::1]:10250",
            "169.254.169.254:80",
            "kubernetes.default.svc:443",
            "vcp.vcp-system.svc:8080",
            "evil.example:443",
            "localhost:10250",
        ] {
            assert!(decide(&a, target).is_err(), "{target}");
        }
        assert_eq!(decide(&a, "no-port"), Err(Refusal::Malformed));
        assert_eq!(decide(&a, "a b:80"), Err(Refusal::Malformed));
        assert_eq!(decide(&a, "x:99999"), Err(Refusal::Malformed));
    }

    #[test]
    fn an_address_stays_allowed_until_every_object_holding_it_is_gone() {
        let mut a = tenant();
        a.set_pod("t1-apps/web-2", Some("10.244.1.7".parse().unwrap()));
        a.set_pod("t1-apps/web", None);
        assert!(decide(&a, "10.244.1.7:80").is_ok());
        a.set_pod("t1-apps/web-2", None);
        assert_eq!(decide(&a, "10.244.1.7:80"), Err(Refusal::Address));
        a.set_service("t1-apps/web", svc("10.96.3.5", &[80]));
        assert_eq!(decide(&a, "10.96.3.4:80"), Err(Refusal::Address));
        assert!(decide(&a, "10.96.3.5:80").is_ok());
        a.set_service("t1-apps/web", None);
        assert!(a.is_empty());
    }

    proptest! {
        /// Whatever the tenant's objects, an address is allowed exactly when one of them
        /// holds it now, however their addresses changed on the way.
        #[test]
        fn allowed_addresses_are_exactly_those_the_objects_hold_now(
            changes in proptest::collection::vec((0u8..6, proptest::option::of(0u8..4), any::<bool>()), 0..60),
            probe in 0u8..4,
            port in 1u16..4,
        ) {
            let mut a = Allowed::default();
            let mut pods: HashMap<u8, u8> = HashMap::new();
            let mut services: HashMap<u8, u8> = HashMap::new();
            let ip = |n: u8| -> IpAddr { format!("10.0.0.{n}").parse().unwrap() };
            for (obj, addr, is_pod) in changes {
                let key = format!("t1-a/o{obj}");
                if is_pod {
                    a.set_pod(&key, addr.map(ip));
                    match addr { Some(n) => { pods.insert(obj, n); } None => { pods.remove(&obj); } }
                } else {
                    a.set_service(&key, addr.map(|n| ServiceAddr { ip: ip(n), ports: vec![1, 2] }));
                    match addr { Some(n) => { services.insert(obj, n); } None => { services.remove(&obj); } }
                }
            }
            let held = pods.values().any(|n| *n == probe)
                || (port <= 2 && services.values().any(|n| *n == probe));
            let target = format!("10.0.0.{probe}:{port}");
            prop_assert_eq!(decide(&a, &target).is_ok(), held);
        }

        /// No target outside the tenant's addresses and names is ever allowed.
        #[test]
        fn arbitrary_targets_are_refused(host in "[a-z0-9.:\\[\\]-]{1,40}", port in any::<u16>()) {
            let a = tenant();
            let target = format!("{host}:{port}");
            if let Ok(d) = decide(&a, &target) {
                let ok = match d {
                    Dial::Own => true,
                    Dial::To(addr) => addr.ip() == "10.244.1.7".parse::<IpAddr>().unwrap()
                        || addr.ip() == "10.96.3.4".parse::<IpAddr>().unwrap(),
                };
                prop_assert!(ok, "{} allowed as {:?}", target, d);
            }
        }
    }
}
