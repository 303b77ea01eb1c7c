//! Upgrades: one tenant's (`PATCH /v1/tenants/{name}` with a version), fleet upgrades and
//! automatic patch updates: the I/O around the pure machines of [`crate::lifecycle`].
//!
//! Data flow: a tenant's upgrade is started by `PATCH /v1/tenants/{name}` ([`crate::tenants::update`]) and recorded by [`store`]; the
//! reconcile pass ([`crate::provision`]) moves it hop by hop ([`crate::lifecycle::upgrade`])
//! and writes each transition through [`store`]. The API plans a fleet upgrade
//! ([`crate::lifecycle::fleet::plan`], in [`api`]) and stores it ([`fleet_store`]); the
//! fleet worker ([`runner`]) of any replica claims it under a lease, asks
//! [`crate::lifecycle::fleet::step`] what to do and starts each tenant's upgrade through the
//! same statement as the `PATCH`; [`auto`] starts patch updates for tenants that opted in.
//! `vcp tenant upgrade` and `vcp upgrade` are in [`cli`].

pub mod api;
pub mod auto;
pub mod cli;
pub mod fleet_store;
pub mod runner;
pub mod store;
pub mod types;
