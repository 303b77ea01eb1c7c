//! The tenant-wide quota at the edges: verdicts from the tenant caches, the host backstop, and
//! usage on `/metrics`.
//!
//! Each down-reconcile that would create a host pod, Service, claim or namespace asks for its
//! object's verdict here; the verdict is [`policy::quota::admitted`] over the tenant caches
//! (pure, in creation order), so it never costs a request. A refused object is told once
//! (`TenantQuotaExceeded`: a Warning event, for pods also a `PodScheduled: False` condition)
//! and looked at again every [`retry`]: when an admitted object goes, the next in line fits
//! within seconds, without a trigger of its own. A cache that has not listed yet never blocks a
//! reconcile: the verdict is [`Verdict::NotReady`] and the caller requeues.

use super::Engine;
use super::shared::Cache;
use crate::Result;
use crate::policy::quota::{self as policy_quota, Objects, Verdicts};
use crate::policy::{self, Refusal};
use crate::resources::FIELD_MANAGER;
use crate::resources::namespaces::backstop;
use k8s_openapi::api::core::v1::{
    LimitRange, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming;

/// The reason of every quota refusal (events and pod conditions).
pub const REASON: &str = "TenantQuotaExceeded";

/// How often an object waiting for quota is looked at again (at most the resync period). A
/// look costs no request: the verdict comes from the caches, and the refusal is told once.
pub const RETRY: Duration = Duration::from_secs(5);

/// How soon a reconcile that found a cache not yet listed tries again.
const NOT_READY: Duration = Duration::from_secs(1);

/// The requeue of an object waiting for quota.
pub fn retry(e: &Engine) -> Duration {
    e.resync.min(RETRY)
}

/// The requeue of a reconcile that found a cache not listed yet.
pub fn not_ready() -> Duration {
    NOT_READY
}

/// How long the syncer remembers a host object it just created: far longer than its host
/// cache lags, after which the cache shows the object (or its absence).
const RECENT: Duration = Duration::from_secs(30);

/// Serializes admission: a verdict and the create it allows happen under one lock, and what
/// was just created counts as on the host until the host cache shows it. Without it, reconciles
/// running at once (one per worker) each see the others' objects not yet on the host, and
/// objects created within the same second (timestamps have seconds only) arrive in the tenant
/// cache in any order: a burst admitted more than the plan allows, and only the host's
/// per-namespace backstop stopped it.
#[derive(Default)]
pub struct Admission {
    lock: tokio::sync::Mutex<()>,
    recent: std::sync::Mutex<std::collections::HashMap<policy_quota::Placed, std::time::Instant>>,
}

impl Admission {
    /// Holds admission for one verdict and the create it allows.
    pub async fn lock(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock.lock().await
    }

    /// Records that `K` `ns/name` was just created on the host.
    pub fn created<K: kube::Resource<DynamicType = ()>>(&self, ns: &str, name: &str) {
        let mut m = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        m.retain(|_, at| at.elapsed() < RECENT);
        m.insert(
            (K::kind(&()).to_string(), ns.to_owned(), name.to_owned()),
            std::time::Instant::now(),
        );
    }

    fn add_recent(&self, out: &mut BTreeSet<policy_quota::Placed>) {
        let m = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(
            m.iter()
                .filter(|(_, at)| at.elapsed() < RECENT)
                .map(|(k, _)| k.clone()),
        );
    }
}

/// An object's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Admitted,
    Refused(Vec<Refusal>),
    /// A cache the verdict needs has not listed yet (or does not show the object yet).
    NotReady,
}

fn ready<K>(c: &std::sync::OnceLock<Cache<K>>) -> Option<Vec<Arc<K>>>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    c.get().filter(|c| super::cache_ready(c)).map(|c| c.state())
}

/// The tenant objects of `host` (this tenant's host objects of one kind) that are on the host.
fn placed<K>(e: &Engine, host: &[Arc<K>], out: &mut BTreeSet<policy_quota::Placed>)
where
    K: kube::Resource<DynamicType = ()>,
{
    for h in host {
        if let Some(r) = naming::tenant_ref(e.key(), h.labels(), h.annotations()) {
            out.insert((
                K::kind(&()).to_string(),
                r.namespace.unwrap_or_default(),
                r.name,
            ));
        }
    }
}

/// A kind the quota counts besides namespaces.
pub trait Counted: kube::Resource<DynamicType = ()> + Clone + 'static {
    /// Puts `all` into its place in `objects`.
    fn list<'a>(objects: &mut Objects<'a>, all: &'a [Arc<Self>]);
}

impl Counted for Pod {
    fn list<'a>(objects: &mut Objects<'a>, all: &'a [Arc<Self>]) {
        objects.pods = all.iter().map(|o| o.as_ref()).collect();
    }
}

impl Counted for Service {
    fn list<'a>(objects: &mut Objects<'a>, all: &'a [Arc<Self>]) {
        objects.services = all.iter().map(|o| o.as_ref()).collect();
    }
}

impl Counted for PersistentVolumeClaim {
    fn list<'a>(objects: &mut Objects<'a>, all: &'a [Arc<Self>]) {
        objects.claims = all.iter().map(|o| o.as_ref()).collect();
    }
}

impl Counted for Namespace {
    /// Namespaces are always listed (see [`verdicts`]).
    fn list<'a>(_: &mut Objects<'a>, _: &'a [Arc<Self>]) {}
}

/// Verdicts for the namespaces and, if given, one other kind (its tenant and host caches).
/// `None` while a cache has not listed yet.
fn verdicts<K: Counted>(e: &Engine, kind: Option<(&Cache<K>, &Cache<K>)>) -> Option<Verdicts> {
    let namespaces = ready(&e.tenant_namespaces)?;
    let mut on_host = BTreeSet::new();
    placed(e, &ready(&e.host_namespaces)?, &mut on_host);
    let (tenant, host) = match kind {
        Some((t, h)) if super::cache_ready(t) && super::cache_ready(h) => (t.state(), h.state()),
        Some(_) => return None,
        None => (Vec::new(), Vec::new()),
    };
    placed(e, &host, &mut on_host);
    e.admission.add_recent(&mut on_host);
    let mut objects = Objects {
        namespaces: namespaces.iter().map(|n| n.as_ref()).collect(),
        placed: on_host,
        ..Default::default()
    };
    K::list(&mut objects, &tenant);
    Some(policy_quota::admitted(&objects, &e.ctx.policy.quota).0)
}

fn lookup<V>(
    m: Option<&std::collections::BTreeMap<V, Vec<Refusal>>>,
    key: &V,
    judged: bool,
) -> Verdict
where
    V: Ord,
{
    let Some(m) = m else {
        return Verdict::NotReady;
    };
    match m.get(key) {
        Some(r) if r.is_empty() => Verdict::Admitted,
        Some(r) => Verdict::Refused(r.clone()),
        // Not judged (terminating, finished): takes nothing, needs nothing.
        None if !judged => Verdict::Admitted,
        // Should be judged but is not in the cache yet.
        None => Verdict::NotReady,
    }
}

fn key<K: kube::Resource>(o: &K) -> (String, String) {
    (
        o.meta().namespace.clone().unwrap_or_default(),
        o.meta().name.clone().unwrap_or_default(),
    )
}

/// A tenant pod's verdict.
pub fn pod(e: &Engine, t: &Pod) -> Verdict {
    let (Some(tenant), Some(host)) = (e.tenant_pods.get(), e.host_pods.get()) else {
        return Verdict::NotReady;
    };
    let v = verdicts(e, Some((tenant, host)));
    lookup(v.as_ref().map(|v| &v.pods), &key(t), false)
}

/// A tenant Service's verdict (`side`: the Service caches).
pub fn service(e: &Engine, side: &super::Side<Service>, t: &Service) -> Verdict {
    let v = verdicts(e, Some((&side.tenant, &side.host)));
    let judged = t.metadata.deletion_timestamp.is_none()
        && !crate::resources::services::is_apiserver_service(t);
    lookup(v.as_ref().map(|v| &v.services), &key(t), judged)
}

/// A tenant claim's verdict (`side`: the claim caches).
pub fn claim(
    e: &Engine,
    side: &super::Side<PersistentVolumeClaim>,
    t: &PersistentVolumeClaim,
) -> Verdict {
    let v = verdicts(e, Some((&side.tenant, &side.host)));
    let judged = t.metadata.deletion_timestamp.is_none();
    lookup(v.as_ref().map(|v| &v.claims), &key(t), judged)
}

/// A tenant namespace's verdict.
pub fn namespace(e: &Engine, t: &Namespace) -> Verdict {
    let v = verdicts::<Namespace>(e, None);
    let judged = t.metadata.deletion_timestamp.is_none();
    lookup(v.as_ref().map(|v| &v.namespaces), &t.name_any(), judged)
}

/// Whether tenant namespace `ns` is kept off the host by the quota (`None`: not known yet).
/// Objects of kinds the quota does not count (ConfigMaps, Secrets, Endpoints) wait with it.
pub fn namespace_waits(e: &Engine, ns: &str) -> Option<bool> {
    let v = verdicts::<Namespace>(e, None)?;
    Some(v.namespaces.get(ns).is_some_and(|r| !r.is_empty()))
}

/// Whether a host create failed on the quota backstop (`vcp-quota`). Other host quotas (the
/// host operator's own) stay errors: counted and retried with backoff, as before.
pub fn host_refused(err: &crate::Error) -> bool {
    let ours = format!(
        "exceeded quota: {}",
        crate::resources::namespaces::QUOTA_NAME
    );
    matches!(err, crate::Error::Kube { source: kube::Error::Api(ae), .. }
        if ae.code == 403 && ae.message.contains(&ours))
}

/// Whether a host create was refused because the backstop of a new host namespace has no
/// usage yet (the host's quota controller fills it in within moments): retried shortly and
/// quietly, not an error.
pub fn host_quota_pending(err: &crate::Error) -> bool {
    let ours = format!(
        "status unknown for quota: {}",
        crate::resources::namespaces::QUOTA_NAME
    );
    matches!(err, crate::Error::Kube { source: kube::Error::Api(ae), .. }
        if ae.code == 403 && ae.message.contains(&ours))
}

/// What a tenant is told when the host's backstop refused an object the syncer admitted.
pub fn host_refusal() -> Refusal {
    Refusal::new(
        "quota",
        policy_quota::RULE,
        "the host's quota for this namespace is used up (objects admitted at the same moment); this one waits",
    )
}

/// Tells the tenant, once per object and message, that `t` waits for quota (a Warning event).
/// Remembered in memory only: a restarted syncer tells again, which costs one event.
pub async fn tell<K: kube::Resource<DynamicType = ()>>(e: &Engine, t: &K, refusals: &[Refusal]) {
    let message = policy::summary(refusals);
    let uid = t.meta().uid.clone().unwrap_or_default();
    {
        let mut told = e.told.lock().unwrap_or_else(|p| p.into_inner());
        if told.get(&uid) == Some(&message) {
            return;
        }
        // Bounded: it only saves repeated events.
        if told.len() >= 10_000 {
            told.clear();
        }
        told.insert(uid, message.clone());
    }
    tracing::info!(kind = %K::kind(&()), ns = ?t.meta().namespace, name = ?t.meta().name, %message, "kept off the host by the tenant quota");
    e.report(t, REASON, message).await;
}

/// Applies the quota backstop (ResourceQuota `vcp-quota`, LimitRange `vcp-limits`) to host
/// namespace `host_ns`, one of this tenant's. Server-side apply with force: idempotent, and
/// whatever someone changed is put back on the next pass.
pub async fn apply_backstop(e: &Engine, host_ns: &str) -> Result<()> {
    let (quota, limits) = backstop(host_ns, &e.ctx);
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    Api::<ResourceQuota>::namespaced(e.host.clone(), host_ns)
        .patch(
            crate::resources::namespaces::QUOTA_NAME,
            &pp,
            &Patch::Apply(&quota),
        )
        .await
        .map_err(super::kube_err(format!(
            "apply host resource quota {host_ns}/{}",
            crate::resources::namespaces::QUOTA_NAME
        )))?;
    Api::<LimitRange>::namespaced(e.host.clone(), host_ns)
        .patch(
            crate::resources::namespaces::LIMITS_NAME,
            &pp,
            &Patch::Apply(&limits),
        )
        .await
        .map_err(super::kube_err(format!(
            "apply host limit range {host_ns}/{}",
            crate::resources::namespaces::LIMITS_NAME
        )))?;
    Ok(())
}

/// Exports the quota once and the tenant's usage every `period` on `/metrics`, from the tenant
/// caches once they have all listed. (Services and claims on the host are not known here, so
/// their order is creation order alone: the counts are the same, only which ones may differ
/// for objects created in the same second.)
pub async fn usage(e: Arc<Engine>, period: Duration) {
    e.metrics.tenant_quota(&e.ctx.policy.quota.hard());
    loop {
        tokio::time::sleep(period).await;
        let (Some(namespaces), Some(pods), Some(services), Some(claims)) = (
            ready(&e.tenant_namespaces),
            ready(&e.tenant_pods),
            ready(&e.tenant_services),
            ready(&e.tenant_claims),
        ) else {
            continue;
        };
        let mut on_host = BTreeSet::new();
        if let Some(h) = ready(&e.host_namespaces) {
            placed(&e, &h, &mut on_host);
        }
        if let Some(h) = ready(&e.host_pods) {
            placed(&e, &h, &mut on_host);
        }
        let objects = Objects {
            namespaces: namespaces.iter().map(|n| n.as_ref()).collect(),
            pods: pods.iter().map(|p| p.as_ref()).collect(),
            services: services.iter().map(|s| s.as_ref()).collect(),
            claims: claims.iter().map(|c| c.as_ref()).collect(),
            placed: on_host,
        };
        let (_, used) = policy_quota::admitted(&objects, &e.ctx.policy.quota);
        e.metrics.tenant_usage(&used);
    }
}
