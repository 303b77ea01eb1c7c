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
use crate::engine::FIELD_MANAGER;
use crate::kinds::namespaces::translate::backstop;
use k8s_openapi::api::core::v1::{
    LimitRange, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service,
};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming;
use vcp_policy::quota::{self as policy_quota, Objects, Verdicts, key};
use vcp_policy::{self as policy, Refusal};

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
    let judged =
        t.metadata.deletion_timestamp.is_none() && !vcp_policy::services::is_local_service(t);
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
        crate::kinds::namespaces::translate::QUOTA_NAME
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
        crate::kinds::namespaces::translate::QUOTA_NAME
    );
    matches!(err, crate::Error::Kube { source: kube::Error::Api(ae), .. }
        if ae.code == 403 && ae.message.contains(&ours))
}

/// The host's backstop's verdict on a create the syncer admitted: refused like any object over
/// the quota when two objects were admitted at once (a race the caches could not see), not
/// ready while it has not counted a new namespace yet; admitted otherwise (the create's own
/// errors are the caller's).
pub fn host_verdict(created: &Result<super::Placed>) -> Verdict {
    match created {
        Err(err) if host_quota_pending(err) => Verdict::NotReady,
        Err(err) if host_refused(err) => Verdict::Refused(vec![host_refusal()]),
        _ => Verdict::Admitted,
    }
}

impl Verdict {
    /// How soon an object with this verdict is looked at again: `None` when admitted (its
    /// reconcile goes on), every [`retry`] when refused, sooner when not judged yet.
    pub fn wait(&self, e: &Engine) -> Option<Action> {
        match self {
            Verdict::Admitted => None,
            Verdict::NotReady => Some(Action::requeue(not_ready())),
            Verdict::Refused(_) => Some(Action::requeue(retry(e))),
        }
    }
}

/// What a reconcile of `t` does about verdict `v`: `None` when admitted (go on); otherwise the
/// requeue to return, once a refusal was told to the tenant ([`tell`]). Pods tell it their own
/// way (a condition too).
pub async fn hold<K: kube::Resource<DynamicType = ()>>(
    e: &Engine,
    t: &K,
    v: Verdict,
) -> Option<Action> {
    if let Verdict::Refused(refusals) = &v {
        tell(e, t, refusals).await;
    }
    v.wait(e)
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
            crate::kinds::namespaces::translate::QUOTA_NAME,
            &pp,
            &Patch::Apply(&quota),
        )
        .await
        .map_err(super::kube_err(format!(
            "apply host resource quota {host_ns}/{}",
            crate::kinds::namespaces::translate::QUOTA_NAME
        )))?;
    Api::<LimitRange>::namespaced(e.host.clone(), host_ns)
        .patch(
            crate::kinds::namespaces::translate::LIMITS_NAME,
            &pp,
            &Patch::Apply(&limits),
        )
        .await
        .map_err(super::kube_err(format!(
            "apply host limit range {host_ns}/{}",
            crate::kinds::namespaces::translate::LIMITS_NAME
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

#[cfg(test)]
mod tests {
    //! The syncer's translators over objects the quota admitted: their host copies use exactly
    //! what admission counted, as vcp samples it from the host (`host_usage`).
    use crate::kinds::Ctx;
    use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Service};
    use kube::ResourceExt;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};
    use vcp_core::naming;
    use vcp_fixtures::{
        arb_claim, arb_namespaces, arb_pod, arb_services, at, dedup, obj, plain, pod,
    };
    use vcp_policy::quota::{
        HostObjects, Key, Limits, Objects, Quantity, Quota, RESOURCES, Resources, Usage, admitted,
        host_usage, key,
    };
    use vcp_policy::{Refusal, TenantPolicy};

    fn demo_ctx(quota: &Quota) -> Ctx {
        Ctx {
            key: naming::TenantKey::new("demo").unwrap(),
            policy: std::sync::Arc::new(TenantPolicy {
                quota: quota.clone(),
                ..Default::default()
            }),
        }
    }

    fn other_tenant(ctx: &Ctx) -> Ctx {
        Ctx {
            key: naming::TenantKey::new("other").unwrap(),
            ..ctx.clone()
        }
    }

    #[test]
    fn host_usage_counts_the_syncers_host_objects_as_admission_counts_them() {
        use crate::kinds::{
            namespaces::translate as namespaces, pods::translate as pods, pvcs::translate as pvcs,
            services::translate as services,
        };
        let l = Limits::default();
        let ctx = demo_ctx(&Quota::plan_default());
        let host_ns =
            |n: &str| namespaces::to_host(&obj(None, n, &at(0), serde_json::json!({})), &ctx);
        let host_pod = |p: &Pod| pods::to_host(p, &ctx, &Default::default());
        let big = pod(
            "apps",
            "big",
            &at(1),
            serde_json::json!([{"name": "c", "resources": {
                "requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "3", "memory": "2Gi"}}}]),
        );
        let mut finished = host_pod(&plain("apps", "done", &at(2)));
        finished.status =
            Some(serde_json::from_value(serde_json::json!({"phase": "Failed"})).unwrap());
        let mut terminating = host_pod(&plain("apps", "old", &at(2)));
        terminating.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!(at(3))).unwrap());
        let foreign = pods::to_host(
            &plain("apps", "theirs", &at(0)),
            &other_tenant(&ctx),
            &Default::default(),
        );
        // A control-plane pod carries the tenant label but no markers.
        let mut control_plane = plain("vcp-demo", "etcd-0", &at(0));
        control_plane.metadata.labels = Some(BTreeMap::from([(
            naming::LABEL_TENANT.to_owned(),
            "demo".to_owned(),
        )]));
        // Markers saying apps/moved, in the host namespace of `default`: not the syncer's doing.
        let mut moved = host_pod(&plain("apps", "moved", &at(0)));
        moved.metadata.namespace = Some("demo-default".into());
        let claim = |n: &str, size: &str| -> PersistentVolumeClaim {
            obj(
                Some("apps"),
                n,
                &at(0),
                serde_json::json!({"resources": {"requests": {"storage": size}}}),
            )
        };
        let mut going = pvcs::to_host(&claim("going", "1Gi"), &ctx, None);
        going.metadata.deletion_timestamp =
            Some(serde_json::from_value(serde_json::json!(at(3))).unwrap());
        let svc =
            |ns: &str, n: &str| -> Service { obj(Some(ns), n, &at(0), serde_json::json!({})) };

        let namespaces = [
            host_ns("default"),
            host_ns("kube-system"),
            host_ns("kube-public"),
            host_ns("kube-node-lease"),
            host_ns("apps"),
            namespaces::to_host(
                &obj(None, "extra", &at(0), serde_json::json!({})),
                &other_tenant(&ctx),
            ),
        ];
        let pods = [
            host_pod(&big),
            host_pod(&plain("default", "web", &at(3))),
            finished,
            terminating,
            foreign,
            control_plane,
            moved,
        ];
        let services = [
            services::to_host(&svc("apps", "web"), &ctx, true, false),
            // The syncer never copies it; were it there, it still would not count.
            services::to_host(&svc("default", "kubernetes"), &ctx, true, false),
            services::to_host(&svc("apps", "web"), &other_tenant(&ctx), true, false),
        ];
        let claims = [pvcs::to_host(&claim("data", "2Gi"), &ctx, None), going];
        let used = host_usage(
            &ctx.key,
            &HostObjects {
                namespaces: &namespaces,
                pods: &pods,
                services: &services,
                claims: &claims,
            },
            &l,
        );
        assert_eq!(
            used,
            Usage {
                pods: 2,
                requests_cpu: 2000 + 100,
                requests_memory: (1 << 30) + (128 << 20),
                limits_cpu: 3000 + 1000,
                limits_memory: (2 << 30) + (512 << 20),
                services: 1,
                persistent_volume_claims: 1,
                requests_storage: 2 << 30,
                namespaces: 1,
            }
        );
        assert_eq!(
            host_usage(
                &naming::TenantKey::new("nobody").unwrap(),
                &HostObjects {
                    namespaces: &namespaces,
                    pods: &pods,
                    services: &services,
                    claims: &claims,
                },
                &l
            ),
            Usage::default(),
            "a tenant without host objects uses nothing"
        );
    }

    proptest! {
        #[test]
        fn the_host_copies_of_an_admitted_set_use_what_admission_counted_within_the_quota(
            pods in proptest::collection::vec(arb_pod(), 0..30),
            claims in proptest::collection::vec(arb_claim(), 0..12),
            services in arb_services(),
            namespaces in arb_namespaces(&["a", "default", "kube-system"]),
            limits in (1u64..8, 0u64..4000, 0u64..4, 0u64..5, 0u64..60, 0u64..4),
            defaults in (0u64..600, 0u64..1500, 1u64..512, 0u64..1024),
        ) {
            let (pods_n, cpu, svc_n, claim_n, storage, ns_n) = limits;
            let (req_cpu, more_cpu, req_mem, more_mem) = defaults;
            let q = Quota {
                pods: Some(pods_n),
                requests_cpu: Some(Quantity(format!("{cpu}m"))),
                requests_memory: Some("2Gi".into()),
                limits_cpu: Some("6".into()),
                limits_memory: None,
                services: Some(svc_n),
                persistent_volume_claims: Some(claim_n),
                requests_storage: Some(Quantity(format!("{storage}Gi"))),
                namespaces: Some(ns_n),
                limits: Limits {
                    default_request: Resources {
                        cpu: Quantity(format!("{req_cpu}m")),
                        memory: Quantity(format!("{req_mem}Mi")),
                    },
                    default_limit: Resources {
                        cpu: Quantity(format!("{}m", req_cpu + more_cpu)),
                        memory: Quantity(format!("{}Mi", req_mem + more_mem)),
                    },
                },
            };
            let pods = dedup(pods);
            let claims = dedup(claims);
            let objects = Objects {
                namespaces: namespaces.iter().collect(),
                pods: pods.iter().collect(),
                services: services.iter().collect(),
                claims: claims.iter().collect(),
                placed: BTreeSet::new(),
            };
            let (v, used) = admitted(&objects, &q);

            // What the syncer puts on the host: the admitted objects, translated; and, as
            // noise that must not count, the refused ones as another tenant's.
            use crate::kinds::{namespaces::translate as ns_res, pods::translate as pod_res, pvcs::translate as pvcs, services::translate as svc_res};
            let ctx = demo_ctx(&q);
            let other = other_tenant(&ctx);
            let admitted_ns = |n: &Namespace| v.namespaces.get(&n.name_any()).is_some_and(Vec::is_empty);
            let is_ok = |m: &BTreeMap<Key, Vec<Refusal>>, k: Key| m.get(&k).is_some_and(Vec::is_empty);
            let pick = |ok: bool| if ok { &ctx } else { &other };
            let host_namespaces: Vec<Namespace> = namespaces.iter().map(|n| ns_res::to_host(n, pick(admitted_ns(n)))).collect();
            let host_pods: Vec<Pod> = pods.iter().map(|p| pod_res::to_host(p, pick(is_ok(&v.pods, key(p))), &Default::default())).collect();
            let host_services: Vec<Service> = services.iter().map(|s| svc_res::to_host(s, pick(is_ok(&v.services, key(s))), true, false)).collect();
            let host_claims: Vec<PersistentVolumeClaim> = claims.iter().map(|c| pvcs::to_host(c, pick(is_ok(&v.claims, key(c))), None)).collect();
            let on_host = host_usage(
                &ctx.key,
                &HostObjects {
                    namespaces: &host_namespaces,
                    pods: &host_pods,
                    services: &host_services,
                    claims: &host_claims,
                },
                &q.limits,
            );
            prop_assert_eq!(on_host, used);
            let hard = q.hard();
            for r in RESOURCES {
                if let Some(h) = hard.get(r) {
                    prop_assert!(on_host.get(r).unwrap() <= h, "{} uses {:?} of {}", r, on_host.get(r), h);
                }
            }
        }
    }
}
