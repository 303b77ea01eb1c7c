//! Quota usage samples in the inventory (`usage_samples`), for billing and the usage API.
//!
//! Data flow: the sampler in `crate::usage` asks which tenants are due
//! ([`Inventory::tenants_due_for_usage`]), counts their host objects and records one row per
//! tenant ([`Inventory::record_usage`], under an advisory lock per tenant so replicas never
//! record twice within the gap); the API reads the latest sample and time ranges back, and old
//! samples are pruned by age.

use crate::Result;
use crate::inventory::{Inventory, TENANT_COLUMNS, Tenant};
use std::collections::BTreeMap;
use std::time::Duration;
use time::OffsetDateTime;
use vcp_core::lifecycle::Phase;
use vcp_policy::quota::Usage;

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

/// One sample of the fleet's usage export: whose, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FleetSample {
    /// The row's key, for paging only (never shown).
    pub tenant_id: i64,
    pub owner: String,
    pub tenant: String,
    pub sample: UsageSample,
}

#[derive(sqlx::FromRow)]
struct FleetRow {
    owner: String,
    name: String,
    #[sqlx(flatten)]
    usage: UsageRow,
}

impl FleetRow {
    fn into_sample(self) -> FleetSample {
        FleetSample {
            tenant_id: self.usage.tenant_id,
            sample: self.usage.sample(),
            owner: self.owner,
            tenant: self.name,
        }
    }
}

/// Advisory lock class of usage recording (`pg_advisory_xact_lock(class, tenant)`): replicas
/// recording a sample for the same tenant take turns, so the gap check before the insert holds.
const USAGE_LOCK: i32 = 0x7663_7075;

impl Inventory {
    /// Ready tenants without a usage sample newer than `min_gap` (live ones only), by name:
    /// those a sampling round should count.
    pub async fn tenants_due_for_usage(&self, min_gap: Duration) -> Result<Vec<Tenant>> {
        Ok(sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT {TENANT_COLUMNS} FROM tenants t
             WHERE deleted_at IS NULL AND phase = ANY($2) AND NOT EXISTS (
               SELECT 1 FROM usage_samples s
               WHERE s.tenant_id = t.id AND s.sampled_at > now() - make_interval(secs => $1))
             ORDER BY name"
        )))
        .bind(min_gap.as_secs_f64())
        // A sleeping tenant's workloads still run on the host, and count.
        .bind(vec![Phase::Ready.as_str(), Phase::Sleeping.as_str()])
        .fetch_all(self.pool())
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
        let mut tx = self.pool().begin().await?;
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
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(|r| (r.tenant_id, r.sample())).collect())
    }

    /// The latest usage sample of every live tenant that has one, with its owner and name:
    /// what `/metrics` shows per tenant. One index probe per live tenant.
    pub async fn live_latest_usage(&self) -> Result<Vec<FleetSample>> {
        let rows: Vec<FleetRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT t.owner, t.name, {USAGE_COLUMNS} FROM tenants t
             CROSS JOIN LATERAL (
               SELECT * FROM usage_samples s WHERE s.tenant_id = t.id
               ORDER BY s.sampled_at DESC LIMIT 1) latest
             WHERE t.deleted_at IS NULL
             ORDER BY t.owner, t.name"
        )))
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(FleetRow::into_sample).collect())
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
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(UsageRow::sample).collect())
    }

    /// Every tenant's samples (`owner`'s only, if given; deleted tenants' too, until their
    /// samples are pruned) with `since <= sampled_at < until`, after `after` (a sample's time
    /// and tenant) in (time, tenant) order, at most `limit`: the fleet's usage export.
    pub async fn fleet_usage_between(
        &self,
        owner: Option<&str>,
        since: OffsetDateTime,
        until: OffsetDateTime,
        after: Option<(OffsetDateTime, i64)>,
        limit: u32,
    ) -> Result<Vec<FleetSample>> {
        let columns: String = USAGE_COLUMNS
            .split(", ")
            .map(|c| format!("s.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ");
        let rows: Vec<FleetRow> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT t.owner, t.name, {columns} FROM usage_samples s
             JOIN tenants t ON t.id = s.tenant_id
             WHERE s.sampled_at >= $1 AND s.sampled_at < $2
               AND ($3::text IS NULL OR t.owner = $3)
               AND ($4::timestamptz IS NULL OR (s.sampled_at, s.tenant_id) > ($4, $5))
             ORDER BY s.sampled_at, s.tenant_id LIMIT $6"
        )))
        .bind(since)
        .bind(until)
        .bind(owner)
        .bind(after.map(|a| a.0))
        .bind(after.map_or(0, |a| a.1))
        .bind(i64::from(limit))
        .fetch_all(self.pool())
        .await?;
        Ok(rows.into_iter().map(FleetRow::into_sample).collect())
    }

    /// Deletes every tenant's samples older than `before` (retention); how many went.
    pub async fn prune_usage(&self, before: OffsetDateTime) -> Result<u64> {
        let r = sqlx::query("DELETE FROM usage_samples WHERE sampled_at < $1")
            .bind(before)
            .execute(self.pool())
            .await?;
        Ok(r.rows_affected())
    }
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
