//! Request and response bodies of the platform API.
//!
//! The server serializes these, the `vcp` client commands deserialize them, and the OpenAPI
//! document is derived from them: one definition for all three. The strings the server checks
//! by a rule are documented by the schemas at the end of this file, built from the rules'
//! own constants in [`crate::names`] and from the server's versions and plans.

use crate::inventory::{KubeconfigRow, Tenant, Token, UsageSample};
use crate::names;
pub use crate::window::{Day, MaintenanceWindow, RawWindow};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::BTreeMap;
use time::OffsetDateTime;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{OpenApi, RefOr};
use utoipa::{IntoParams, PartialSchema, ToSchema};
pub use vcp_core::lifecycle::{
    AutoUpdate, Condition, FleetEntryState, FleetState, FleetUpgrades, Phase, RestoreState,
    SnapshotState, UpgradeState,
};
pub use vcp_policy::quota::{Hard, Usage};

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
}

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

impl From<crate::inventory::UpgradeRow> for UpgradeView {
    fn from(u: crate::inventory::UpgradeRow) -> UpgradeView {
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
    /// Go through every minor between, one hop each, each gated (`1.35` -> `1.37` is two
    /// hops). Without it, a request that skips a minor is refused (rule `one-minor-per-hop`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub chain: bool,
    /// The target may be a `preview` version.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_preview: bool,
}

/// One etcd snapshot of a tenant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotView {
    /// Its number among the tenant's snapshots (1, 2, ...; those taken before snapshots were
    /// numbered per tenant kept their earlier id): what `POST .../restore` takes.
    pub id: i64,
    /// `Pending` until the tenant's next pass (once its etcd is up) has taken it.
    pub state: SnapshotState,
    /// Why it failed.
    pub reason: Option<String>,
    /// The upgrade that took it before one of its hops; none when asked for.
    pub upgrade: Option<i64>,
    /// The tenant's minor when it was asked for.
    pub version: String,
    /// The store's revision when the snapshot started.
    pub revision: Option<i64>,
    /// Bytes of the file (etcd's integrity trailer included).
    pub size_bytes: Option<i64>,
    /// SHA-256 of the file, hex; a restore checks the file against it first.
    pub sha256: Option<String>,
    /// `pvc://<control-plane namespace>/etcd-snapshots/<file>`.
    pub location: String,
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<crate::inventory::SnapshotRow> for SnapshotView {
    fn from(s: crate::inventory::SnapshotRow) -> SnapshotView {
        SnapshotView {
            id: s.number,
            state: s.state,
            reason: s.reason,
            upgrade: s.upgrade_id,
            version: s.version,
            revision: s.revision,
            size_bytes: s.size_bytes,
            sha256: s.sha256,
            location: s.location,
            requested_by: s.requested_by,
            created_at: s.created_at,
            finished_at: s.finished_at,
        }
    }
}

/// One restore of a tenant from a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct RestoreView {
    pub id: i64,
    /// The snapshot's `id` (its number among the tenant's snapshots).
    pub snapshot: i64,
    pub state: RestoreState,
    /// Every etcd member holds the snapshot's data (the control plane may still be starting).
    pub restored: bool,
    /// Why it failed.
    pub reason: Option<String>,
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
}

impl From<crate::inventory::RestoreRow> for RestoreView {
    fn from(r: crate::inventory::RestoreRow) -> RestoreView {
        RestoreView {
            id: r.id,
            snapshot: r.snapshot_number,
            state: r.state,
            restored: r.restored,
            reason: r.reason,
            requested_by: r.requested_by,
            started_at: r.created_at,
            finished_at: r.finished_at,
        }
    }
}

/// `GET /v1/tenants/{name}/snapshots`: a tenant's snapshots and restores, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct SnapshotList {
    pub snapshots: Vec<SnapshotView>,
    pub restores: Vec<RestoreView>,
}

/// `POST /v1/tenants/{name}/restore` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreTenant {
    /// The `id` of a `Succeeded` snapshot of this tenant, as its snapshot list shows it.
    #[schema(minimum = 1)]
    pub snapshot: i64,
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

/// A field that is there (even as `null`) is `Some`: tells "set to null" from "absent".
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
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
            maintenance_window: t.maintenance_window.map(|w| w.0),
            fleet_upgrades: t.fleet_upgrades,
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

/// `GET /v1/tenants/{name}/usage` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the range, inclusive: an RFC 3339 time (`2026-01-01T00:00:00Z`); default
    /// `until` minus 24 hours. At most `until`.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-01-01T00:00:00Z")]
    pub since: Option<String>,
    /// End of the range, exclusive: an RFC 3339 time; default now.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-02-01T00:00:00Z")]
    pub until: Option<String>,
    /// Most samples in one answer, 1 to 10000 (default 1000); `next_since` pages on.
    #[param(minimum = 1, maximum = 10000, example = 1000)]
    pub limit: Option<u32>,
}

/// One usage sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSampleView {
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
}

impl From<UsageSample> for UsageSampleView {
    fn from(s: UsageSample) -> UsageSampleView {
        UsageSampleView {
            sampled_at: s.sampled_at,
            used: s.used,
        }
    }
}

/// `GET /v1/audit` query: every filter given must match.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    /// Entries of tenants with this name (every tenant that had it, deleted ones too).
    #[param(value_type = Option<NameSchema>)]
    pub tenant: Option<String>,
    /// Who made the change: a token's name (`team-a`, `admin`), or vcp itself
    /// (`reconciler/<replica>`, ...). 1 to 128 characters, none of them U+0000 to U+001F or
    /// U+007F.
    #[param(
        min_length = 1,
        max_length = 128,
        pattern = r"^[^\x00-\x1f\x7f]+$",
        example = "team-a"
    )]
    pub actor: Option<String>,
    /// An action (`tenant.create`), or, ending with a dot, every action under it (`tenant.`).
    #[param(
        max_length = 64,
        pattern = r"^[a-z][a-z_-]*(\.[a-z][a-z_-]*)*\.?$",
        example = "tenant."
    )]
    pub action: Option<String>,
    /// Entries at or after this RFC 3339 time.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-01-01T00:00:00Z")]
    pub since: Option<String>,
    /// Entries before this RFC 3339 time (at or before `since`: no entries).
    #[param(value_type = Option<String>, format = DateTime, example = "2026-02-01T00:00:00Z")]
    pub until: Option<String>,
    /// Entries after this id: the previous page's `next_after`. Default 0 (from the start).
    #[param(minimum = 0, maximum = 9_223_372_036_854_775_807_i64, example = 0)]
    pub after: Option<i64>,
    /// Most entries in one answer, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000, example = 100)]
    pub limit: Option<u32>,
}

/// One audit entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEntryView {
    /// Increasing in the order entries were written; the paging cursor.
    pub id: i64,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: OffsetDateTime,
    /// Who made the change: a token's name, or vcp itself (`reconciler/<replica>`, ...).
    pub actor: String,
    /// What changed: `tenant.create`, `kubeconfig.issue`, `token.revoke`, `token.admin-bootstrap`, ...
    pub action: String,
    /// The tenant's name, when the entry is about one.
    pub tenant: Option<String>,
    /// The change's particulars (never a secret).
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
}

/// `GET /v1/audit` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditPage {
    /// Entries, oldest first, at most `limit`.
    pub items: Vec<AuditEntryView>,
    /// Set when more entries match: ask again with this as `after` (and the same filters).
    /// Null on the last page.
    pub next_after: Option<i64>,
}

/// `GET /v1/tenants/{name}/usage` answer: a tenant's samples in `[since, until)`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSamples {
    /// The range answered (defaults filled in): `since` inclusive.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub since: OffsetDateTime,
    /// `until` exclusive.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub until: OffsetDateTime,
    /// Samples, oldest first, at most `limit`. A sample holds from its `sampled_at` until the
    /// next one; gaps are times the tenant was not Ready (or vcp was not running).
    pub items: Vec<UsageSampleView>,
    /// Set when the range holds more than `limit` samples: ask again with this as `since`
    /// (and the same `until`) for the next page. Null on the last page.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_since: Option<OffsetDateTime>,
    /// The plan's quota now (null: unlimited).
    pub limits: Hard,
}

/// `POST /v1/tenants/{name}/kubeconfigs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueKubeconfig {
    /// The user name (certificate CN).
    #[schema(value_type = SubjectSchema)]
    pub user: String,
    /// Groups (certificate O), at most 16. `view`, `edit` and `admin` are bound in every
    /// tenant; `sudo` makes this kubeconfig a sudoer's, whose holder may act as admin for one
    /// command by impersonating its user into `vcp:sudo` (`kubectl --as=<user>
    /// --as-group=vcp:sudo`) until the kubeconfig is revoked or expires (other kubeconfigs
    /// of the user may not); others are the tenant's to bind.
    #[serde(default)]
    #[schema(value_type = Vec<SubjectSchema>, max_items = 16, example = json!(["view"]))]
    pub groups: Vec<String>,
    /// The default is 8h; any lifetime is capped at the server's maximum (168h unless
    /// configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TtlSchema>)]
    pub ttl: Option<String>,
}

/// An issued kubeconfig; the only time its private key leaves the server.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigIssued {
    /// kubeconfig YAML with the client certificate and key embedded.
    pub kubeconfig: String,
    /// Serial number of the client certificate (hex).
    pub serial: String,
    pub user: String,
    pub groups: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: OffsetDateTime,
}

impl std::fmt::Debug for KubeconfigIssued {
    // The kubeconfig embeds a private key: never printed, not even by a stray `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigIssued")
            .field("kubeconfig", &"<redacted>")
            .field("serial", &self.serial)
            .field("user", &self.user)
            .field("groups", &self.groups)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// A kubeconfig as the inventory remembers it: never its key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigView {
    pub user: String,
    pub groups: Vec<String>,
    pub serial: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: OffsetDateTime,
    /// The token that issued it.
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    /// When it was revoked; the tenant apiserver refuses it from then on (within 60 s).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<OffsetDateTime>,
    /// A break-glass kubeconfig: it cannot be revoked, only expire.
    #[serde(default)]
    pub break_glass: bool,
}

/// `POST /v1/tenants/{name}/break-glass` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakGlassRequest {
    /// Why, for the audit trail: 1 to 200 characters, no NUL.
    #[schema(min_length = 1, max_length = 200, pattern = "^[^\\u0000]*$")]
    pub reason: String,
    /// Lifetime like 15m or 1h, default 30m; a longer one is cut to 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TtlSchema>)]
    pub ttl: Option<String>,
}

impl From<KubeconfigRow> for KubeconfigView {
    fn from(r: KubeconfigRow) -> KubeconfigView {
        KubeconfigView {
            user: r.username,
            groups: r.groups,
            serial: r.serial,
            expires_at: r.expires_at,
            created_by: r.created_by,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
            break_glass: r.break_glass,
        }
    }
}

/// `GET /v1/tenants/{name}/kubeconfigs` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigList {
    pub items: Vec<KubeconfigView>,
}

/// Who a token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees and changes every tenant, and manages tokens.
    Admin,
    /// Sees and changes only the tenants it created.
    Owner,
}

impl Role {
    /// The role of an inventory row (the database allows only these two).
    pub fn of(name: &str) -> Role {
        if name == "admin" {
            Role::Admin
        } else {
            Role::Owner
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
}

/// `POST /v1/tokens` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Unique among tokens, live and revoked.
    #[schema(value_type = NameSchema)]
    pub name: String,
    pub role: Role,
}

/// A new token: the secret is in this answer and nowhere else.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub name: String,
    pub role: Role,
    /// The bearer secret; only its hash is stored.
    pub token: String,
}

impl std::fmt::Debug for TokenCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCreated")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A token without its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub name: String,
    pub role: Role,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<OffsetDateTime>,
}

impl From<Token> for TokenView {
    fn from(t: Token) -> TokenView {
        TokenView {
            role: Role::of(&t.role),
            name: t.name,
            created_at: t.created_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// `GET /v1/tokens` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// One Kubernetes minor the server can provision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionView {
    #[schema(example = "1.37")]
    pub minor: String,
    #[schema(example = "v1.37.1")]
    pub kubernetes: String,
    /// Where the minor is in its life: `preview` (new tenants need `allow_preview`),
    /// `supported`, `deprecated` (owners should upgrade), `expired` (no new tenants; the next
    /// fleet upgrade moves tenants off it).
    pub class: crate::render::catalog::Class,
    pub default: bool,
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

/// `GET /v1/versions` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionList {
    pub default: String,
    pub versions: Vec<VersionView>,
}

/// Declares `$T`, a unit type whose schema is `$build`, named `$name` in the document (so
/// bodies refer to it with `#[schema(value_type = $T)]` and the document holds it once).
macro_rules! named_schema {
    ($(#[$doc:meta])* $T:ident = $name:literal, $build:block) => {
        $(#[$doc])*
        pub struct $T;

        impl PartialSchema for $T {
            fn schema() -> RefOr<Schema> {
                $build
            }
        }

        impl ToSchema for $T {
            fn name() -> Cow<'static, str> {
                $name.into()
            }
        }
    };
}

// Schemas of the strings the server checks by a rule. Each states the rule's pattern and
// lengths from the constants the server's check uses (`crate::names`), so the document and
// the server cannot drift apart; `names` proves each pattern and its check agree.

named_schema!(
    /// The schema of a tenant or token name, `Name` in the document.
    NameSchema = "Name",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A tenant or token name: lowercase letters, digits and `-`, starting with a \
                 letter and not ending with `-`, 1 to {} characters.",
                names::MAX_NAME_LEN
            )))
            .pattern(Some(names::NAME_PATTERN))
            .min_length(Some(1))
            .max_length(Some(names::MAX_NAME_LEN))
            .examples(["team-a"])
            .into()
    }
);

named_schema!(
    /// The schema of a kubeconfig user or group, `Subject` in the document.
    SubjectSchema = "Subject",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A kubeconfig user or group: 1 to {} printable ASCII characters without \
                 spaces, not starting with `system:` or `vcp:` (Kubernetes' and vcp's own \
                 identities).",
                names::MAX_SUBJECT_LEN
            )))
            .pattern(Some(names::SUBJECT_PATTERN))
            .min_length(Some(1))
            .max_length(Some(names::MAX_SUBJECT_LEN))
            .examples(["alice"])
            .into()
    }
);

named_schema!(
    /// The schema of a certificate serial, `Serial` in the document.
    SerialSchema = "Serial",
    {
        let (min, max) = vcp_core::revocation::SERIAL_LEN;
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A kubeconfig's certificate serial as vcp reports it: lowercase hex, {min} to \
                 {max} digits."
            )))
            .pattern(Some(vcp_core::revocation::SERIAL_PATTERN))
            .min_length(Some(min))
            .max_length(Some(max))
            .examples(["4f1c0e9a7b2d4c6e8f0a1b2c3d4e5f60"])
            .into()
    }
);

named_schema!(
    /// The schema of a tenant's labels, `Labels` in the document.
    LabelsSchema = "Labels",
    {
        let text = |pattern: &str, min: usize, max: usize| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(pattern))
                .min_length(Some(min))
                .max_length(Some(max))
        };
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(format!(
                "Free-form labels: at most {} keys of 1 to {} and values of up to {} \
                 characters of `[A-Za-z0-9-_./]`.",
                names::MAX_LABELS,
                names::MAX_LABEL_KEY_LEN,
                names::MAX_LABEL_VALUE_LEN
            )))
            .property_names(Some(text(
                names::LABEL_KEY_PATTERN,
                1,
                names::MAX_LABEL_KEY_LEN,
            )))
            .additional_properties(Some(text(
                names::LABEL_VALUE_PATTERN,
                0,
                names::MAX_LABEL_VALUE_LEN,
            )))
            .max_properties(Some(names::MAX_LABELS))
            .examples([serde_json::json!({"team": "shop"})])
            .into()
    }
);

named_schema!(
    /// The schema of a kubeconfig lifetime, `Ttl` in the document.
    TtlSchema = "Ttl",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A lifetime: a positive number and a unit, `s` (or none), `m`, `h` or `d` \
                 (`90m`, `12h`, `7d`). The server caps it at its maximum \
                 (`--max-kubeconfig-ttl-hours`, 168 hours unless configured).",
            ))
            .pattern(Some(names::TTL_PATTERN))
            .examples(["12h"])
            .into()
    }
);

named_schema!(
    /// The schema of a requested Kubernetes version, `KubernetesVersion` in the document: the
    /// spellings the server's catalog resolves (the built-in catalog here; [`with_choices`] puts
    /// a server's own in the document it serves).
    VersionSchema = "KubernetesVersion",
    {
        VersionSchema::of(crate::render::Catalog::builtin().spellings())
    }
);

impl VersionSchema {
    fn of(spellings: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A Kubernetes version this server provisions (`GET /v1/versions`): a minor \
                 (`1.37`, `v1.37`) or its release (`v1.37.1`, `1.37.1`).",
            ))
            .enum_values(Some(spellings))
            .into()
    }
}

named_schema!(
    /// The schema of a fleet upgrade's target, `UpgradeTarget` in the document: the spellings
    /// of the catalog's versions that are not `expired` ([`with_choices`] puts a server's own
    /// in the document it serves).
    TargetSchema = "UpgradeTarget",
    {
        TargetSchema::of(target_spellings(&crate::render::Catalog::builtin()))
    }
);

/// The spellings of a catalog's versions that may be upgrade targets (not `expired`).
pub fn target_spellings(catalog: &crate::render::Catalog) -> Vec<String> {
    let live = crate::render::Catalog {
        default: catalog.default.clone(),
        versions: catalog
            .versions
            .iter()
            .filter(|v| v.class != crate::render::catalog::Class::Expired)
            .cloned()
            .collect(),
    };
    live.spellings()
}

impl TargetSchema {
    fn of(spellings: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A Kubernetes version tenants may be upgraded to (`GET /v1/versions`, any class \
                 but `expired`): a minor (`1.37`, `v1.37`) or its release (`v1.37.1`).",
            ))
            .enum_values(Some(spellings))
            .into()
    }
}

named_schema!(
    /// The schema of a plan name, `Plan` in the document: the plans configured on the server
    /// (`default` alone here; [`with_choices`] puts a server's own in the document it serves).
    PlanSchema = "Plan",
    {
        let builtin = crate::render::parse_plans("{}").unwrap_or_default();
        PlanSchema::of(builtin.into_keys().collect())
    }
);

impl PlanSchema {
    fn of(plans: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A placement plan configured on this server (`--plans`; `default` always \
                 exists).",
            ))
            .enum_values(Some(plans))
            .into()
    }
}

/// States a server's own versions (all of them, and those that may be upgrade targets) and
/// plans in its document.
pub fn with_choices(
    doc: &mut OpenApi,
    versions: Vec<String>,
    targets: Vec<String>,
    plans: Vec<String>,
) {
    if let Some(c) = doc.components.as_mut() {
        c.schemas
            .insert(TargetSchema::name().into_owned(), TargetSchema::of(targets));
        c.schemas.insert(
            VersionSchema::name().into_owned(),
            VersionSchema::of(versions),
        );
        c.schemas
            .insert(PlanSchema::name().into_owned(), PlanSchema::of(plans));
    }
}
