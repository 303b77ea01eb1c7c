//! Reading the audit trail (`GET /v1/audit`, `vcp audit`). Entries are written with the change
//! they record, in its transaction ([`crate::inventory::audit_in`]); here they are only read back, oldest
//! first, filtered and in pages.
//!
//! An owner reads the entries of tenants it owns (or owned: a deleted tenant's history stays
//! its owner's), never entries without a tenant (tokens, the admin token) or of another
//! owner's tenant, even one that once had the same name.

use crate::Result;
use crate::inventory::Inventory;
use sqlx::types::Json;
use time::OffsetDateTime;

/// What to read of the trail. Every filter that is set must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditFilter {
    /// Only entries of this owner's tenants (an owner's reads); `None` for admins.
    pub owner: Option<String>,
    /// Entries of tenants with this name (every tenant that had it).
    pub tenant: Option<String>,
    pub actor: Option<String>,
    /// An action (`tenant.create`), or every action under a prefix (`tenant.`).
    pub action: Option<ActionFilter>,
    /// `[since, until)`.
    pub since: Option<OffsetDateTime>,
    pub until: Option<OffsetDateTime>,
    /// Entries after this id: where the previous page ended.
    pub after: i64,
    pub limit: u32,
}

/// Which actions an audit read takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActionFilter {
    Exactly(String),
    StartingWith(String),
}

/// One audit entry, as read back.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct AuditEntry {
    pub id: i64,
    pub at: OffsetDateTime,
    pub actor: String,
    pub action: String,
    /// The tenant's name when the entry is about one.
    pub tenant: Option<String>,
    pub detail: Json<serde_json::Value>,
}

impl Inventory {
    /// Audit entries matching `f`, oldest first (in the order they were written), at most
    /// `f.limit`.
    pub async fn audit(&self, f: &AuditFilter) -> Result<Vec<AuditEntry>> {
        let (exact, prefix) = match &f.action {
            Some(ActionFilter::Exactly(a)) => (Some(a.as_str()), None),
            Some(ActionFilter::StartingWith(p)) => (None, Some(p.as_str())),
            None => (None, None),
        };
        Ok(sqlx::query_as(
            "SELECT a.id, a.at, a.actor, a.action, t.name AS tenant, a.detail
             FROM audit a LEFT JOIN tenants t ON t.id = a.tenant_id
             WHERE a.id > $1
               AND ($2::text IS NULL OR t.owner = $2)
               AND ($3::text IS NULL OR t.name = $3)
               AND ($4::text IS NULL OR a.actor = $4)
               AND ($5::text IS NULL OR a.action = $5)
               AND ($6::text IS NULL OR starts_with(a.action, $6))
               AND ($7::timestamptz IS NULL OR a.at >= $7)
               AND ($8::timestamptz IS NULL OR a.at < $8)
             ORDER BY a.id LIMIT $9",
        )
        .bind(f.after)
        .bind(f.owner.as_deref())
        .bind(f.tenant.as_deref())
        .bind(f.actor.as_deref())
        .bind(exact)
        .bind(prefix)
        .bind(f.since)
        .bind(f.until)
        .bind(i64::from(f.limit))
        .fetch_all(self.pool())
        .await?)
    }
}
