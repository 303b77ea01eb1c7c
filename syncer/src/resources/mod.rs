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

use vcp_core::naming::TenantKey;

/// Field manager of every write the syncer makes.
pub const FIELD_MANAGER: &str = "vcp-syncer";

/// What translators need to know about the tenant.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub key: TenantKey,
    /// What the tenant's plan lets it put on the host.
    pub policy: std::sync::Arc<vcp_policy::TenantPolicy>,
}

#[cfg(test)]
pub(crate) mod fixtures {
    use super::Ctx;
    use vcp_core::naming::TenantKey;

    pub fn ctx() -> Ctx {
        Ctx {
            key: TenantKey::new("demo").unwrap(),
            policy: Default::default(),
        }
    }
}
