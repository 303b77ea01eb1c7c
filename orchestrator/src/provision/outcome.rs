//! What a pass leaves behind, written back in one transaction: the tenant's phase, conditions
//! and endpoint, its upgrade's transition and its restore's state. It sits with the pass
//! because it joins the tenant's row to the upgrade's and the restore's tables.

use crate::Result;
use crate::inventory::{Inventory, Tenant, audit_in};
use crate::lifecycle::upgrade::Transition;
use crate::snapshots::store::{NewRestore, apply_restore};
use crate::upgrades::store::apply_transition;
use sqlx::types::Json;
use std::time::Duration;
use vcp_core::lifecycle::{Condition, Phase};

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

impl Inventory {
    /// Writes a pass's outcome and releases the lease. A generation bumped by the API during
    /// the pass is kept (the pass reports the generation it saw), so the change is not lost:
    /// the phase the API set stays (a deletion stays `Deleting`) and the tenant is due at once
    /// instead of at the stale outcome's requeue time. So is a tenant made due during the pass
    /// by anything else (a snapshot or a restore asked for): its `next_reconcile_at` moved
    /// past the one the claim read. Returns false if the lease had been lost.
    pub async fn finish(&self, t: &Tenant, worker: &str, o: &Outcome, actor: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let phase: Option<Phase> = sqlx::query_scalar(
            "UPDATE tenants SET
               phase = CASE WHEN generation > $6 THEN phase ELSE $3 END,
               conditions = $4, endpoint = $5,
               observed_generation = GREATEST(observed_generation, $6),
               first_ready_at = CASE WHEN first_ready_at IS NULL AND generation <= $6
                 AND $3 = 'Ready' THEN now() ELSE first_ready_at END,
               next_reconcile_at = CASE WHEN generation > $6 OR next_reconcile_at > $8 THEN now()
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
        .bind(t.next_reconcile_at)
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
            apply_restore(&mut tx, t.id, *id, r, actor).await?;
        }
        tx.commit().await?;
        Ok(true)
    }
}
