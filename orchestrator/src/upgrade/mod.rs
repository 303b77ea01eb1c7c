//! Fleet upgrades and automatic patch updates: the I/O around the pure machines of
//! [`crate::lifecycle`].
//!
//! Data flow: the API plans a fleet upgrade ([`crate::lifecycle::fleet::plan`]) and stores it
//! ([`store`]); the fleet worker ([`runner`]) of any replica claims it under a lease, asks
//! [`crate::lifecycle::fleet::step`] what to do and starts each tenant's upgrade through the
//! inventory's `PATCH` path; [`auto`] starts patch updates for tenants that opted in. From
//! there the reconcile workers of [`crate::provision`] move each tenant hop by hop
//! ([`crate::lifecycle::upgrade`]).

pub mod auto;
pub mod runner;
pub mod store;
