//! The Postgres inventory: one [`Inventory`] over the pool, with the tenants every feature
//! reads.
//!
//! This file holds the tenants (create, list, claim, tombstone), the caller a token speaks for
//! ([`Token`]), and the steps every feature's writes share: row leases (`FOR UPDATE SKIP
//! LOCKED`) for reconcile work, the audit trail (`audit_in`, in the writing transaction),
//! `NOTIFY vcp_tenants` (`notify`) so idle replicas wake at once instead of at their next
//! poll, and `commit_work` and `due_if_present`, the write most features end with. Each
//! feature keeps its own tables' SQL in its folder (`crate::snapshots::store`,
//! `crate::upgrades::store`, ...), on this pool; the pass's write-back, which joins a tenant's
//! update to its upgrade's and restore's, is [`crate::provision`]'s.

use crate::render::catalog::Catalog;
use crate::window::MaintenanceWindow;
use crate::{Error, Result};
use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};
use sqlx::types::Json;
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::{AutoUpdate, Condition, Desired, FleetUpgrades, Phase, Sleep};
use vcp_core::naming::TenantKey;

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
    /// Whether its control plane should run ([`crate::sleep`]).
    pub sleep: Sleep,
    /// The gateway's last report of a connection for it (`None`: never seen).
    pub active_at: Option<OffsetDateTime>,
    /// A clone's copy of the snapshot it was created from, restored once it is up
    /// (`migrations/0018_clones.sql`); `None` for a tenant created empty.
    pub seed_snapshot_id: Option<i64>,
    /// The tenant's own backup schedule in place of its plan's (`migrations/0019`).
    pub backups: Option<Json<crate::backup_store::BackupPlan>>,
    /// When its next pass is due, as read. A pass compares it at its end
    /// ([`Inventory::finish`]): a later one means something made the tenant due meanwhile.
    pub next_reconcile_at: OffsetDateTime,
    /// When a pass first found it Ready (`None`: never yet). From then on its CA and
    /// endpoint exist for good, whatever a later pass finds (`migrations/0021`).
    pub first_ready_at: Option<OffsetDateTime>,
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
    /// `Some(None)`: back to the plan's schedule.
    pub backups: Option<Option<crate::backup_store::BackupPlan>>,
}

impl TenantSettings {
    pub fn is_empty(&self) -> bool {
        self.maintenance_window.is_none()
            && self.fleet_upgrades.is_none()
            && self.auto_update.is_none()
            && self.backups.is_none()
    }
}

/// The leases [`Inventory::release_leases_of`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Released {
    pub tenants: u64,
    pub fleet_upgrades: u64,
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

pub(crate) const TENANT_COLUMNS: &str = "id, name, key, owner, labels, version, plan, desired, retain_data, \
     phase, conditions, endpoint, generation, observed_generation, created_at, updated_at, deleted_at, \
     maintenance_window, fleet_upgrades, auto_update, release, sleep, active_at, seed_snapshot_id, backups, \
     next_reconcile_at, first_ready_at";

/// Inserts a new tenant's row, in the caller's transaction: a live tenant of the same name and
/// owner is a [`Error::Duplicate`], a key taken already a [`Error::KeyCollision`].
pub(crate) async fn insert_tenant(tx: &mut sqlx::PgConnection, t: &NewTenant) -> Result<Tenant> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
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
    })
}

/// What the audit trail's `tenant.create` says of a new tenant.
pub(crate) fn creation(t: &NewTenant) -> serde_json::Value {
    serde_json::json!({"name": t.name, "key": t.key, "version": t.version, "plan": t.plan,
        "release": t.release, "maintenance_window": t.maintenance_window,
        "fleet_upgrades": t.fleet_upgrades, "auto_update": t.auto_update})
}

pub(crate) fn unique_violation(e: &sqlx::Error) -> Option<String> {
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
    pool: PgPool,
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
        let row = insert_tenant(&mut tx, t).await?;
        commit_work(tx, actor, "tenant.create", Some(row.id), creation(t)).await?;
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
               auto_update = CASE WHEN $6 THEN $7 ELSE auto_update END,
               backups = CASE WHEN $8 THEN $9 ELSE backups END, updated_at = now()
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
        .bind(s.backups.is_some())
        .bind(s.backups.flatten().map(Json))
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = &row {
            audit_in(
                &mut tx,
                actor,
                "tenant.settings",
                Some(row.id),
                serde_json::json!({"maintenance_window": row.maintenance_window,
                    "fleet_upgrades": row.fleet_upgrades, "auto_update": row.auto_update,
                    "backups": row.backups}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(row)
    }

    /// Changes a Ready tenant's plan in place (for `owner`'s own only, if given; nothing else
    /// moving it), audits it and wakes the workers, whose next pass renders the control plane
    /// and the syncer's policy from it. `None` if the tenant is gone, changed meanwhile, or
    /// something else moves it.
    pub async fn change_plan(
        &self,
        t: &Tenant,
        owner: Option<&str>,
        to: &str,
        actor: &str,
    ) -> Result<Option<Tenant>> {
        let mut tx = self.pool.begin().await?;
        let row: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET plan = $4, generation = generation + 1,
               next_reconcile_at = now(), updated_at = now()
             WHERE id = $1 AND deleted_at IS NULL AND ($2::text IS NULL OR owner = $2)
               AND plan = $3 AND phase = $5
               AND NOT EXISTS (SELECT 1 FROM tenant_upgrades
                               WHERE tenant_id = $1 AND state = ANY($6))
               AND NOT EXISTS (SELECT 1 FROM etcd_restores
                               WHERE tenant_id = $1 AND state = 'Running')
             RETURNING {TENANT_COLUMNS}"
        )))
        .bind(t.id)
        .bind(owner)
        .bind(&t.plan)
        .bind(to)
        .bind(Phase::Ready)
        .bind(vcp_core::lifecycle::UpgradeState::active_names())
        .fetch_optional(&mut *tx)
        .await?;
        if let Some(row) = &row {
            audit_in(
                &mut tx,
                actor,
                "tenant.plan",
                Some(row.id),
                serde_json::json!({"from": t.plan, "to": to}),
            )
            .await?;
            notify(&mut tx).await?;
        }
        tx.commit().await?;
        Ok(row)
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

    /// Live tenants per phase.
    pub async fn phase_counts(&self) -> Result<Vec<(Phase, i64)>> {
        Ok(sqlx::query_as(
            "SELECT phase, count(*) FROM tenants WHERE deleted_at IS NULL GROUP BY phase ORDER BY phase",
        )
        .fetch_all(&self.pool)
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

    /// A listener on [`CHANNEL`].
    pub async fn listener(&self) -> Result<PgListener> {
        let mut l = PgListener::connect_with(&self.pool).await?;
        l.listen(CHANNEL).await?;
        Ok(l)
    }
}

pub(crate) async fn notify(tx: &mut sqlx::PgConnection) -> Result<()> {
    sqlx::query("SELECT pg_notify($1, '')")
        .bind(CHANNEL)
        .execute(tx)
        .await?;
    Ok(())
}

/// The last steps of a transaction whose change gives the workers something to do: its audit
/// entry, `NOTIFY` (Postgres delivers it at commit, so no worker wakes before the change is
/// visible), then the commit. One helper, so no such write forgets its audit or its wake-up.
pub(crate) async fn commit_work(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    actor: &str,
    action: &str,
    tenant_id: Option<i64>,
    detail: serde_json::Value,
) -> Result<()> {
    audit_in(&mut tx, actor, action, tenant_id, detail).await?;
    notify(&mut tx).await?;
    tx.commit().await?;
    Ok(())
}

/// Locks a live tenant that is to be present and makes it due at once, so the change the
/// caller writes next runs in the next pass; `None` when it is gone or being deleted
/// meanwhile. By id, not by name: an admin's name may match several owners' tenants.
pub(crate) async fn due_if_present(tx: &mut sqlx::PgConnection, id: i64) -> Result<Option<Tenant>> {
    Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "UPDATE tenants SET next_reconcile_at = now()
         WHERE id = $1 AND deleted_at IS NULL AND desired = $2
         RETURNING {TENANT_COLUMNS}"
    )))
    .bind(id)
    .bind(Desired::Present)
    .fetch_optional(tx)
    .await?)
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
