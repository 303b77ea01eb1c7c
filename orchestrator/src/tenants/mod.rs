//! Tenants: the feature an owner uses first. `POST /v1/tenants` validates a request against
//! the catalog and the plans and writes the desired tenant into the inventory ([`api`]); the
//! reconcile pass ([`crate::provision`]) brings it up and writes phase and conditions back,
//! which `GET` serves as a [`types::TenantView`] (with its latest usage and upgrade).
//! `PATCH` ([`update`]) changes its upgrade settings, starts an upgrade through
//! [`crate::upgrades::store`], or changes its plan ([`plan_change`] decides how: in place, or
//! a move of its data to another store through [`crate::snapshots::moves`]). `vcp tenant ...` ([`cli`]) carries the subcommands of the
//! features that act on one tenant (usage, rotations, upgrade, kubeconfigs) and follows a
//! tenant's progress. The `tenants` row and its SQL stay in [`crate::inventory`], since every
//! feature reads them.

pub mod api;
pub mod cli;
pub mod plan_change;
pub mod types;
pub mod update;
