//! The audit trail: the query (filters, paging) and its entries.

use crate::http::schema::NameSchema;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

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
