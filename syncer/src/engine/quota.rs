//! The tenant-wide quota at the edges: the running ledger fed by the watches, verdicts, the
//! host backstop, and usage on `/metrics`.
//!
//! The tenant and host watches of namespaces, pods, Services and claims tell the engine's
//! [`Ledger`] of every object they touch ([`observe`]), before any reconcile hears of it. A
//! down-reconcile that would create a host pod, Service, claim or namespace asks for its
//! object's verdict ([`pod`], [`service`], [`claim`], [`namespace`]): a lookup in the ledger,
//! never a recount and never a request. Right before the create it takes the object's share
//! ([`admit_pod`] and friends), atomically, so two reconciles running at once can never both
//! take the last share, and nothing else waits on a create in flight. A refused object is told
//! once (`TenantQuotaExceeded`: a Warning event, for pods also a `PodScheduled: False`
//! condition) and looked at again every [`retry`]: when a holder goes, the next in line fits
//! within seconds, without a trigger of its own. A cache that has not listed yet never blocks
//! a reconcile: the verdict is [`Verdict::NotReady`] and the caller requeues.

use super::Engine;
use super::backstop::{LIMITS_NAME, QUOTA_NAME, backstop};
use super::shared::{Cache, Shared};
use crate::Result;
use crate::engine::FIELD_MANAGER;
use k8s_openapi::api::core::v1::{
    LimitRange, Namespace, PersistentVolumeClaim, Pod, ResourceQuota, Service,
};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;
use vcp_policy::quota::{self as policy_quota, Counted, Judgement, Kind, Ledger, key};
use vcp_policy::{self as policy, Refusal};

/// The reason of every quota refusal (events and pod conditions).
pub const REASON: &str = "TenantQuotaExceeded";

/// How often an object waiting for quota is looked at again (at most the resync period). A
/// look costs no request: the verdict comes from the ledger, and the refusal is told once.
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

/// The engine's ledger, locked for one quick look or change (never across an await).
fn ledger(e: &Engine) -> std::sync::MutexGuard<'_, Ledger> {
    e.ledger.lock().unwrap_or_else(|p| p.into_inner())
}

/// Feeds the ledger from a kind's tenant and host watches (see [`super::shared::Observer`]).
pub fn observe<K, H>(e: &Arc<Engine>, tenant: &mut Shared<K>, host: &mut Shared<H>)
where
    K: Counted + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    H: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let t = e.clone();
    tenant.observe(Box::new(move |obj: &K, present| {
        ledger(&t).tenant(obj, present);
    }));
    let h = e.clone();
    host.observe(Box::new(move |obj: &H, present| {
        let key = h.key().clone();
        ledger(&h).host::<K, H>(&key, obj, present);
    }));
}

/// An object's verdict.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Admitted,
    Refused(Vec<Refusal>),
    /// A cache the verdict needs has not listed yet (or does not show the object yet).
    NotReady,
}

fn ready<K>(c: &std::sync::OnceLock<Cache<K>>) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    c.get().is_some_and(|c| super::cache_ready(c))
}

/// Whether the ledger knows all it needs for `K`: the namespace caches and, for other kinds,
/// their tenant and host caches have listed.
fn known<K, H>(e: &Engine, side: Option<(&Cache<K>, &Cache<H>)>) -> bool
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
    H: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    ready(&e.tenant_namespaces)
        && ready(&e.host_namespaces)
        && side.is_none_or(|(t, h)| super::cache_ready(t) && super::cache_ready(h))
}

/// The verdict of tenant object `t`, or (`take`) its share taken if it fits.
fn verdict<K: Counted>(e: &Engine, t: &K, ready: bool, take: bool) -> Verdict {
    if !ready {
        return Verdict::NotReady;
    }
    let k = key(t);
    let j = {
        let mut l = ledger(e);
        if take {
            l.admit(K::KIND, &k)
        } else {
            l.judge(K::KIND, &k)
        }
    };
    match j {
        Judgement::Holds | Judgement::Admitted => Verdict::Admitted,
        Judgement::Refused(r) => Verdict::Refused(vec![r]),
        // Not judged (terminating, finished): takes nothing, needs nothing.
        Judgement::Unknown if !t.counts() => Verdict::Admitted,
        // Should be judged but the watch has not shown it yet.
        Judgement::Unknown => Verdict::NotReady,
    }
}

fn pods_ready(e: &Engine) -> bool {
    match (e.tenant_pods.get(), e.host_pods.get()) {
        (Some(t), Some(h)) => known(e, Some((t, h))),
        _ => false,
    }
}

/// A tenant pod's verdict.
pub fn pod(e: &Engine, t: &Pod) -> Verdict {
    verdict(e, t, pods_ready(e), false)
}

/// A tenant pod's verdict, its share taken if admitted: call it right before the create.
pub fn admit_pod(e: &Engine, t: &Pod) -> Verdict {
    verdict(e, t, pods_ready(e), true)
}

/// Whether a placed pod's in-place resize may go to the host: one that asks for more
/// (`grows`) only while the pods holding their share, this one at its new size, fit the quota
/// together. A smaller one always may: it frees what it gives back.
pub fn resize(e: &Engine, grows: bool) -> Verdict {
    if !grows {
        return Verdict::Admitted;
    }
    if !pods_ready(e) {
        return Verdict::NotReady;
    }
    if ledger(e).holders_fit(Kind::Pod) {
        return Verdict::Admitted;
    }
    Verdict::Refused(vec![policy::Refusal::new(
        "spec.containers[*].resources",
        policy_quota::RULE,
        "the resize takes the tenant's pods over the plan's quota; the pod keeps the resources it runs with until the resize fits",
    )])
}

/// A tenant Service's verdict, its share taken if admitted (`side`: the Service caches).
pub fn admit_service(e: &Engine, side: &super::Side<Service>, t: &Service) -> Verdict {
    verdict(e, t, known(e, Some((&side.tenant, &side.host))), true)
}

/// A tenant claim's verdict, its share taken if admitted (`side`: the claim caches).
pub fn admit_claim(
    e: &Engine,
    side: &super::Side<PersistentVolumeClaim>,
    t: &PersistentVolumeClaim,
) -> Verdict {
    verdict(e, t, known(e, Some((&side.tenant, &side.host))), true)
}

/// A tenant namespace's verdict, its share taken if admitted.
pub fn admit_namespace(e: &Engine, t: &Namespace) -> Verdict {
    verdict(e, t, known::<Namespace, Namespace>(e, None), true)
}

/// Whether tenant namespace `ns` is kept off the host by the quota (`None`: not known yet).
/// Objects of kinds the quota does not count (ConfigMaps, Secrets, Endpoints) wait with it.
pub fn namespace_waits(e: &Engine, ns: &str) -> Option<bool> {
    if !known::<Namespace, Namespace>(e, None) {
        return None;
    }
    let j = ledger(e).judge(Kind::Namespace, &(String::new(), ns.to_owned()));
    Some(matches!(j, Judgement::Refused(_)))
}

/// Whether a host create failed on the quota backstop (`vcp-quota`). Other host quotas (the
/// host operator's own) stay errors: counted and retried with backoff, as before.
pub fn host_refused(err: &crate::Error) -> bool {
    let ours = format!("exceeded quota: {}", QUOTA_NAME);
    matches!(err, crate::Error::Kube { source: kube::Error::Api(ae), .. }
        if ae.code == 403 && ae.message.contains(&ours))
}

/// Whether a host create was refused because the backstop of a new host namespace has no
/// usage yet (the host's quota controller fills it in within moments): retried shortly and
/// quietly, not an error.
pub fn host_quota_pending(err: &crate::Error) -> bool {
    let ours = format!("status unknown for quota: {}", QUOTA_NAME);
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

/// Tells the tenant, once per object and message, that `t` waits for quota (a Warning event,
/// [`Engine::report_once`]).
pub async fn tell<K: kube::Resource<DynamicType = ()>>(e: &Engine, t: &K, refusals: &[Refusal]) {
    let message = policy::summary(refusals);
    let uid = t.meta().uid.clone().unwrap_or_default();
    if !e.first_telling(&uid, REASON, &message) {
        return;
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
        .patch(QUOTA_NAME, &pp, &Patch::Apply(&quota))
        .await
        .map_err(super::kube_err(format!(
            "apply host resource quota {host_ns}/{}",
            QUOTA_NAME
        )))?;
    Api::<LimitRange>::namespaced(e.host.clone(), host_ns)
        .patch(LIMITS_NAME, &pp, &Patch::Apply(&limits))
        .await
        .map_err(super::kube_err(format!(
            "apply host limit range {host_ns}/{}",
            LIMITS_NAME
        )))?;
    Ok(())
}

/// Exports the quota once and the tenant's usage, as the ledger counts it, every `period` on
/// `/metrics`, once the caches it is fed from have listed.
pub async fn usage(e: Arc<Engine>, period: Duration) {
    e.metrics.tenant_quota(&e.ctx.policy.quota.hard());
    loop {
        tokio::time::sleep(period).await;
        let listed = ready(&e.tenant_pods)
            && ready(&e.tenant_services)
            && ready(&e.tenant_claims)
            && known::<Namespace, Namespace>(&e, None);
        if !listed {
            continue;
        }
        let used = ledger(&e).used();
        e.metrics.tenant_usage(&used);
    }
}

#[cfg(test)]
mod tests {
    //! The syncer's translators over objects the quota admitted: their host copies use exactly
    //! what admission counted, as vcp samples it from the host (`host_usage`).
    use crate::tenant::Ctx;
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
            services::to_host(&svc("apps", "web"), &ctx, services::Ask::Tenant, false),
            // The syncer never copies it; were it there, it still would not count.
            services::to_host(
                &svc("default", "kubernetes"),
                &ctx,
                services::Ask::Tenant,
                false,
            ),
            services::to_host(
                &svc("apps", "web"),
                &other_tenant(&ctx),
                services::Ask::Tenant,
                false,
            ),
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
                    default_request: Some(Resources {
                        cpu: Quantity(format!("{req_cpu}m")),
                        memory: Quantity(format!("{req_mem}Mi")),
                    }),
                    default_limit: Some(Resources {
                        cpu: Quantity(format!("{}m", req_cpu + more_cpu)),
                        memory: Quantity(format!("{}Mi", req_mem + more_mem)),
                    }),
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
            let host_services: Vec<Service> = services.iter().map(|s| svc_res::to_host(s, pick(is_ok(&v.services, key(s))), svc_res::Ask::Tenant, false)).collect();
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
