//! What the syncer knows of its tenant, read by the engine and every kind: its key and plan
//! ([`Ctx`], all a translator needs) and where its pods find its control plane on the host
//! ([`PodEnv`]). Set once at start from the flags and the host's Services; never changes.

use vcp_core::naming::TenantKey;

/// What translators need to know about the tenant.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub key: TenantKey,
    /// What the tenant's plan lets it put on the host.
    pub policy: std::sync::Arc<vcp_policy::TenantPolicy>,
}

/// Where a tenant's pods find their control plane from the host.
#[derive(Debug, Clone, Default)]
pub struct PodEnv {
    /// ClusterIP and port of the tenant apiserver's host Service.
    pub apiserver: Option<(String, i32)>,
    /// ClusterIP of the tenant CoreDNS Service.
    pub dns: Option<String>,
    /// The tenant's cluster domain.
    pub cluster_domain: String,
    /// The image of the `/etc/hosts` init container ([`crate::etc_hosts`]), if configured.
    pub etc_hosts_image: Option<String>,
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
