//! The client commands of `vcp` (`tenant`, `upgrade`, `kubeconfig`, `token`, `audit`, `version`): thin callers of
//! the platform API. They read the server from `VCP_API_URL` and the bearer token from
//! `VCP_TOKEN`, decode answers into the same types the server encodes ([`crate::api`]), and
//! print them with [`output`]. API problems come back as [`Error::Api`] with the server's
//! detail and field.

pub mod output;

use crate::api::{
    AuditPage, AutoUpdate, CreateFleetUpgrade, CreateTenant, CreateToken, FleetSelector,
    FleetState, FleetUpgradeAction, FleetUpgradeDetail, FleetUpgradeList, FleetUpgrades,
    IssueKubeconfig, KubeconfigIssued, KubeconfigList, KubeconfigView, MaintenanceWindow, Phase,
    ProblemBody, RestoreState, RestoreTenant, RestoreView, Role, RotateTenant, RotationList,
    RotationTarget, RotationView, SnapshotList, SnapshotState, SnapshotView, TenantList,
    TenantView, TokenCreated, TokenList, UpgradeState, UpgradeTenant, UsageSamples, VersionList,
};
use crate::{Error, Result};
use output::Format;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// Where the API is and who calls it.
#[derive(Clone, clap::Args)]
pub struct Connection {
    /// Base URL of the platform API.
    #[arg(
        long,
        env = "VCP_API_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub api_url: String,
    /// Bearer token (admin or owner).
    #[arg(long, env = "VCP_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// For commands that name a tenant: whose tenant of that name (a token name). Tenant
    /// names are unique per owner, so an admin needs it when several owners have a tenant of
    /// the name; an owner sees only its own tenants.
    #[arg(long, env = "VCP_OWNER", global = true)]
    pub owner: Option<String>,
}

impl std::fmt::Debug for Connection {
    // The token is a bearer secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("api_url", &self.api_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("owner", &self.owner)
            .finish()
    }
}

/// Output format flag shared by the listing commands.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "VCP_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Format,
}

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

fn window(s: &str) -> Result<MaintenanceWindow, String> {
    s.parse()
        .map_err(|e: crate::window::WindowError| e.to_string())
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
pub struct AuditArgs {
    /// Only entries of tenants with this name.
    #[arg(long, env = "VCP_AUDIT_TENANT")]
    pub tenant: Option<String>,
    /// Only changes made by this actor (a token's name, or `reconciler/<replica>`, ...).
    #[arg(long, env = "VCP_AUDIT_ACTOR")]
    pub actor: Option<String>,
    /// Only this action (tenant.create), or every action under a prefix ending in a dot
    /// (tenant.).
    #[arg(long, env = "VCP_AUDIT_ACTION")]
    pub action: Option<String>,
    /// Entries at or after: an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d).
    #[arg(long, env = "VCP_AUDIT_SINCE")]
    pub since: Option<String>,
    /// Entries before: an RFC 3339 time or an age.
    #[arg(long, env = "VCP_AUDIT_UNTIL")]
    pub until: Option<String>,
    /// Most entries printed, oldest first; 0 for all of them.
    #[arg(long, env = "VCP_AUDIT_LIMIT", default_value_t = 1000)]
    pub limit: usize,
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

#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Wait until done, showing progress on stderr.
    #[arg(long, env = "VCP_WAIT")]
    pub wait: bool,
    /// Give up waiting after this long (e.g. 90s, 10m).
    #[arg(long, env = "VCP_WAIT_TIMEOUT", default_value = "10m", value_parser = duration)]
    pub timeout: Duration,
}

/// `vcp kubeconfig NAME ...`
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// Tenant name.
    #[arg(required = true)]
    pub name: Option<String>,
    /// User name in the certificate (CN).
    #[arg(long, env = "VCP_KUBECONFIG_USER", required = true)]
    pub user: Option<String>,
    /// Group (O); repeatable. view, edit and admin are bound in every tenant.
    #[arg(long = "group", env = "VCP_KUBECONFIG_GROUPS", value_delimiter = ',')]
    pub groups: Vec<String>,
    /// Lifetime such as 90m, 12h or 7d; the server's default is 8h, and it caps it (a week
    /// unless configured).
    #[arg(long, env = "VCP_KUBECONFIG_TTL")]
    pub ttl: Option<String>,
    /// Write the kubeconfig here (mode 0600); `-` prints it.
    #[arg(
        short = 'o',
        long = "output",
        env = "VCP_KUBECONFIG_OUTPUT",
        default_value = "-"
    )]
    pub output: PathBuf,
}

/// `vcp kubeconfig revoke ...`
#[derive(Debug, clap::Subcommand)]
pub enum KubeconfigCommand {
    /// Revoke one kubeconfig by its certificate serial (`vcp tenant kubeconfigs` lists them):
    /// the tenant apiserver refuses it within 60 s.
    Revoke {
        /// Tenant name.
        tenant: String,
        /// The certificate serial (hex).
        serial: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Issue a break-glass kubeconfig (admins only): `system:masters` for at most an hour,
    /// for when vcp or the tenant's syncer is down; it cannot be revoked, and is audited.
    BreakGlass {
        /// Tenant name.
        tenant: String,
        /// Why, for the audit trail.
        #[arg(long, env = "VCP_BREAK_GLASS_REASON")]
        reason: String,
        /// Lifetime such as 15m (at most 1h; default 30m).
        #[arg(long, env = "VCP_BREAK_GLASS_TTL")]
        ttl: Option<String>,
        /// Write the kubeconfig here (mode 0600); `-` prints it.
        #[arg(
            short = 'o',
            long = "output",
            env = "VCP_KUBECONFIG_OUTPUT",
            default_value = "-"
        )]
        output: PathBuf,
    },
}

/// `vcp user ...`
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Revoke every kubeconfig issued to a user in a tenant: the tenant apiserver refuses
    /// each within 60 s.
    Revoke {
        /// Tenant name.
        tenant: String,
        /// The user (certificate CN).
        user: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `vcp token ...`
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create a token (admins only); its secret is printed once.
    Create {
        /// Token name: lowercase letters, digits and '-'.
        name: String,
        /// admin or owner.
        #[arg(long, env = "VCP_TOKEN_ROLE", value_enum, default_value = "owner")]
        role: RoleArg,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List tokens without their secrets (admins only).
    List(OutputArgs),
    /// Revoke a token (admins only).
    Revoke {
        /// Token name.
        name: String,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    Admin,
    Owner,
}

/// `vcp version ...`
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Take an etcd snapshot of a tenant (and with --wait, until it is taken).
    Create {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List a tenant's snapshots and restores.
    List {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Restore a tenant's etcd from one of its snapshots (admins; and with --wait, until the
    /// tenant is Ready again).
    Restore {
        /// Tenant name.
        name: String,
        /// The snapshot's id (`vcp snapshot list`).
        #[arg(long, env = "VCP_SNAPSHOT")]
        snapshot: i64,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `vcp version ...`
#[derive(Debug, clap::Subcommand)]
pub enum VersionCommand {
    /// Kubernetes versions tenants can run.
    List(OutputArgs),
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::api::parse_ttl(s).ok_or_else(|| format!("{s:?} is not a duration like 90s, 10m or 1h"))
}

/// A client of the platform API.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    /// `--owner`, checked: added to every request about one tenant ([`with_owner`]).
    owner: Option<String>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(c: &Connection) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|source| Error::Http {
                url: c.api_url.clone(),
                source,
            })?;
        let token = c
            .token
            .clone()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| Error::Client("no token: set VCP_TOKEN or pass --token".into()))?;
        let owner = c.owner.as_deref().map(name).transpose()?;
        Ok(Client {
            base: c.api_url.trim_end_matches('/').to_owned(),
            token,
            owner,
            http,
        })
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Option<T>> {
        let url = format!("{}{}", self.base, with_owner(path, self.owner.as_deref()));
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            req = req.json(b);
        }
        let http = |source| Error::Http {
            url: url.clone(),
            source,
        };
        let resp = req.send().await.map_err(http)?;
        let status = resp.status();
        let text = resp.text().await.map_err(http)?;
        if status.is_success() {
            if status == reqwest::StatusCode::NO_CONTENT || text.is_empty() {
                return Ok(None);
            }
            return serde_json::from_str(&text)
                .map(Some)
                .map_err(|source| Error::Answer { url, source });
        }
        Err(match serde_json::from_str::<ProblemBody>(&text) {
            Ok(p) => Error::Api {
                status: p.status,
                detail: p.detail,
                field: p.field,
            },
            Err(_) => Error::Api {
                status: status.as_u16(),
                detail: text.chars().take(200).collect(),
                field: None,
            },
        })
    }

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(reqwest::Method::GET, path, None::<&()>)
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    async fn post<T: DeserializeOwned>(&self, path: &str, body: &impl Serialize) -> Result<T> {
        self.call(reqwest::Method::POST, path, Some(body))
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    /// This client for the tenants of `owner` (a name the server gave).
    fn owned_by(&self, owner: &str) -> Client {
        Client {
            owner: Some(segment(owner)),
            ..self.clone()
        }
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantView> {
        self.get(&format!("/v1/tenants/{}", self::name(name)?))
            .await
    }
}

/// A tenant or token name checked before it goes into a URL: the server would refuse a bad
/// one anyway, but a name like `..` must never become a different path.
fn name(name: &str) -> Result<String> {
    crate::names::TenantName::parse(name)
        .map(|_| segment(name))
        .map_err(|e| Error::Client(format!("{name:?}: {e}")))
}

/// `path` with `owner=` added when it is about one tenant (`/v1/tenants/<name>...`): in one
/// place, so every command that names a tenant (and every `--wait` that polls one) means the
/// same owner's. `owner` is already a checked, escaped name.
fn with_owner(path: &str, owner: Option<&str>) -> String {
    let one_tenant = path
        .strip_prefix("/v1/tenants/")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('?'));
    match owner {
        Some(o) if one_tenant => {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!("{path}{sep}owner={o}")
        }
        _ => path.to_owned(),
    }
}

/// A name as one URL path segment: anything outside the name alphabet is escaped.
fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn print(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Client(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

fn progress(line: &str) {
    eprintln!("{line}");
}

fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

fn labels(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::Client(format!("--label {p:?}: expected KEY=VALUE"))),
        })
        .collect()
}

/// Polls a tenant until `done` says so, printing progress; fails on `Failed` or timeout.
async fn follow(
    client: &Client,
    name: &str,
    wait: &WaitArgs,
    done: impl Fn(&TenantView) -> bool,
) -> Result<Option<TenantView>> {
    let start = Instant::now();
    let mut p = output::Progress::default();
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
        if let Some(h) = output::Progress::waiting_on(&t)
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

/// A `--since`/`--until` value as the API takes it: an RFC 3339 time as given, or an age
/// (`12h`) as the time that long before `now`.
fn instant(flag: &str, v: &str, now: OffsetDateTime) -> Result<String> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    if OffsetDateTime::parse(v, rfc3339).is_ok() {
        return Ok(v.to_owned());
    }
    crate::api::parse_ttl(v)
        .and_then(|d| time::Duration::try_from(d).ok())
        .and_then(|d| now.checked_sub(d))
        .and_then(|t| t.format(rfc3339).ok())
        .ok_or_else(|| {
            Error::Client(format!(
                "{flag} {v:?}: expected an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d)"
            ))
        })
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

pub async fn kubeconfig(conn: &Connection, a: KubeconfigArgs) -> Result<()> {
    let client = Client::new(conn)?;
    // clap requires both unless a subcommand is given.
    let (Some(tenant), Some(user)) = (a.name, a.user) else {
        return Err(Error::Client(
            "a tenant name and --user are required".into(),
        ));
    };
    let req = IssueKubeconfig {
        user,
        groups: a.groups,
        ttl: a.ttl,
    };
    let issued: KubeconfigIssued = client
        .post(&format!("/v1/tenants/{}/kubeconfigs", name(&tenant)?), &req)
        .await?;
    save_kubeconfig(&issued, &a.output)
}

/// Prints an issued kubeconfig (`-`) or writes it to a file only its owner reads, saying so.
fn save_kubeconfig(issued: &KubeconfigIssued, output: &std::path::Path) -> Result<()> {
    if output.as_os_str() == "-" {
        return print(&issued.kubeconfig);
    }
    write_private(output, issued.kubeconfig.as_bytes())?;
    let expires = issued
        .expires_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    progress(&format!(
        "wrote {} (user {}, groups {}, expires {expires}, serial {})",
        output.display(),
        issued.user,
        if issued.groups.is_empty() {
            "-".to_owned()
        } else {
            issued.groups.join(",")
        },
        issued.serial
    ));
    Ok(())
}

/// Prints revoked kubeconfigs: a line each in a table, or the API's answer.
fn print_revoked(
    items: &[KubeconfigView],
    answer: &impl serde::Serialize,
    f: Format,
) -> Result<()> {
    match f {
        Format::Table => {
            let mut out = String::new();
            for k in items {
                out.push_str(&format!(
                    "revoked kubeconfig {} of user {} (the tenant refuses it within 60s)\n",
                    k.serial, k.user
                ));
            }
            print(&out)
        }
        f => print(&output::structured(answer, f)),
    }
}

/// `vcp kubeconfig revoke ...`
pub async fn kubeconfig_command(conn: &Connection, action: KubeconfigCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match action {
        KubeconfigCommand::Revoke {
            tenant,
            serial,
            output: o,
        } => {
            let view: Option<KubeconfigView> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!(
                        "/v1/tenants/{}/kubeconfigs/{}",
                        name(&tenant)?,
                        segment(&serial)
                    ),
                    None::<&()>,
                )
                .await?;
            let view = view.ok_or_else(|| Error::Client("no answer".into()))?;
            print_revoked(std::slice::from_ref(&view), &view, o.output)
        }
        KubeconfigCommand::BreakGlass {
            tenant,
            reason,
            ttl,
            output,
        } => {
            let issued: KubeconfigIssued = client
                .post(
                    &format!("/v1/tenants/{}/break-glass", name(&tenant)?),
                    &crate::api::BreakGlassRequest { reason, ttl },
                )
                .await?;
            save_kubeconfig(&issued, &output)
        }
    }
}

/// `vcp user ...`
pub async fn user(conn: &Connection, action: UserCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match action {
        UserCommand::Revoke {
            tenant,
            user,
            output: o,
        } => {
            let list: Option<KubeconfigList> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/tenants/{}/users/{}", name(&tenant)?, segment(&user)),
                    None::<&()>,
                )
                .await?;
            let list = list.ok_or_else(|| Error::Client("no answer".into()))?;
            print_revoked(&list.items, &list, o.output)
        }
    }
}

/// Writes a file only its owner can read: it holds a private key.
fn write_private(path: &std::path::Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // An existing file keeps its mode on open; tighten it too.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io)?;
    f.write_all(data).map_err(io)
}

pub async fn token(conn: &Connection, cmd: TokenCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match cmd {
        TokenCommand::Create { name, role, output } => {
            let role = match role {
                RoleArg::Admin => Role::Admin,
                RoleArg::Owner => Role::Owner,
            };
            let t: TokenCreated = client
                .post("/v1/tokens", &CreateToken { name, role })
                .await?;
            match output.output {
                Format::Table => {
                    progress(&format!(
                        "token {} ({}) created; its secret is shown this once:",
                        t.name,
                        t.role.as_str()
                    ));
                    print(&format!("{}\n", t.token))
                }
                f => print(&output::structured(&t, f)),
            }
        }
        TokenCommand::List(o) => {
            let list: TokenList = client.get("/v1/tokens").await?;
            match o.output {
                Format::Table => print(&output::tokens_table(
                    &list.items,
                    now(),
                    output::terminal_width(),
                )),
                f => print(&output::structured(&list, f)),
            }
        }
        TokenCommand::Revoke { name } => {
            let _: Option<()> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/tokens/{}", self::name(&name)?),
                    None::<&()>,
                )
                .await?;
            print(&format!("token {name} revoked\n"))
        }
    }
}

/// `vcp snapshot ...`
pub async fn snapshot(conn: &Connection, cmd: SnapshotCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let now = OffsetDateTime::now_utc();
    let width = output::terminal_width();
    match cmd {
        SnapshotCommand::Create {
            name: n,
            wait,
            output: o,
        } => {
            let path = format!("/v1/tenants/{}/snapshots", name(&n)?);
            let mut s: SnapshotView = client.post(&path, &serde_json::json!({})).await?;
            let start = Instant::now();
            while wait.wait && s.state == SnapshotState::Pending {
                if start.elapsed() > wait.timeout {
                    return Err(Error::Client(format!(
                        "snapshot {} of {n} still Pending after {:?}",
                        s.id, wait.timeout
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let l: SnapshotList = client.get(&path).await?;
                if let Some(x) = l.snapshots.into_iter().find(|x| x.id == s.id) {
                    s = x;
                }
            }
            if s.state == SnapshotState::Failed {
                return Err(Error::Client(format!(
                    "snapshot {} of {n} failed: {}",
                    s.id,
                    s.reason.unwrap_or_default()
                )));
            }
            match o.output {
                Format::Table => print(&output::snapshots_table(&[s], &[], now, width)),
                f => print(&output::structured(&s, f)),
            }
        }
        SnapshotCommand::List { name: n, output: o } => {
            let l: SnapshotList = client
                .get(&format!("/v1/tenants/{}/snapshots", name(&n)?))
                .await?;
            match o.output {
                Format::Table => print(&output::snapshots_table(
                    &l.snapshots,
                    &l.restores,
                    now,
                    width,
                )),
                f => print(&output::structured(&l, f)),
            }
        }
        SnapshotCommand::Restore {
            name: n,
            snapshot,
            wait,
            output: o,
        } => {
            let seg = name(&n)?;
            let r: RestoreView = client
                .post(
                    &format!("/v1/tenants/{seg}/restore"),
                    &RestoreTenant { snapshot },
                )
                .await?;
            let mut r = r;
            let start = Instant::now();
            while wait.wait && r.state == RestoreState::Running {
                if start.elapsed() > wait.timeout {
                    return Err(Error::Client(format!(
                        "restore {} of {n} still running after {:?}",
                        r.id, wait.timeout
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let l: SnapshotList = client.get(&format!("/v1/tenants/{seg}/snapshots")).await?;
                if let Some(x) = l.restores.into_iter().find(|x| x.id == r.id) {
                    r = x;
                }
            }
            if r.state == RestoreState::Failed {
                return Err(Error::Client(format!(
                    "restore {} of {n} failed: {}",
                    r.id,
                    r.reason.unwrap_or_default()
                )));
            }
            match o.output {
                Format::Table => print(&output::snapshots_table(&[], &[r], now, width)),
                f => print(&output::structured(&r, f)),
            }
        }
    }
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

/// The entries `a` asks for, oldest first, following `next_after` page by page.
async fn audit_entries(client: &Client, a: &AuditArgs, now: OffsetDateTime) -> Result<AuditPage> {
    let mut fixed = Vec::new();
    for (k, v) in [
        ("tenant", a.tenant.clone()),
        ("actor", a.actor.clone()),
        ("action", a.action.clone()),
        (
            "since",
            a.since
                .as_deref()
                .map(|v| instant("--since", v, now))
                .transpose()?,
        ),
        (
            "until",
            a.until
                .as_deref()
                .map(|v| instant("--until", v, now))
                .transpose()?,
        ),
    ] {
        if let Some(v) = v {
            fixed.push(format!("{k}={}", segment(&v)));
        }
    }
    let mut all = AuditPage {
        items: Vec::new(),
        next_after: None,
    };
    let mut after = 0;
    loop {
        let left = if a.limit == 0 {
            crate::api::MAX_AUDIT_PAGE as usize
        } else {
            a.limit - all.items.len()
        };
        let page_size = left.min(crate::api::MAX_AUDIT_PAGE as usize);
        let mut query = fixed.clone();
        query.push(format!("after={after}"));
        query.push(format!("limit={page_size}"));
        let page: AuditPage = client
            .get(&format!("/v1/audit?{}", query.join("&")))
            .await?;
        all.items.extend(page.items);
        all.next_after = page.next_after;
        match page.next_after {
            Some(next) if a.limit == 0 || all.items.len() < a.limit => after = next,
            _ => break,
        }
    }
    Ok(all)
}

pub async fn audit(conn: &Connection, a: AuditArgs) -> Result<()> {
    let client = Client::new(conn)?;
    let page = audit_entries(&client, &a, now()).await?;
    match a.output.output {
        Format::Table => {
            print(&output::audit_table(&page.items, output::terminal_width()))?;
            if page.next_after.is_some() {
                eprintln!(
                    "(more entries follow: raise --limit, or 0 for all, or narrow the filters)"
                );
            }
            Ok(())
        }
        f => print(&output::structured(&page, f)),
    }
}

pub async fn version(conn: &Connection, cmd: VersionCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let VersionCommand::List(o) = cmd;
    let v: VersionList = client.get("/v1/versions").await?;
    match o.output {
        Format::Table => print(&output::versions_table(&v, output::terminal_width())),
        f => print(&output::structured(&v, f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_one_path_segment() {
        assert_eq!(segment("team-a"), "team-a");
        assert_eq!(segment("../tokens"), "%2E%2E%2Ftokens");
        assert!(name("..").is_err());
        assert_eq!(name("team-a").unwrap(), "team-a");
        assert_eq!(segment("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn usage_range_flags_take_rfc3339_times_or_ages() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        assert_eq!(
            instant("--since", "2026-01-01T00:00:00+02:00", now).unwrap(),
            "2026-01-01T00:00:00+02:00",
            "a time goes to the server as given"
        );
        assert_eq!(
            instant("--since", "12h", now).unwrap(),
            "2027-01-14T20:00:00Z"
        );
        for bad in ["yesterday", "2026-01-01", "-1h", ""] {
            let e = instant("--until", bad, now).unwrap_err().to_string();
            assert!(e.starts_with("--until"), "{bad}: {e}");
        }
        // `+` in an offset must survive the query string.
        assert_eq!(
            segment("2026-01-01T00:00:00+02:00"),
            "2026-01-01T00%3A00%3A00%2B02%3A00"
        );
    }

    #[test]
    fn owner_goes_with_every_request_about_one_tenant() {
        let o = Some("team-b");
        assert_eq!(with_owner("/v1/tenants/a", o), "/v1/tenants/a?owner=team-b");
        assert_eq!(
            with_owner("/v1/tenants/a?retain_data=true", o),
            "/v1/tenants/a?retain_data=true&owner=team-b"
        );
        assert_eq!(
            with_owner("/v1/tenants/a/kubeconfigs/0f", o),
            "/v1/tenants/a/kubeconfigs/0f?owner=team-b"
        );
        // Not about one tenant: the list, creating one, tokens, the fleet.
        for p in [
            "/v1/tenants",
            "/v1/tenants/",
            "/v1/tokens/a",
            "/v1/fleet-upgrades",
        ] {
            assert_eq!(with_owner(p, o), p);
        }
        assert_eq!(with_owner("/v1/tenants/a", None), "/v1/tenants/a");
    }

    #[test]
    fn labels_parse_as_key_value() {
        let l = labels(&["team=a".into(), "tier=".into()]).unwrap();
        assert_eq!(l["team"], "a");
        assert_eq!(l["tier"], "");
        assert!(labels(&["=x".into()]).is_err());
        assert!(labels(&["novalue".into()]).is_err());
    }
}
