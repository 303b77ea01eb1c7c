//! A tenant's audit log over the API: the query (filters, paging) and its events.

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

/// `GET /v1/tenants/{name}/audit-events` query: every filter given must match.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditEventsQuery {
    /// Requests by this user or made as this user (impersonation: sudo). 1 to 256
    /// characters, none of them U+0000 to U+001F or U+007F.
    #[param(
        min_length = 1,
        max_length = 256,
        pattern = r"^[^\x00-\x1f\x7f]+$",
        example = "dave"
    )]
    pub user: Option<String>,
    /// The request's verb (`get`, `list`, `create`, `update`, `patch`, `delete`, `watch`, ...).
    #[param(
        min_length = 1,
        max_length = 32,
        pattern = r"^[a-z]+$",
        example = "create"
    )]
    pub verb: Option<String>,
    /// The resource: `<resource>` in any group (`secrets`), or `<resource>.<group>`
    /// (`deployments.apps`). Lowercase DNS labels joined by dots, at most 253 characters.
    #[param(
        min_length = 1,
        max_length = 253,
        pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$",
        example = "secrets"
    )]
    pub resource: Option<String>,
    /// Requests received at or after this RFC 3339 time.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-01-01T00:00:00Z")]
    pub since: Option<String>,
    /// Requests received before this RFC 3339 time (at or before `since`: no events).
    #[param(value_type = Option<String>, format = DateTime, example = "2026-02-01T00:00:00Z")]
    pub until: Option<String>,
    /// Where the previous page ended: its `next_cursor`, as it was given.
    #[param(
        max_length = 40,
        pattern = r"^[0-9]{1,19}-[0-9]{1,19}$",
        example = "1767225600000000-42"
    )]
    pub cursor: Option<String>,
    /// Most events in one answer, 1 to 1000 (default 100).
    #[param(minimum = 1, maximum = 1000, example = 100)]
    pub limit: Option<u32>,
}

/// One request to the tenant apiserver, as its audit log recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AuditEventView {
    /// When the apiserver received the request.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub time: OffsetDateTime,
    /// The apiserver's id of the request.
    pub audit_id: String,
    /// `ResponseComplete`, or `Panic`.
    pub stage: String,
    /// Who authenticated: the kubeconfig's user, a service account, `vcp:break-glass:<admin>`.
    pub user: String,
    pub groups: Vec<String>,
    /// Whom the user acted as (impersonation; a sudoer's own name with the group `vcp:sudo`).
    pub impersonated_user: Option<String>,
    pub impersonated_groups: Option<Vec<String>>,
    /// For a break-glass certificate's requests: the admin token it was issued to.
    pub break_glass_by: Option<String>,
    pub verb: String,
    /// The resource's API group (`null` for the core group and non-resource URLs).
    pub api_group: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub request_uri: String,
    /// The answer's HTTP status.
    pub response_code: Option<i32>,
    /// The audit event itself (`audit.k8s.io/v1` `Event`), at most 64 KiB: without a
    /// Secret's bodies ever, and without any bodies when it would be larger.
    #[schema(value_type = Object)]
    pub event: serde_json::Value,
}

/// `GET /v1/tenants/{name}/audit-events` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AuditEventPage {
    /// Events, oldest first (by the time the request was received), at most `limit`.
    pub items: Vec<AuditEventView>,
    /// Set when more events match: ask again with this as `cursor` (and the same filters).
    /// Null on the last page.
    pub next_cursor: Option<String>,
}
