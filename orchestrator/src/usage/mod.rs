//! Quota usage: what each Ready tenant uses of its plan's quota, over time.
//!
//! Data flow: the [`sampler`] counts every Ready tenant's host objects by the syncer's own
//! quota rules and records a sample ([`store`]); `GET /v1/tenants/{name}/usage` ([`api`])
//! serves them for billing, and `vcp tenant usage` ([`cli`]) prints them.

pub mod api;
pub mod cli;
pub mod export;
pub mod sampler;
pub mod store;
pub mod types;

pub use sampler::Sampler;
