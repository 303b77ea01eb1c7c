//! Upgrades: one tenant's (`PATCH`) and fleet upgrades (`/v1/upgrades`), requests and views.

use crate::http::schema::{NameSchema, TargetSchema, VersionSchema, present};
use crate::window::{MaintenanceWindow, RawWindow};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;
use vcp_core::lifecycle::{
    AutoUpdate, FleetEntryState, FleetState, FleetUpgrades, RestoreState, UpgradeState,
};

/// One upgrade of a tenant's control plane.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UpgradeView {
    pub id: i64,
    /// The minor the tenant ran when the upgrade started.
    pub from: String,
    /// The minor it should end on.
    pub target: String,
    /// The hop in progress (or the last one): its start is where a rollback returns to.
    /// A patch update is one hop inside a minor (`hop_from` = `hop_to`).
    pub hop_from: String,
    pub hop_to: String,
    /// The releases of that hop: the tenant's when it started, and where it goes (null: the
    /// catalog's release of `hop_to`).
    pub hop_from_release: Option<String>,
    pub hop_to_release: Option<String>,
    pub state: UpgradeState,
    /// Why it was rolled back.
    pub reason: Option<String>,
    /// The restore of the failed hop's etcd snapshot its rollback started, when the old
    /// version may not read what the new one wrote (the hop moved etcd, or the catalog marks
    /// the new minor `storage_change`); null when the rollback only returned to the old images.
    pub restore_id: Option<i64>,
    /// That restore's state: `Succeeded` once the tenant's data is the snapshot's again.
    pub restore_state: Option<RestoreState>,
    /// The token that asked for it, or `fleet-upgrade/<id>` (with why, when the tenant's
    /// version expired and the fleet upgrade moved it without being asked).
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<super::store::UpgradeRow> for UpgradeView {
    fn from(u: super::store::UpgradeRow) -> UpgradeView {
        UpgradeView {
            id: u.id,
            from: u.from_version,
            target: u.target_version,
            hop_from: u.hop_from,
            hop_to: u.hop_to,
            hop_from_release: u.hop_from_release,
            hop_to_release: u.hop_to_release,
            state: u.state,
            reason: u.reason,
            restore_id: u.restore_id,
            restore_state: u.restore_state,
            requested_by: u.requested_by,
            started_at: u.created_at,
            finished_at: u.finished_at,
        }
    }
}

/// `PATCH /v1/tenants/{name}` body: upgrade the tenant's control plane (`version`), change
/// its fleet upgrade settings, or both (a body with neither changes nothing).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpgradeTenant {
    /// Another plan for the tenant (asked alone: no `version` or settings with it). Its quota
    /// must hold the tenant's last usage sample (409 names what does not fit). Sizes, policy
    /// and tuning change in place (200); a plan whose data live in another store (a dedicated
    /// etcd, a shared datastore, another datastore) moves them (202; phase `Restoring` while
    /// the keys are exported, the stores switched and the keys imported; docs/orchestrator.md,
    /// "Changing a tenant's plan"). Changing the members of the tenant's own etcd is refused
    /// (409) for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// The minor (or release) to run: one minor above the tenant's, or more with `chain`.
    /// Absent: no upgrade, only the settings change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<VersionSchema>)]
    pub version: Option<String>,
    /// The tenant's maintenance window for fleet upgrades (UTC); `null` removes it (its
    /// plan's applies again); absent leaves it.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<RawWindow>)]
    pub maintenance_window: Option<Option<MaintenanceWindow>>,
    /// `include` or `exclude` the tenant from fleet upgrades (an `expired` version moves it
    /// regardless); absent leaves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_upgrades: Option<FleetUpgrades>,
    /// `patch` or `off` (automatic patch updates in the maintenance window); `null` removes
    /// the tenant's own setting (its plan's applies again); absent leaves it.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<AutoUpdate>)]
    pub auto_update: Option<Option<AutoUpdate>>,
    /// The tenant's own backup schedule, in place of its plan's `backups` (each 0 to 1000;
    /// `{"hourly": 0, "daily": 0}` takes none); `null` removes it (its plan's applies
    /// again); absent leaves it. Retention follows it at the next sweep.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<crate::backup_store::BackupPlan>)]
    pub backups: Option<Option<crate::backup_store::BackupPlan>>,
    /// Go through every minor between, one hop each, each gated (`1.35` -> `1.37` is two
    /// hops). Without it, a request that skips a minor is refused (rule `one-minor-per-hop`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain: bool,
    /// The target may be a `preview` version.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_preview: bool,
}

/// `POST /v1/upgrades` body: a fleet upgrade.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateFleetUpgrade {
    /// The minor to move tenants to; not `expired`, `preview` only with `allow_preview`.
    #[schema(value_type = TargetSchema)]
    pub target: String,
    /// Which tenants: every part given must match; absent: every tenant below the target.
    /// Tenants on an `expired` version are always included (moved one minor), and tenants
    /// that set `fleet_upgrades: exclude` never are (unless expired).
    #[serde(default)]
    pub selector: FleetSelector,
    /// Tenants more than one minor below the target go through every minor between, one
    /// gated hop each. Without it they are skipped (rule `one-minor-per-hop`), and a request
    /// whose `selector.version` or named tenant needs it is refused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain: bool,
    /// The target may be a `preview` version.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_preview: bool,
    /// Tenants in the first wave, 1 to 1000; each wave after is twice the one before.
    #[serde(
        default = "default_canary",
        deserialize_with = "crate::window::whole_number"
    )]
    #[schema(minimum = 1, maximum = 1000, default = 1)]
    pub canary: u32,
    /// At most this many tenants moving at once, 1 to 1000.
    #[serde(
        default = "default_max_parallel",
        deserialize_with = "crate::window::whole_number"
    )]
    #[schema(minimum = 1, maximum = 1000, default = 10)]
    pub max_parallel: u32,
    /// The fleet upgrade stops (state `Failed`, later waves skipped) when more tenants of
    /// one wave fail than this, 0 to 100000.
    #[serde(default, deserialize_with = "crate::window::whole_number")]
    #[schema(minimum = 0, maximum = 100000, default = 0)]
    pub failure_budget: u32,
    /// Seconds to wait after a wave before the next one starts, 0 to 604800.
    #[serde(
        default = "default_soak",
        deserialize_with = "crate::window::whole_number"
    )]
    #[schema(minimum = 0, maximum = 604800, default = 60)]
    pub soak_seconds: u32,
    /// Start each tenant only inside its maintenance window (its own, else its plan's).
    #[serde(default = "yes")]
    #[schema(default = true)]
    pub respect_maintenance_windows: bool,
}

fn default_canary() -> u32 {
    1
}

fn default_max_parallel() -> u32 {
    10
}

fn default_soak() -> u32 {
    60
}

fn yes() -> bool {
    true
}

/// Which tenants a fleet upgrade is for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetSelector {
    /// A label selector, `key=value` pairs separated by commas (`env=dev,tier=web`): every
    /// pair must be among the tenant's labels.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        example = "env=dev",
        pattern = "^[A-Za-z0-9._/-]{1,253}=[A-Za-z0-9._/-]{0,63}(,[A-Za-z0-9._/-]{1,253}=[A-Za-z0-9._/-]{0,63})*$"
    )]
    pub labels: Option<String>,
    /// Only tenants of these names, at most 1000: every live tenant of a name, whoever owns
    /// it (names are unique per owner only). Each name must exist, and its tenants run a
    /// version below the target that the skew rules allow to move to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<NameSchema>>, max_items = 1000)]
    pub names: Option<Vec<String>>,
    /// Only tenants on this version (the skew rules must allow it to the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<VersionSchema>)]
    pub version: Option<String>,
}

/// Tenants of a fleet upgrade by state, and a rough time left.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FleetProgress {
    pub total: u32,
    pub pending: u32,
    pub running: u32,
    pub succeeded: u32,
    pub failed: u32,
    pub skipped: u32,
    /// Seconds left at the pace so far (mean tenant upgrade time, `max_parallel` at once;
    /// soaks and windows not counted); null before the first tenant is done.
    pub eta_seconds: Option<u64>,
}

/// A fleet upgrade.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FleetUpgradeView {
    pub id: i64,
    pub target: String,
    pub state: FleetState,
    pub selector: FleetSelector,
    pub chain: bool,
    pub canary: u32,
    pub max_parallel: u32,
    pub failure_budget: u32,
    pub soak_seconds: u32,
    pub respect_maintenance_windows: bool,
    /// The wave being started, from 0 (the canary).
    pub current_wave: u32,
    /// How many waves it has.
    pub waves: u32,
    /// Set while soaking after a wave: the next starts no earlier.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub soak_until: Option<OffsetDateTime>,
    /// Why it stopped (the failure budget, a cancel).
    pub reason: Option<String>,
    /// The token that created it.
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
    pub progress: FleetProgress,
}

/// One tenant of a fleet upgrade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FleetTenantView {
    pub name: String,
    /// The tenant's owner: tenant names are unique per owner only, so two entries may share a
    /// name.
    #[serde(default)]
    pub owner: String,
    pub wave: u32,
    pub from: String,
    pub target: String,
    pub state: FleetEntryState,
    /// Its own upgrade (as in `GET /v1/tenants/{name}`), once started.
    pub upgrade_id: Option<i64>,
    pub upgrade_state: Option<UpgradeState>,
    /// Why it is included although no selector chose it (its version expired).
    pub forced: Option<String>,
    /// Why it failed (its rollback's reason) or was skipped; while pending, why it waits (its
    /// maintenance window is closed, and when it opens).
    pub reason: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

/// `GET /v1/upgrades/{id}` answer: a fleet upgrade with its tenants.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FleetUpgradeDetail {
    #[serde(flatten)]
    pub upgrade: FleetUpgradeView,
    /// Every tenant, in plan order (wave by wave).
    pub tenants: Vec<FleetTenantView>,
    /// The tenants that failed, with their reasons (also in `tenants`).
    pub failures: Vec<FleetTenantView>,
}

/// `GET /v1/upgrades` answer, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FleetUpgradeList {
    pub items: Vec<FleetUpgradeView>,
}

/// `POST /v1/upgrades/{id}/pause|resume|cancel` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FleetUpgradeAction {
    /// Why, for the audit trail (and, for a cancel, the fleet upgrade's reason); up to 200
    /// characters, no NUL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 200, pattern = "^[^\\u0000]*$")]
    pub reason: Option<String>,
}
