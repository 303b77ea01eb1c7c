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
//! What more than one binary reads is here too: the control-plane label the orchestrator writes
//! and the syncer's NetworkPolicies select by ([`naming::LABEL_CONTROL_PLANE_OF`]), the quota's
//! resources the syncer enforces and the orchestrator samples and stores ([`quota`]), and how
//! errors are told on one line ([`chain`]), and the narrowed host pod the syncer caches and
//! the endpoint checks read ([`host_pod::HostPod`]).
//!
//! No client, no pool, no I/O: everything here is a function of its arguments, tested with
//! plain values and property tests. The syncer's labels for objects only it makes (virtual
//! nodes, mirrored volumes, token Secrets) live with the kind that makes them.

pub mod host_pod;
pub mod lifecycle;
pub mod naming;
pub mod quota;
pub mod revocation;

/// An error and its causes on one line, `outer: cause: root cause`: an apiserver's own message
/// (why a write was refused) is the last link, and a log line without it says nothing useful.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

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
