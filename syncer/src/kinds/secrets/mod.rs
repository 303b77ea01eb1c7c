//! Secrets: as ConfigMaps ([`crate::kinds::configmaps`]), copied while a tenant pod references
//! one; service-account token Secrets never ([`translate`]). The host Secrets the syncer makes
//! itself (a pod's token, [`crate::kinds::pods::tokens`]) are marked as generated and never
//! adopted by a tenant Secret.

pub mod translate;

use crate::engine::{Engine, Synced};
use crate::kinds::pods;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

impl Synced for Secret {
    /// The pods' state: a Secret goes down when a pod references it.
    type Own = pods::PodCtx;
    type Host = Self;

    fn to_host(t: &Self, e: &Engine, pods: &pods::PodCtx) -> Option<Self> {
        pods::referenced(e, pods, &t.namespace()?, &t.name_any(), true)
            .then(|| translate::to_host(t, &e.ctx))
            .flatten()
    }
}

/// Starts the Secret controllers (see [`super::KINDS`]); their host cache is published for
/// the pods' token Secrets.
pub fn start(s: &super::Start) -> futures::future::BoxFuture<'static, ()> {
    let e = s.engine.clone();
    Box::pin(crate::engine::run_kind::<Secret>(
        s.engine.clone(),
        s.pods.clone(),
        s.workers,
        |t, s| Box::pin(crate::engine::down(t, s)),
        move |_, host| {
            let _ = e.host_secrets.set(host);
        },
    ))
}
