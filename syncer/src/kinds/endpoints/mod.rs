//! Endpoints and EndpointSlices of selector-less Services (translation: [`translate`]).
//!
//! Whether an object goes down depends on its Service, read from the tenant Service cache. An
//! Endpoints object whose Service is not cached (yet) is retried soon rather than left
//! waiting for a change: owners often write the Service and its Endpoints back to back.
//!
//! A Service can gain or lose its selector. Once it has one, the host computes its endpoints:
//! the copies the syncer made are deleted (the host's endpoints controller would adopt the
//! copied Endpoints, keeping the tenant's markers, and a copied hand-written slice would keep
//! routing to its addresses beside the host's). Once it has none again, the tenant's objects
//! are copied down again. The Service reconcile sees the change first (the host Service still
//! has the old selector) and calls [`selector_changed`]; the reconciles of the objects
//! themselves check again, which covers a syncer that stopped in between.
//!
//! Only addresses the tenant may name go down (`policy::endpoints`): its own pods', read from
//! the host pod cache, and the plan's outside ranges. Until that cache holds its first list a
//! reconcile requeues (never waits, see [`crate::engine::cache_ready`]), so no copy is ever made from a
//! partial view of the tenant's pods. What is dropped is told to the tenant as `PolicyRefused`
//! Warning events on the object, on every pass that writes or checks the copy. A pod that gets
//! its address after its endpoints were written (the usual order for a hand-written endpoint
//! naming a pod that is starting) must not wait for the resync: [`pod_addresses_changed`]
//! compares the tenant's pod addresses every few seconds (a walk over the host pod cache, no
//! request) and reconciles every Endpoints and EndpointSlice again when they changed; a pass
//! that changes nothing writes nothing to the host.

pub mod translate;

use crate::engine::{Engine, Side, Synced, create_or_adopt, delete_host, host_selector};
use crate::tenant::Ctx;
use crate::{Result, kube_err};
use futures::Stream;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;
use translate::{
    SERVICE_NAME, controller_managed, endpoints_to_host, endpoints_unchanged, hand_managed,
    service_of_slice, slice_to_host, slice_unchanged,
};
use vcp_core::naming;
use vcp_policy::{self as policy, Refusal, endpoints::TenantPods};

/// How soon an object whose Service is not cached is looked at again.
const SERVICE_PENDING: Duration = Duration::from_secs(5);
/// How soon an object is looked at again while the host pod cache is not complete yet.
const PODS_PENDING: Duration = Duration::from_secs(1);
/// How often the tenant's pod addresses are compared with the last ones seen.
const POD_ADDRESSES_POLL: Duration = Duration::from_secs(5);

/// Whether the host pod cache holds its first complete list (before it, the index would
/// lack the addresses of pods not listed yet).
fn pods_listed(e: &Engine) -> bool {
    e.host_pods.get().is_some_and(crate::engine::cache_ready)
}

/// This tenant's pods by address, as the host pod watch keeps them ([`Engine::pod_index`]);
/// `None` until the host pod cache holds its first complete list.
pub fn tenant_pods(e: &Engine) -> Option<TenantPods> {
    pods_listed(e).then(|| {
        e.pod_index
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .pods()
            .clone()
    })
}

/// Yields whenever this tenant's pod addresses changed since the last look (and once when
/// the host pod cache first holds its list), looked at every [`POD_ADDRESSES_POLL`]: a
/// comparison of the index's generation, whatever the number of pods.
pub fn pod_addresses_changed(e: Arc<Engine>) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold((e, None::<u64>), |(e, mut last)| async move {
        loop {
            tokio::time::sleep(POD_ADDRESSES_POLL).await;
            if !pods_listed(&e) {
                continue;
            }
            let now = e
                .pod_index
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .generation();
            if last != Some(now) {
                last = Some(now);
                return Some(((), (e, last)));
            }
        }
    })
}

/// Tells the tenant which addresses of its object stayed off the host.
async fn tell<K: kube::Resource<DynamicType = ()>>(e: &Engine, t: &K, refusals: &[Refusal]) {
    if refusals.is_empty() || t.meta().deletion_timestamp.is_some() {
        return;
    }
    let message = format!(
        "{}; the host copy carries the other addresses only",
        policy::summary(refusals)
    );
    tracing::info!(ns = ?t.meta().namespace, name = ?t.meta().name, %message, "endpoint addresses kept off the host");
    e.report(t, "PolicyRefused", message).await;
}

fn tenant_service(e: &Engine, ns: &str, name: &str) -> Option<Arc<Service>> {
    e.tenant_services
        .get()?
        .get(&ObjectRef::new(name).within(ns))
}

impl Synced for Endpoints {
    type Own = ();
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, _: &()) -> Option<Self> {
        let svc = tenant_service(e, &t.namespace()?, &t.name_any())?;
        // The Service first: only hand-managed endpoints go down, and the pod map costs a
        // pass over every host pod, which the Endpoints of every other Service must not pay.
        if !hand_managed(&svc) {
            return None;
        }
        Some(endpoints_to_host(t, &e.ctx, &tenant_pods(e)?).0)
    }

    fn unchanged(desired: &Self, host: &Self) -> bool {
        endpoints_unchanged(desired, host)
    }
}

impl Synced for EndpointSlice {
    type Own = ();
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, _: &()) -> Option<Self> {
        if controller_managed(t) {
            return None;
        }
        let svc = tenant_service(e, &t.namespace()?, service_of_slice(t)?)?;
        if !hand_managed(&svc) {
            return None;
        }
        Some(slice_to_host(t, &e.ctx, &tenant_pods(e)?).0)
    }

    fn unchanged(desired: &Self, host: &Self) -> bool {
        slice_unchanged(desired, host)
    }

    fn host_watch(key: &vcp_core::naming::TenantKey) -> kube::runtime::watcher::Config {
        // The host's own controllers copy a Service's or Endpoints' labels (our markers among
        // them) onto the slices they manage; those are theirs, never ours to collect.
        let managers = translate::CONTROLLER_MANAGERS.join(",");
        kube::runtime::watcher::Config::default().labels(&format!(
            "{}={key},{} notin ({managers})",
            vcp_core::naming::LABEL_TENANT,
            translate::MANAGED_BY
        ))
    }
}

/// Whether host object `h` is the syncer's copy of tenant object `ns/name` (the host
/// controllers' own objects may carry the tenant label, copied from the Service, but never the
/// name and namespace markers).
fn copy_of<K: Resource>(e: &Engine, h: &K, ns: &str, name: &str) -> bool {
    naming::tenant_ref(e.key(), h.labels(), h.annotations())
        .is_some_and(|r| r.name == name && r.namespace.as_deref() == Some(ns))
}

/// Deletes the host copy of tenant object `t` if the cache holds one: its Service has a
/// selector now.
async fn release<K: Synced>(side: &Side<K>, t: &K) -> Result<()> {
    let e = &side.engine;
    let (ns, name) = (t.namespace().unwrap_or_default(), t.name_any());
    let host_ns = naming::host_namespace(e.key(), &ns);
    if let Some(h) = side.host.get(&ObjectRef::new(&name).within(&host_ns))
        && copy_of(e, h.as_ref(), &ns, &name)
    {
        tracing::info!(kind = K::kind(&()).as_ref(), ns = %ns, name = %name, "service has a selector now; deleting the host copy");
        delete_host(e, h.as_ref(), None).await?;
    }
    Ok(())
}

/// Down-reconcile of tenant Endpoints.
#[tracing::instrument(skip_all, fields(kind = "Endpoints", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down_endpoints(t: Arc<Endpoints>, side: Arc<Side<Endpoints>>) -> Result<Action> {
    let service = t.name_any();
    down_copy(t, side, &service, endpoints_to_host).await
}

/// Down-reconcile of a tenant EndpointSlice.
#[tracing::instrument(skip_all, fields(kind = "EndpointSlice", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down_slice(t: Arc<EndpointSlice>, side: Arc<Side<EndpointSlice>>) -> Result<Action> {
    if controller_managed(&t) {
        return Ok(Action::await_change());
    }
    let Some(service) = service_of_slice(&t).map(str::to_owned) else {
        return crate::engine::down(t, side).await;
    };
    down_copy(t, side, &service, slice_to_host).await
}

/// Down-reconcile of tenant object `t` (Endpoints, or a slice) of Service `service`: copied
/// down by `translate` (keeping only the addresses the tenant may name) while the Service has
/// no selector, its copy released when it has one.
async fn down_copy<K: Synced>(
    t: Arc<K>,
    side: Arc<Side<K>>,
    service: &str,
    translate: fn(&K, &Ctx, &TenantPods) -> (K, Vec<Refusal>),
) -> Result<Action> {
    let ns = t.namespace().unwrap_or_default();
    let Some(svc) = tenant_service(&side.engine, &ns, service) else {
        return Ok(Action::requeue(SERVICE_PENDING));
    };
    if !hand_managed(&svc) {
        release(&side, &t).await?;
        return Ok(Action::await_change());
    }
    let Some(pods) = tenant_pods(&side.engine) else {
        return Ok(Action::requeue(PODS_PENDING));
    };
    let (desired, refusals) = translate(&t, &side.engine.ctx, &pods);
    tell(&side.engine, t.as_ref(), &refusals).await;
    crate::engine::down_to(t, side, desired).await
}

/// Called by the Service reconcile when tenant Service `t` gained a selector (before the host
/// Service gets it) or lost it (after): deletes the syncer's host copies of its Endpoints and
/// hand-written slices, or copies the tenant's down again. Both are idempotent.
pub async fn selector_changed(e: &Engine, t: &Service) -> Result<()> {
    let (ns, name) = (t.namespace().unwrap_or_default(), t.name_any());
    let host_ns = naming::host_namespace(e.key(), &ns);
    if hand_managed(t) {
        // Only while the host pod cache is incomplete (at startup), when every object's own
        // reconcile runs anyway and requeues until it is.
        let Some(pods) = tenant_pods(e) else {
            tracing::debug!(ns = %ns, service = %name, "host pods not listed yet; the endpoints follow through their own reconciles");
            return Ok(());
        };
        let tenant_eps = Api::<Endpoints>::namespaced(e.tenant.clone(), &ns)
            .get_opt(&name)
            .await
            .map_err(kube_err(format!("get tenant endpoints {ns}/{name}")))?;
        if let Some(ep) = tenant_eps {
            let (desired, refusals) = endpoints_to_host(&ep, &e.ctx, &pods);
            tell(e, &ep, &refusals).await;
            create_or_adopt(e, &ep, &desired).await?;
        }
        let slices = Api::<EndpointSlice>::namespaced(e.tenant.clone(), &ns)
            .list(&ListParams::default().labels(&format!("{SERVICE_NAME}={name}")))
            .await
            .map_err(kube_err(format!("list tenant slices of {ns}/{name}")))?;
        for s in slices.items.iter().filter(|s| !controller_managed(s)) {
            let (desired, refusals) = slice_to_host(s, &e.ctx, &pods);
            tell(e, s, &refusals).await;
            create_or_adopt(e, s, &desired).await?;
        }
        tracing::info!(ns = %ns, service = %name, "service lost its selector; its endpoints go down again");
        return Ok(());
    }
    let host_eps = Api::<Endpoints>::namespaced(e.host.clone(), &host_ns)
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host endpoints {host_ns}/{name}")))?;
    if let Some(h) = host_eps.filter(|h| copy_of(e, h, &ns, &name)) {
        delete_host(e, &h, None).await?;
    }
    // This tenant's slices of the Service, minus the host controllers' (which carry the tenant
    // label too: they copy it from the Service).
    let selector = host_selector(e.key());
    let labels = format!(
        "{},{SERVICE_NAME}={name}",
        selector.label_selector.unwrap_or_default()
    );
    let slices = Api::<EndpointSlice>::namespaced(e.host.clone(), &host_ns)
        .list(&ListParams::default().labels(&labels))
        .await
        .map_err(kube_err(format!("list host slices of {host_ns}/{name}")))?;
    for h in slices.items.iter().filter(|h| !controller_managed(h)) {
        let copied = naming::tenant_ref(e.key(), h.labels(), h.annotations())
            .is_some_and(|r| r.namespace.as_deref() == Some(ns.as_str()));
        if copied {
            delete_host(e, h, None).await?;
        }
    }
    tracing::info!(ns = %ns, service = %name, "service has a selector now; deleted the host copies of its endpoints");
    Ok(())
}

/// Keeps the tenant's `default/kubernetes` Endpoints at the apiserver's host Service
/// ([`translate::kubernetes_endpoints`]), re-applied every `period` (a server-side apply that
/// changes nothing is cheap, and repairs anyone's edit).
pub async fn kubernetes_endpoints(e: Arc<Engine>, period: Duration) {
    let Some((ip, port)) = e.pod_env.apiserver.clone() else {
        return;
    };
    let want = translate::kubernetes_endpoints(&ip, port);
    let api: Api<Endpoints> = Api::namespaced(e.tenant.clone(), "default");
    let pp = kube::api::PatchParams::apply(crate::engine::FIELD_MANAGER).force();
    loop {
        if let Err(err) = api
            .patch("kubernetes", &pp, &kube::api::Patch::Apply(&want))
            .await
        {
            tracing::warn!(error = %crate::chain(&err), "failed to set the tenant's kubernetes endpoints");
        }
        tokio::time::sleep(period).await;
    }
}

/// Starts the Endpoints and EndpointSlice controllers, both following the tenant's pod
/// addresses (only those go down), and the upkeep of the tenant's `kubernetes` Endpoints
/// (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let (e, w, period) = (s.engine.clone(), s.workers, s.period);
    Box::pin(async move {
        futures::join!(
            crate::engine::run_kind_on::<Endpoints>(
                e.clone(),
                Arc::new(()),
                w,
                |t, s| Box::pin(down_endpoints(t, s)),
                |_, _| {},
                pod_addresses_changed(e.clone())
            ),
            crate::engine::run_kind_on::<EndpointSlice>(
                e.clone(),
                Arc::new(()),
                w,
                |t, s| Box::pin(down_slice(t, s)),
                |_, _| {},
                pod_addresses_changed(e.clone())
            ),
            crate::engine::spawned(kubernetes_endpoints(e.clone(), period)),
        );
    })
}
