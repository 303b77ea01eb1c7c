//! The tenants' audit logs in the inventory: ingest tokens (only their SHA-256), events, the
//! owner's filtered and paged reads, and the retention sweep's bounded deletes.
//!
//! Every read and write names one tenant id: the ingest's from the token, the API's from the
//! tenant the caller may see. No statement here reads events across tenants except the
//! sweep, which only deletes by age.

use super::events::EventRow;
use crate::Result;
use crate::inventory::Inventory;
use sqlx::types::Json;
use time::OffsetDateTime;

/// What an owner reads of one tenant's log. Every filter that is set must match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventFilter {
    pub tenant_id: i64,
    /// Who authenticated or whom they acted as.
    pub user: Option<String>,
    pub verb: Option<String>,
    pub resource: Option<String>,
    /// The resource's API group, when the filter named one (`deployments.apps`); `Some("")`
    /// for the core group is never set: `secrets` matches any group's `secrets`.
    pub group: Option<String>,
    /// `[since, until)` on the request's time.
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// Events after this (time, id): where the previous page ended.
    pub after: Option<(OffsetDateTime, i64)>,
    pub limit: u32,
}

/// One event, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct EventRecord {
    pub id: i64,
    pub at: OffsetDateTime,
    pub audit_id: String,
    pub stage: String,
    pub username: String,
    pub groups: Vec<String>,
    pub impersonated_user: Option<String>,
    pub impersonated_groups: Option<Vec<String>>,
    pub verb: String,
    pub api_group: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub request_uri: String,
    pub response_code: Option<i32>,
    pub event: Json<serde_json::Value>,
}

/// What storing a batch did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stored {
    pub inserted: u64,
    /// Already stored (the webhook sent the batch again).
    pub duplicates: u64,
}

impl Inventory {
    /// The tenant whose ingest token hashes to `hash`: a live tenant only.
    pub async fn audit_token_tenant(&self, hash: &[u8]) -> Result<Option<i64>> {
        Ok(sqlx::query_scalar(
            "SELECT k.tenant_id FROM tenant_audit_tokens k JOIN tenants t ON t.id = k.tenant_id
             WHERE k.token_hash = $1 AND t.deleted_at IS NULL",
        )
        .bind(hash)
        .fetch_optional(self.pool())
        .await?)
    }

    /// Whether `hash` is the tenant's ingest token now.
    pub async fn audit_token_is(&self, tenant_id: i64, hash: &[u8]) -> Result<bool> {
        Ok(sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM tenant_audit_tokens WHERE tenant_id = $1 AND token_hash = $2)",
        )
        .bind(tenant_id)
        .bind(hash)
        .fetch_one(self.pool())
        .await?)
    }

    /// Makes `hash` the tenant's ingest token (the one before stops working).
    pub async fn set_audit_token(&self, tenant_id: i64, hash: &[u8]) -> Result<()> {
        sqlx::query(
            "INSERT INTO tenant_audit_tokens (tenant_id, token_hash) VALUES ($1, $2)
             ON CONFLICT (tenant_id) DO UPDATE SET token_hash = $2, created_at = now()",
        )
        .bind(tenant_id)
        .bind(hash)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Stores `rows` for `tenant_id` in one statement; copies already stored (same audit id
    /// and stage) are skipped.
    pub async fn insert_audit_events(&self, tenant_id: i64, rows: &[EventRow]) -> Result<Stored> {
        if rows.is_empty() {
            return Ok(Stored::default());
        }
        // Postgres has no arrays of arrays of differing lengths: groups go as JSON.
        let col = |f: &dyn Fn(&EventRow) -> Option<String>| rows.iter().map(f).collect::<Vec<_>>();
        let at: Vec<OffsetDateTime> = rows.iter().map(|r| r.at).collect();
        let codes: Vec<Option<i32>> = rows.iter().map(|r| r.response_code).collect();
        let groups: Vec<Json<&Vec<String>>> = rows.iter().map(|r| Json(&r.groups)).collect();
        let igroups: Vec<Option<Json<&Vec<String>>>> = rows
            .iter()
            .map(|r| r.impersonated_groups.as_ref().map(Json))
            .collect();
        let events: Vec<Json<&serde_json::Value>> = rows.iter().map(|r| Json(&r.event)).collect();
        let inserted = sqlx::query(
            "INSERT INTO tenant_audit_events (tenant_id, at, audit_id, stage, username, groups,
                 impersonated_user, impersonated_groups, verb, api_group, resource, subresource,
                 namespace, name, request_uri, response_code, event)
             SELECT $1, e.at, e.audit_id, e.stage, e.username,
                 ARRAY(SELECT jsonb_array_elements_text(e.groups)),
                 e.iuser,
                 CASE WHEN e.igroups IS NULL THEN NULL
                      ELSE ARRAY(SELECT jsonb_array_elements_text(e.igroups)) END,
                 e.verb, e.api_group, e.resource, e.subresource, e.namespace, e.name, e.uri,
                 e.code, e.event
             FROM UNNEST($2::timestamptz[], $3::text[], $4::text[], $5::text[], $6::jsonb[],
                 $7::text[], $8::jsonb[], $9::text[], $10::text[], $11::text[], $12::text[],
                 $13::text[], $14::text[], $15::text[], $16::int4[], $17::jsonb[])
               AS e(at, audit_id, stage, username, groups, iuser, igroups, verb, api_group,
                 resource, subresource, namespace, name, uri, code, event)
             ON CONFLICT (tenant_id, audit_id, stage) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(&at)
        .bind(col(&|r| Some(r.audit_id.clone())))
        .bind(col(&|r| Some(r.stage.clone())))
        .bind(col(&|r| Some(r.username.clone())))
        .bind(&groups)
        .bind(col(&|r| r.impersonated_user.clone()))
        .bind(&igroups)
        .bind(col(&|r| Some(r.verb.clone())))
        .bind(col(&|r| r.api_group.clone()))
        .bind(col(&|r| r.resource.clone()))
        .bind(col(&|r| r.subresource.clone()))
        .bind(col(&|r| r.namespace.clone()))
        .bind(col(&|r| r.name.clone()))
        .bind(col(&|r| Some(r.request_uri.clone())))
        .bind(&codes)
        .bind(&events)
        .execute(self.pool())
        .await?
        .rows_affected();
        Ok(Stored {
            inserted,
            duplicates: rows.len() as u64 - inserted,
        })
    }

    /// One tenant's events matching `f`, oldest first (by request time, then id), at most
    /// `f.limit`.
    pub async fn audit_events(&self, f: &EventFilter) -> Result<Vec<EventRecord>> {
        let (after_at, after_id) = f.after.map_or((None, None), |(t, i)| (Some(t), Some(i)));
        Ok(sqlx::query_as(
            "SELECT id, at, audit_id, stage, username, groups, impersonated_user,
                 impersonated_groups, verb, api_group, resource, subresource, namespace, name,
                 request_uri, response_code, event
             FROM tenant_audit_events
             WHERE tenant_id = $1
               AND ($2::text IS NULL OR username = $2 OR impersonated_user = $2)
               AND ($3::text IS NULL OR verb = $3)
               AND ($4::text IS NULL OR resource = $4)
               AND ($5::text IS NULL OR api_group = $5)
               AND ($6::timestamptz IS NULL OR at >= $6)
               AND ($7::timestamptz IS NULL OR at < $7)
               AND ($8::timestamptz IS NULL OR (at, id) > ($8, $9::bigint))
             ORDER BY at, id LIMIT $10",
        )
        .bind(f.tenant_id)
        .bind(f.user.as_deref())
        .bind(f.verb.as_deref())
        .bind(f.resource.as_deref())
        .bind(f.group.as_deref())
        .bind(f.since)
        .bind(f.until)
        .bind(after_at)
        .bind(after_id)
        .bind(i64::from(f.limit))
        .fetch_all(self.pool())
        .await?)
    }

    /// Deletes at most `batch` events older than `before` of tenants on `plans` (or, with
    /// `others`, of tenants on any plan but those: plans no longer configured); how many.
    pub async fn delete_old_audit_events(
        &self,
        plans: &[String],
        others: bool,
        before: OffsetDateTime,
        batch: u32,
    ) -> Result<u64> {
        Ok(sqlx::query(
            "DELETE FROM tenant_audit_events WHERE id IN (
                 SELECT e.id FROM tenant_audit_events e JOIN tenants t ON t.id = e.tenant_id
                 WHERE e.at < $1 AND ((t.plan = ANY($2)) <> $3)
                 LIMIT $4)",
        )
        .bind(before)
        .bind(plans)
        .bind(others)
        .bind(i64::from(batch))
        .execute(self.pool())
        .await?
        .rows_affected())
    }
}
