//! The tenant's audit log: what happened inside a tenant apiserver, collected by vcp and read
//! by the tenant's owner.
//!
//! Data flow: each pass writes the apiserver's audit policy (from the plan, pure:
//! [`crate::render::audit`]) and a webhook kubeconfig with a per-tenant ingest token into the
//! host Secret `audit-config` ([`host`]); the apiserver posts batches of events through its
//! control-plane egress relay to vcp's ingest listener ([`ingest`]), which knows the tenant by
//! the token alone, turns each event into a bounded row ([`events`], pure) and stores it
//! ([`store`]); the owner reads them with `GET /v1/tenants/{name}/audit-events` ([`api`]) and
//! `vcp tenant audit` ([`cli`]); [`retention`] deletes events older than the plan keeps them.

pub mod api;
pub mod cli;
pub mod events;
pub mod host;
pub mod ingest;
pub mod retention;
pub mod store;
pub mod types;
