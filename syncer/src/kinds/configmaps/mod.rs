//! ConfigMaps: copied into the host namespace under the same name while a tenant pod
//! references one (or always, with `--sync-all-configmaps-secrets`). A pod's own reconcile
//! copies them first, before its host pod ([`crate::kinds::pods`]); this kind's controllers
//! (the engine's generic down and gc) keep the copies in step and delete them with the tenant
//! object. Translation: [`translate`].

pub mod translate;

use crate::engine::{Engine, Synced};
use crate::kinds::pods;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;

impl Synced for ConfigMap {
    fn to_host(t: &Self, e: &Engine) -> Option<Self> {
        pods::referenced(e, &t.namespace()?, &t.name_any(), false)
            .then(|| translate::to_host(t, &e.ctx))
    }
}
