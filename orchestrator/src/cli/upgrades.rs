//! `vcp upgrade ...` and `vcp tenant upgrade`: one tenant's upgrade and fleet upgrades.

use super::client::{Client, Connection};
use super::output::{self, Format};
use super::{OutputArgs, WaitArgs, now, print, progress};
use crate::api::{
    CreateFleetUpgrade, FleetSelector, FleetState, FleetUpgradeAction, FleetUpgradeDetail,
    FleetUpgradeList,
};
use crate::{Error, Result};
use std::time::{Duration, Instant};

/// `vcp upgrade ...`: fleet upgrades (admins only).
#[derive(Debug, clap::Subcommand)]
pub enum UpgradeCommand {
    /// Start a fleet upgrade (and with --wait, follow it wave by wave until it ends).
    Create(UpgradeCreate),
    /// List fleet upgrades, newest first.
    List(OutputArgs),
    /// Show a fleet upgrade with every tenant's state.
    Get {
        /// Fleet upgrade id.
        id: i64,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Hold a fleet upgrade: no tenant starts; those moving finish.
    Pause(UpgradeActionArgs),
    /// Resume a paused fleet upgrade.
    Resume(UpgradeActionArgs),
    /// Cancel a fleet upgrade: tenants not started are skipped.
    Cancel(UpgradeActionArgs),
}

#[derive(Debug, clap::Args)]
pub struct UpgradeActionArgs {
    /// Fleet upgrade id.
    pub id: i64,
    /// Why, for the audit trail.
    #[arg(long, env = "VCP_UPGRADE_REASON")]
    pub reason: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub struct UpgradeCreate {
    /// The minor to move tenants to (`vcp version list`).
    #[arg(long, env = "VCP_UPGRADE_TO")]
    pub to: String,
    /// Only tenants with these labels: `key=value,key2=value2`.
    #[arg(long, env = "VCP_UPGRADE_SELECTOR")]
    pub selector: Option<String>,
    /// Only these tenants (comma-separated names).
    #[arg(long, env = "VCP_UPGRADE_NAMES", value_delimiter = ',')]
    pub names: Vec<String>,
    /// Only tenants on this version.
    #[arg(long, env = "VCP_UPGRADE_FROM_VERSION")]
    pub from_version: Option<String>,
    /// Tenants more than one minor behind go through every minor between.
    #[arg(long, env = "VCP_UPGRADE_CHAIN")]
    pub chain: bool,
    /// Allow a `preview` target.
    #[arg(long, env = "VCP_ALLOW_PREVIEW")]
    pub allow_preview: bool,
    /// Tenants in the first wave; each wave after is twice the one before.
    #[arg(long, env = "VCP_UPGRADE_CANARY", default_value_t = 1)]
    pub canary: u32,
    /// At most this many tenants moving at once.
    #[arg(long, env = "VCP_UPGRADE_MAX_PARALLEL", default_value_t = 10)]
    pub max_parallel: u32,
    /// Stop when more tenants of one wave fail than this.
    #[arg(long, env = "VCP_UPGRADE_FAILURE_BUDGET", default_value_t = 0)]
    pub failure_budget: u32,
    /// Seconds to wait after a wave before the next one.
    #[arg(long, env = "VCP_UPGRADE_SOAK_SECONDS", default_value_t = 60)]
    pub soak_seconds: u32,
    /// Start tenants at any time, not only inside their maintenance windows.
    #[arg(long, env = "VCP_UPGRADE_IGNORE_WINDOWS")]
    pub ignore_maintenance_windows: bool,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub struct TenantUpgrade {
    /// Tenant name.
    pub name: String,
    /// The minor to run (`vcp version list`).
    #[arg(long, env = "VCP_UPGRADE_TO")]
    pub to: String,
    /// Go through the minors between, one gated hop each.
    #[arg(long, env = "VCP_UPGRADE_CHAIN")]
    pub chain: bool,
    /// Allow a `preview` target.
    #[arg(long, env = "VCP_ALLOW_PREVIEW")]
    pub allow_preview: bool,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `vcp upgrade ...`
pub async fn upgrade(conn: &Connection, cmd: UpgradeCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let width = output::terminal_width();
    let show = |d: &FleetUpgradeDetail, f: Format| match f {
        Format::Table => print(&output::fleet_detail(d, now(), width)),
        f => print(&output::structured(d, f)),
    };
    match cmd {
        UpgradeCommand::Create(a) => {
            let req = CreateFleetUpgrade {
                target: a.to.clone(),
                selector: FleetSelector {
                    labels: a.selector,
                    names: (!a.names.is_empty()).then_some(a.names),
                    version: a.from_version,
                },
                chain: a.chain,
                allow_preview: a.allow_preview,
                canary: a.canary,
                max_parallel: a.max_parallel,
                failure_budget: a.failure_budget,
                soak_seconds: a.soak_seconds,
                respect_maintenance_windows: !a.ignore_maintenance_windows,
            };
            let mut d: FleetUpgradeDetail = client.post("/v1/upgrades", &req).await?;
            if a.wait.wait {
                progress(&format!(
                    "fleet upgrade {} to {}: {} tenants in {} waves; waiting until done",
                    d.upgrade.id, d.upgrade.target, d.upgrade.progress.total, d.upgrade.waves
                ));
                d = follow_fleet(&client, d.upgrade.id, &a.wait).await?;
                if d.upgrade.state != FleetState::Succeeded {
                    show(&d, a.output.output)?;
                    return Err(Error::Client(format!(
                        "fleet upgrade {} ended {}: {}",
                        d.upgrade.id,
                        d.upgrade.state,
                        d.upgrade.reason.as_deref().unwrap_or("no reason recorded")
                    )));
                }
            }
            show(&d, a.output.output)
        }
        UpgradeCommand::List(o) => {
            let list: FleetUpgradeList = client.get("/v1/upgrades").await?;
            match o.output {
                Format::Table => print(&output::fleets_table(&list.items, now(), width)),
                f => print(&output::structured(&list, f)),
            }
        }
        UpgradeCommand::Get { id, output: o } => {
            let d: FleetUpgradeDetail = client.get(&format!("/v1/upgrades/{id}")).await?;
            show(&d, o.output)
        }
        UpgradeCommand::Pause(a) => fleet_action(&client, "pause", a, show).await,
        UpgradeCommand::Resume(a) => fleet_action(&client, "resume", a, show).await,
        UpgradeCommand::Cancel(a) => fleet_action(&client, "cancel", a, show).await,
    }
}

async fn fleet_action(
    client: &Client,
    action: &str,
    a: UpgradeActionArgs,
    show: impl Fn(&FleetUpgradeDetail, Format) -> Result<()>,
) -> Result<()> {
    let d: FleetUpgradeDetail = client
        .post(
            &format!("/v1/upgrades/{}/{action}", a.id),
            &FleetUpgradeAction { reason: a.reason },
        )
        .await?;
    show(&d, a.output.output)
}

/// Polls a fleet upgrade until it is finished with nothing moving, printing a progress line
/// whenever it changes (waves, done, failed, remaining, ETA).
async fn follow_fleet(client: &Client, id: i64, wait: &WaitArgs) -> Result<FleetUpgradeDetail> {
    let start = Instant::now();
    let mut last = String::new();
    loop {
        let d: FleetUpgradeDetail = client.get(&format!("/v1/upgrades/{id}")).await?;
        let line = output::fleet_progress(&d.upgrade);
        if line != last {
            progress(&format!("{:>6.1}s  {line}", start.elapsed().as_secs_f64()));
            for f in &d.failures {
                if !last.is_empty() || d.upgrade.state.finished() {
                    progress(&format!(
                        "          failed: {} ({} -> {}): {}",
                        f.name,
                        f.from,
                        f.target,
                        f.reason.as_deref().unwrap_or("-")
                    ));
                }
            }
            last = line;
        }
        if d.upgrade.state.finished() && d.upgrade.progress.running == 0 {
            return Ok(d);
        }
        if start.elapsed() > wait.timeout {
            return Err(Error::Client(format!(
                "fleet upgrade {id} is still {} after {}s",
                d.upgrade.state,
                wait.timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}
