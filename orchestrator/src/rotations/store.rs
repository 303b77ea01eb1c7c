//! Rotations of a tenant's CAs and service-account key in the inventory
//! (`migrations/0010_rotations.sql`): started by an admin through the API, advanced phase by
//! phase by the tenant's reconcile pass ([`crate::pki::rotation`]), each step audited.

use crate::Result;
use crate::inventory::{Inventory, Tenant, audit_in, commit_work, due_if_present};
use crate::kubeconfigs::store::KubeconfigRow;
use crate::pki::rotation::{Phase, Target};
use time::OffsetDateTime;

/// One rotation, as stored.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct RotationRow {
    pub id: i64,
    pub tenant_id: i64,
    pub target: String,
    pub phase: String,
    pub overlap_seconds: i64,
    pub requested_by: String,
    pub created_at: OffsetDateTime,
    pub phase_since: OffsetDateTime,
    pub signing_since: Option<OffsetDateTime>,
    pub finished_at: Option<OffsetDateTime>,
}

impl RotationRow {
    /// The target and phase, which the table's CHECKs keep to known names.
    pub fn parsed(&self) -> Option<(Target, Phase)> {
        Some((self.target.parse().ok()?, self.phase.parse().ok()?))
    }

    pub fn overlap(&self) -> time::Duration {
        time::Duration::seconds(self.overlap_seconds)
    }
}

/// Why a rotation could not start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartRefused {
    /// The tenant is being deleted (or is gone).
    NotPresent,
    /// Another rotation of the tenant is under way.
    InProgress(RotationRow),
}

impl Inventory {
    /// Starts a rotation of `target` for tenant `t` in phase `trust`, makes the tenant due at
    /// once, and audits it.
    pub async fn start_rotation(
        &self,
        t: &Tenant,
        target: Target,
        overlap: time::Duration,
        actor: &str,
    ) -> Result<std::result::Result<RotationRow, StartRefused>> {
        let mut tx = self.pool().begin().await?;
        if due_if_present(&mut tx, t.id).await?.is_none() {
            return Ok(Err(StartRefused::NotPresent));
        }
        let active: Option<RotationRow> =
            sqlx::query_as("SELECT * FROM rotations WHERE tenant_id = $1 AND finished_at IS NULL")
                .bind(t.id)
                .fetch_optional(&mut *tx)
                .await?;
        if let Some(r) = active {
            return Ok(Err(StartRefused::InProgress(r)));
        }
        // The unique index settles a race between two requests: the loser's insert fails and
        // its transaction rolls back (answered as a database error, which is retried).
        let row: RotationRow = sqlx::query_as(
            "INSERT INTO rotations (tenant_id, target, phase, overlap_seconds, requested_by)
             VALUES ($1, $2, $3, $4, $5) RETURNING *",
        )
        .bind(t.id)
        .bind(target.as_str())
        .bind(Phase::Trust.as_str())
        .bind(overlap.whole_seconds())
        .bind(actor)
        .fetch_one(&mut *tx)
        .await?;
        commit_work(
            tx,
            actor,
            "tenant.rotate",
            Some(t.id),
            serde_json::json!({"rotation": row.id, "target": target.as_str(),
                "overlap_seconds": row.overlap_seconds}),
        )
        .await?;
        Ok(Ok(row))
    }

    /// The rotation under way for a tenant, if any.
    pub async fn active_rotation(&self, tenant_id: i64) -> Result<Option<RotationRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM rotations WHERE tenant_id = $1 AND finished_at IS NULL")
                .bind(tenant_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    /// A tenant's rotations, newest first.
    pub async fn rotations(&self, tenant_id: i64) -> Result<Vec<RotationRow>> {
        Ok(
            sqlx::query_as("SELECT * FROM rotations WHERE tenant_id = $1 ORDER BY id DESC")
                .bind(tenant_id)
                .fetch_all(self.pool())
                .await?,
        )
    }

    /// Moves rotation `r` from its phase to `to` (done: finished), audited as the reconciler
    /// `actor`. `false` if another replica moved it first: nothing is written then.
    pub async fn advance_rotation(
        &self,
        r: &RotationRow,
        to: Phase,
        actor: &str,
        now: OffsetDateTime,
    ) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let moved = sqlx::query(
            "UPDATE rotations SET phase = $3, phase_since = $4,
                 signing_since = CASE WHEN $3 = 'sign' THEN $4 ELSE signing_since END,
                 finished_at = CASE WHEN $3 = 'done' THEN $4 ELSE NULL END
             WHERE id = $1 AND phase = $2 AND finished_at IS NULL",
        )
        .bind(r.id)
        .bind(&r.phase)
        .bind(to.as_str())
        .bind(now)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            == 1;
        if moved {
            audit_in(
                &mut tx,
                actor,
                if to == Phase::Done {
                    "tenant.rotate.done"
                } else {
                    "tenant.rotate.phase"
                },
                Some(r.tenant_id),
                serde_json::json!({"rotation": r.id, "target": r.target,
                    "from": r.phase, "to": to.as_str()}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(moved)
    }

    /// The kubeconfigs a `ca` rotation ends when its serving certificate moves to the new CA
    /// (phase `serve`): unrevoked, unexpired ones issued before it began signing with the new
    /// CA, which hold only the old one. Empty for other targets.
    pub async fn to_reissue(&self, r: &RotationRow) -> Result<Vec<KubeconfigRow>> {
        if r.target != Target::Ca.as_str() {
            return Ok(Vec::new());
        }
        Ok(sqlx::query_as(
            "SELECT username, groups, serial, expires_at, created_by, created_at, revoked_at, break_glass
             FROM kubeconfigs
             WHERE tenant_id = $1 AND revoked_at IS NULL AND expires_at > now()
               AND created_at < COALESCE($2, now())
             ORDER BY created_at, id",
        )
        .bind(r.tenant_id)
        .bind(r.signing_since)
        .fetch_all(self.pool())
        .await?)
    }
}
