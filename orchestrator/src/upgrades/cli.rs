//! `vcp upgrade ...` and `vcp tenant upgrade`: one tenant's upgrade and fleet upgrades.

use crate::client::output::{self, Format, age, table};
use crate::client::{Client, Connection, OutputArgs, WaitArgs, now, print, progress};
use crate::upgrades::types::FleetUpgradeView;
use crate::upgrades::types::{
    CreateFleetUpgrade, FleetSelector, FleetUpgradeAction, FleetUpgradeDetail, FleetUpgradeList,
};
use crate::{Error, Result};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use vcp_core::lifecycle::FleetState;

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
        Format::Table => print(&fleet_detail(d, now(), width)),
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
                Format::Table => print(&fleets_table(&list.items, now(), width)),
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
        let line = fleet_progress(&d.upgrade);
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

/// A duration as people read it: `45s`, `3m20s`, `1h05m`.
pub fn span(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One line of a fleet upgrade's progress, as `vcp upgrade create --wait` prints it.
pub fn fleet_progress(f: &FleetUpgradeView) -> String {
    let p = &f.progress;
    let done = p.succeeded + p.failed + p.skipped;
    let mut line = format!(
        "{} wave {}/{}  done {}/{} (failed {}, skipped {})  running {}  remaining {}",
        f.state,
        (f.current_wave + 1).min(f.waves.max(1)),
        f.waves,
        done,
        p.total,
        p.failed,
        p.skipped,
        p.running,
        p.pending + p.running
    );
    if let Some(until) = f.soak_until {
        let _ = write!(line, "  soaking until {}", until.time());
    }
    if let Some(eta) = p.eta_seconds.filter(|_| !f.state.finished()) {
        let _ = write!(line, "  eta {}", span(eta));
    }
    if let Some(r) = f.reason.as_deref().filter(|_| f.state.finished()) {
        let _ = write!(line, "  ({r})");
    }
    line
}

pub fn fleets_table(items: &[FleetUpgradeView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|f| {
            let p = &f.progress;
            vec![
                f.id.to_string(),
                f.target.clone(),
                f.state.as_str().to_owned(),
                format!("{}/{}", (f.current_wave + 1).min(f.waves.max(1)), f.waves),
                format!("{}/{}", p.succeeded, p.total),
                p.failed.to_string(),
                age(f.created_at, now),
            ]
        })
        .collect();
    table(
        &["ID", "TARGET", "STATE", "WAVE", "DONE", "FAILED", "AGE"],
        &rows,
        width,
    )
}

/// A fleet upgrade and its tenants.
pub fn fleet_detail(d: &FleetUpgradeDetail, now: OffsetDateTime, width: usize) -> String {
    let f = &d.upgrade;
    let mut out = format!(
        "fleet upgrade {} to {} (created by {}, {} ago)\n{}\n\n",
        f.id,
        f.target,
        f.created_by,
        age(f.created_at, now),
        fleet_progress(f)
    );
    let rows: Vec<Vec<String>> = d
        .tenants
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.owner.clone(),
                t.wave.to_string(),
                format!("{} -> {}", t.from, t.target),
                t.state.as_str().to_owned(),
                t.reason
                    .clone()
                    .or_else(|| t.forced.clone())
                    .unwrap_or_default(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TENANT", "OWNER", "WAVE", "VERSION", "STATE", "REASON"],
        &rows,
        width,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::output::fixtures::{at, max_line};

    #[test]
    fn fleet_progress_shows_waves_counts_and_eta_and_the_table_fits() {
        use crate::api::{FleetEntryState, FleetProgress, FleetState, FleetTenantView};
        let f = FleetUpgradeView {
            id: 7,
            target: "1.37".into(),
            state: FleetState::Running,
            selector: Default::default(),
            chain: false,
            canary: 1,
            max_parallel: 10,
            failure_budget: 0,
            soak_seconds: 60,
            respect_maintenance_windows: true,
            current_wave: 1,
            waves: 3,
            soak_until: None,
            reason: None,
            created_by: "admin".into(),
            created_at: at(0),
            finished_at: None,
            progress: FleetProgress {
                total: 7,
                pending: 4,
                running: 2,
                succeeded: 1,
                failed: 0,
                skipped: 0,
                eta_seconds: Some(200),
            },
        };
        assert_eq!(
            fleet_progress(&f),
            "Running wave 2/3  done 1/7 (failed 0, skipped 0)  running 2  remaining 6  eta 3m20s"
        );
        let t = FleetTenantView {
            name: "a".repeat(40),
            owner: "team-a".into(),
            wave: 2,
            from: "1.36".into(),
            target: "1.37".into(),
            state: FleetEntryState::Failed,
            upgrade_id: Some(3),
            upgrade_state: None,
            forced: None,
            reason: Some("hop 1.36 -> 1.37 not healthy after 300s: ".repeat(3)),
            started_at: None,
            finished_at: None,
        };
        let d = FleetUpgradeDetail {
            upgrade: f.clone(),
            tenants: vec![t.clone()],
            failures: vec![t],
        };
        let out = fleet_detail(&d, at(100), 80);
        assert!(max_line(&out) <= 100, "{out}");
        assert!(max_line(&fleets_table(&[f], at(100), 80)) <= 80);
    }
}
