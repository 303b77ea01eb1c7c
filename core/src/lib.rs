//! vcp-core: what the orchestrator and the syncer must agree on, as types and pure functions.
//!
//! Data flow: the orchestrator makes a tenant's [`naming::TenantKey`] when the tenant is created,
//! stores it in its inventory, names the tenant's control-plane namespace after it
//! ([`naming::control_plane_namespace`]) and passes it to the tenant's syncer as
//! `--tenant-key`. The syncer checks it with the same rule and derives every host name from it
//! ([`naming::host_namespace`], [`naming::host_cluster_name`]), marking each host object with
//! the tenant label and annotations ([`naming::host_meta`]); the orchestrator selects the
//! tenant's host objects by that label to sample usage and to clean up. So a name, a label or
//! a key means the same on both sides because both sides call the same code.
//!
//! The tenant lifecycle ([`lifecycle`]: what was asked of a tenant, where it is, its
//! conditions) is one set of types for the orchestrator's inventory, workers and API; the
//! inventory's sqlx mapping and the API's schemas are behind the features `sqlx` and `openapi`.
//!
//! No client, no pool, no I/O: everything here is a function of its arguments, tested with
//! plain values and property tests. The orchestrator's own labels for control-plane objects
//! (`vcp.dev/control-plane-of`, ...) live with its renderer, which is their only writer; the
//! syncer's labels for objects only it makes (virtual nodes, mirrored volumes, token Secrets)
//! live with the kind that makes them.

pub mod lifecycle;
pub mod naming;
pub mod revocation;

/// Errors of vcp-core.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("invalid tenant key {0:?}: use 1-20 characters of [a-z0-9], starting with a letter")]
    InvalidKey(String),
    /// A name that is not one of a lifecycle enum's values.
    #[error("unknown {what} {value:?}")]
    Unknown {
        /// Which enum (`phase`, `desired state`, ...).
        what: &'static str,
        /// The name that was read.
        value: String,
    },
}

/// Result with vcp-core's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
