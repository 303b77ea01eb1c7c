//! Tenant-created PersistentVolumes (cluster-scoped) down once claimed and only with sources
//! and classes the tenant's plan allows, their phase up.
//!
//! Volumes are few, so both controllers read the other side with a GET instead of a cache:
//! **down** reconciles each tenant volume (re-triggered by changes of its host volume) and
//! **gc** deletes host volumes of this tenant whose tenant volume is gone or was recreated.

pub mod translate;

use crate::engine::FIELD_MANAGER;
use crate::engine::{Engine, backoff, delete_exact, host_selector};
use crate::kinds::volumes::translate::{phase_to_tenant, synced, to_host};
use crate::metrics::Direction;
use crate::{Result, kube_err};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use std::sync::Arc;
use std::time::Duration;
use vcp_core::naming::{self, TenantKey};

const KIND: &str = "PersistentVolume";

fn drifted(desired: &PersistentVolume, host: &PersistentVolume) -> bool {
    let subset = |want: &std::collections::BTreeMap<String, String>,
                  have: &std::collections::BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
    };
    // The claim is compared by what the tenant decides (namespace and name); the UID and
    // resource version are the host binder's, and an apply over them would fight it.
    let spec = |v: &PersistentVolume| {
        v.spec.as_ref().map(|s| {
            let claim = s
                .claim_ref
                .as_ref()
                .map(|c| (c.namespace.clone(), c.name.clone()));
            (
                claim,
                s.capacity.clone(),
                s.persistent_volume_reclaim_policy.clone(),
            )
        })
    };
    !subset(desired.labels(), host.labels())
        || !subset(desired.annotations(), host.annotations())
        || spec(desired) != spec(host)
}

#[tracing::instrument(skip_all, fields(kind = "PersistentVolume", name = %t.name_any()))]
async fn down(t: Arc<PersistentVolume>, e: Arc<Engine>) -> Result<Action> {
    if !synced(&t) {
        return Ok(Action::await_change());
    }
    let host_api: Api<PersistentVolume> = Api::all(e.host.clone());
    let name = naming::host_cluster_name(e.key(), &t.name_any());
    let current = host_api
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host volume {name}")))?;
    let desired = to_host(&t, &e.ctx, current.as_ref());
    let Some(h) = current else {
        if t.metadata.deletion_timestamp.is_some() {
            return Ok(Action::await_change());
        }
        // A source the plan does not list (a node's own files, someone's storage) never goes
        // down; the tenant is told why.
        let refusals = vcp_policy::volumes::check_volume(&t, &e.ctx.policy);
        if !refusals.is_empty() {
            e.report(t.as_ref(), "PolicyRefused", vcp_policy::summary(&refusals))
                .await;
            return Ok(Action::requeue(e.resync));
        }
        // Unclaimed, it would be any host claim's to take ([`translate`]); the tenant
        // binder's claimRef re-triggers this reconcile.
        if t.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_none() {
            tracing::debug!(volume = %t.name_any(), "tenant volume not claimed yet; not on the host");
            return Ok(Action::await_change());
        }
        let pp = PostParams {
            field_manager: Some(FIELD_MANAGER.into()),
            ..Default::default()
        };
        match host_api.create(&pp, &desired).await {
            Ok(_) => tracing::info!(volume = %t.name_any(), host = %name, "created host volume"),
            // Created meanwhile: the next pass (triggered by it) inspects it.
            Err(kube::Error::Api(ae)) if ae.code == 409 => {}
            Err(err) => return Err(kube_err(format!("create host volume {name}"))(err)),
        }
        return Ok(Action::requeue(e.resync));
    };
    let Some(r) = naming::tenant_ref(e.key(), h.labels(), h.annotations()) else {
        e.report(
            t.as_ref(),
            "HostConflict",
            format!(
                "host volume {name} exists and is not managed by this tenant; it was left untouched"
            ),
        )
        .await;
        return Ok(Action::requeue(e.resync));
    };
    if r.uid.is_some() && r.uid != t.uid() {
        // The tenant volume was recreated under the same name: replace the host one.
        delete_exact(&Api::all(e.host.clone()), &h, None, "host volume").await?;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if drifted(&desired, &h) {
        host_api
            .patch(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&desired),
            )
            .await
            .map_err(kube_err(format!("apply host volume {name}")))?;
    }
    if let Some(phase) = phase_to_tenant(&h, &t) {
        let patch = serde_json::json!({"status": {"phase": phase}});
        Api::<PersistentVolume>::all(e.tenant.clone())
            .patch_status(
                &t.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(kube_err(format!(
                "update status of tenant volume {}",
                t.name_any()
            )))?;
    }
    Ok(Action::requeue(e.resync))
}

#[tracing::instrument(skip_all, fields(kind = "PersistentVolume", name = %h.name_any()))]
async fn gc(h: Arc<PersistentVolume>, e: Arc<Engine>) -> Result<Action> {
    let Some(r) = naming::tenant_ref(e.key(), h.labels(), h.annotations()) else {
        return Ok(Action::await_change());
    };
    if h.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let tenant = Api::<PersistentVolume>::all(e.tenant.clone())
        .get_opt(&r.name)
        .await
        .map_err(kube_err(format!("get tenant volume {}", r.name)))?;
    let wanted = tenant.is_some_and(|t| r.uid.is_none() || t.uid() == r.uid);
    if !wanted {
        tracing::info!(volume = %r.name, host = %h.name_any(), "tenant volume gone; deleting host volume");
        delete_exact(&Api::all(e.host.clone()), h.as_ref(), None, "host volume").await?;
    }
    Ok(Action::requeue(e.resync))
}

/// Runs the volume controllers until dropped.
pub async fn run(engine: Arc<Engine>, key: TenantKey) {
    let tenant_api = Api::<PersistentVolume>::all(engine.tenant.clone());
    let host_api = Api::<PersistentVolume>::all(engine.host.clone());
    let k2 = key.clone();
    let down_fut = Controller::new(tenant_api.clone(), watcher::Config::default())
        .watches(
            host_api.clone(),
            host_selector(&key),
            move |h: PersistentVolume| {
                let r = naming::tenant_ref(&k2, h.labels(), h.annotations())?;
                Some(ObjectRef::new(&r.name))
            },
        )
        .run(
            |t, e: Arc<Engine>| async move {
                let m = e.clone();
                m.metrics
                    .timed(KIND, Direction::Down, true, down(t, e))
                    .await
            },
            backoff,
            engine.clone(),
        )
        .for_each(|_| async {});
    let k3 = key.clone();
    let gc_fut = Controller::new(host_api, host_selector(&key))
        .watches(
            tenant_api,
            watcher::Config::default(),
            move |t: PersistentVolume| {
                Some(ObjectRef::new(&naming::host_cluster_name(
                    &k3,
                    &t.name_any(),
                )))
            },
        )
        .run(
            |h, e: Arc<Engine>| async move {
                let m = e.clone();
                m.metrics.timed(KIND, Direction::Down, true, gc(h, e)).await
            },
            backoff,
            engine,
        )
        .for_each(|_| async {});
    futures::join!(down_fut, gc_fut);
}

/// Starts the volume controllers (see [`super::KINDS`]).
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let key = s.engine.key().clone();
    Box::pin(run(s.engine.clone(), key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenant::fixtures::ctx;

    #[test]
    fn what_the_host_binder_adds_to_the_claim_is_no_drift() {
        let tenant: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "fast", "uid": "v1"},
            "spec": {"capacity": {"storage": "1Gi"}, "hostPath": {"path": "/srv"},
                "claimRef": {"namespace": "apps", "name": "data", "uid": "tenant-claim"}},
        }))
        .unwrap();
        let mut host = to_host(&tenant, &ctx(), None);
        let c = host.spec.as_mut().unwrap().claim_ref.as_mut().unwrap();
        c.uid = Some("host-claim".into());
        c.resource_version = Some("42".into());
        assert!(!drifted(&to_host(&tenant, &ctx(), None), &host));
        let mut moved = tenant.clone();
        moved
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .name = Some("other".into());
        assert!(drifted(&to_host(&moved, &ctx(), Some(&host)), &host));
    }

    #[tokio::test]
    async fn down_and_gc_run_in_spans_naming_the_volume() {
        use crate::engine::testing::{fields, obj, offline_engine, span, spans_of};
        let e = offline_engine();
        let pv = || obj::<PersistentVolume>(serde_json::json!({"metadata": {"name": "fast"}}));
        let want = fields(&[("kind", "PersistentVolume"), ("name", "fast")]);
        let spans = spans_of(down(pv(), e.clone())).await;
        assert_eq!(span(&spans, "down"), Some(&want), "{spans:?}");
        let spans = spans_of(gc(pv(), e)).await;
        assert_eq!(span(&spans, "gc"), Some(&want), "{spans:?}");
    }
}
