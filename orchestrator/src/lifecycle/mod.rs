//! What a tenant's control plane goes through, as pure machines: no client, no pool, no clock
//! of their own (the caller passes `now`).
//!
//! - [`steps`]: bring-up and tear-down, one verdict per reconcile pass from what the pass saw.
//! - [`upgrade`]: an upgrade's hops, each gated on its snapshot, rollout and round trip, with
//!   rollback to the hop's start.
//! - [`skew`]: which version moves are allowed, and in which hops.
//! - [`fleet`]: fleet upgrades in waves, with a canary, a failure budget and windows.
//! - [`members`]: a tenant's own etcd grown from one member to three while it serves.
//!
//! Data flow: [`crate::provision`] runs [`steps`] and [`upgrade`] in each reconcile pass and
//! writes their verdicts through [`crate::inventory`]; [`crate::upgrades`] runs [`fleet`]. Both
//! depend on this module and it depends on neither, so the I/O sits above the rules.

pub mod fleet;
pub mod members;
pub mod skew;
pub mod steps;
pub mod upgrade;
