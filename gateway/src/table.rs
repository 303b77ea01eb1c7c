//! Filling the [`RouteTable`] from the host cluster: every Service labelled
//! [`LABEL_GATEWAY_NAME`] is a tenant apiserver the gateway routes to.
//!
//! Data flow: [`run`] watches Services with the label in every namespace (kube-runtime's
//! watcher, with its backoff) and hands each event to a [`Follower`]. The follower reads the
//! Service's backend ([`backend_of`]: the label's tenant name, `spec.clusterIP`, the port
//! named `https`, else the first, and whether the [`ANNOTATION_ASLEEP`] annotation says the
//! tenant is asleep), records it in its [`Claims`] and writes the routes whose owner or target
//! changed into the table, so an added, changed or deleted Service takes effect at once, and a
//! tenant falling asleep or waking (the annotation alone changing) too.
//! A full list (the first, and each one the watcher makes after losing its watch) is gathered
//! aside and swapped in whole when complete: the table keeps serving the old routes meanwhile,
//! and routes of Services deleted while the watch was down go then. The first complete list
//! marks the table synced, which makes the gateway ready.
//!
//! Two Services claiming the same tenant name should not happen (the orchestrator labels one
//! per tenant), but a label is easy to copy. The claim of the Service first in
//! `namespace/name` order wins, so every replica of the gateway picks the same one whatever
//! order it saw them in; the conflict is logged. Per event the work is one map update, whatever
//! the number of Services.

use crate::route::{RouteTable, Target, TenantKey};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Service;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// The label of a tenant apiserver's Service on the host; its value is the tenant name.
pub const LABEL_GATEWAY_NAME: &str = "vcp.dev/gateway-name";
/// The Service port the gateway connects to; without one of that name, the first port.
pub const PORT_NAME: &str = "https";
/// The annotation vcp puts on an asleep tenant's apiserver Service, with the value `"true"`
/// (absent when awake). The orchestrator's `render::ANNOTATION_ASLEEP`, restated: the gateway
/// does not depend on the orchestrator crate.
pub const ANNOTATION_ASLEEP: &str = "vcp.dev/asleep";

/// A Service, by namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceRef {
    pub fn of(svc: &Service) -> ServiceRef {
        ServiceRef {
            namespace: svc.metadata.namespace.clone().unwrap_or_default(),
            name: svc.metadata.name.clone().unwrap_or_default(),
        }
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// Why a labelled Service gives no route.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("label {LABEL_GATEWAY_NAME} is not a tenant key")]
    BadName,
    #[error("no cluster IP (headless or ExternalName)")]
    NoClusterIp,
    #[error("cluster IP {0:?} is not an IP address")]
    BadClusterIp(String),
    #[error("no ports")]
    NoPorts,
    #[error("port {0} out of range")]
    BadPort(i32),
}

/// Whether a Service says its tenant is asleep: [`ANNOTATION_ASLEEP`] is `"true"`. vcp writes
/// that or nothing; any other value is read as awake, which only costs a waiting connection
/// its wait (a refused dial fails at once) rather than waking a tenant nobody put to sleep.
pub fn is_asleep(svc: &Service) -> bool {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_ASLEEP))
        .is_some_and(|v| v == "true")
}

/// The tenant a Service serves and where: its label, cluster IP and `https` (or first) port,
/// and whether the tenant is asleep.
pub fn backend_of(svc: &Service) -> Result<(TenantKey, Target), Skip> {
    let label = svc
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_GATEWAY_NAME))
        .map_or("", String::as_str);
    let name = TenantKey::new(label).map_err(|_| Skip::BadName)?;
    let spec = svc.spec.as_ref();
    let ip = match spec.and_then(|s| s.cluster_ip.as_deref()) {
        None | Some("" | "None") => return Err(Skip::NoClusterIp),
        Some(ip) => ip
            .parse::<IpAddr>()
            .map_err(|_| Skip::BadClusterIp(ip.to_owned()))?,
    };
    let ports = spec.and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let port = ports
        .iter()
        .find(|p| p.name.as_deref() == Some(PORT_NAME))
        .or(ports.first())
        .ok_or(Skip::NoPorts)?
        .port;
    let port = u16::try_from(port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(Skip::BadPort(port))?;
    let target = Target {
        backend: SocketAddr::new(ip, port),
        asleep: is_asleep(svc),
    };
    Ok((name, target))
}

/// Which Services claim which tenant names (pure bookkeeping).
#[derive(Debug, Default)]
pub struct Claims {
    by_service: HashMap<ServiceRef, TenantKey>,
    by_name: HashMap<TenantKey, BTreeMap<ServiceRef, Target>>,
}

impl Claims {
    /// Records what `svc` claims now (`None`: nothing, it was deleted or is skipped); returns
    /// the names whose route may have changed.
    pub fn update(
        &mut self,
        svc: ServiceRef,
        claim: Option<(TenantKey, Target)>,
    ) -> Vec<TenantKey> {
        let mut changed = Vec::with_capacity(2);
        if let Some(old) = self.by_service.remove(&svc) {
            if let Some(claimants) = self.by_name.get_mut(&old) {
                claimants.remove(&svc);
                if claimants.is_empty() {
                    self.by_name.remove(&old);
                }
            }
            changed.push(old);
        }
        if let Some((name, target)) = claim {
            self.by_name
                .entry(name.clone())
                .or_default()
                .insert(svc.clone(), target);
            self.by_service.insert(svc, name.clone());
            if !changed.contains(&name) {
                changed.push(name);
            }
        }
        changed
    }

    /// The Service whose claim on `name` wins (the first by namespace and name), and its
    /// target.
    pub fn winner(&self, name: &str) -> Option<(&ServiceRef, Target)> {
        let (svc, target) = self.by_name.get(name)?.first_key_value()?;
        Some((svc, *target))
    }

    /// How many Services claim `name`.
    pub fn claimants(&self, name: &str) -> usize {
        self.by_name.get(name).map_or(0, BTreeMap::len)
    }

    /// Every name's winning target.
    pub fn routes(&self) -> HashMap<TenantKey, Target> {
        self.by_name
            .iter()
            .filter_map(|(name, c)| Some((name.clone(), *c.first_key_value()?.1)))
            .collect()
    }
}

/// Applies watch events to a route table; `on_removed` hears of every name whose route went
/// (the caller drops what it keeps per tenant).
pub struct Follower<F> {
    routes: Arc<RouteTable>,
    claims: Claims,
    /// The list in progress, swapped in when complete.
    listing: Option<Claims>,
    on_removed: F,
}

impl<F: FnMut(&TenantKey)> Follower<F> {
    pub fn new(routes: Arc<RouteTable>, on_removed: F) -> Follower<F> {
        Follower {
            routes,
            claims: Claims::default(),
            listing: None,
            on_removed,
        }
    }

    /// Applies one watch event.
    pub fn handle(&mut self, event: watcher::Event<Service>) {
        match event {
            watcher::Event::Apply(svc) => {
                let changed = self.claims.update(ServiceRef::of(&svc), claim(&svc));
                self.write(changed);
            }
            watcher::Event::Delete(svc) => {
                let changed = self.claims.update(ServiceRef::of(&svc), None);
                self.write(changed);
            }
            watcher::Event::Init => self.listing = Some(Claims::default()),
            watcher::Event::InitApply(svc) => {
                let listing = self.listing.get_or_insert_default();
                listing.update(ServiceRef::of(&svc), claim(&svc));
            }
            watcher::Event::InitDone => {
                self.claims = self.listing.take().unwrap_or_default();
                for name in self.claims.routes().keys() {
                    self.warn_conflict(name);
                }
                for name in self.routes.replace_all(self.claims.routes()) {
                    (self.on_removed)(&name);
                }
                if !self.routes.is_synced() {
                    tracing::info!(routes = self.routes.len(), "route table synced");
                }
                self.routes.mark_synced();
            }
        }
    }

    /// Writes the current winner of each name in `changed` into the table.
    fn write(&mut self, changed: Vec<TenantKey>) {
        for name in changed {
            match self.claims.winner(name.as_str()) {
                Some((svc, target)) => {
                    let (backend, asleep) = (target.backend, target.asleep);
                    tracing::info!(tenant = %name, service = %svc, %backend, asleep, "route set");
                    self.warn_conflict(&name);
                    self.routes.set(name, target);
                }
                None => {
                    if self.routes.remove(name.as_str()).is_some() {
                        tracing::info!(tenant = %name, "route removed");
                        (self.on_removed)(&name);
                    }
                }
            }
        }
    }

    fn warn_conflict(&self, name: &TenantKey) {
        let n = self.claims.claimants(name.as_str());
        if n > 1
            && let Some((svc, _)) = self.claims.winner(name.as_str())
        {
            tracing::warn!(tenant = %name, claimants = n, winner = %svc, "several services claim one tenant name; the first by namespace and name wins");
        }
    }
}

/// A Service's claim, or `None` with a warning saying why it has none.
fn claim(svc: &Service) -> Option<(TenantKey, Target)> {
    match backend_of(svc) {
        Ok(c) => Some(c),
        Err(skip) => {
            tracing::warn!(service = %ServiceRef::of(svc), reason = %skip, "service skipped");
            None
        }
    }
}

/// Applies a stream of watch events until it ends; errors are logged (the watcher retries
/// with backoff, and the table keeps its routes meanwhile).
pub async fn follow<S, F>(events: S, follower: &mut Follower<F>)
where
    S: Stream<Item = watcher::Result<watcher::Event<Service>>>,
    F: FnMut(&TenantKey),
{
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(e) => follower.handle(e),
            Err(error) => tracing::warn!(%error, "watching services failed; retrying"),
        }
    }
}

/// Watches the labelled Services of every namespace into `routes` until the future is dropped.
pub async fn run(
    client: kube::Client,
    routes: Arc<RouteTable>,
    on_removed: impl FnMut(&TenantKey),
) {
    let api: kube::Api<Service> = kube::Api::all(client);
    let config = watcher::Config::default().labels(LABEL_GATEWAY_NAME);
    let mut follower = Follower::new(routes, on_removed);
    follow(watcher(api, config).default_backoff(), &mut follower).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use std::cell::RefCell;
    use std::rc::Rc;

    /// A labelled Service: `Svc::new("ns", "a").ip("10.96.0.1").port(Some("https"), 443)`.
    struct Svc(Service);

    impl Svc {
        fn new(namespace: &str, tenant: &str) -> Svc {
            let mut s = Service::default();
            s.metadata.namespace = Some(namespace.into());
            s.metadata.name = Some("kube-apiserver".into());
            s.metadata.labels = Some([(LABEL_GATEWAY_NAME.to_owned(), tenant.to_owned())].into());
            s.spec = Some(ServiceSpec::default());
            Svc(s)
        }
        fn ip(mut self, ip: &str) -> Svc {
            self.0.spec.as_mut().unwrap().cluster_ip = Some(ip.into());
            self
        }
        fn annotated(mut self, key: &str, value: &str) -> Svc {
            let annotations = self.0.metadata.annotations.get_or_insert_default();
            annotations.insert(key.into(), value.into());
            self
        }
        fn port(mut self, name: Option<&str>, port: i32) -> Svc {
            let spec = self.0.spec.as_mut().unwrap();
            spec.ports.get_or_insert_default().push(ServicePort {
                name: name.map(Into::into),
                port,
                ..Default::default()
            });
            self
        }
        /// A tenant's usual Service.
        fn apiserver(namespace: &str, tenant: &str, ip: &str) -> Service {
            Svc::new(namespace, tenant)
                .ip(ip)
                .port(Some("https"), 443)
                .0
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_backend_is_the_cluster_ip_and_the_https_port() {
        let svc = Svc::new("vcp-a", "a")
            .ip("10.96.0.7")
            .port(Some("metrics"), 9090)
            .port(Some("https"), 6443)
            .0;
        let (name, target) = backend_of(&svc).unwrap();
        assert_eq!(name.as_str(), "a");
        assert_eq!(target, Target::awake(addr("10.96.0.7:6443")));
        let first = Svc::new("vcp-a", "a")
            .ip("fd00::7")
            .port(None, 443)
            .port(None, 80)
            .0;
        assert_eq!(backend_of(&first).unwrap().1.backend, addr("[fd00::7]:443"));
    }

    #[test]
    fn services_without_a_usable_backend_or_name_are_skipped() {
        let cases = [
            (Svc::new("n", "a").port(None, 443).0, Skip::NoClusterIp),
            (
                Svc::new("n", "a").ip("None").port(None, 443).0,
                Skip::NoClusterIp,
            ),
            (
                Svc::new("n", "a").ip("").port(None, 443).0,
                Skip::NoClusterIp,
            ),
            (
                Svc::new("n", "a").ip("nope").port(None, 443).0,
                Skip::BadClusterIp("nope".into()),
            ),
            (Svc::new("n", "a").ip("10.0.0.1").0, Skip::NoPorts),
            (
                Svc::new("n", "a").ip("10.0.0.1").port(None, 70000).0,
                Skip::BadPort(70000),
            ),
        ];
        for (svc, want) in cases {
            assert_eq!(backend_of(&svc), Err(want));
        }
        for bad in ["", "A", "a.b", "-a", "a-b", &"a".repeat(21)] {
            let svc = Svc::apiserver("n", bad, "10.0.0.1");
            assert_eq!(backend_of(&svc), Err(Skip::BadName), "{bad:?}");
        }
        let mut unlabelled = Svc::apiserver("n", "a", "10.0.0.1");
        unlabelled.metadata.labels = None;
        assert_eq!(backend_of(&unlabelled), Err(Skip::BadName));
    }

    #[test]
    fn the_asleep_annotation_set_to_true_marks_the_tenant_asleep() {
        let svc = |value: Option<&str>| {
            let s = Svc::new("vcp-a", "a").ip("10.96.0.7").port(None, 443);
            let s = s.annotated("vcp.dev/other", "true");
            match value {
                Some(v) => s.annotated(ANNOTATION_ASLEEP, v).0,
                None => s.0,
            }
        };
        assert!(is_asleep(&svc(Some("true"))));
        let (_, target) = backend_of(&svc(Some("true"))).unwrap();
        assert_eq!(target, Target::asleep(addr("10.96.0.7:443")));
        // vcp writes "true" or nothing; anything else is awake.
        for awake in [None, Some("false"), Some(""), Some("True"), Some("yes")] {
            assert!(!is_asleep(&svc(awake)), "{awake:?}");
            assert!(!backend_of(&svc(awake)).unwrap().1.asleep, "{awake:?}");
        }
        assert_eq!(
            ANNOTATION_ASLEEP, "vcp.dev/asleep",
            "the orchestrator's name"
        );
    }

    /// The names a follower reported removed.
    type Removed = Rc<RefCell<Vec<String>>>;

    /// A follower over a fresh table, and the names it reported removed.
    fn follower() -> (Follower<impl FnMut(&TenantKey)>, Arc<RouteTable>, Removed) {
        let routes = Arc::new(RouteTable::new());
        let removed = Rc::new(RefCell::new(Vec::new()));
        let r = removed.clone();
        let f = Follower::new(routes.clone(), move |n: &TenantKey| {
            r.borrow_mut().push(n.to_string())
        });
        (f, routes, removed)
    }

    fn backend(routes: &RouteTable, name: &str) -> Option<SocketAddr> {
        routes.get(name).map(|r| r.backend)
    }

    #[test]
    fn a_tenant_falling_asleep_and_waking_changes_its_route_at_once() {
        let (mut f, routes, removed) = follower();
        let asleep = || {
            Svc::new("vcp-a", "a")
                .ip("10.0.0.1")
                .port(Some("https"), 443)
                .annotated(ANNOTATION_ASLEEP, "true")
                .0
        };
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        let awake = routes.get("a").unwrap();
        assert!(!awake.asleep);
        f.handle(watcher::Event::Apply(asleep()));
        let slept = routes.get("a").unwrap();
        assert!(slept.asleep, "the annotation alone is a route change");
        assert!(slept.generation > awake.generation);
        assert_eq!(slept.backend, awake.backend);
        f.handle(watcher::Event::Apply(asleep()));
        assert_eq!(
            routes.get("a"),
            Some(slept),
            "the same Service is no change"
        );
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        assert!(!routes.get("a").unwrap().asleep);
        // A relist sees the annotation too.
        f.handle(watcher::Event::Init);
        f.handle(watcher::Event::InitApply(asleep()));
        f.handle(watcher::Event::InitDone);
        assert!(routes.get("a").unwrap().asleep);
        assert!(removed.borrow().is_empty(), "asleep is not gone");
    }

    #[test]
    fn the_table_is_synced_once_the_first_list_is_complete() {
        let (mut f, routes, _) = follower();
        f.handle(watcher::Event::Init);
        f.handle(watcher::Event::InitApply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        f.handle(watcher::Event::InitApply(
            Svc::new("vcp-x", "x").port(None, 443).0,
        ));
        assert!(!routes.is_synced());
        assert_eq!(backend(&routes, "a"), None, "a list is swapped in whole");
        f.handle(watcher::Event::InitDone);
        assert!(routes.is_synced());
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.1:443")));
        assert_eq!(backend(&routes, "x"), None, "skipped: no cluster IP");
    }

    #[test]
    fn changes_and_deletions_take_effect_at_once() {
        let (mut f, routes, removed) = follower();
        f.handle(watcher::Event::Init);
        f.handle(watcher::Event::InitDone);
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-b", "b", "10.0.0.2",
        )));
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.1:443")));
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.9",
        )));
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.9:443")));
        f.handle(watcher::Event::Delete(Svc::apiserver(
            "vcp-b", "b", "10.0.0.2",
        )));
        assert_eq!(backend(&routes, "b"), None);
        assert_eq!(*removed.borrow(), ["b"]);
        // A Service that loses its cluster IP or changes its label loses its old route.
        f.handle(watcher::Event::Apply(
            Svc::new("vcp-a", "a").port(None, 443).0,
        ));
        assert_eq!(backend(&routes, "a"), None);
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a2", "10.0.0.1",
        )));
        assert_eq!(backend(&routes, "a"), None);
        assert_eq!(backend(&routes, "a2"), Some(addr("10.0.0.1:443")));
        assert_eq!(*removed.borrow(), ["b", "a", "a"]);
    }

    #[test]
    fn a_relist_drops_the_services_deleted_while_the_watch_was_down() {
        let (mut f, routes, removed) = follower();
        f.handle(watcher::Event::Init);
        f.handle(watcher::Event::InitApply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        f.handle(watcher::Event::InitApply(Svc::apiserver(
            "vcp-b", "b", "10.0.0.2",
        )));
        f.handle(watcher::Event::InitDone);
        f.handle(watcher::Event::Init);
        f.handle(watcher::Event::InitApply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        assert_eq!(
            backend(&routes, "b"),
            Some(addr("10.0.0.2:443")),
            "served meanwhile"
        );
        f.handle(watcher::Event::InitDone);
        assert_eq!(backend(&routes, "b"), None);
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.1:443")));
        assert_eq!(*removed.borrow(), ["b"]);
        // The relisted claims are the follower's from now on.
        f.handle(watcher::Event::Delete(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        assert_eq!(backend(&routes, "a"), None);
    }

    #[test]
    fn the_first_service_by_namespace_and_name_wins_a_contested_name() {
        let (mut f, routes, removed) = follower();
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "z-copy",
            "a",
            "10.0.0.66",
        )));
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.66:443")));
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.1:443")));
        f.handle(watcher::Event::Apply(Svc::apiserver(
            "z-copy",
            "a",
            "10.0.0.67",
        )));
        assert_eq!(
            backend(&routes, "a"),
            Some(addr("10.0.0.1:443")),
            "the winner stays"
        );
        f.handle(watcher::Event::Delete(Svc::apiserver(
            "vcp-a", "a", "10.0.0.1",
        )));
        assert_eq!(backend(&routes, "a"), Some(addr("10.0.0.67:443")));
        assert!(removed.borrow().is_empty(), "the name never lost its route");
    }
}
