//! The inventory's part of sleeping tenants: what was asked (`tenants.sleep`, audited, the
//! workers woken), the gateway's activity reports (`tenants.active_at`), and the tenants the
//! idle sweep looks at.

use crate::Result;
use crate::inventory::{Inventory, TENANT_COLUMNS, Tenant, commit_work};
use time::OffsetDateTime;
use vcp_core::lifecycle::{Desired, Phase, Sleep, UpgradeState};

/// What a sleep or wake request did.
#[derive(Debug, Clone)]
pub enum Asked {
    /// Recorded; the tenant's next pass (due now) acts on it.
    Changed(Box<Tenant>),
    /// It was already asked for.
    Unchanged(Box<Tenant>),
    /// Put to sleep: only a Ready tenant with nothing else moving it (an upgrade, a restore
    /// or a rotation) goes to sleep.
    Busy(Phase),
    /// Gone, or being deleted.
    Gone,
}

impl Inventory {
    /// Asks tenant `t` to sleep or wake (by id: an admin's name may match several owners'),
    /// for `why` (an owner, the gateway, the idle sweep), audited as `tenant.sleep` or
    /// `tenant.wake`. A wake is always taken while the tenant is present; a sleep only as
    /// [`Asked::Busy`] says. Taken under the tenant's row lock, so a wake racing a delete either
    /// lands before it (and the deletion then tears the woken tenant down) or finds it gone.
    pub async fn ask_sleep(&self, t: &Tenant, to: Sleep, actor: &str, why: &str) -> Result<Asked> {
        let mut tx = self.pool().begin().await?;
        let current: Option<Tenant> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants
             WHERE id = $1 AND deleted_at IS NULL AND desired = $2 FOR UPDATE"
        )))
        .bind(t.id)
        .bind(Desired::Present)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(current) = current else {
            return Ok(Asked::Gone);
        };
        if current.sleep == to {
            return Ok(Asked::Unchanged(Box::new(current)));
        }
        if to == Sleep::Asleep {
            let busy: bool = sqlx::query_scalar(
                "SELECT EXISTS (SELECT 1 FROM tenant_upgrades WHERE tenant_id = $1 AND state = ANY($2))
                     OR EXISTS (SELECT 1 FROM etcd_restores WHERE tenant_id = $1 AND state = 'Running')
                     OR EXISTS (SELECT 1 FROM rotations WHERE tenant_id = $1 AND finished_at IS NULL)",
            )
            .bind(t.id)
            .bind(UpgradeState::active_names())
            .fetch_one(&mut *tx)
            .await?;
            if busy || current.phase != Phase::Ready {
                return Ok(Asked::Busy(current.phase));
            }
        }
        // A new generation, so that a pass holding the tenant now (the sleep pass that just
        // saw the last pod go) does not put the change off until its own requeue
        // (`Inventory::finish`).
        let changed: Tenant = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "UPDATE tenants SET sleep = $2, next_reconcile_at = now(), updated_at = now(),
                 generation = generation + 1,
                 active_at = CASE WHEN $2 = 'awake' THEN now() ELSE active_at END
             WHERE id = $1 RETURNING {TENANT_COLUMNS}"
        )))
        .bind(t.id)
        .bind(to)
        .fetch_one(&mut *tx)
        .await?;
        let action = match to {
            Sleep::Asleep => "tenant.sleep",
            Sleep::Awake => "tenant.wake",
        };
        commit_work(
            tx,
            actor,
            action,
            Some(t.id),
            serde_json::json!({"why": why}),
        )
        .await?;
        Ok(Asked::Changed(Box::new(changed)))
    }

    /// The live tenant with key `key` (keys are unique and never reused), for the gateway,
    /// which knows tenants only by key.
    pub async fn tenant_by_key(&self, key: &str) -> Result<Option<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants WHERE key = $1 AND deleted_at IS NULL"
        )))
        .bind(key)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Records the gateway's report: when each tenant (by key) last had a connection. One
    /// statement for the whole report; an older time than the one recorded (another replica's
    /// report arriving late) moves nothing. Unknown keys are ignored. Returns how many tenants
    /// moved.
    pub async fn record_activity(&self, seen: &[(String, OffsetDateTime)]) -> Result<u64> {
        let (keys, at): (Vec<&str>, Vec<OffsetDateTime>) =
            seen.iter().map(|(k, t)| (k.as_str(), *t)).unzip();
        Ok(sqlx::query(
            "UPDATE tenants t SET active_at = r.at
             FROM unnest($1::text[], $2::timestamptz[]) AS r(key, at)
             WHERE t.key = r.key AND t.deleted_at IS NULL
               AND (t.active_at IS NULL OR t.active_at < r.at)",
        )
        .bind(keys)
        .bind(at)
        .execute(self.pool())
        .await?
        .rows_affected())
    }

    /// Tenants the idle sweep may put to sleep: present, awake, Ready, nothing else moving
    /// them. Whether their plan sleeps and whether they are idle is the sweep's to decide.
    pub async fn sleep_candidates(&self) -> Result<Vec<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t
             WHERE deleted_at IS NULL AND desired = $1 AND sleep = $2 AND phase = $3
               AND NOT EXISTS (SELECT 1 FROM tenant_upgrades u
                               WHERE u.tenant_id = t.id AND u.state = ANY($4))
               AND NOT EXISTS (SELECT 1 FROM etcd_restores r
                               WHERE r.tenant_id = t.id AND r.state = 'Running')
               AND NOT EXISTS (SELECT 1 FROM rotations o
                               WHERE o.tenant_id = t.id AND o.finished_at IS NULL)
             ORDER BY id"
        )))
        .bind(Desired::Present)
        .bind(Sleep::Awake)
        .bind(Phase::Ready)
        .bind(UpgradeState::active_names())
        .fetch_all(self.pool())
        .await?)
    }
}

/// The name of the gateway's token: `vcp:` is never an owner's (owner names are tenant-name
/// shaped), so it cannot collide with one.
pub const GATEWAY_TOKEN_NAME: &str = "vcp:gateway";

impl Inventory {
    /// Makes `hash` the gateway's token (role `gateway`, [`GATEWAY_TOKEN_NAME`]), replacing a
    /// different one, audited when it changes; nothing when it is already the one.
    pub async fn ensure_gateway_token(&self, hash: &[u8], actor: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let stored: Option<Vec<u8>> = sqlx::query_scalar(
            "SELECT hash FROM api_tokens WHERE name = $1 AND revoked_at IS NULL FOR UPDATE",
        )
        .bind(GATEWAY_TOKEN_NAME)
        .fetch_optional(&mut *tx)
        .await?;
        if stored.as_deref() == Some(hash) {
            tx.commit().await?;
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO api_tokens (name, role, hash) VALUES ($1, $2, $3)
             ON CONFLICT (name) DO UPDATE SET hash = EXCLUDED.hash, role = EXCLUDED.role,
                 revoked_at = NULL",
        )
        .bind(GATEWAY_TOKEN_NAME)
        .bind(crate::http::auth::GATEWAY_ROLE)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
        crate::inventory::audit_in(
            &mut tx,
            actor,
            "token.gateway-set",
            None,
            serde_json::json!({}),
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }
}
