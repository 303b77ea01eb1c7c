//! NetworkPolicies: the tenant's go down translated ([`vcp_policy::network::to_host`]), vcp's
//! own deny-by-default policies are kept in every host namespace of the tenant
//! ([`ensure_host_policies`], called by the namespace controller right after it creates a
//! namespace, before any pod can land there), and host pods carry the isolation labels that
//! tell vcp's "whole tenant" policies which pods a tenant policy isolates ([`relabel`]).
//!
//! A pod's labels are computed when its host pod is created or updated (the pod controller,
//! from the tenant policy cache) and again here whenever a tenant policy of its namespace
//! changes, so a new policy takes effect at once; one deleted takes effect at the pods' next
//! pass (at most the resync period), and meanwhile the pods stay isolated: the tenant's
//! traffic fails closed, never open.

use crate::engine::FIELD_MANAGER;
use crate::engine::decide::{Decision, HostSide, decide};
use crate::engine::{Engine, Side, apply, cached_host, create_or_adopt, delete_host};
use crate::{Result, kube_err};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::host_pod::HostPod;
use vcp_core::naming;
use vcp_policy::{self as policy, network};

impl crate::engine::Synced for NetworkPolicy {
    type Own = ();
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, _: &()) -> Option<Self> {
        if network::reserved_name(&t.name_any()) {
            return None;
        }
        Some(network::to_host(t, e.key(), &e.ctx.policy.network).0)
    }

    fn observe(
        e: &Arc<Engine>,
        _: &Arc<()>,
        tenant: &mut crate::engine::shared::Shared<Self>,
        _host: &mut crate::engine::shared::Shared<Self>,
    ) {
        let e = e.clone();
        tenant.observe(Box::new(move |p: &NetworkPolicy, present| {
            if let (Some(ns), Some(name)) = (&p.metadata.namespace, &p.metadata.name) {
                e.tenant_netpols_by_ns.observe(ns, name, present);
            }
        }));
    }
}

/// Down-reconcile of a tenant NetworkPolicy.
#[tracing::instrument(skip_all, fields(kind = "NetworkPolicy", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down(t: Arc<NetworkPolicy>, side: Arc<Side<NetworkPolicy>>) -> Result<Action> {
    let e = &side.engine;
    let ns = t.namespace().unwrap_or_default();
    if network::reserved_name(&t.name_any()) {
        e.report(
            t.as_ref(),
            "PolicyRefused",
            format!(
                "NetworkPolicy names starting {} are vcp's own in every namespace; rename it",
                network::GENERATED_PREFIX
            ),
        )
        .await;
        return Ok(Action::requeue(e.resync));
    }
    let (desired, refusals) = network::to_host(&t, e.key(), &e.ctx.policy.network);
    let alive = t.metadata.deletion_timestamp.is_none();
    if alive && !refusals.is_empty() {
        e.report(t.as_ref(), "PolicyRefused", policy::summary(&refusals))
            .await;
    }
    let host_side = HostSide::of(e.key(), cached_host(&side, &desired));
    match decide(t.uid().as_deref(), alive, host_side) {
        Decision::Create => {
            create_or_adopt(e, t.as_ref(), &desired).await?;
        }
        Decision::Update(_) => apply(e, &desired).await?,
        Decision::Replace(h) => {
            delete_host(e, h.as_ref(), None).await?;
            return Ok(Action::requeue(Duration::from_secs(1)));
        }
        Decision::Delete(_) | Decision::Conflict(_) | Decision::Nothing => {}
    }
    relabel(e, &ns).await?;
    Ok(Action::requeue(e.resync))
}

/// The tenant policies of tenant namespace `ns` that go down, from the cache (empty until it is listed:
/// pods then carry no isolation labels, which only widens traffic inside the tenant until the
/// next pass).
pub fn tenant_policies(e: &Engine, ns: &str) -> Vec<NetworkPolicy> {
    let Some(cache) = e.tenant_netpols.get() else {
        return Vec::new();
    };
    // The namespace's own names, not a scan of every policy of the tenant: asked for each pod.
    e.tenant_netpols_by_ns
        .names(ns)
        .iter()
        // Those that never reach the host (reserved names) isolate nothing there.
        .filter(|name| !network::reserved_name(name))
        .filter_map(|name| cache.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns)))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.as_ref().clone())
        .collect()
}

/// Brings the isolation labels of every host pod of tenant namespace `ns` in line with the
/// tenant's policies there (one merge patch per pod whose labels change).
async fn relabel(e: &Engine, ns: &str) -> Result<()> {
    let (Some(tenant_pods), Some(host_pods)) = (e.tenant_pods.get(), e.host_pods.get()) else {
        return Ok(());
    };
    let policies = tenant_policies(e, ns);
    let host_ns = naming::host_namespace(e.key(), ns);
    let in_ns = e.tenant_pods_by_ns.names(ns);
    for t in in_ns.iter().filter_map(|name| {
        tenant_pods.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))
    }) {
        let key = kube::runtime::reflector::ObjectRef::new(&t.name_any()).within(&host_ns);
        if let Some(h) = host_pods.get(&key) {
            relabel_pod(e, &h, &network::isolation_labels(t.labels(), &policies)).await?;
        }
    }
    Ok(())
}

/// Sets and removes the isolation labels of host pod `h` as `want` says (read for the two
/// isolation keys only: the tenant pod's labels under its namespace's policies,
/// `network::isolation_labels`). A merge patch, not an apply: the labels must also go when a
/// policy no longer isolates the pod, whoever set them.
pub async fn relabel_pod(e: &Engine, h: &HostPod, want: &BTreeMap<String, String>) -> Result<()> {
    if !naming::owned_by(e.key(), h.labels()) {
        return Ok(());
    }
    let mut patch = serde_json::Map::new();
    for k in [
        network::LABEL_INGRESS_ISOLATED,
        network::LABEL_EGRESS_ISOLATED,
    ] {
        match (want.get(k), h.labels().get(k)) {
            (Some(w), Some(have)) if w == have => {}
            (None, None) => {}
            (Some(w), _) => {
                patch.insert(k.to_owned(), serde_json::json!(w));
            }
            (None, Some(_)) => {
                patch.insert(k.to_owned(), serde_json::Value::Null);
            }
        }
    }
    if patch.is_empty() {
        return Ok(());
    }
    let (host_ns, name) = (h.namespace().unwrap_or_default(), h.name_any());
    let body = serde_json::json!({"metadata": {"labels": patch}});
    match Api::<Pod>::namespaced(e.host.clone(), &host_ns)
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(ae)) if ae.code == 404 => Ok(()),
        Err(err) => Err(kube_err(format!("relabel host pod {host_ns}/{name}"))(err)),
    }
}

/// Applies vcp's own policies ([`network::host_policies`]) to host namespace `host_ns`:
/// deny by default, the tenant's CoreDNS and apiserver, and the tenant-wide defaults for pods
/// no tenant policy isolates. Idempotent (server-side apply), so every namespace pass repairs
/// them.
pub async fn ensure_host_policies(e: &Engine, host_ns: &str) -> Result<()> {
    let control_plane = e
        .control_plane_namespace
        .clone()
        .unwrap_or_else(|| format!("vcp-{}", e.key()));
    let api: Api<NetworkPolicy> = Api::namespaced(e.host.clone(), host_ns);
    for p in network::host_policies(e.key(), host_ns, &control_plane, &e.ctx.policy.network) {
        let name = p.name_any();
        api.patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&p),
        )
        .await
        .map_err(kube_err(format!("apply network policy {host_ns}/{name}")))?;
    }
    Ok(())
}

/// Starts the NetworkPolicy controllers (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let e = s.engine.clone();
    Box::pin(crate::engine::run_kind::<NetworkPolicy>(
        s.engine.clone(),
        Arc::new(()),
        s.workers,
        |t, s| Box::pin(down(t, s)),
        // Pods' isolation labels read the tenant's policies.
        move |s, _| {
            let _ = e.tenant_netpols.set(s);
        },
    ))
}
