//! ConfigMaps: copied into the host namespace under the same name while a tenant pod
//! references one (or always, with `--sync-all-configmaps-secrets`). A pod's own reconcile
//! copies them first, before its host pod ([`crate::kinds::pods`]); this kind's controllers
//! (the engine's generic down and gc) keep the copies in step and delete them with the tenant
//! object. Translation: [`translate`].
//!
//! The upgrade canary (`vcp_core::naming::CANARY_NAME` in `default`) is always copied, and
//! once its host copy carries the tenant's stamp the syncer marks the tenant object with
//! `ANN_CANARY_SEEN`: the orchestrator's upgrade gate waits for that round trip.

pub mod translate;

use crate::engine::{self, Engine, Side, Synced};
use crate::kinds::pods;
use crate::{Result, kube_err};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use std::sync::Arc;
use vcp_core::naming::{ANN_CANARY_SEEN, CANARY_KEY, is_canary};

impl Synced for ConfigMap {
    /// The pods' state: a ConfigMap goes down when a pod references it.
    type Own = pods::PodCtx;
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, pods: &pods::PodCtx) -> Option<Self> {
        let (ns, name) = (t.namespace()?, t.name_any());
        (is_canary(&ns, &name) || pods::referenced(e, pods, &ns, &name, false))
            .then(|| translate::to_host(t, &e.ctx))
    }
}

/// The stamp the canary's tenant object should be marked with, if its host copy carries it
/// and the mark is not there yet (pure).
pub fn canary_mark(tenant: &ConfigMap, host: Option<&ConfigMap>) -> Option<String> {
    if !is_canary(&tenant.namespace()?, &tenant.name_any()) {
        return None;
    }
    let stamp = |c: &ConfigMap| c.data.as_ref()?.get(CANARY_KEY).cloned();
    let want = stamp(tenant)?;
    let seen = tenant.annotations().get(ANN_CANARY_SEEN);
    (host.and_then(stamp).as_ref() == Some(&want) && seen != Some(&want)).then_some(want)
}

/// Down-reconcile of a ConfigMap, then the canary's mark.
#[tracing::instrument(skip_all, fields(kind = "ConfigMap", namespace = t.namespace().as_deref(), name = %t.name_any()))]
pub async fn down(t: Arc<ConfigMap>, side: Arc<Side<ConfigMap>>) -> Result<Action> {
    let action = engine::down(t.clone(), side.clone()).await?;
    let (Some(ns), name) = (t.namespace(), t.name_any()) else {
        return Ok(action);
    };
    if !is_canary(&ns, &name) {
        return Ok(action);
    }
    let e = &side.engine;
    let host_ns = vcp_core::naming::host_namespace(e.key(), &ns);
    // Asked of the host apiserver, not the cache: the copy was just written.
    let host = Api::<ConfigMap>::namespaced(e.host.clone(), &host_ns)
        .get_opt(&name)
        .await
        .map_err(kube_err(format!("get host {host_ns}/{name}")))?;
    if let Some(stamp) = canary_mark(&t, host.as_ref()) {
        let mark = serde_json::json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "annotations": {ANN_CANARY_SEEN: stamp}},
        });
        Api::<ConfigMap>::namespaced(e.tenant.clone(), &ns)
            .patch(
                &name,
                &PatchParams::apply(engine::FIELD_MANAGER),
                &Patch::Apply(&mark),
            )
            .await
            .map_err(kube_err(format!("mark tenant {ns}/{name}")))?;
        tracing::info!(stamp = %stamp, "upgrade canary made the round trip to the host");
    }
    Ok(action)
}

/// Starts the ConfigMap controllers (see [`super::KINDS`]); their host cache is published for
/// the pods' trust-bundle ConfigMaps.
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let e = s.engine.clone();
    Box::pin(crate::engine::run_kind::<ConfigMap>(
        s.engine.clone(),
        s.pods.clone(),
        s.workers,
        |t, s| Box::pin(down(t, s)),
        move |_, host| {
            let _ = e.host_configmaps.set(host);
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(ns: &str, name: &str, stamp: Option<&str>, seen: Option<&str>) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns,
                "annotations": seen.map(|s| serde_json::json!({ANN_CANARY_SEEN: s}))},
            "data": stamp.map(|s| serde_json::json!({CANARY_KEY: s})),
        }))
        .unwrap()
    }

    #[test]
    fn the_canary_is_marked_once_its_host_copy_carries_the_stamp() {
        let t = cm("default", "vcp-upgrade-canary", Some("7/1.37"), None);
        let old = cm("x-default", "vcp-upgrade-canary", Some("7/1.36"), None);
        let new = cm("x-default", "vcp-upgrade-canary", Some("7/1.37"), None);
        assert_eq!(canary_mark(&t, None), None, "no host copy yet");
        assert_eq!(canary_mark(&t, Some(&old)), None, "the host copy is stale");
        assert_eq!(canary_mark(&t, Some(&new)).as_deref(), Some("7/1.37"));
        let marked = cm(
            "default",
            "vcp-upgrade-canary",
            Some("7/1.37"),
            Some("7/1.37"),
        );
        assert_eq!(canary_mark(&marked, Some(&new)), None, "marked already");
        // Any other ConfigMap, even one of the same name elsewhere, is never marked.
        let other = cm("team", "vcp-upgrade-canary", Some("7/1.37"), None);
        assert_eq!(canary_mark(&other, Some(&new)), None);
    }
}
