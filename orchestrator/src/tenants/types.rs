//! Tenants: the create body, the view the API returns, its list, usage and delete query.

use crate::http::schema::{LabelsSchema, NameSchema, PlanSchema, VersionSchema};
use crate::inventory::Tenant;
use crate::upgrades::types::UpgradeView;
use crate::window::{MaintenanceWindow, RawWindow};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use vcp_core::lifecycle::{AutoUpdate, Condition, FleetUpgrades, Phase, Sleep};
use vcp_policy::quota::{Hard, Usage};

/// `POST /v1/tenants` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// Unique among live tenants.
    #[schema(value_type = NameSchema)]
    pub name: String,
    /// The default minor when absent or null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<VersionSchema>)]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schema(value_type = LabelsSchema)]
    pub labels: BTreeMap<String, String>,
    /// `default` when absent or null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<PlanSchema>)]
    pub plan: Option<String>,
    /// Required to create a tenant on a `preview` version (`GET /v1/versions` says which).
    /// `expired` versions take no new tenants at all.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_preview: bool,
    /// When fleet upgrades may start this tenant (UTC); absent or null: its plan's window, or
    /// any time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<RawWindow>)]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// `include` (the default): fleet upgrades whose selector matches may move the tenant;
    /// `exclude`: only an `expired` version moves it (one minor per fleet upgrade).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_upgrades: Option<FleetUpgrades>,
    /// `patch`: in its maintenance window, move the tenant to the newest `supported` or
    /// `deprecated` release of its minor (through an upgrade: snapshot, gates, rollback);
    /// `off`: never. Absent or null: its plan's setting (off when the plan has none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_update: Option<AutoUpdate>,
    /// A clone: `TENANT/N`, snapshot `N` of a tenant (a live one's name among the caller's, or
    /// any tenant's key, a deleted one's too; an admin may name any owner's), which must be
    /// `Succeeded`, uploaded to the backup store (an `s3://` location) and not pruned. The new
    /// tenant comes up with that snapshot's data, restored before it is `Ready`; its version
    /// is the snapshot's (absent `version`, or the same).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(
        pattern = r"^[a-z]([a-z0-9-]{0,38}[a-z0-9])?/[1-9][0-9]{0,18}$",
        max_length = 60,
        example = "shop/3"
    )]
    pub from_snapshot: Option<String>,
}

/// A tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub name: String,
    /// Short immutable key: host names of the tenant's objects start with it.
    pub key: String,
    /// The token that created the tenant.
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    /// The Kubernetes minor (`1.37`).
    pub version: String,
    /// The exact Kubernetes release of that minor (`v1.37.1`).
    pub kubernetes_version: Option<String>,
    pub plan: String,
    pub phase: Phase,
    /// One condition per provisioning step, in order, then `Ready`.
    pub conditions: Vec<Condition>,
    /// `https://host:port` of the tenant apiserver once exposed.
    pub endpoint: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    /// When vcp first found every step ready; null until then. From then on kubeconfigs are
    /// issued in every phase but `Deleting`.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub first_ready_at: Option<OffsetDateTime>,
    /// The latest usage sample against the plan's quota; null before the first sample (vcp
    /// samples Ready tenants every `--usage-interval-seconds`).
    pub usage: Option<TenantUsage>,
    /// The tenant's latest upgrade, moving or finished; null if it never had one.
    pub upgrade: Option<UpgradeView>,
    /// The tenant's own maintenance window (null: its plan's, or any time).
    #[schema(value_type = Option<RawWindow>)]
    pub maintenance_window: Option<MaintenanceWindow>,
    /// Whether fleet upgrades may move it (`exclude`: only off an expired version).
    pub fleet_upgrades: FleetUpgrades,
    /// The tenant's own automatic update setting; null: its plan's.
    pub auto_update: Option<AutoUpdate>,
    /// The setting in effect: the tenant's own, else its plan's, else `off`.
    pub auto_update_effective: AutoUpdate,
    /// The tenant's own backup schedule; null: its plan's `backups`.
    pub backups: Option<crate::backup_store::BackupPlan>,
    /// Whether its control plane is to run (`asleep`: scaled to zero until a wake; phase
    /// `Sleeping` once it is down).
    pub sleep: Sleep,
    /// The gateway's last report of a connection for the tenant; null if it never saw one.
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub active_at: Option<OffsetDateTime>,
}

/// What a tenant held at its latest sample, and its plan's limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    /// When vcp counted the tenant's host objects.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
    /// The plan's quota now (null: unlimited; all null if the plan is no longer configured).
    pub limits: Hard,
}

impl TenantView {
    pub fn new(
        t: Tenant,
        kubernetes_version: Option<String>,
        usage: Option<TenantUsage>,
        upgrade: Option<UpgradeView>,
        auto_update_effective: AutoUpdate,
    ) -> TenantView {
        TenantView {
            auto_update_effective,
            auto_update: t.auto_update,
            usage,
            upgrade,
            kubernetes_version,
            phase: t.phase,
            name: t.name,
            key: t.key.into(),
            owner: t.owner,
            labels: t.labels.0,
            version: t.version,
            plan: t.plan,
            conditions: t.conditions.0,
            endpoint: t.endpoint,
            generation: t.generation,
            observed_generation: t.observed_generation,
            created_at: t.created_at,
            first_ready_at: t.first_ready_at,
            maintenance_window: t.maintenance_window.map(|w| w.0),
            fleet_upgrades: t.fleet_upgrades,
            sleep: t.sleep,
            active_at: t.active_at,
            backups: t.backups.map(|b| b.0),
        }
    }
}

/// `GET /v1/tenants` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub items: Vec<TenantView>,
}

/// `DELETE /v1/tenants/{name}` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Keep the etcd volumes (their reclaim policy becomes `Retain`).
    #[serde(default)]
    pub retain_data: bool,
}
