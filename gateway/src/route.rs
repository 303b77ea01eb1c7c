//! Which tenant a server name means, and where that tenant's apiserver is (pure).
//!
//! Data flow: the proxy hands the name from the ClientHello to [`tenant_of`], which strips the
//! gateway's [`Domain`] and checks what is left as a [`TenantKey`] (the rule of
//! `vcp_core::naming`, which makes every key); the key is then looked up in the
//! [`RouteTable`], which [`crate::table`] fills from the host cluster's Services (and tests
//! fill by hand). A name that is not `<key>.<domain>` gets a [`Refusal`] and no lookup, so a
//! hostile client never makes the gateway hold anything keyed by a name it made up.
//!
//! A route is a [`Target`]: the Service's address and whether the tenant is asleep (its
//! control plane scaled to zero), which tells the proxy to ask for a wake and wait rather than
//! fail on the first refused dial.
//!
//! Tenants are routed by key, not by name: names repeat across owners, and a key is never
//! reused (a tenant created again under a deleted one's name is a new host name).

use std::collections::HashMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{PoisonError, RwLock};

pub use vcp_core::naming::TenantKey;

/// Why a server name does not name a tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not under the gateway's domain")]
    WrongDomain,
    #[error("more than one label before the domain")]
    Nested,
    #[error("not a tenant key (a lowercase letter, then at most 19 lowercase letters or digits)")]
    BadKey,
}

/// The domain tenants are served under: lowercase, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain(String);

impl Domain {
    /// Checks a configured domain (a DNS name of LDH labels; a trailing dot is dropped).
    pub fn new(s: &str) -> crate::Result<Domain> {
        let d = s.strip_suffix('.').unwrap_or(s).to_ascii_lowercase();
        let refuse = |reason| {
            Err(crate::Error::Domain {
                domain: s.to_owned(),
                reason,
            })
        };
        if d.is_empty() || d.len() > crate::sni::MAX_NAME - 2 {
            return refuse("must be 1 to 251 characters");
        }
        for label in d.split('.') {
            let ldh = label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
            if !(1..=63).contains(&label.len())
                || !ldh
                || label.starts_with('-')
                || label.ends_with('-')
            {
                return refuse("must be dot-separated labels of letters, digits and '-'");
            }
        }
        Ok(Domain(d))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The tenant `host` names: `host` must be `<key>.<domain>` (ASCII case ignored), one label
/// before the domain, and `<key>` (lowercased) a valid tenant key.
pub fn tenant_of(host: &str, domain: &Domain) -> Result<TenantKey, Refusal> {
    let d = domain.as_str();
    // `get` rather than indexing: a host that is not ASCII must be refused, not panic.
    let cut = host.len().checked_sub(d.len() + 1);
    let (label, dot, suffix) = match cut {
        Some(cut) => (host.get(..cut), host.get(cut..=cut), host.get(cut + 1..)),
        None => (None, None, None),
    };
    let (Some(label), Some("."), Some(suffix)) = (label, dot, suffix) else {
        return Err(Refusal::WrongDomain);
    };
    if !suffix.eq_ignore_ascii_case(d) {
        return Err(Refusal::WrongDomain);
    }
    if label.contains('.') {
        return Err(Refusal::Nested);
    }
    TenantKey::new(&label.to_ascii_lowercase()).map_err(|_| Refusal::BadKey)
}

/// What a tenant's Service says of its apiserver: where it is, and whether it is asleep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The tenant apiserver's Service: its cluster IP and port.
    pub backend: SocketAddr,
    /// The tenant is asleep: its control plane is scaled to zero, so the Service has no
    /// endpoints and a connection must wait for a wake.
    pub asleep: bool,
}

impl Target {
    pub fn awake(backend: SocketAddr) -> Target {
        Target {
            backend,
            asleep: false,
        }
    }

    pub fn asleep(backend: SocketAddr) -> Target {
        Target {
            backend,
            asleep: true,
        }
    }
}

/// A bare address is an awake tenant's (tests, a static configuration).
impl From<SocketAddr> for Target {
    fn from(backend: SocketAddr) -> Target {
        Target::awake(backend)
    }
}

/// Where a tenant's connections go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Route {
    /// The tenant apiserver's Service: its cluster IP and port.
    pub backend: SocketAddr,
    /// Whether the tenant is asleep (see [`Target::asleep`]).
    pub asleep: bool,
    /// The table's generation when this route was set.
    pub generation: u64,
}

impl Route {
    fn new(target: Target, generation: u64) -> Route {
        Route {
            backend: target.backend,
            asleep: target.asleep,
            generation,
        }
    }

    pub fn target(&self) -> Target {
        Target {
            backend: self.backend,
            asleep: self.asleep,
        }
    }
}

/// Tenant name -> backend, shared by the proxy (reads, one per connection) and whatever fills
/// it (writes, one per Service change). Every change, of the backend or of whether the tenant
/// is asleep, bumps the table's generation, and a route keeps the generation it was set at, so
/// a reader can tell a route it saw before from a new one.
#[derive(Debug, Default)]
pub struct RouteTable {
    state: RwLock<State>,
    synced: AtomicBool,
}

#[derive(Debug, Default)]
struct State {
    routes: HashMap<TenantKey, Route>,
    generation: u64,
}

impl RouteTable {
    /// An empty table, not synced: [`crate::table`] fills it and marks it synced.
    pub fn new() -> RouteTable {
        RouteTable::default()
    }

    /// A table holding these routes, already synced (tests, a static configuration).
    pub fn from_routes<T: Into<Target>>(
        routes: impl IntoIterator<Item = (TenantKey, T)>,
    ) -> RouteTable {
        let table = RouteTable::new();
        table.replace_all(routes.into_iter().map(|(n, t)| (n, t.into())).collect());
        table.mark_synced();
        table
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, State> {
        // Nothing panics while holding the lock, and the map is consistent after every
        // statement; a poisoned lock is still a good table.
        self.state.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The route of tenant `name`, if there is one.
    pub fn get(&self, name: &str) -> Option<Route> {
        self.read().routes.get(name).copied()
    }

    /// Routes `name` to `target` (a bare address: awake); the route's generation (unchanged if
    /// it already was exactly that).
    pub fn set(&self, name: TenantKey, target: impl Into<Target>) -> u64 {
        let target = target.into();
        let mut s = self.write();
        if let Some(r) = s.routes.get(&name)
            && r.target() == target
        {
            return r.generation;
        }
        s.generation += 1;
        let generation = s.generation;
        s.routes.insert(name, Route::new(target, generation));
        generation
    }

    /// Removes the route of `name`: new connections for it are refused from now on.
    pub fn remove(&self, name: &str) -> Option<Route> {
        let mut s = self.write();
        let removed = s.routes.remove(name);
        if removed.is_some() {
            s.generation += 1;
        }
        removed
    }

    /// Makes the table exactly `routes` (after a full list); routes that did not change keep
    /// their generation. Returns the names that no longer have a route.
    pub fn replace_all(&self, mut routes: HashMap<TenantKey, Target>) -> Vec<TenantKey> {
        let mut s = self.write();
        let mut removed = Vec::new();
        s.routes.retain(|name, route| match routes.remove(name) {
            Some(target) if target == route.target() => true,
            Some(target) => {
                // Re-added below with a new generation.
                routes.insert(name.clone(), target);
                false
            }
            None => {
                removed.push(name.clone());
                false
            }
        });
        if !removed.is_empty() || !routes.is_empty() {
            s.generation += 1;
        }
        let generation = s.generation;
        s.routes.extend(
            routes
                .into_iter()
                .map(|(name, target)| (name, Route::new(target, generation))),
        );
        removed
    }

    /// The generation of the last change.
    pub fn generation(&self) -> u64 {
        self.read().generation
    }

    /// How many tenants have a route.
    pub fn len(&self) -> usize {
        self.read().routes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Records that the table reflects the cluster (the first full list is in).
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// Whether the table reflects the cluster: until then the gateway is not ready.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn domain() -> Domain {
        Domain::new("example.test").unwrap()
    }

    fn name(s: &str) -> TenantKey {
        TenantKey::new(s).unwrap()
    }

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([10, 96, 0, 1], port))
    }

    #[test]
    fn one_label_before_the_domain_is_the_tenant_in_any_case() {
        assert_eq!(tenant_of("a.example.test", &domain()), Ok(name("a")));
        assert_eq!(
            tenant_of("Team1abc.EXAMPLE.test", &domain()),
            Ok(name("team1abc"))
        );
        let configured = Domain::new("Example.Test.").unwrap();
        assert_eq!(configured.as_str(), "example.test");
        assert_eq!(tenant_of("a.example.test", &configured), Ok(name("a")));
    }

    #[test]
    fn names_outside_the_domain_are_refused() {
        for host in [
            "example.test",
            "a.example.org",
            "a.other-example.test",
            "aexample.test",
            "a.example.test.evil",
            "",
            "test",
            "\u{e9}\u{e9}example.test",
        ] {
            assert_eq!(
                tenant_of(host, &domain()),
                Err(Refusal::WrongDomain),
                "{host:?}"
            );
        }
    }

    #[test]
    fn nested_names_are_refused() {
        assert_eq!(
            tenant_of("x.a.example.test", &domain()),
            Err(Refusal::Nested)
        );
        assert_eq!(tenant_of("..example.test", &domain()), Err(Refusal::Nested));
    }

    #[test]
    fn what_is_no_tenant_key_is_refused() {
        let refused = |label: &str| tenant_of(&format!("{label}.example.test"), &domain());
        let max = vcp_core::naming::MAX_KEY;
        assert_eq!(refused(&"a".repeat(max)), Ok(name(&"a".repeat(max))));
        for label in [
            "a".repeat(max + 1),
            "a".repeat(300),
            "1a".into(),
            "a-b".into(),
            "a_b".into(),
            "a\u{e9}".into(),
            "a b".into(),
            "x*".into(),
        ] {
            assert_eq!(refused(&label), Err(Refusal::BadKey), "{label:?}");
        }
        assert_eq!(tenant_of(".example.test", &domain()), Err(Refusal::BadKey));
        // The rule itself does not fold case: labels from Services must be exact.
        assert!(TenantKey::new("A").is_err());
    }

    #[test]
    fn bad_domains_are_refused() {
        for d in ["", ".", "a..b", "-a.test", "a_b.test", &"a".repeat(64)] {
            assert!(Domain::new(d).is_err(), "{d:?}");
        }
    }

    #[test]
    fn the_table_routes_until_a_name_is_removed_and_counts_generations() {
        let t = RouteTable::new();
        assert!(!t.is_synced());
        assert_eq!(t.get("a"), None);
        let g1 = t.set(name("a"), addr(443));
        assert_eq!(
            t.get("a"),
            Some(Route {
                backend: addr(443),
                asleep: false,
                generation: g1
            })
        );
        assert_eq!(
            t.set(name("a"), addr(443)),
            g1,
            "the same backend is no change"
        );
        let g2 = t.set(name("a"), addr(6443));
        assert!(g2 > g1);
        assert_eq!(t.get("a").unwrap().backend, addr(6443));
        assert_eq!(t.remove("a").map(|r| r.backend), Some(addr(6443)));
        assert_eq!(t.get("a"), None);
        assert!(t.generation() > g2);
        assert_eq!(t.remove("a"), None);
    }

    #[test]
    fn replacing_the_table_reports_the_names_that_went_and_keeps_the_rest() {
        let t = RouteTable::from_routes([(name("a"), addr(1)), (name("b"), addr(2))]);
        assert!(t.is_synced());
        let a = t.get("a").unwrap();
        let removed = t.replace_all(HashMap::from([
            (name("a"), Target::awake(addr(1))),
            (name("c"), Target::awake(addr(3))),
        ]));
        assert_eq!(removed, vec![name("b")]);
        assert_eq!(
            t.get("a"),
            Some(a),
            "an unchanged route keeps its generation"
        );
        assert_eq!(t.get("b"), None);
        assert_eq!(t.get("c").unwrap().backend, addr(3));
        let moved = t.replace_all(HashMap::from([
            (name("a"), Target::awake(addr(9))),
            (name("c"), Target::awake(addr(3))),
        ]));
        assert!(moved.is_empty());
        assert_eq!(t.get("a").unwrap().backend, addr(9));
        assert!(t.get("a").unwrap().generation > a.generation);
        assert_eq!(t.len(), 2);
        let c = t.get("c").unwrap();
        assert!(
            t.replace_all(HashMap::from([
                (name("a"), Target::awake(addr(9))),
                (name("c"), Target::asleep(addr(3))),
            ]))
            .is_empty()
        );
        let slept = t.get("c").unwrap();
        assert!(slept.asleep && slept.generation > c.generation);
    }

    #[test]
    fn falling_asleep_or_waking_alone_is_a_route_change() {
        let t = RouteTable::new();
        let awake = t.set(name("a"), Target::awake(addr(443)));
        assert!(!t.get("a").unwrap().asleep);
        let asleep = t.set(name("a"), Target::asleep(addr(443)));
        assert!(asleep > awake, "the same backend, asleep now: a new route");
        assert!(t.get("a").unwrap().asleep);
        assert_eq!(t.set(name("a"), Target::asleep(addr(443))), asleep);
        let woken = t.set(name("a"), addr(443));
        assert!(woken > asleep);
        assert_eq!(t.get("a").unwrap().target(), Target::awake(addr(443)));
    }

    proptest! {
        #[test]
        fn every_valid_key_routes_and_nothing_else_does(label in "[a-z0-9-]{0,25}") {
            let got = tenant_of(&format!("{label}.example.test"), &domain());
            let valid = (1..=vcp_core::naming::MAX_KEY).contains(&label.len())
                && label.starts_with(|c: char| c.is_ascii_lowercase())
                && !label.contains('-');
            prop_assert_eq!(got.is_ok(), valid, "{:?}", got);
        }

        #[test]
        fn arbitrary_hosts_never_panic(host in ".{0,80}") {
            let _ = tenant_of(&host, &domain());
        }
    }
}
