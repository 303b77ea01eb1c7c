//! Services: ClusterIP negotiation with the host, NodePorts and load-balancer status up; a
//! selector that comes or goes hands the Service's endpoints to the host or back
//! (`endpoints::selector_changed`); an ExternalName the plan does not allow stays off the host
//! (`vcp_policy::services::refused_external_name`).

pub mod node_ports;
pub mod translate;

use crate::engine::decide::{Decision, HostSide, decide};
use crate::engine::quota;
use crate::engine::{Engine, FIELD_MANAGER, Side, Synced, apply, cached_host, delete_host};
use crate::kinds::endpoints::translate::hand_managed;
use crate::kinds::services::translate::Ask;
use crate::{Error, Result, kube_err};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming;
use vcp_policy::{self as policy, Refusal};

/// Down-reconcile of a tenant Service.
#[tracing::instrument(skip_all, fields(kind = "Service", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down(t: Arc<Service>, side: Arc<Side<Service>>) -> Result<Action> {
    let e = &side.engine;
    if vcp_policy::services::is_local_service(&t) {
        return Ok(Action::await_change());
    }
    let (host_ports, refusals) = host_ports(e, &side.own, &t);
    let desired = translate::to_host(&t, &e.ctx, Ask::Tenant, host_ports);
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    // An ExternalName the plan does not allow never reaches the host, and a copy made before
    // (when the Service named something else, or by an older syncer) goes.
    if let Some(refusal) = policy::services::refused_external_name(&t, &e.ctx.policy) {
        if t.metadata.deletion_timestamp.is_none() {
            e.report(t.as_ref(), "PolicyRefused", refusal.to_string())
                .await;
        }
        if let HostSide::Ours { host, .. } = host_side {
            tracing::info!(ns = %ns, service = %name, "deleting the host copy of a refused ExternalName Service");
            delete_host(e, host.as_ref(), None).await?;
        }
        return Ok(Action::requeue(e.resync));
    }
    if t.metadata.deletion_timestamp.is_none() {
        tell(e, &t, &refusals).await;
    }
    match decide(
        t.uid().as_deref(),
        t.metadata.deletion_timestamp.is_none(),
        host_side,
    ) {
        Decision::Create => {
            // Over the tenant-wide quota, a Service has no host copy at all (not even a
            // ClusterIP one): it waits until an earlier one goes.
            let verdict = quota::admit_service(e, &side, &t);
            if let Some(wait) = quota::hold(e, t.as_ref(), verdict).await {
                return Ok(wait);
            }
            let created = create(e, &t, &desired, host_ports).await;
            if let Some(wait) = quota::hold(e, t.as_ref(), quota::host_verdict(&created)).await {
                return Ok(wait);
            }
            created?;
        }
        // The tenant Service was recreated to carry the host's address: same IP, same Service.
        Decision::Replace(h) if !translate::ip_mismatch(&h, &t) => {
            apply(e, &translate::to_host(&t, &e.ctx, Ask::Host, host_ports)).await?;
            if h.annotations().contains_key(naming::ANN_RECREATING) {
                // Adopted: garbage collection may see to it again.
                let unmark = serde_json::json!({"metadata": {"annotations": {naming::ANN_RECREATING: null}}});
                Api::<Service>::namespaced(e.host.clone(), &h.namespace().unwrap_or_default())
                    .patch(
                        &h.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&unmark),
                    )
                    .await
                    .map_err(kube_err(format!("unmark host service {}", h.name_any())))?;
            }
        }
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), None).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Update(h) => {
            if translate::ip_mismatch(&h, &t) {
                recreate_tenant_with_ip(e, &t, &h).await?;
                return Ok(Action::requeue(Duration::from_secs(1)));
            }
            // Hand-written endpoints go down only while the Service has no selector; the host
            // Service still shows the selector as it was (see `endpoints` for the order).
            let had_selector = !hand_managed(&h);
            let has_selector = !hand_managed(&t);
            if has_selector && !had_selector {
                crate::kinds::endpoints::selector_changed(e, &t).await?;
            }
            apply(e, &translate::to_host(&t, &e.ctx, Ask::Host, host_ports)).await?;
            if had_selector && !has_selector {
                crate::kinds::endpoints::selector_changed(e, &t).await?;
            }
            if let Some(patch) = translate::to_tenant_patch(&h, &t) {
                let api: Api<Service> = Api::namespaced(e.tenant.clone(), &ns);
                if let Some(spec) = patch.get("spec") {
                    api.patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&serde_json::json!({"spec": spec})),
                    )
                    .await
                    .map_err(kube_err(format!(
                        "copy node ports to tenant service {ns}/{name}"
                    )))?;
                }
                if let Some(status) = patch.get("status") {
                    api.patch_status(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(&serde_json::json!({"status": status})),
                    )
                    .await
                    .map_err(kube_err(format!(
                        "copy status to tenant service {ns}/{name}"
                    )))?;
                }
            }
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    Ok(Action::requeue(e.resync))
}

async fn create(
    e: &Engine,
    t: &Service,
    desired: &Service,
    host_ports: bool,
) -> Result<crate::engine::Placed> {
    // A NodePort or the address of the tenant's is taken on the host (another tenant
    // allocated it): ask for less, down to letting the host choose everything.
    let taken = |r: &Result<crate::engine::Placed>| matches!(r, Err(Error::Kube { source: kube::Error::Api(ae), .. }) if ae.code == 422);
    let mut created = crate::engine::create_or_adopt(e, t, desired).await;
    for ask in [Ask::TenantIp, Ask::Host] {
        if !taken(&created) {
            break;
        }
        created =
            crate::engine::create_or_adopt(e, t, &translate::to_host(t, &e.ctx, ask, host_ports))
                .await;
    }
    created
}

/// What the Service kind keeps beside the engine.
#[derive(Default)]
pub struct ServicesCtx {
    /// The tenant's host addresses, which the egress proxy reads (the pods keep them too).
    pub addresses: Arc<crate::egress::Addresses>,
    /// The tenant's NodePort and LoadBalancer Services and their verdicts, fed by the tenant
    /// Service watch.
    pub node_ports: std::sync::Mutex<node_ports::NodePorts>,
}

/// Whether the tenant's plan admits `t` with host NodePorts (always, for other types), and what
/// it refuses. Decided over the tenant's Services in creation order, so every pass and every
/// restarted syncer admits the same Services; looked up in [`node_ports`], not recounted.
pub fn host_ports(e: &Engine, own: &ServicesCtx, t: &Service) -> (bool, Vec<Refusal>) {
    if !policy::services::takes_node_ports(t) {
        return (true, Vec::new());
    }
    // Until the tenant cache holds its first list the order is not known: no NodePorts yet.
    if !e.tenant_services.get().is_some_and(|c| c.is_ready()) {
        return (false, policy::services::check(t, &e.ctx.policy.services));
    }
    let refusals = own
        .node_ports
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .refusals(t, &e.ctx.policy.services);
    (refusals.is_empty(), refusals)
}

/// Tells the tenant what of its Service the host does not get (Warning events; the recorder
/// folds repeats into one event with a count).
async fn tell(e: &Engine, t: &Service, refusals: &[Refusal]) {
    if !refusals.is_empty() {
        let note = format!(
            "{}; the Service is served inside the cluster only",
            policy::summary(refusals)
        );
        e.report(t, "PolicyRefused", note).await;
    }
    let spec = t.spec.as_ref();
    if spec.is_some_and(|s| s.external_ips.as_ref().is_some_and(|i| !i.is_empty())) {
        e.report(
            t,
            "PolicyRefused",
            policy::services::EXTERNAL_IPS_NOTE.into(),
        )
        .await;
    }
    if let Some(ip) = policy::services::reserved_ip(t, &e.ctx.policy) {
        e.report(
            t,
            "PolicyRefused",
            format!(
                "clusterIP {ip} is reserved by the host; the Service gets a host-allocated address"
            ),
        )
        .await;
    }
}

/// Replaces the tenant Service with one carrying the host's ClusterIP (the address is
/// immutable, so a new object is the only way; name, spec and labels stay).
async fn recreate_tenant_with_ip(e: &Engine, t: &Service, h: &Service) -> Result<()> {
    let ns = t.namespace().unwrap_or_default();
    let name = t.name_any();
    let api: Api<Service> = Api::namespaced(e.tenant.clone(), &ns);
    let mut fresh = t.clone();
    fresh.metadata = kube::api::ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(ns.clone()),
        labels: t.metadata.labels.clone(),
        annotations: t.metadata.annotations.clone(),
        owner_references: t.metadata.owner_references.clone(),
        ..Default::default()
    };
    fresh.status = None;
    if let Some(spec) = &mut fresh.spec {
        let ip = h.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        spec.cluster_ip = ip.clone();
        spec.cluster_ips = ip.map(|i| vec![i]);
    }
    tracing::info!(ns = %ns, service = %name, "recreating tenant service with the host's cluster IP");
    // Garbage collection would see the tenant Service gone (or replaced) and delete the host
    // one, whose address the new tenant Service asks for; the host would then give the next
    // host Service another address, and the two would chase each other. The mark holds it off
    // until the new tenant Service adopts the host one.
    let mark = serde_json::json!({"metadata": {"annotations": {
        naming::ANN_RECREATING: k8s_openapi::jiff::Timestamp::now().to_string(),
    }}});
    Api::<Service>::namespaced(e.host.clone(), &h.namespace().unwrap_or_default())
        .patch(&h.name_any(), &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .map_err(kube_err(format!("mark host service {}", h.name_any())))?;
    api.delete(&name, &DeleteParams::default())
        .await
        .map_err(kube_err(format!("delete tenant service {ns}/{name}")))?;
    let pp = PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    };
    // Nothing else would bring the tenant Service back once it is deleted: try a few times
    // before giving up (a slow apiserver, the address not released yet).
    let mut tries = 0;
    loop {
        match api.create(&pp, &fresh).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(ae)) if ae.code == 409 => return Ok(()),
            Err(err) if tries < 5 => {
                tries += 1;
                tracing::warn!(ns = %ns, service = %name, error = %err, "recreating tenant service failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(err) => {
                return Err(kube_err(format!("recreate tenant service {ns}/{name}"))(
                    err,
                ));
            }
        }
    }
}

impl Synced for Service {
    type Own = ServicesCtx;
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, own: &ServicesCtx) -> Option<Self> {
        // The tenant apiserver's own Service: it points at the tenant apiserver, not at pods.
        if vcp_policy::services::is_local_service(t) {
            return None;
        }
        if policy::services::refused_external_name(t, &e.ctx.policy).is_some() {
            return None;
        }
        let (host_ports, _) = host_ports(e, own, t);
        Some(translate::to_host(t, &e.ctx, Ask::Tenant, host_ports))
    }

    fn observe(
        e: &std::sync::Arc<Engine>,
        own: &std::sync::Arc<ServicesCtx>,
        tenant: &mut crate::engine::shared::Shared<Self>,
        host: &mut crate::engine::shared::Shared<Self>,
    ) {
        crate::engine::quota::observe(e, tenant, host);
        let (kept, e) = (own.clone(), e.clone());
        tenant.observe(Box::new(move |s, present| {
            if let (Some(ns), Some(name)) = (&s.metadata.namespace, &s.metadata.name) {
                e.tenant_services_by_ns.observe(ns, name, present);
            }
            kept.node_ports
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .observe(s, present);
        }));
        let addresses = own.addresses.clone();
        host.observe(Box::new(move |s, present| {
            addresses.observe_service(s, present);
        }));
    }
}

/// Starts the Service controllers (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let e = s.engine.clone();
    Box::pin(crate::engine::run_kind::<Service>(
        s.engine.clone(),
        Arc::new(ServicesCtx {
            addresses: s.pods.addresses.clone(),
            ..Default::default()
        }),
        s.workers,
        |t, s| Box::pin(down(t, s)),
        // Pods' service links and Endpoints read the tenant's Services.
        move |s, _| {
            let _ = e.tenant_services.set(s);
        },
    ))
}
