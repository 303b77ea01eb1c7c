//! vcp orchestrator: turns tenant requests into control planes on a host cluster.
//!
//! Data flow (as the crate grows): the platform API (`api`) writes desired tenants into the
//! Postgres inventory (`inventory`); the provisioner (`provision`) claims tenants, renders their
//! control plane from templates (`render`) with certificates from `pki`, applies it to the host
//! cluster and records progress back in the inventory; `upgrade` plans and runs fleet upgrades.
//! Today the crate holds only its command-line surface; each module arrives with its issue.

use clap::Parser;

/// Errors of the orchestrator.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A subcommand the binary knows of but that is not built yet.
    #[error("`vcp {0}` is not available in this build")]
    NotAvailable(&'static str),
}

/// Result with the orchestrator's error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Command line of `vcp`.
#[derive(Debug, Parser)]
#[command(
    name = "vcp",
    version,
    about = "Kubernetes control planes as a service"
)]
pub struct Args {}

/// Runs the command the arguments ask for.
pub fn run(_args: Args) -> Result<()> {
    Err(Error::NotAvailable("serve"))
}
