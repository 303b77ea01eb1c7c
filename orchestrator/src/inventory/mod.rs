//! The Postgres inventory: the tenants' tables, the pool, and the steps every table's writes
//! share (leases, the audit trail, `NOTIFY`). A feature with tables of its own keeps their SQL
//! in its folder (fleet upgrades: [`crate::upgrade::store`]).
//!
//! Tenants, the versions catalog in use, certificates and kubeconfigs issued, API tokens (as
//! SHA-256 hashes), an audit trail, and the tenants' quota usage samples (for billing).
//! Reconcile work is claimed through row leases (`FOR UPDATE SKIP LOCKED`), and every change
//! that creates work sends `NOTIFY vcp_tenants` so idle replicas wake at once instead of at
//! their next poll.
//!
//! Fleet upgrades (many tenants moved in waves) keep their tables in
//! [`crate::upgrade::store`]; they start each tenant's upgrade through the same transaction a
//! `PATCH /v1/tenants/{name}` uses ([`start_upgrade_in`]).
//!
//! The lifecycle columns are typed ([`vcp_core::lifecycle`]): `desired` and `phase` decode through
//! checked mappings and `conditions` through serde, so a value the code does not know fails the
//! read instead of turning into a default.

pub mod audit;
pub mod rotations;

use crate::lifecycle::upgrade::{Active, HopSnapshot, Transition};
use crate::pki::CertInfo;
use crate::render::Catalog;
use crate::window::MaintenanceWindow;
use crate::{Error, Result};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::types::Json;
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{
    AutoUpdate, Condition, Desired, FleetUpgrades, Phase, SnapshotState, UpgradeState,
};
use vcp_core::naming::TenantKey;
use vcp_policy::quota::Usage;

pub mod snapshots;

pub use audit::{ActionFilter, AuditEntry, AuditFilter};
pub use snapshots::{NewRestore, RestoreRow, SnapshotRow};

/// Channel that wakes reconcile workers.
pub const CHANNEL: &str = "vcp_tenants";

/// A tenant row.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Tenant {
    pub id: i64,
    pub name: String,
    /// Checked when read: a row whose key breaks the rule is an error, not a tenant.
    #[sqlx(try_from = "String")]
    pub key: TenantKey,
    pub owner: String,
    pub labels: Json<BTreeMap<String, String>>,
    pub version: String,
    pub plan: String,
    pub desired: Desired,
    pub retain_data: bool,
    pub phase: Phase,
    pub conditions: Json<Vec<Condition>>,
    pub endpoint: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    pub created_at: OffsetDateTime,
    pub updated_at: OffsetDateTime,
    pub deleted_at: Option<OffsetDateTime>,
    /// When fleet upgrades may start it (`None`: its plan's window, or any time).
    pub maintenance_window: Option<Json<MaintenanceWindow>>,
    /// Whether fleet upgrades may move it (an expired version moves it regardless).
    pub fleet_upgrades: FleetUpgrades,
    /// Its own automatic update setting (`None`: its plan's).
    pub auto_update: Option<AutoUpdate>,
    /// The release of `version` its control plane runs (`v1.37.1`); `None` only for rows from
    /// before migration 0007 that it could not place (they run the catalog's release).
    pub release: Option<String>,
}

/// A tenant to create.
#[derive(Debug, Clone)]
pub struct NewTenant {
    pub name: String,
    pub key: TenantKey,
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    pub version: String,
    pub plan: String,
    pub maintenance_window: Option<MaintenanceWindow>,
    pub fleet_upgrades: FleetUpgrades,
    pub auto_update: Option<AutoUpdate>,
    /// The release of `version` it starts on.
    pub release: String,
}

/// What an owner may change of a tenant besides its version (`PATCH /v1/tenants/{name}`);
/// `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct TenantSettings {
    /// `Some(None)` removes the tenant's own window (its plan's applies again).
    pub maintenance_window: Option<Option<MaintenanceWindow>>,
    pub fleet_upgrades: Option<FleetUpgrades>,
    /// `Some(None)` removes the tenant's own setting (its plan's applies again).
    pub auto_update: Option<Option<AutoUpdate>>,
}

impl TenantSettings {
    pub fn is_empty(&self) -> bool {
        self.maintenance_window.is_none()
            && self.fleet_upgrades.is_none()
            && self.auto_update.is_none()
    }
}

/// The leases [`Inventory::release_leases_of`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    pub tenants: u64,
    pub fleet_upgrades: u64,
}

/// What one reconcile pass leaves behind.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// [`Phase::Deleted`] is not written by [`Inventory::finish`]: the worker tombstones the
    /// row instead ([`Inventory::tombstone`]).
    pub phase: Phase,
    pub conditions: Vec<Condition>,
    pub endpoint: Option<String>,
    pub observed_generation: i64,
    pub requeue_after: Duration,
    /// What the pass means for the tenant's upgrade (its id and the transition), written in
    /// the same transaction.
    pub upgrade: Option<(i64, Transition)>,
    /// What the pass means for the tenant's restore, written in the same transaction.
    pub restore: Option<(i64, NewRestore)>,
}

/// One upgrade of a tenant, as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct UpgradeRow {
    pub id: i64,
    pub tenant_id: i64,
    pub from_version: String,
    pub target_version: String,
    pub chain: bool,
    pub hop_from: String,
    pub hop_to: String,
    pub hop_started_at: OffsetDateTime,
    pub state: UpgradeState,
    pub reason: Option<String>,
    pub requested_by: String,
    pub created_at: OffsetDateTime,
    pub finished_at: Option<OffsetDateTime>,
    /// The snapshot taken before the current hop.
    pub snapshot_id: Option<i64>,
    /// The releases of the current hop (migration 0007): the tenant's when it started, and
    /// where it goes (`None`: the catalog's release of `hop_to`).
    pub hop_from_release: Option<String>,
    pub hop_to_release: Option<String>,
    /// The restore of that snapshot a rollback started (migration 0006), if it needed one.
    pub restore_id: Option<i64>,
    /// That restore's state; read by [`Inventory::latest_upgrades`] and
    /// [`Inventory::latest_upgrade`] only (`None` elsewhere).
    #[sqlx(default)]
    pub restore_state: Option<vcp_core::lifecycle::RestoreState>,
}

impl UpgradeRow {
    /// What a pass needs of it, with the current hop's snapshot as read.
    pub fn active(&self, snapshot: Option<&SnapshotRow>) -> Active {
        let snapshot = snapshot.map(|s| match s.state {
            SnapshotState::Pending => HopSnapshot::Pending,
            SnapshotState::Succeeded => HopSnapshot::Taken(s.id),
            SnapshotState::Failed => HopSnapshot::Failed(s.reason.clone().unwrap_or_default()),
        });
        Active {
            snapshot,
            id: self.id,
            target: self.target_version.clone(),
            chain: self.chain,
            hop_from: self.hop_from.clone(),
            hop_to: self.hop_to.clone(),
            hop_from_release: self.hop_from_release.clone(),
            hop_to_release: self.hop_to_release.clone(),
            hop_started_at: self.hop_started_at,
            state: self.state,
        }
    }
}

/// An upgrade to start.
#[derive(Debug, Clone)]
pub struct NewUpgrade {
    pub target: String,
    pub chain: bool,
    /// The first hop's end.
    pub first_hop: String,
    /// The release the first hop goes to; `None`: the catalog's release of `first_hop`. A
    /// patch update names it (and its hop stays inside the tenant's minor).
    pub to_release: Option<String>,
    /// Start only if the tenant still runs this release (a patch update decided on it).
    pub expect_release: Option<String>,
}

/// An API token (the hash only).
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Token {
    pub id: i64,
    pub name: String,
    pub role: String,
    pub created_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
}

/// An issued kubeconfig as the inventory records it (never its key).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct KubeconfigRow {
    pub username: String,
    pub groups: Vec<String>,
    pub serial: String,
    pub expires_at: OffsetDateTime,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    /// A break-glass kubeconfig: not revocable, short-lived.
    pub break_glass: bool,
}

/// One usage sample of a tenant: what its host objects held at `sampled_at`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UsageSample {
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
}

/// A `usage_samples` row (BIGINT columns; the CHECKs keep them non-negative).
#[derive(sqlx::FromRow)]
struct UsageRow {
    tenant_id: i64,
    sampled_at: OffsetDateTime,
    pods: i64,
    requests_cpu: i64,
    requests_memory: i64,
    limits_cpu: i64,
    limits_memory: i64,
    services: i64,
    persistent_volume_claims: i64,
    requests_storage: i64,
    namespaces: i64,
}

impl UsageRow {
    fn sample(&self) -> UsageSample {
        let n = |v: i64| u64::try_from(v).unwrap_or(0);
        UsageSample {
            sampled_at: self.sampled_at,
            used: Usage {
                pods: n(self.pods),
                requests_cpu: n(self.requests_cpu),
                requests_memory: n(self.requests_memory),
                limits_cpu: n(self.limits_cpu),
                limits_memory: n(self.limits_memory),
                services: n(self.services),
                persistent_volume_claims: n(self.persistent_volume_claims),
                requests_storage: n(self.requests_storage),
                namespaces: n(self.namespaces),
            },
        }
    }
}

const USAGE_COLUMNS: &str = "tenant_id, sampled_at, pods, requests_cpu, requests_memory, \
     limits_cpu, limits_memory, services, persistent_volume_claims, requests_storage, namespaces";

/// Advisory lock class of usage recording (`pg_advisory_xact_lock(class, tenant)`): replicas
/// recording a sample for the same tenant take turns, so the gap check before the insert holds.
const USAGE_LOCK: i32 = 0x7663_7075;

/// A certificate record.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CertificateRow {
    pub purpose: String,
    pub serial: String,
    pub fingerprint: String,
    pub subject: String,
    pub not_after: OffsetDateTime,
}

pub(crate) const TENANT_COLUMNS: &str = "id, name, key, owner, labels, version, plan, desired, retain_data, \
     phase, conditions, endpoint, generation, observed_generation, created_at, updated_at, deleted_at, \
     maintenance_window, fleet_upgrades, auto_update, release";

fn unique_violation(e: &sqlx::Error) -> Option<String> {
    match e {
        sqlx::Error::Database(d) if d.code().as_deref() == Some("23505") => {
            Some(d.constraint().unwrap_or_default().to_owned())
        }
        _ => None,
    }
}

/// The inventory.
#[derive(Debug, Clone)]
pub struct Inventory {
    pub(crate) pool: PgPool,
}

impl Inventory {
    /// Connects (lazily: a database that is down now may be up at first use).
    pub async fn connect(url: &str) -> Result<Inventory> {
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .acquire_timeout(Duration::from_secs(10))
            .connect(url)
            .await
            .map_err(Error::Database)?;
        Ok(Inventory { pool })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Applies pending migrations from `migrations/` (embedded at build time).
    pub async fn migrate(&self) -> Result<()> {
        sqlx::migrate!("../migrations")
            .run(&self.pool)
            .await
            .map_err(Error::Migrate)
    }

    /// True when the database answers.
    pub async fn ping(&self) -> bool {
        sqlx::query("SELECT 1").execute(&self.pool).await.is_ok()
    }

    /// Records the catalog this replica serves (newer replicas overwrite older entries).
    pub async fn upsert_versions(&self, catalog: &Catalog) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for v in &catalog.versions {
            sqlx::query(
                "INSERT INTO versions (minor, kubernetes, images, is_default) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (minor) DO UPDATE SET kubernetes = EXCLUDED.kubernetes,
                   images = EXCLUDED.images, is_default = EXCLUDED.is_default, updated_at = now()",
            )
            .bind(&v.minor)
            .bind(&v.kubernetes)
            .bind(Json(&v.images))
            .bind(v.minor == catalog.default)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Creates a tenant and its audit entry; a live tenant of the same name and owner is a
    /// [`Error::Duplicate`] (another owner's of that name is not: names are per owner).
    pub async fn create_tenant(&self, t: &NewTenant, actor: &str) -> Result<Tenant> {
        let mut tx = self.pool.begin().await?;
        let row: Tenant = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "INSERT INTO tenants (name, key, owner, labels, version, plan, maintenance_window,
               fleet_upgrades, auto_update, release)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) RETURNING {TENANT_COLUMNS}"
        )))
        .bind(&t.name)
        .bind(t.key.as_str())
        .bind(&t.owner)
        .bind(Json(&t.labels))
        .bind(&t.version)
        .bind(&t.plan)
        .bind(t.maintenance_window.as_ref().map(Json))
        .bind(t.fleet_upgrades)
        .bind(t.auto_update)
        .bind(&t.release)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match unique_violation(&e).as_deref() {
            Some("tenants_live_owner_name") => Error::Duplicate(t.name.clone()),
            Some("tenants_key_key") => Error::KeyCollision,
            _ => Error::Database(e),
        })?;
        audit_in(
            &mut tx,
            actor,
            "tenant.create",
            Some(row.id),
            serde_json::json!({"name": t.name, "key": t.key, "version": t.version, "plan": t.plan,
                "release": t.release, "maintenance_window": t.maintenance_window,
                "fleet_upgrades": t.fleet_upgrades, "auto_update": t.auto_update}),
        )
        .await?;
        notify(&mut tx).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Live tenants, optionally only one owner's, by name.
    pub async fn list_tenants(&self, owner: Option<&str>) -> Result<Vec<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants
             WHERE deleted_at IS NULL AND ($1::text IS NULL OR owner = $1) ORDER BY name"
        )))
        .bind(owner)
        .fetch_all(&self.pool)
        .await?)
    }

    /// The live tenants of this name, by owner (only `owner`'s when given). Names are unique
    /// per owner (migration 0009), so an owner's lookup finds at most one; without `owner`
    /// (an admin's) it may find one per owner holding the name, and the caller decides.
    pub async fn tenants_named(&self, name: &str, owner: Option<&str>) -> Result<Vec<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants
             WHERE deleted_at IS NULL AND name = $1 AND ($2::text IS NULL OR owner = $2)
             ORDER BY owner, id"
        )))
        .bind(name)
        .bind(owner)
        .fetch_all(&self.pool)
        .await?)
    }

    /// A tenant by id, deleted or not.
    pub async fn tenant_by_id(&self, id: i64) -> Result<Option<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        )))
        .bind(id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Marks a live tenant for deletion; `None` if it is gone already. By id, not by name: an
    /// admin's name may match several owners' tenants, so the caller resolves it first.
    pub async fn request_delete(
        &self,
        t: &Tenant,
        retain_data: bool,
        actor: &str,
    ) -> Result<Option<Tenant>> {
        let mut tx = self.pool.begin().await?;
        let row: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET desired = $3, phase = $4, retain_data = $2,
               generation = generation + CASE WHEN desired = $3 THEN 0 ELSE 1 END,
               next_reconcile_at = now(), updated_at = now()
             WHERE deleted_at IS NULL AND id = $1
             RETURNING {TENANT_COLUMNS}"
        )))
        .bind(t.id)
        .bind(retain_data)
        .bind(Desired::Absent)
        .bind(Phase::Deleting)
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(t) = &row {
            audit_in(
                &mut tx,
                actor,
                "tenant.delete",
                Some(t.id),
                serde_json::json!({"name": t.name, "retain_data": retain_data}),
            )
            .await?;
            notify(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    /// Starts an upgrade of a live tenant the caller may see (`owner`: an owner's own only),
    /// if it is `Ready` and no upgrade moves it already: records it, sets the tenant's version
    /// to the first hop and its phase to `Upgrading`, and wakes the workers. `Ok(None)` when
    /// the tenant is not there, not Ready, or already upgrading (the caller tells which).
    pub async fn start_upgrade(
        &self,
        t: &Tenant,
        owner: Option<&str>,
        u: &NewUpgrade,
        actor: &str,
    ) -> Result<Option<(Tenant, UpgradeRow)>> {
        let mut tx = self.pool.begin().await?;
        let started = start_upgrade_in(&mut tx, t.id, &t.version, owner, u, actor, actor).await?;
        if started.is_some() {
            tx.commit().await?;
        }
        Ok(started)
    }

    /// Changes a live tenant's settings (for `owner`'s own only, if given) and audits it;
    /// `None` if there is no such tenant.
    pub async fn update_tenant_settings(
        &self,
        t: &Tenant,
        owner: Option<&str>,
        s: &TenantSettings,
        actor: &str,
    ) -> Result<Option<Tenant>> {
        let mut tx = self.pool.begin().await?;
        let row: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET
               maintenance_window = CASE WHEN $3 THEN $4 ELSE maintenance_window END,
               fleet_upgrades = COALESCE($5, fleet_upgrades),
               auto_update = CASE WHEN $6 THEN $7 ELSE auto_update END, updated_at = now()
             WHERE id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR owner = $2)
             RETURNING {TENANT_COLUMNS}"
        )))
        .bind(t.id)
        .bind(owner)
        .bind(s.maintenance_window.is_some())
        .bind(s.maintenance_window.clone().flatten().map(Json))
        .bind(s.fleet_upgrades)
        .bind(s.auto_update.is_some())
        .bind(s.auto_update.flatten())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = &row {
            audit_in(
                &mut tx,
                actor,
                "tenant.settings",
                Some(row.id),
                serde_json::json!({"maintenance_window": row.maintenance_window,
                    "fleet_upgrades": row.fleet_upgrades, "auto_update": row.auto_update}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    /// Tenants a patch update may start for (`crate::upgrade::auto`): live, present, Ready,
    /// with no upgrade or restore moving them, and not opted out on their own (a tenant with
    /// no setting follows its plan, which the caller knows); each with the releases its patch
    /// updates were rolled back from.
    pub async fn patch_update_candidates(&self) -> Result<Vec<(Tenant, Vec<String>)>> {
        let tenants: Vec<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t
             WHERE deleted_at IS NULL AND desired = $1 AND phase = $2
               AND (auto_update IS NULL OR auto_update = $3)
               AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                               WHERE tenant_id = t.id AND state = ANY($4))
               AND NOT EXISTS (SELECT 1 FROM etcd_restores
                               WHERE tenant_id = t.id AND state = 'Running')
             ORDER BY name"
        )))
        .bind(Desired::Present)
        .bind(Phase::Ready)
        .bind(AutoUpdate::Patch)
        .bind(UpgradeState::active_names())
        .fetch_all(&self.pool)
        .await?;
        let ids: Vec<i64> = tenants.iter().map(|t| t.id).collect();
        let failed: Vec<(i64, String)> = sqlx::query_as(
            "SELECT tenant_id, hop_to_release FROM tenant_upgrades
             WHERE tenant_id = ANY($1) AND state = $2 AND hop_from = hop_to
               AND hop_to_release IS NOT NULL",
        )
        .bind(&ids)
        .bind(UpgradeState::RolledBack)
        .fetch_all(&self.pool)
        .await?;
        let mut by_tenant: BTreeMap<i64, Vec<String>> = BTreeMap::new();
        for (id, r) in failed {
            by_tenant.entry(id).or_default().push(r);
        }
        Ok(tenants
            .into_iter()
            .map(|t| {
                let f = by_tenant.remove(&t.id).unwrap_or_default();
                (t, f)
            })
            .collect())
    }

    /// Starts a patch update of a tenant to `to` (a release of its minor) through the same
    /// transaction as any upgrade: one hop inside its minor, snapshot first. Only if the tenant
    /// is still Ready on the release it was decided on, with nothing moving it; the upgrade's
    /// id, or `None` when that no longer holds (another replica started it, say).
    pub async fn start_patch_update(
        &self,
        t: &Tenant,
        to: &str,
        requested_by: &str,
        actor: &str,
    ) -> Result<Option<i64>> {
        let new = NewUpgrade {
            target: t.version.clone(),
            chain: false,
            first_hop: t.version.clone(),
            to_release: Some(to.to_owned()),
            expect_release: t.release.clone(),
        };
        let mut tx = self.pool.begin().await?;
        let started =
            start_upgrade_in(&mut tx, t.id, &t.version, None, &new, requested_by, actor).await?;
        let Some((_, up)) = started else {
            return Ok(None);
        };
        tx.commit().await?;
        Ok(Some(up.id))
    }

    /// The upgrade moving a tenant now, if any.
    pub async fn active_upgrade(&self, tenant_id: i64) -> Result<Option<UpgradeRow>> {
        Ok(
            sqlx::query_as(
                "SELECT * FROM tenant_upgrades WHERE tenant_id = $1 AND state = ANY($2)",
            )
            .bind(tenant_id)
            .bind(UpgradeState::active_names())
            .fetch_optional(&self.pool)
            .await?,
        )
    }

    /// The latest upgrade of each of these tenants that had one.
    pub async fn latest_upgrades(&self, ids: &[i64]) -> Result<BTreeMap<i64, UpgradeRow>> {
        let rows: Vec<UpgradeRow> = sqlx::query_as(
            "SELECT DISTINCT ON (u.tenant_id) u.*, r.state AS restore_state
             FROM tenant_upgrades u LEFT JOIN etcd_restores r ON r.id = u.restore_id
             WHERE u.tenant_id = ANY($1) ORDER BY u.tenant_id, u.id DESC",
        )
        .bind(ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|u| (u.tenant_id, u)).collect())
    }

    /// A tenant's latest upgrade, active or finished.
    pub async fn latest_upgrade(&self, tenant_id: i64) -> Result<Option<UpgradeRow>> {
        Ok(sqlx::query_as(
            "SELECT u.*, r.state AS restore_state
             FROM tenant_upgrades u LEFT JOIN etcd_restores r ON r.id = u.restore_id
             WHERE u.tenant_id = $1 ORDER BY u.id DESC LIMIT 1",
        )
        .bind(tenant_id)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Claims the most overdue tenant no other worker holds, for `lease`.
    pub async fn claim(&self, worker: &str, lease: Duration) -> Result<Option<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET lease_owner = $1, lease_until = now() + make_interval(secs => $2)
             WHERE id = (
               SELECT id FROM tenants
               WHERE deleted_at IS NULL AND next_reconcile_at <= now()
                 AND (lease_until IS NULL OR lease_until < now())
               ORDER BY next_reconcile_at LIMIT 1
               FOR UPDATE SKIP LOCKED)
             RETURNING {TENANT_COLUMNS}"
        )))
        .bind(worker)
        .bind(lease.as_secs_f64())
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Drops the leases a replica held before it restarted (same replica id), of tenants and
    /// of fleet upgrades alike: its old workers are gone, so what they held need not wait for
    /// the leases to run out. One transaction; returns how many of each it released.
    pub async fn release_leases_of(&self, replica: &str) -> Result<Released> {
        let mut tx = self.pool.begin().await?;
        let tenants = sqlx::query(
            "UPDATE tenants SET lease_owner = NULL, lease_until = NULL
             WHERE lease_owner LIKE $1 || '/%'",
        )
        .bind(replica)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let fleet_upgrades = sqlx::query(
            "UPDATE fleet_upgrades SET lease_owner = NULL, lease_until = NULL
             WHERE lease_owner LIKE $1 || '/%'",
        )
        .bind(replica)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(Released {
            tenants,
            fleet_upgrades,
        })
    }

    /// Extends a held lease; false if the lease was lost (another worker took over).
    pub async fn renew(&self, id: i64, worker: &str, lease: Duration) -> Result<bool> {
        let r = sqlx::query(
            "UPDATE tenants SET lease_until = now() + make_interval(secs => $3)
             WHERE id = $1 AND lease_owner = $2 AND lease_until > now()",
        )
        .bind(id)
        .bind(worker)
        .bind(lease.as_secs_f64())
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// Writes a pass's outcome and releases the lease. A generation bumped by the API during
    /// the pass is kept (the pass reports the generation it saw), so the change is not lost:
    /// the phase the API set stays (a deletion stays `Deleting`) and the tenant is due at once
    /// instead of at the stale outcome's requeue time. Returns false if the lease had been lost.
    pub async fn finish(&self, t: &Tenant, worker: &str, o: &Outcome, actor: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let phase: Option<Phase> = sqlx::query_scalar(
            "UPDATE tenants SET
               phase = CASE WHEN generation > $6 THEN phase ELSE $3 END,
               conditions = $4, endpoint = $5,
               observed_generation = GREATEST(observed_generation, $6),
               next_reconcile_at = CASE WHEN generation > $6 THEN now()
                 ELSE now() + make_interval(secs => $7) END,
               lease_owner = NULL, lease_until = NULL, updated_at = now()
             WHERE id = $1 AND lease_owner = $2
             RETURNING phase",
        )
        .bind(t.id)
        .bind(worker)
        .bind(o.phase)
        .bind(Json(&o.conditions))
        .bind(&o.endpoint)
        .bind(o.observed_generation)
        .bind(o.requeue_after.as_secs_f64())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(phase) = phase else {
            return Ok(false);
        };
        if phase != t.phase {
            audit_in(
                &mut tx,
                actor,
                "tenant.phase",
                Some(t.id),
                serde_json::json!({"from": t.phase, "to": phase}),
            )
            .await?;
        }
        if let Some((id, tr)) = &o.upgrade {
            apply_transition(&mut tx, t.id, *id, tr, actor).await?;
        }
        if let Some((id, r)) = &o.restore {
            snapshots::apply_restore(&mut tx, t.id, *id, r, actor).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Tombstones a deleted tenant (its name becomes free; the row stays for the record).
    pub async fn tombstone(&self, t: &Tenant, worker: &str, actor: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "UPDATE tenants SET deleted_at = now(), phase = $3, lease_owner = NULL,
               lease_until = NULL, observed_generation = generation, updated_at = now()
             WHERE id = $1 AND lease_owner = $2 AND deleted_at IS NULL",
        )
        .bind(t.id)
        .bind(worker)
        .bind(Phase::Deleted)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            return Ok(false);
        }
        audit_in(
            &mut tx,
            actor,
            "tenant.deleted",
            Some(t.id),
            serde_json::json!({"name": t.name, "key": t.key}),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Records a certificate once (idempotent on tenant, purpose and serial).
    pub async fn record_certificate(
        &self,
        tenant_id: i64,
        purpose: &str,
        c: &CertInfo,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO certificates (tenant_id, purpose, serial, fingerprint, subject, not_before, not_after)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, purpose, serial) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(purpose)
        .bind(&c.serial)
        .bind(&c.fingerprint)
        .bind(&c.subject)
        .bind(c.not_before)
        .bind(c.not_after)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every certificate recorded for a tenant, oldest first.
    pub async fn certificates(&self, tenant_id: i64) -> Result<Vec<CertificateRow>> {
        Ok(sqlx::query_as(
            "SELECT purpose, serial, fingerprint, subject, not_after FROM certificates
             WHERE tenant_id = $1 ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records an issued kubeconfig; `break_glass`: the reason of a break-glass one.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_kubeconfig(
        &self,
        tenant_id: i64,
        user: &str,
        groups: &[String],
        serial: &str,
        expires_at: OffsetDateTime,
        actor: &str,
        break_glass: Option<&str>,
    ) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        sqlx::query(
            "INSERT INTO kubeconfigs
               (tenant_id, username, groups, serial, expires_at, created_by, break_glass)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(tenant_id)
        .bind(user)
        .bind(groups)
        .bind(serial)
        .bind(expires_at)
        .bind(actor)
        .bind(break_glass.is_some())
        .execute(&mut *tx)
        .await?;
        let (action, detail) = match break_glass {
            None => (
                "kubeconfig.issue",
                serde_json::json!({"user": user, "groups": groups, "serial": serial}),
            ),
            Some(reason) => (
                "kubeconfig.break-glass",
                serde_json::json!({"user": user, "groups": groups, "serial": serial,
                    "expires_at": expires_at.format(&time::format_description::well_known::Rfc3339).ok(),
                    "reason": reason}),
            ),
        };
        audit_in(&mut tx, actor, action, Some(tenant_id), detail).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The kubeconfigs issued for a tenant, oldest first.
    pub async fn kubeconfigs(&self, tenant_id: i64) -> Result<Vec<KubeconfigRow>> {
        Ok(sqlx::query_as(
            "SELECT username, groups, serial, expires_at, created_by, created_at, revoked_at, break_glass
             FROM kubeconfigs WHERE tenant_id = $1 ORDER BY created_at, id",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Revokes one kubeconfig of a tenant, by serial, and audits it. `None` if the tenant has
    /// no kubeconfig of that serial; one already revoked keeps its first revocation time (and
    /// is not audited again).
    pub async fn revoke_kubeconfig(
        &self,
        tenant_id: i64,
        serial: &str,
        actor: &str,
    ) -> Result<Option<KubeconfigRow>> {
        self.revoke_where(tenant_id, Some(serial), None, actor)
            .await
            .map(|rows| rows.into_iter().next())
    }

    /// Revokes every kubeconfig issued to `user` in a tenant (already revoked ones too, which
    /// keep their time), and audits it; the user's kubeconfigs, oldest first.
    pub async fn revoke_user(
        &self,
        tenant_id: i64,
        user: &str,
        actor: &str,
    ) -> Result<Vec<KubeconfigRow>> {
        self.revoke_where(tenant_id, None, Some(user), actor).await
    }

    /// Revokes the tenant's kubeconfigs of one serial or of one user.
    async fn revoke_where(
        &self,
        tenant_id: i64,
        serial: Option<&str>,
        user: Option<&str>,
        actor: &str,
    ) -> Result<Vec<KubeconfigRow>> {
        let mut tx = self.pool.begin().await?;
        // Row locks first, so two revocations of one kubeconfig audit it once.
        let newly: Vec<String> = sqlx::query_scalar(
            "UPDATE kubeconfigs SET revoked_at = now()
             WHERE tenant_id = $1 AND ($2::text IS NULL OR serial = $2)
               AND ($3::text IS NULL OR username = $3) AND revoked_at IS NULL
               AND NOT break_glass
             RETURNING serial",
        )
        .bind(tenant_id)
        .bind(serial)
        .bind(user)
        .fetch_all(&mut *tx)
        .await?;
        let rows: Vec<KubeconfigRow> = sqlx::query_as(
            "SELECT username, groups, serial, expires_at, created_by, created_at, revoked_at, break_glass
             FROM kubeconfigs WHERE tenant_id = $1 AND ($2::text IS NULL OR serial = $2)
               AND ($3::text IS NULL OR username = $3)
             ORDER BY created_at, id",
        )
        .bind(tenant_id)
        .bind(serial)
        .bind(user)
        .fetch_all(&mut *tx)
        .await?;
        if !newly.is_empty() {
            let mut serials = newly;
            serials.sort();
            let (action, detail) = match user {
                Some(user) => (
                    "user.revoke",
                    serde_json::json!({"user": user, "serials": serials}),
                ),
                None => (
                    "kubeconfig.revoke",
                    serde_json::json!({"serial": serial, "user": rows.first().map(|r| &r.username)}),
                ),
            };
            audit_in(&mut tx, actor, action, Some(tenant_id), detail).await?;
        }
        tx.commit().await?;
        Ok(rows)
    }

    /// The serials of a tenant's revoked kubeconfigs that have not expired yet: what its
    /// apiserver must refuse (an expired certificate is refused anyway).
    pub async fn revoked_serials(&self, tenant_id: i64) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT serial FROM kubeconfigs
             WHERE tenant_id = $1 AND revoked_at IS NOT NULL AND expires_at > now()
             ORDER BY serial",
        )
        .bind(tenant_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// A tenant's live sudo kubeconfigs (neither revoked nor expired, with the group
    /// [`crate::access::SUDO_GROUP`]), by serial: the ones that keep a sudo role in the tenant.
    pub async fn live_sudoers(&self, tenant_id: i64) -> Result<Vec<crate::access::Sudoer>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT username, serial FROM kubeconfigs
             WHERE tenant_id = $1 AND revoked_at IS NULL AND expires_at > now()
               AND NOT break_glass AND $2 = ANY (groups)
             ORDER BY serial",
        )
        .bind(tenant_id)
        .bind(crate::access::SUDO_GROUP)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(user, serial)| crate::access::Sudoer { user, serial })
            .collect())
    }

    /// Every token (live and revoked), by name.
    pub async fn tokens(&self) -> Result<Vec<Token>> {
        Ok(sqlx::query_as(
            "SELECT id, name, role, created_at, revoked_at FROM api_tokens ORDER BY name",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Stores a token's hash; a duplicate name is [`Error::Duplicate`].
    pub async fn create_token(
        &self,
        name: &str,
        role: &str,
        hash: &[u8],
        actor: &str,
    ) -> Result<Token> {
        let mut tx = self.pool.begin().await?;
        let t: Token = sqlx::query_as(
            "INSERT INTO api_tokens (name, role, hash) VALUES ($1, $2, $3)
             RETURNING id, name, role, created_at, revoked_at",
        )
        .bind(name)
        .bind(role)
        .bind(hash)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match unique_violation(&e) {
            Some(_) => Error::Duplicate(name.to_owned()),
            None => Error::Database(e),
        })?;
        audit_in(
            &mut tx,
            actor,
            "token.create",
            None,
            serde_json::json!({"name": name, "role": role}),
        )
        .await?;
        tx.commit().await?;
        Ok(t)
    }

    /// The live token with this hash.
    pub async fn token_by_hash(&self, hash: &[u8]) -> Result<Option<Token>> {
        Ok(sqlx::query_as(
            "SELECT id, name, role, created_at, revoked_at FROM api_tokens
             WHERE hash = $1 AND revoked_at IS NULL",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// Revokes a token by name; false if there was no live one.
    pub async fn revoke_token(&self, name: &str, actor: &str) -> Result<bool> {
        let mut tx = self.pool.begin().await?;
        let r = sqlx::query(
            "UPDATE api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
        )
        .bind(name)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 1 {
            audit_in(
                &mut tx,
                actor,
                "token.revoke",
                None,
                serde_json::json!({"name": name}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    /// Makes `hash` the admin token named `name` (the configured admin token, or one vcp
    /// generated at its first start), and records in the audit trail, as `actor`, what changed.
    /// A configured token that was revoked stays revoked when it is configured again (a restart
    /// must not undo a revocation); a different one replaces it and is live.
    pub async fn ensure_admin_token(
        &self,
        name: &str,
        hash: &[u8],
        actor: &str,
    ) -> Result<AdminTokenChange> {
        let mut tx = self.pool.begin().await?;
        let stored: Option<(Vec<u8>, Option<OffsetDateTime>)> =
            sqlx::query_as("SELECT hash, revoked_at FROM api_tokens WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let change = match stored {
            None => AdminTokenChange::Created,
            Some((h, Some(_))) if h == hash => AdminTokenChange::StillRevoked,
            Some((h, None)) if h == hash => AdminTokenChange::Unchanged,
            Some(_) => AdminTokenChange::Replaced,
        };
        let action = match change {
            AdminTokenChange::Created => "token.admin-bootstrap",
            AdminTokenChange::Replaced => "token.admin-replace",
            AdminTokenChange::Unchanged | AdminTokenChange::StillRevoked => {
                tx.commit().await?;
                return Ok(change);
            }
        };
        sqlx::query(
            "INSERT INTO api_tokens (name, role, hash) VALUES ($1, 'admin', $2)
             ON CONFLICT (name) DO UPDATE SET hash = EXCLUDED.hash, role = 'admin', revoked_at = NULL",
        )
        .bind(name)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
        audit_in(
            &mut tx,
            actor,
            action,
            None,
            serde_json::json!({"name": name}),
        )
        .await?;
        tx.commit().await?;
        Ok(change)
    }

    /// Live tenants per phase.
    pub async fn phase_counts(&self) -> Result<Vec<(Phase, i64)>> {
        Ok(sqlx::query_as(
            "SELECT phase, count(*) FROM tenants WHERE deleted_at IS NULL GROUP BY phase ORDER BY phase",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Number of live admin tokens.
    pub async fn admin_tokens(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM api_tokens WHERE role = 'admin' AND revoked_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?)
    }

    /// Audit entries for a tenant, oldest first: (actor, action).
    pub async fn audit_trail(&self, tenant_id: i64) -> Result<Vec<(String, String)>> {
        Ok(
            sqlx::query_as("SELECT actor, action FROM audit WHERE tenant_id = $1 ORDER BY id")
                .bind(tenant_id)
                .fetch_all(&self.pool)
                .await?,
        )
    }

    /// Makes the live tenants with these keys due now, and wakes idle workers (`NOTIFY`) if
    /// that moved any; a tenant already due is left alone. Returns how many moved.
    pub async fn wake(&self, keys: &[String]) -> Result<u64> {
        let mut tx = self.pool.begin().await?;
        let moved = sqlx::query(
            "UPDATE tenants SET next_reconcile_at = now()
             WHERE key = ANY($1) AND deleted_at IS NULL AND next_reconcile_at > now()",
        )
        .bind(keys)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if moved > 0 {
            notify(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    /// Time until the next tenant is due (zero if one is due now), if any is scheduled.
    pub async fn next_due(&self) -> Result<Option<Duration>> {
        let secs: Option<f64> = sqlx::query_scalar(
            "SELECT GREATEST(0, EXTRACT(EPOCH FROM min(next_reconcile_at) - now()))::float8
             FROM tenants WHERE deleted_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await?;
        Ok(secs.map(Duration::from_secs_f64))
    }

    /// Ready tenants without a usage sample newer than `min_gap` (live ones only), by name:
    /// those a sampling round should count.
    pub async fn tenants_due_for_usage(&self, min_gap: Duration) -> Result<Vec<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t
             WHERE deleted_at IS NULL AND phase = $2 AND NOT EXISTS (
               SELECT 1 FROM usage_samples s
               WHERE s.tenant_id = t.id AND s.sampled_at > now() - make_interval(secs => $1))
             ORDER BY name"
        )))
        .bind(min_gap.as_secs_f64())
        .bind(Phase::Ready)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Records what a tenant held at `at`, unless it has a sample newer than `at - min_gap`
    /// already (another replica's round got there first; `Duration::ZERO` records unless one
    /// has exactly this instant). The check and the insert run under a per-tenant advisory
    /// lock, so two replicas never both record. Returns the stored time (Postgres keeps
    /// microseconds), or `None` if skipped.
    pub async fn record_usage(
        &self,
        tenant_id: i64,
        at: OffsetDateTime,
        used: &Usage,
        min_gap: Duration,
    ) -> Result<Option<OffsetDateTime>> {
        let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut tx = self.pool.begin().await?;
        sqlx::query("SELECT pg_advisory_xact_lock($1, ($2 % 2147483647)::int4)")
            .bind(USAGE_LOCK)
            .bind(tenant_id)
            .execute(&mut *tx)
            .await?;
        let stored: Option<OffsetDateTime> = sqlx::query_scalar(
            "INSERT INTO usage_samples (tenant_id, sampled_at, pods, requests_cpu, requests_memory,
               limits_cpu, limits_memory, services, persistent_volume_claims, requests_storage, namespaces)
             SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11
             WHERE NOT EXISTS (
               SELECT 1 FROM usage_samples
               WHERE tenant_id = $1 AND sampled_at > $2 - make_interval(secs => $12))
             ON CONFLICT (tenant_id, sampled_at) DO NOTHING
             RETURNING sampled_at",
        )
        .bind(tenant_id)
        .bind(at)
        .bind(n(used.pods))
        .bind(n(used.requests_cpu))
        .bind(n(used.requests_memory))
        .bind(n(used.limits_cpu))
        .bind(n(used.limits_memory))
        .bind(n(used.services))
        .bind(n(used.persistent_volume_claims))
        .bind(n(used.requests_storage))
        .bind(n(used.namespaces))
        .bind(min_gap.as_secs_f64())
        .fetch_optional(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(stored)
    }

    /// The latest usage sample of each of these tenants that has one.
    pub async fn latest_usage(&self, tenant_ids: &[i64]) -> Result<BTreeMap<i64, UsageSample>> {
        // One index probe per tenant (a backward scan of the primary key), however many
        // samples each has.
        let rows: Vec<UsageRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {USAGE_COLUMNS} FROM unnest($1::bigint[]) AS t (id)
             CROSS JOIN LATERAL (
               SELECT * FROM usage_samples s WHERE s.tenant_id = t.id
               ORDER BY s.sampled_at DESC LIMIT 1) latest"
        )))
        .bind(tenant_ids)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(|r| (r.tenant_id, r.sample())).collect())
    }

    /// A tenant's samples with `since <= sampled_at < until`, oldest first, at most `limit`.
    pub async fn usage_between(
        &self,
        tenant_id: i64,
        since: OffsetDateTime,
        until: OffsetDateTime,
        limit: u32,
    ) -> Result<Vec<UsageSample>> {
        let rows: Vec<UsageRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {USAGE_COLUMNS} FROM usage_samples
             WHERE tenant_id = $1 AND sampled_at >= $2 AND sampled_at < $3
             ORDER BY sampled_at LIMIT $4"
        )))
        .bind(tenant_id)
        .bind(since)
        .bind(until)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(UsageRow::sample).collect())
    }

    /// Deletes every tenant's samples older than `before` (retention); how many went.
    pub async fn prune_usage(&self, before: OffsetDateTime) -> Result<u64> {
        let r = sqlx::query("DELETE FROM usage_samples WHERE sampled_at < $1")
            .bind(before)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// A listener on [`CHANNEL`].
    pub async fn listener(&self) -> Result<PgListener> {
        let mut l = PgListener::connect_with(&self.pool).await?;
        l.listen(CHANNEL).await?;
        Ok(l)
    }
}

/// Starts an upgrade inside `tx` (see [`Inventory::start_upgrade`]): the tenant `tenant_id`
/// must be live, Ready, on `from`, (`owner`'s, if given) and not moved by another upgrade.
/// `requested_by` is what the upgrade shows as its origin; `actor` is the audit's.
pub(crate) async fn start_upgrade_in(
    tx: &mut sqlx::PgConnection,
    tenant_id: i64,
    from: &str,
    owner: Option<&str>,
    u: &NewUpgrade,
    requested_by: &str,
    actor: &str,
) -> Result<Option<(Tenant, UpgradeRow)>> {
    // The phase check and the phase switch are one statement, so two requests racing for
    // one tenant cannot both pass it; the unique index catches what else could. The version
    // stays until the hop's snapshot is taken.
    let row: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET phase = $4, generation = generation + 1,
           next_reconcile_at = now(), updated_at = now()
         WHERE id = $1 AND deleted_at IS NULL AND desired = $5 AND phase = $6
           AND version = $3 AND ($2::text IS NULL OR owner = $2)
           AND ($8::text IS NULL OR release = $8)
           AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                           WHERE tenant_id = $1 AND state = ANY($7))
           AND NOT EXISTS (SELECT 1 FROM etcd_restores
                           WHERE tenant_id = $1 AND state = 'Running')
         RETURNING {TENANT_COLUMNS}"
    )))
    .bind(tenant_id)
    .bind(owner)
    .bind(from)
    .bind(Phase::Upgrading)
    .bind(Desired::Present)
    .bind(Phase::Ready)
    .bind(UpgradeState::active_names())
    .bind(&u.expect_release)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        return Ok(None);
    };
    let up: UpgradeRow = sqlx::query_as(
        "INSERT INTO tenant_upgrades
           (tenant_id, from_version, target_version, chain, hop_from, hop_to, state,
            requested_by, hop_from_release, hop_to_release)
         VALUES ($1, $2, $3, $4, $2, $5, $6, $7, $8, $9)
         RETURNING *",
    )
    .bind(tenant_id)
    .bind(from)
    .bind(&u.target)
    .bind(u.chain)
    .bind(&u.first_hop)
    .bind(UpgradeState::Snapshotting)
    .bind(requested_by)
    .bind(&row.release)
    .bind(&u.to_release)
    .fetch_one(&mut *tx)
    .await?;
    let (up, snapshot) = snapshots::snapshot_hop(&mut *tx, &row, up.id, actor).await?;
    audit_in(
        &mut *tx,
        actor,
        "tenant.upgrade.start",
        Some(tenant_id),
        serde_json::json!({"upgrade": up.id, "from": from, "to": u.target,
            "chain": u.chain, "hop": u.first_hop, "requested_by": requested_by,
            "from_release": row.release, "to_release": u.to_release,
            "snapshot": snapshot}),
    )
    .await?;
    notify(&mut *tx).await?;
    Ok(Some((row, up)))
}

/// Makes the fleet upgrade that started tenant upgrade `upgrade` (if one did) due at once and
/// wakes the workers: its entry's end is recorded, and the slot refilled, by the next step
/// rather than at the fleet worker's poll. A step running under a lease meanwhile keeps it
/// due: [`Inventory::claim_fleet`](crate::upgrade::store) moves `next_step_at` to the lease's end, and
/// `Inventory::release_fleet` keeps the earlier of that and its own wake-up.
async fn fleet_due_now(tx: &mut sqlx::PgConnection, upgrade: i64) -> Result<()> {
    let r = sqlx::query(
        "UPDATE fleet_upgrades SET next_step_at = now()
         WHERE id IN (SELECT fleet_id FROM fleet_upgrade_tenants WHERE upgrade_id = $1)
           AND next_step_at > now()",
    )
    .bind(upgrade)
    .execute(&mut *tx)
    .await?;
    if r.rows_affected() > 0 {
        notify(tx).await?;
    }
    Ok(())
}

pub(crate) async fn notify(tx: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(tx)
        .await?;
    Ok(())
}

/// Writes what a pass means for an upgrade: the upgrade's row (and the next hop's snapshot
/// request), and the tenant's version when a hop starts or rolls back (due again at once, so
/// the next pass rolls the new version).
async fn apply_transition(
    tx: &mut sqlx::PgConnection,
    tenant: i64,
    upgrade: i64,
    tr: &Transition,
    actor: &str,
) -> Result<()> {
    let (state, reason, hop): (UpgradeState, Option<&str>, Option<&str>) = match tr {
        Transition::Wait(_) => return Ok(()),
        Transition::StartHop => (UpgradeState::Running, None, None),
        Transition::Abort(why) => (UpgradeState::RolledBack, Some(why), None),
        Transition::NextHop { to, .. } => (UpgradeState::Snapshotting, None, Some(to)),
        Transition::Succeeded => (UpgradeState::Succeeded, None, None),
        Transition::RollBack { reason, .. } => (UpgradeState::RollingBack, Some(reason), None),
        Transition::RolledBack => (UpgradeState::RolledBack, None, None),
    };
    let row: Option<UpgradeRow> = sqlx::query_as(
        "UPDATE tenant_upgrades SET state = $3,
           reason = COALESCE($4, reason),
           hop_from = CASE WHEN $5::text IS NULL THEN hop_from ELSE hop_to END,
           hop_to = COALESCE($5, hop_to),
           hop_from_release = CASE WHEN $5::text IS NULL THEN hop_from_release
             ELSE (SELECT release FROM tenants WHERE id = $2) END,
           hop_to_release = CASE WHEN $5::text IS NULL THEN hop_to_release END,
           hop_started_at = CASE WHEN $5::text IS NULL AND $3 <> 'Running' THEN hop_started_at
             ELSE now() END,
           finished_at = CASE WHEN $3 IN ('Succeeded', 'RolledBack') THEN now() END
         WHERE id = $1 AND tenant_id = $2 AND state = ANY($6)
         RETURNING *",
    )
    .bind(upgrade)
    .bind(tenant)
    .bind(state)
    .bind(reason)
    .bind(hop)
    .bind(UpgradeState::active_names())
    .fetch_optional(&mut *tx)
    .await?;
    let Some(row) = row else {
        // Finished by someone else meanwhile: nothing of ours to write.
        return Ok(());
    };
    if !row.state.active() {
        // The upgrade ended: a fleet upgrade that started it has a slot free (or a wave
        // done) now, so it is due at once instead of at its next poll.
        fleet_due_now(&mut *tx, row.id).await?;
    }
    if matches!(tr, Transition::NextHop { .. }) {
        let t: Tenant = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE id = $1"
        )))
        .bind(tenant)
        .fetch_one(&mut *tx)
        .await?;
        snapshots::snapshot_hop(&mut *tx, &t, row.id, actor).await?;
    }
    // The version the control plane runs next: the started hop's end, or the rollback's
    // target, each with its release (a hop between minors goes to the release the catalog
    // this replica serves names for the new minor).
    let version = match tr {
        Transition::StartHop => Some((row.hop_to.as_str(), row.hop_to_release.as_deref())),
        Transition::RollBack { .. } => {
            Some((row.hop_from.as_str(), row.hop_from_release.as_deref()))
        }
        _ => None,
    };
    if let Some((v, release)) = version {
        sqlx::query(
            "UPDATE tenants SET version = $2,
               release = COALESCE($3, (SELECT kubernetes FROM versions WHERE minor = $2)),
               next_reconcile_at = now(), updated_at = now()
             WHERE id = $1",
        )
        .bind(tenant)
        .bind(v)
        .bind(release)
        .execute(&mut *tx)
        .await?;
    }
    if let Transition::RollBack {
        restore: Some((snapshot, why)),
        ..
    } = tr
    {
        snapshots::restore_for_rollback(&mut *tx, tenant, &row, *snapshot, why, actor).await?;
    }
    let action = match tr {
        Transition::StartHop => "tenant.upgrade.hop-started",
        Transition::Abort(_) => "tenant.upgrade.aborted",
        Transition::NextHop { .. } => "tenant.upgrade.hop",
        Transition::Succeeded => "tenant.upgrade.succeeded",
        Transition::RollBack { .. } => "tenant.upgrade.rollback",
        _ => "tenant.upgrade.rolled-back",
    };
    audit_in(
        tx,
        actor,
        action,
        Some(tenant),
        serde_json::json!({"upgrade": upgrade, "hop_from": row.hop_from, "hop_to": row.hop_to,
            "reason": row.reason}),
    )
    .await
}

/// What [`Inventory::ensure_admin_token`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminTokenChange {
    /// There was none of that name: created.
    Created,
    /// Another secret was stored under the name: replaced, and live.
    Replaced,
    /// The same secret, live: nothing changed.
    Unchanged,
    /// The same secret, revoked: it stays revoked.
    StillRevoked,
}

pub(crate) async fn audit_in(
    tx: &mut sqlx::PgConnection,
    actor: &str,
    action: &str,
    tenant_id: Option<i64>,
    detail: serde_json::Value,
) -> Result<()> {
    sqlx::query("INSERT INTO audit (actor, action, tenant_id, detail) VALUES ($1, $2, $3, $4)")
        .bind(actor)
        .bind(action)
        .bind(tenant_id)
        .bind(Json(detail))
        .execute(tx)
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::USAGE_COLUMNS;
    use vcp_core::quota::RESOURCES;

    /// The columns of `usage_samples` after its key, in order, as the migration creates them.
    fn migration_columns(sql: &str) -> Vec<&str> {
        let table = sql
            .split("CREATE TABLE usage_samples (")
            .nth(1)
            .and_then(|rest| rest.split("PRIMARY KEY").next())
            .expect("the migration creates usage_samples");
        table
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with("--"))
            .filter_map(|l| l.split_whitespace().next())
            .collect()
    }

    /// One list of quota resources (vcp-core's) for the plans, the syncer's ledger and metrics,
    /// and the inventory: the table's columns and the queries' are that list.
    #[test]
    fn usage_columns_are_the_quota_resources_in_the_migration_and_the_queries() {
        let sql = include_str!("../../../migrations/0002_usage.sql");
        let mut want = vec!["tenant_id", "sampled_at"];
        want.extend(RESOURCES);
        assert_eq!(migration_columns(sql), want);
        let queried: Vec<&str> = USAGE_COLUMNS.split(',').map(str::trim).collect();
        assert_eq!(queried, want);
    }
}
