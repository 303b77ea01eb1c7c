//! Kubeconfigs and the tenant's users: issuing, listing and revoking client certificates,
//! sudo and break-glass access.
//!
//! Data flow: `POST /v1/tenants/{name}/kubeconfigs` ([`api`]) signs a client certificate
//! with the tenant's CA on the host ([`sign`]) and records its serial ([`store`]); a revocation
//! records the serial, which the tenant apiserver's revocation authorizer reads back through
//! the policy the pass renders. [`access`] says which groups and roles a kubeconfig's user
//! gets (pure). `vcp kubeconfig` and `vcp user` are in [`cli`].

pub mod access;
pub mod api;
pub mod cli;
pub mod sign;
pub mod store;
pub mod types;
