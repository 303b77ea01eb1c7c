//! `vcp tenant ...`: create, list, show, update, delete, sleep and wake, usage and rotations
//! of tenants.

use crate::backup_store::BackupPlan;
use crate::client::output::{self, Format, age, cut, table};
use crate::client::{
    Client, Connection, OutputArgs, WaitArgs, labels, name, now, print, progress, window,
};
use crate::kubeconfigs::types::KubeconfigList;
use crate::tenants::types::{CreateTenant, TenantList, TenantView};
use crate::upgrades::cli::TenantUpgrade;
use crate::upgrades::types::UpgradeTenant;
use crate::window::MaintenanceWindow;
use crate::{Error, Result};
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use vcp_core::lifecycle::AutoUpdate;
use vcp_core::lifecycle::FleetUpgrades;
use vcp_core::lifecycle::Phase;
use vcp_core::lifecycle::Sleep;
use vcp_core::lifecycle::UpgradeState;
use vcp_core::lifecycle::{ConditionStatus, ConditionType};

/// `vcp tenant ...`
#[derive(Debug, clap::Subcommand)]
pub enum TenantCommand {
    /// Create a tenant (and with --wait, follow it until Ready).
    Create(TenantCreate),
    /// List the tenants this token sees.
    List(OutputArgs),
    /// Show one tenant and its conditions.
    Get {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Delete a tenant (and with --wait, until it is gone).
    Delete(TenantDelete),
    /// List the kubeconfigs issued for a tenant (never their keys).
    Kubeconfigs {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Show a tenant's quota usage samples in a time range (every page), e.g. for billing.
    Usage(crate::usage::cli::TenantUsageArgs),
    /// Show a tenant apiserver's audit log: who did what, on which object (every page up to
    /// --limit), oldest first.
    Audit(crate::tenant_audit::cli::TenantAuditArgs),
    /// Upgrade a tenant's control plane to another minor (and with --wait, follow it until
    /// it is done or rolled back).
    Upgrade(TenantUpgrade),
    /// Change a tenant's fleet upgrade settings: its maintenance window, whether fleet
    /// upgrades may move it.
    Update(TenantUpdate),
    /// Put a tenant to sleep: its control plane scales to zero until a wake or a connection
    /// through the gateway (and with --wait, until it is down).
    Sleep(TenantSleep),
    /// Wake a sleeping tenant (and with --wait, until it is Ready).
    Wake(TenantSleep),
    /// Rotate one of a tenant's CAs or its service-account key without downtime (admins; and
    /// with --wait, follow its phases until done).
    Rotate(crate::rotations::cli::TenantRotate),
    /// List a tenant's rotations, newest first, with the kubeconfigs a CA rotation ends.
    Rotations {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `--fleet-upgrades`: whether fleet upgrades may move a tenant.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum FleetUpgradesArg {
    /// Fleet upgrades whose selector matches move it.
    Include,
    /// Only an expired version moves it (one minor per fleet upgrade).
    Exclude,
}

impl From<FleetUpgradesArg> for FleetUpgrades {
    fn from(a: FleetUpgradesArg) -> FleetUpgrades {
        match a {
            FleetUpgradesArg::Include => FleetUpgrades::Include,
            FleetUpgradesArg::Exclude => FleetUpgrades::Exclude,
        }
    }
}

/// `--auto-update`: whether vcp moves a tenant to newer patch releases by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AutoUpdateArg {
    /// In its maintenance window, to the newest release of its minor.
    Patch,
    /// Never.
    Off,
    /// Whatever its plan says (removes the tenant's own setting).
    Plan,
}

impl AutoUpdateArg {
    /// The tenant's own setting this asks for (`None`: its plan's).
    fn setting(self) -> Option<AutoUpdate> {
        match self {
            AutoUpdateArg::Patch => Some(AutoUpdate::Patch),
            AutoUpdateArg::Off => Some(AutoUpdate::Off),
            AutoUpdateArg::Plan => None,
        }
    }
}

/// `--backups`: a schedule of the tenant's own, or `None` for its plan's again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupsArg(pub Option<BackupPlan>);

/// `hourly=N,daily=M` (either may be left out: 0), or `plan`.
fn backups(s: &str) -> std::result::Result<BackupsArg, String> {
    if s == "plan" {
        return Ok(BackupsArg(None));
    }
    let mut b = BackupPlan::default();
    for part in s.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("{part:?} is not hourly=N or daily=N (or say `plan`)"))?;
        let n: u32 = v
            .parse()
            .map_err(|_| format!("{v:?} is not a number of snapshots to keep"))?;
        match k {
            "hourly" => b.hourly = n,
            "daily" => b.daily = n,
            _ => return Err(format!("{k:?} is not hourly or daily")),
        }
    }
    b.validate()?;
    Ok(BackupsArg(Some(b)))
}

#[derive(Debug, clap::Args)]
pub struct TenantUpdate {
    /// Tenant name.
    pub name: String,
    /// When fleet upgrades may start the tenant, UTC: `DAYS HH:MM DURATION`, e.g.
    /// `sat,sun 02:00 4h` (days: mon..sun, daily, weekdays, weekends; duration up to 24h).
    #[arg(long, env = "VCP_MAINTENANCE_WINDOW", value_parser = window, conflicts_with = "no_maintenance_window")]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// Remove the tenant's own window (its plan's applies again).
    #[arg(long, env = "VCP_NO_MAINTENANCE_WINDOW")]
    pub no_maintenance_window: bool,
    /// Whether fleet upgrades may move the tenant.
    #[arg(long, env = "VCP_FLEET_UPGRADES", value_enum)]
    pub fleet_upgrades: Option<FleetUpgradesArg>,
    /// Automatic patch updates in the maintenance window: `patch`, `off`, or `plan` (the
    /// plan's setting).
    #[arg(long, env = "VCP_AUTO_UPDATE", value_enum)]
    pub auto_update: Option<AutoUpdateArg>,
    /// The tenant's own backup schedule, `hourly=N,daily=M` (keep the newest N hourly and M
    /// daily snapshots; 0 or absent: none of that schedule), or `plan` (its plan's again).
    #[arg(long, env = "VCP_BACKUPS", value_parser = backups)]
    pub backups: Option<BackupsArg>,
    /// Move the tenant to another plan (alone: not with the settings above). A plan whose data
    /// live in another store moves them; `vcp tenant get` shows the move's progress.
    #[arg(
        long,
        env = "VCP_PLAN",
        conflicts_with_all = ["maintenance_window", "no_maintenance_window", "fleet_upgrades", "auto_update", "backups"]
    )]
    pub plan: Option<String>,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub struct TenantCreate {
    /// Tenant name: lowercase letters, digits and '-', up to 40.
    pub name: String,
    /// Kubernetes minor (`vcp version list`); the server's default when absent.
    #[arg(long = "kubernetes-version", env = "VCP_KUBERNETES_VERSION")]
    pub version: Option<String>,
    /// Allow a `preview` version (`vcp version list` shows each version's class).
    #[arg(long, env = "VCP_ALLOW_PREVIEW")]
    pub allow_preview: bool,
    /// Placement plan configured on the server.
    #[arg(long, env = "VCP_PLAN")]
    pub plan: Option<String>,
    /// Label as KEY=VALUE (repeatable).
    #[arg(long = "label", env = "VCP_LABELS", value_delimiter = ',')]
    pub labels: Vec<String>,
    /// When fleet upgrades may start the tenant, UTC: `DAYS HH:MM DURATION`, e.g.
    /// `sat,sun 02:00 4h`; absent: its plan's window, or any time.
    #[arg(long, env = "VCP_MAINTENANCE_WINDOW", value_parser = window)]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// Whether fleet upgrades may move the tenant (default include).
    #[arg(long, env = "VCP_FLEET_UPGRADES", value_enum)]
    pub fleet_upgrades: Option<FleetUpgradesArg>,
    /// Automatic patch updates in the maintenance window: `patch`, `off`, or `plan` (the
    /// default: the plan's setting).
    #[arg(long, env = "VCP_AUTO_UPDATE", value_enum)]
    pub auto_update: Option<AutoUpdateArg>,
    /// A clone of snapshot N of a tenant, `TENANT/N` (a live tenant's name, or a tenant's key,
    /// a deleted one's too): it comes up with that snapshot's data. Only uploaded snapshots.
    #[arg(long, env = "VCP_FROM_SNAPSHOT")]
    pub from_snapshot: Option<String>,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub struct TenantDelete {
    /// Tenant name.
    pub name: String,
    /// Keep the etcd volumes.
    #[arg(long, env = "VCP_RETAIN_DATA")]
    pub retain_data: bool,
    #[command(flatten)]
    pub wait: WaitArgs,
}

pub async fn tenant(conn: &Connection, cmd: TenantCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let width = output::terminal_width();
    match cmd {
        TenantCommand::Create(a) => {
            let req = CreateTenant {
                name: a.name.clone(),
                version: a.version,
                labels: labels(&a.labels)?,
                plan: a.plan,
                allow_preview: a.allow_preview,
                maintenance_window: a.maintenance_window,
                fleet_upgrades: a.fleet_upgrades.map(Into::into),
                auto_update: a.auto_update.and_then(AutoUpdateArg::setting),
                from_snapshot: a.from_snapshot,
            };
            let mut t: TenantView = client.post("/v1/tenants", &req).await?;
            if a.wait.wait {
                progress(&format!("tenant {} created; waiting until Ready", t.name));
                // The new tenant is the caller's, whatever `--owner` says: poll that one.
                let client = client.owned_by(&t.owner);
                t = follow(&client, &a.name, &a.wait, |t| t.phase == Phase::Ready)
                    .await?
                    .ok_or_else(|| Error::Client(format!("tenant {} vanished", a.name)))?;
            }
            match a.output.output {
                Format::Table => print(&tenants_table(&[t], now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::List(o) => {
            let list: TenantList = client.get("/v1/tenants").await?;
            match o.output {
                Format::Table => print(&tenants_table(&list.items, now(), width)),
                f => print(&output::structured(&list, f)),
            }
        }
        TenantCommand::Get { name, output: o } => {
            let t = client.tenant(&name).await?;
            match o.output {
                Format::Table => print(&tenant_detail(&t, now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::Delete(a) => {
            let path = format!(
                "/v1/tenants/{}?retain_data={}",
                name(&a.name)?,
                a.retain_data
            );
            let _: Option<TenantView> = client
                .call(reqwest::Method::DELETE, &path, None::<&()>)
                .await?;
            if a.wait.wait {
                progress(&format!("tenant {} deleting; waiting until gone", a.name));
                follow(&client, &a.name, &a.wait, |_| false).await?;
                print(&format!("tenant {} deleted\n", a.name))
            } else {
                print(&format!("tenant {} deleting\n", a.name))
            }
        }
        TenantCommand::Upgrade(a) => {
            let req = UpgradeTenant {
                version: Some(a.to.clone()),
                chain: a.chain,
                allow_preview: a.allow_preview,
                ..Default::default()
            };
            let path = format!("/v1/tenants/{}", name(&a.name)?);
            let mut t: TenantView = client
                .call(reqwest::Method::PATCH, &path, Some(&req))
                .await?
                .ok_or_else(|| Error::Client(format!("empty answer from {path}")))?;
            if a.wait.wait {
                progress(&format!(
                    "tenant {} upgrading to {}; waiting until done",
                    t.name, a.to
                ));
                let done = |t: &TenantView| {
                    t.phase != Phase::Upgrading
                        && t.upgrade.as_ref().is_some_and(|u| !u.state.active())
                };
                t = follow(&client, &a.name, &a.wait, done)
                    .await?
                    .ok_or_else(|| Error::Client(format!("tenant {} vanished", a.name)))?;
                if let Some(u) = t
                    .upgrade
                    .as_ref()
                    .filter(|u| u.state == UpgradeState::RolledBack)
                {
                    return Err(Error::Client(format!(
                        "tenant {} was rolled back to {}: {}",
                        t.name,
                        u.hop_from,
                        u.reason.as_deref().unwrap_or("no reason recorded")
                    )));
                }
            }
            match a.output.output {
                Format::Table => print(&tenants_table(&[t], now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::Update(a) => {
            let req = UpgradeTenant {
                maintenance_window: if a.no_maintenance_window {
                    Some(None)
                } else {
                    a.maintenance_window.map(Some)
                },
                fleet_upgrades: a.fleet_upgrades.map(Into::into),
                auto_update: a.auto_update.map(AutoUpdateArg::setting),
                backups: a.backups.map(|b| b.0),
                plan: a.plan.clone(),
                ..Default::default()
            };
            let path = format!("/v1/tenants/{}", name(&a.name)?);
            let t: TenantView = client
                .call(reqwest::Method::PATCH, &path, Some(&req))
                .await?
                .ok_or_else(|| Error::Client(format!("empty answer from {path}")))?;
            match a.output.output {
                Format::Table => print(&tenant_detail(&t, now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::Usage(a) => {
            let samples = crate::usage::cli::usage_samples(&client, &a, now()).await?;
            match a.output.output {
                Format::Table => print(&crate::usage::cli::usage_table(&samples, width)),
                f => print(&output::structured(&samples, f)),
            }
        }
        TenantCommand::Audit(a) => {
            let page = crate::tenant_audit::cli::audit_events(&client, &a, now()).await?;
            crate::tenant_audit::cli::print_events(&page, &a, width)
        }
        TenantCommand::Kubeconfigs { name, output: o } => {
            let list: KubeconfigList = client
                .get(&format!("/v1/tenants/{}/kubeconfigs", self::name(&name)?))
                .await?;
            match o.output {
                Format::Table => print(&crate::kubeconfigs::cli::kubeconfigs_table(
                    &list.items,
                    now(),
                    width,
                )),
                f => print(&output::structured(&list, f)),
            }
        }
        TenantCommand::Sleep(a) => ask_sleep(&client, a, vcp_core::lifecycle::Sleep::Asleep).await,
        TenantCommand::Wake(a) => ask_sleep(&client, a, vcp_core::lifecycle::Sleep::Awake).await,
        TenantCommand::Rotate(a) => crate::rotations::cli::rotate(&client, a, width).await,
        TenantCommand::Rotations { name, output: o } => {
            crate::rotations::cli::rotations(&client, &name, o, width).await
        }
    }
}

/// `ready/total` over the step conditions (the final `Ready` condition is not a step).
pub fn steps(t: &TenantView) -> String {
    let steps: Vec<_> = t
        .conditions
        .iter()
        .filter(|c| c.type_ != ConditionType::Ready)
        .collect();
    let ready = steps
        .iter()
        .filter(|c| c.status == ConditionStatus::True)
        .count();
    format!("{ready}/{}", steps.len())
}

pub fn tenants_table(items: &[TenantView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.phase.as_str().to_owned(),
                steps(t),
                t.kubernetes_version.clone().unwrap_or(t.version.clone()),
                t.owner.clone(),
                age(t.created_at, now),
            ]
        })
        .collect();
    table(
        &["NAME", "PHASE", "STEPS", "VERSION", "OWNER", "AGE"],
        &rows,
        width,
    )
}

/// One tenant: its fields, then its conditions.
pub fn tenant_detail(t: &TenantView, now: OffsetDateTime, width: usize) -> String {
    let mut out = String::new();
    let fields = [
        ("Name", t.name.clone()),
        ("Key", t.key.clone()),
        ("Owner", t.owner.clone()),
        ("Phase", t.phase.as_str().to_owned()),
        (
            "Version",
            format!(
                "{} ({})",
                t.version,
                t.kubernetes_version.as_deref().unwrap_or("unknown")
            ),
        ),
        ("Plan", t.plan.clone()),
        ("Endpoint", t.endpoint.clone().unwrap_or_else(|| "-".into())),
        (
            "Labels",
            if t.labels.is_empty() {
                "-".into()
            } else {
                t.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            },
        ),
        (
            "Window",
            t.maintenance_window
                .as_ref()
                .map_or_else(|| "- (the plan's, or any time)".into(), |w| w.to_string()),
        ),
        ("Fleet", t.fleet_upgrades.as_str().to_owned()),
        (
            "Auto",
            format!(
                "{}{}",
                t.auto_update_effective,
                if t.auto_update.is_none() {
                    " (the plan's)"
                } else {
                    ""
                }
            ),
        ),
        (
            "Backups",
            t.backups.map_or_else(
                || "- (the plan's)".into(),
                |b| format!("hourly={},daily={}", b.hourly, b.daily),
            ),
        ),
        ("Age", age(t.created_at, now)),
    ];
    for (k, v) in fields {
        let _ = writeln!(
            out,
            "{:<10}{}",
            format!("{k}:"),
            cut(&v, width.saturating_sub(10))
        );
    }
    if let Some(u) = &t.upgrade {
        let _ = writeln!(
            out,
            "\nUpgrade:  {} {} -> {} (hop {} -> {}), by {}, {} ago",
            u.state,
            u.from,
            u.target,
            u.hop_from,
            u.hop_to,
            u.requested_by,
            age(u.started_at, now)
        );
        if let Some(why) = &u.reason {
            let _ = writeln!(out, "Reason:   {}", cut(why, width.saturating_sub(10)));
        }
        if let Some(id) = u.restore_id {
            let state = u.restore_state.map_or("unknown", |s| s.as_str());
            let _ = writeln!(
                out,
                "Restore:  {id} {state} (the rollback restored the snapshot before the hop)"
            );
        }
    }
    out.push_str("\nUsage:");
    match &t.usage {
        None => out.push_str(" not sampled yet\n"),
        Some(u) => {
            let at = u
                .sampled_at
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default();
            let _ = writeln!(out, " sampled {} ago ({at})", age(u.sampled_at, now));
            out.push_str(&table(
                &["RESOURCE", "USED", "LIMIT"],
                &crate::usage::cli::usage_rows(&u.used, &u.limits),
                width,
            ));
        }
    }
    out.push_str("\nConditions:\n");
    let rows: Vec<Vec<String>> = t
        .conditions
        .iter()
        .map(|c| {
            vec![
                c.type_.to_string(),
                c.status.to_string(),
                c.reason.to_string(),
                age(c.last_transition_time, now),
                c.message.clone(),
            ]
        })
        .collect();
    out.push_str(&table(
        &["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"],
        &rows,
        width,
    ));
    out
}

/// Follows a tenant while `--wait` polls it: remembers what was already reported so each
/// step is printed once, when it becomes ready.
#[derive(Debug, Default)]
pub struct Progress {
    reported: Vec<ConditionType>,
    phase: Option<Phase>,
}

impl Progress {
    /// Lines to print for a newly polled state (`elapsed` since the wait began).
    pub fn update(&mut self, t: &TenantView, elapsed: std::time::Duration) -> Vec<String> {
        let mut lines = Vec::new();
        if self.phase != Some(t.phase) {
            lines.push(format!(
                "{:>6.1}s  {} is {}",
                elapsed.as_secs_f64(),
                t.name,
                t.phase.as_str()
            ));
            self.phase = Some(t.phase);
        }
        let steps: Vec<_> = t
            .conditions
            .iter()
            .filter(|c| c.type_ != ConditionType::Ready)
            .collect();
        for (i, c) in steps.iter().enumerate() {
            if c.status == ConditionStatus::True && !self.reported.contains(&c.type_) {
                self.reported.push(c.type_);
                lines.push(format!(
                    "{:>6.1}s  [{}/{}] {}",
                    elapsed.as_secs_f64(),
                    i + 1,
                    steps.len(),
                    c.type_
                ));
            }
        }
        lines
    }

    /// What the tenant is waiting on now, if a step says so (shown while nothing changes).
    pub fn waiting_on(t: &TenantView) -> Option<String> {
        t.conditions
            .iter()
            .find(|c| c.type_ != ConditionType::Ready && c.status != ConditionStatus::True)
            .map(|c| {
                if c.message.is_empty() {
                    format!("waiting for {}", c.type_)
                } else {
                    format!("waiting for {}: {}", c.type_, c.message)
                }
            })
    }
}

impl Client {
    /// One tenant, as `GET /v1/tenants/{name}` answers.
    pub async fn tenant(&self, name: &str) -> Result<TenantView> {
        self.get(&format!("/v1/tenants/{}", crate::client::name(name)?))
            .await
    }
}

/// Polls a tenant until `done` says so, printing progress; fails on `Failed` or timeout.
pub async fn follow(
    client: &Client,
    name: &str,
    wait: &WaitArgs,
    done: impl Fn(&TenantView) -> bool,
) -> Result<Option<TenantView>> {
    let start = Instant::now();
    let mut p = Progress::default();
    let mut last_hint = String::new();
    let mut hint_at = Instant::now();
    loop {
        let t = match client.tenant(name).await {
            Ok(t) => t,
            // Gone: what a finished deletion looks like.
            Err(Error::Api { status: 404, .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        for line in p.update(&t, start.elapsed()) {
            progress(&line);
        }
        if done(&t) {
            return Ok(Some(t));
        }
        if t.phase == Phase::Failed {
            let why = t
                .conditions
                .iter()
                .find(|c| c.reason == vcp_core::lifecycle::ConditionReason::Failed)
                .map(|c| format!("{}: {}", c.type_, c.message))
                .unwrap_or_default();
            return Err(Error::Client(format!("tenant {name} failed: {why}")));
        }
        // While nothing changes, say what the tenant waits on every 10 s.
        if let Some(h) = Progress::waiting_on(&t)
            && (h != last_hint || hint_at.elapsed() > Duration::from_secs(10))
            && start.elapsed() > Duration::from_secs(5)
        {
            progress(&format!("{:>6.1}s  {h}", start.elapsed().as_secs_f64()));
            last_hint = h;
            hint_at = Instant::now();
        }
        if start.elapsed() > wait.timeout {
            return Err(Error::Client(format!(
                "tenant {name} is still {} after {}s",
                t.phase.as_str(),
                wait.timeout.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `vcp tenant sleep|wake NAME`
#[derive(Debug, clap::Args)]
pub struct TenantSleep {
    /// Tenant name.
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Asks the tenant to sleep (`to` asleep) or wake, and with `--wait` follows it to `Sleeping`
/// or `Ready`.
async fn ask_sleep(client: &Client, a: TenantSleep, to: Sleep) -> Result<()> {
    let (verb, phase) = match to {
        Sleep::Asleep => ("sleep", Phase::Sleeping),
        Sleep::Awake => ("wake", Phase::Ready),
    };
    let path = format!("/v1/tenants/{}/{verb}", name(&a.name)?);
    let _: Option<TenantView> = client
        .call(reqwest::Method::POST, &path, None::<&()>)
        .await?;
    if !a.wait.wait {
        return print(&format!("tenant {}: asked to {verb}\n", a.name));
    }
    progress(&format!(
        "tenant {}: asked to {verb}; waiting for {phase}",
        a.name
    ));
    // Asleep means no control-plane pod left, which the condition's message says.
    let done = |t: &TenantView| {
        t.phase == phase
            && (to == Sleep::Awake || t.conditions.iter().any(|c| c.message.starts_with("asleep")))
    };
    match follow(client, &a.name, &a.wait, done).await? {
        Some(_) => print(&format!("tenant {} {phase}\n", a.name)),
        None => Err(Error::Client(format!("tenant {} is gone", a.name))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Hard;
    use crate::client::output::fixtures::{at, max_line, used};
    use std::collections::BTreeMap;
    use std::time::Duration;
    use vcp_core::lifecycle::{Condition, ConditionStatus};

    #[test]
    fn backups_are_hourly_and_daily_counts_or_the_plan() {
        let b = |h, d| {
            BackupsArg(Some(BackupPlan {
                hourly: h,
                daily: d,
            }))
        };
        assert_eq!(backups("hourly=24,daily=7"), Ok(b(24, 7)));
        assert_eq!(backups("daily=7"), Ok(b(0, 7)));
        assert_eq!(backups("hourly=0"), Ok(b(0, 0)));
        assert_eq!(backups("plan"), Ok(BackupsArg(None)));
        for bad in [
            "",
            "hourly",
            "hourly=x",
            "weekly=1",
            "hourly=1001",
            "hourly=-1",
        ] {
            assert!(backups(bad).is_err(), "{bad:?}");
        }
    }

    fn cond(t: &str, status: &str, message: &str) -> Condition {
        Condition {
            type_: t.parse().unwrap(),
            status: status.parse().unwrap(),
            reason: if status == "True" { "Ready" } else { "Waiting" }
                .parse()
                .unwrap(),
            message: message.into(),
            last_transition_time: at(0),
        }
    }

    fn tenant(name: &str, owner: &str, conditions: Vec<Condition>) -> TenantView {
        TenantView {
            name: name.into(),
            key: "k".into(),
            owner: owner.into(),
            labels: BTreeMap::new(),
            version: "1.37".into(),
            kubernetes_version: Some("v1.37.1".into()),
            plan: "default".into(),
            phase: Phase::Provisioning,
            conditions,
            endpoint: None,
            generation: 1,
            observed_generation: 1,
            created_at: at(0),
            first_ready_at: None,
            usage: None,
            upgrade: None,
            maintenance_window: None,
            fleet_upgrades: crate::api::FleetUpgrades::Include,
            auto_update: None,
            auto_update_effective: crate::api::AutoUpdate::Off,
            sleep: crate::api::Sleep::Awake,
            active_at: None,
            backups: None,
        }
    }

    #[test]
    fn a_table_of_the_longest_names_fits_80_columns() {
        let long = "a".repeat(40);
        let items = vec![
            tenant(&long, &"o".repeat(40), vec![]),
            tenant("short", "team-a", vec![]),
        ];
        let out = tenants_table(&items, at(90_000), 80);
        assert!(max_line(&out) <= 80, "{out}");
        // Short cells survive; the long ones are cut visibly, the name last.
        assert!(out.contains("short"), "{out}");
        assert!(out.contains(&"a".repeat(30)), "{out}");
        assert!(out.contains('~'), "{out}");
        assert!(out.lines().next().unwrap().starts_with("NAME"));
        // Columns line up: every row's PHASE starts where the header's does.
        let col = out.lines().next().unwrap().find("PHASE").unwrap();
        for l in out.lines().skip(1) {
            assert_eq!(&l[col..col + 5], "Provi", "{out}");
        }
    }

    #[test]
    fn narrow_terminals_and_wide_messages_still_fit() {
        let mut t = tenant(
            "team-a",
            "team-a",
            vec![cond("EtcdReady", "False", &"x".repeat(300))],
        );
        t.labels.insert("team".into(), "a".repeat(63));
        t.labels.insert("b".repeat(200), "x".into());
        t.endpoint = Some(format!("https://{}.example.com:6443", "e".repeat(80)));
        for width in [40, 60, 80, 120] {
            let out = tenant_detail(&t, at(10), width);
            assert!(max_line(&out) <= width, "{width}: {out}");
        }
    }

    #[test]
    fn a_tenant_shows_its_auto_update_setting_and_a_rollbacks_restore() {
        use crate::api::{AutoUpdate, RestoreState, UpgradeState, UpgradeView};
        let mut t = tenant("a", "o", vec![]);
        t.auto_update_effective = AutoUpdate::Patch;
        let auto = |t: &TenantView| {
            tenant_detail(t, at(10), 80)
                .lines()
                .find(|l| l.starts_with("Auto:"))
                .map(|l| l["Auto:".len()..].trim().to_owned())
        };
        assert_eq!(auto(&t).as_deref(), Some("patch (the plan's)"));
        t.auto_update = Some(AutoUpdate::Patch);
        assert_eq!(auto(&t).as_deref(), Some("patch"));
        t.upgrade = Some(UpgradeView {
            id: 3,
            from: "1.36".into(),
            target: "1.37".into(),
            hop_from: "1.36".into(),
            hop_to: "1.37".into(),
            hop_from_release: Some("v1.36.4".into()),
            hop_to_release: Some("v1.37.1".into()),
            state: UpgradeState::RolledBack,
            reason: Some("hop 1.36 -> 1.37 not healthy after 30s".into()),
            restore_id: Some(5),
            restore_state: Some(RestoreState::Succeeded),
            requested_by: "admin".into(),
            started_at: at(0),
            finished_at: Some(at(5)),
        });
        let out = tenant_detail(&t, at(10), 80);
        assert!(out.contains("Restore:  5 Succeeded"), "{out}");
    }

    #[test]
    fn a_tenant_shows_its_latest_usage_against_its_limits() {
        let mut t = tenant("a", "o", vec![cond("EtcdReady", "True", "")]);
        assert!(tenant_detail(&t, at(10), 80).contains("Usage: not sampled yet"));
        t.usage = Some(crate::api::TenantUsage {
            sampled_at: at(0),
            used: used(),
            limits: Hard {
                pods: Some(100),
                requests_cpu: Some(20_000),
                ..Default::default()
            },
        });
        let out = tenant_detail(&t, at(40), 80);
        assert!(
            out.contains("sampled 40s ago (2027-01-15T08:00:00Z)"),
            "{out}"
        );
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("{name} ")))
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .unwrap_or_else(|| panic!("no {name} row: {out}"))
        };
        assert_eq!(line("pods"), ["pods", "3", "100"]);
        assert_eq!(line("requests.cpu"), ["requests.cpu", "300m", "20"]);
        assert_eq!(
            line("limits.memory"),
            ["limits.memory", "1.5Gi", "unlimited"]
        );
        assert!(out.find("Usage:") < out.find("Conditions:"));
    }

    #[test]
    fn progress_reports_each_step_once_in_order() {
        let mut p = Progress::default();
        let mut t = tenant(
            "a",
            "o",
            vec![
                cond("NamespaceReady", "True", ""),
                cond("EtcdReady", "False", "1 of 1 members not ready"),
                cond("Ready", "False", ""),
            ],
        );
        let first = p.update(&t, Duration::from_secs(1));
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(first[0].ends_with("a is Provisioning"));
        assert!(first[1].ends_with("[1/2] NamespaceReady"));
        assert_eq!(
            Progress::waiting_on(&t).as_deref(),
            Some("waiting for EtcdReady: 1 of 1 members not ready")
        );
        assert!(p.update(&t, Duration::from_secs(2)).is_empty());
        t.conditions[1].status = ConditionStatus::True;
        t.phase = Phase::Ready;
        let last = p.update(&t, Duration::from_secs(3));
        assert_eq!(last.len(), 2, "{last:?}");
        assert!(last[0].ends_with("a is Ready"));
        assert!(last[1].ends_with("[2/2] EtcdReady"));
        assert_eq!(steps(&t), "2/2");
    }

    #[test]
    fn structured_output_round_trips() {
        let items = vec![tenant("a", "o", vec![cond("EtcdReady", "True", "")])];
        for f in [Format::Json, Format::Yaml] {
            let s = output::structured(&items, f);
            let back: Vec<TenantView> = match f {
                Format::Json => serde_json::from_str(&s).unwrap(),
                _ => serde_yaml::from_str(&s).unwrap(),
            };
            assert_eq!(back[0].name, "a");
            assert_eq!(back[0].conditions, items[0].conditions);
        }
    }
}
