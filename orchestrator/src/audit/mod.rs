//! The audit trail read back: every write of the platform is recorded in the same
//! transaction ([`crate::inventory::audit_in`]); this feature filters and pages it
//! ([`store`]) for `GET /v1/audit` ([`api`]) and `vcp audit` ([`cli`]).

pub mod api;
pub mod cli;
pub mod store;
pub mod types;
