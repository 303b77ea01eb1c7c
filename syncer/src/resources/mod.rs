//! One translator per kind: pure functions from a tenant object to its host object, and from a
//! host object's status back to a patch of the tenant object. The engine (`engine/`) decides
//! what to do per key; translators only say what the host object should be.
//!
//! Ownership of fields: the tenant owns spec, labels and annotations (copied down); the host
//! owns status (copied up). Server-side apply with the field manager [`FIELD_MANAGER`] writes
//! exactly the fields a translator sets, so host-side defaults and other managers' fields are
//! left alone.

pub mod configmaps;
pub mod endpoints;
pub mod events;
pub mod namespaces;
pub mod pods;
pub mod pvcs;
pub mod secrets;
pub mod services;
pub mod volumes;

use crate::naming::{self, TenantKey, TenantRef};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;

/// Field manager of every write the syncer makes.
pub const FIELD_MANAGER: &str = "vcp-syncer";

/// What translators need to know about the tenant.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub key: TenantKey,
    /// What the tenant's plan lets it put on the host.
    pub policy: std::sync::Arc<crate::policy::TenantPolicy>,
}

/// Host metadata for a namespaced tenant object: same name, translated namespace, tenant labels
/// and annotations (reserved keys rewritten), markers, and nothing the host must not inherit
/// (owner references, finalizers, managed fields, resource versions).
pub fn host_meta<K: kube::Resource>(obj: &K, ctx: &Ctx) -> ObjectMeta {
    let r = TenantRef {
        namespace: obj.namespace(),
        name: obj.name_any(),
        uid: obj.uid(),
    };
    let (marker_labels, marker_annotations) = naming::markers(&ctx.key, &r);
    let mut labels = naming::map_to_host(obj.labels());
    labels.extend(marker_labels);
    let mut annotations = naming::map_to_host(obj.annotations());
    // kubectl's record of the tenant's last apply is meaningless (and large) on the host.
    annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    annotations.extend(marker_annotations);
    ObjectMeta {
        name: Some(r.name),
        namespace: r.namespace.map(|ns| naming::host_namespace(&ctx.key, &ns)),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::Ctx;
    use crate::naming::TenantKey;

    pub fn ctx() -> Ctx {
        Ctx {
            key: TenantKey::new("demo").unwrap(),
            policy: Default::default(),
        }
    }
}
