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
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        pods::referenced(e, &t.namespace()?, &t.name_any(), true)
            .then(|| translate::to_host(t, &e.ctx))
            .flatten()
    }
}
