//! `vcp tenant ...`: create, list, show, update, delete, usage and rotations of tenants.

use super::client::{Client, Connection, name, segment};
use super::instant;
use super::output::{self, Format};
use super::upgrades::TenantUpgrade;
use super::{OutputArgs, WaitArgs, follow, labels, now, print, progress, window};
use crate::api::{
    AutoUpdate, CreateTenant, FleetUpgrades, KubeconfigList, MaintenanceWindow, Phase,
    RotateTenant, RotationList, RotationTarget, RotationView, TenantList, TenantView, UpgradeState,
    UpgradeTenant, UsageSamples,
};
use crate::{Error, Result};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

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
    Usage(TenantUsageArgs),
    /// Upgrade a tenant's control plane to another minor (and with --wait, follow it until
    /// it is done or rolled back).
    Upgrade(TenantUpgrade),
    /// Change a tenant's fleet upgrade settings: its maintenance window, whether fleet
    /// upgrades may move it.
    Update(TenantUpdate),
    /// Rotate one of a tenant's CAs or its service-account key without downtime (admins; and
    /// with --wait, follow its phases until done).
    Rotate(TenantRotate),
    /// List a tenant's rotations, newest first, with the kubeconfigs a CA rotation ends.
    Rotations {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `vcp tenant rotate NAME --target ...`
#[derive(Debug, clap::Args)]
pub struct TenantRotate {
    /// Tenant name.
    pub name: String,
    /// What to rotate.
    #[arg(long, env = "VCP_ROTATE_TARGET", value_enum)]
    pub target: RotateTargetArg,
    /// How long phase `sign` lasts at least (e.g. 0s, 90m, 12h; a longer one than 30d is cut to 30d): for `ca`, the
    /// time users have to fetch new kubeconfigs. Default: the server's per target.
    #[arg(long, env = "VCP_ROTATE_OVERLAP")]
    pub overlap: Option<String>,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--target` of `vcp tenant rotate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RotateTargetArg {
    Ca,
    EtcdCa,
    FrontProxyCa,
    ServiceAccountKey,
}

impl From<RotateTargetArg> for RotationTarget {
    fn from(t: RotateTargetArg) -> RotationTarget {
        use crate::pki::rotation::Target;
        match t {
            RotateTargetArg::Ca => Target::Ca,
            RotateTargetArg::EtcdCa => Target::EtcdCa,
            RotateTargetArg::FrontProxyCa => Target::FrontProxyCa,
            RotateTargetArg::ServiceAccountKey => Target::ServiceAccountKey,
        }
        .into()
    }
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
    #[command(flatten)]
    pub output: OutputArgs,
}

#[derive(Debug, clap::Args)]
pub struct TenantUsageArgs {
    /// Tenant name.
    pub name: String,
    /// Start of the range, inclusive: an RFC 3339 time (2026-01-01T00:00:00Z) or an age
    /// (90m, 12h, 30d ago); default: 24 hours before --until.
    #[arg(long, env = "VCP_USAGE_SINCE")]
    pub since: Option<String>,
    /// End of the range, exclusive: an RFC 3339 time or an age; default now.
    #[arg(long, env = "VCP_USAGE_UNTIL")]
    pub until: Option<String>,
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
                Format::Table => print(&output::tenants_table(&[t], now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::List(o) => {
            let list: TenantList = client.get("/v1/tenants").await?;
            match o.output {
                Format::Table => print(&output::tenants_table(&list.items, now(), width)),
                f => print(&output::structured(&list, f)),
            }
        }
        TenantCommand::Get { name, output: o } => {
            let t = client.tenant(&name).await?;
            match o.output {
                Format::Table => print(&output::tenant_detail(&t, now(), width)),
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
                Format::Table => print(&output::tenants_table(&[t], now(), width)),
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
                ..Default::default()
            };
            let path = format!("/v1/tenants/{}", name(&a.name)?);
            let t: TenantView = client
                .call(reqwest::Method::PATCH, &path, Some(&req))
                .await?
                .ok_or_else(|| Error::Client(format!("empty answer from {path}")))?;
            match a.output.output {
                Format::Table => print(&output::tenant_detail(&t, now(), width)),
                f => print(&output::structured(&t, f)),
            }
        }
        TenantCommand::Usage(a) => {
            let samples = usage_samples(&client, &a, now()).await?;
            match a.output.output {
                Format::Table => print(&output::usage_table(&samples, width)),
                f => print(&output::structured(&samples, f)),
            }
        }
        TenantCommand::Kubeconfigs { name, output: o } => {
            let list: KubeconfigList = client
                .get(&format!("/v1/tenants/{}/kubeconfigs", self::name(&name)?))
                .await?;
            match o.output {
                Format::Table => print(&output::kubeconfigs_table(&list.items, now(), width)),
                f => print(&output::structured(&list, f)),
            }
        }
        TenantCommand::Rotate(a) => {
            let seg = self::name(&a.name)?;
            let req = RotateTenant {
                target: a.target.into(),
                overlap: a.overlap.clone(),
            };
            let mut r: RotationView = client
                .post(&format!("/v1/tenants/{seg}/rotate"), &req)
                .await?;
            let start = Instant::now();
            let mut shown = String::new();
            while a.wait.wait && r.finished_at.is_none() {
                if r.phase != shown {
                    eprintln!("rotation {} of {}: phase {}", r.id, a.name, r.phase);
                    shown = r.phase.clone();
                }
                if start.elapsed() > a.wait.timeout {
                    return Err(Error::Client(format!(
                        "rotation {} of {} still in phase {} after {:?}",
                        r.id, a.name, r.phase, a.wait.timeout
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let l: RotationList = client.get(&format!("/v1/tenants/{seg}/rotations")).await?;
                if let Some(x) = l.items.into_iter().find(|x| x.id == r.id) {
                    r = x;
                }
            }
            match a.output.output {
                Format::Table => print(&output::rotations_table(&[r], now(), width)),
                f => print(&output::structured(&r, f)),
            }
        }
        TenantCommand::Rotations { name, output: o } => {
            let l: RotationList = client
                .get(&format!("/v1/tenants/{}/rotations", self::name(&name)?))
                .await?;
            match o.output {
                Format::Table => print(&output::rotations_table(&l.items, now(), width)),
                f => print(&output::structured(&l, f)),
            }
        }
    }
}

/// Every sample in the range, following `next_since` page by page.
async fn usage_samples(
    client: &Client,
    a: &TenantUsageArgs,
    now: OffsetDateTime,
) -> Result<UsageSamples> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    let format = |t: OffsetDateTime| {
        t.format(rfc3339)
            .map_err(|e| Error::Client(format!("cannot format {t}: {e}")))
    };
    let mut query = String::new();
    let mut until = a
        .until
        .as_deref()
        .map(|v| instant("--until", v, now))
        .transpose()?;
    let mut since = a
        .since
        .as_deref()
        .map(|v| instant("--since", v, now))
        .transpose()?;
    let mut all: Option<UsageSamples> = None;
    loop {
        query.clear();
        for (k, v) in [("since", &since), ("until", &until)] {
            if let Some(v) = v {
                query.push(if query.is_empty() { '?' } else { '&' });
                query.push_str(&format!("{k}={}", segment(v)));
            }
        }
        let page: UsageSamples = client
            .get(&format!("/v1/tenants/{}/usage{query}", name(&a.name)?))
            .await?;
        let next = page.next_since;
        // The first answer fixed the range (a default `until` is the server's now): later
        // pages keep its end.
        until = Some(format(page.until)?);
        match &mut all {
            None => all = Some(page),
            Some(all) => {
                all.items.extend(page.items);
                all.limits = page.limits;
            }
        }
        let Some(next) = next else { break };
        since = Some(format(next)?);
    }
    let mut all = all.ok_or_else(|| Error::Client("no answer".into()))?;
    all.next_since = None;
    Ok(all)
}
