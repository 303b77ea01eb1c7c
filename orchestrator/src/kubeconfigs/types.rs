//! User kubeconfigs: the issue request, the issued kubeconfig (key never printed in `Debug`),
//! the views and break-glass requests.

use crate::http::schema::{SubjectSchema, TtlSchema};
use crate::kubeconfigs::store::KubeconfigRow;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

/// `POST /v1/tenants/{name}/kubeconfigs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueKubeconfig {
    /// The user name (certificate CN).
    #[schema(value_type = SubjectSchema)]
    pub user: String,
    /// Groups (certificate O), at most 16. `view`, `edit` and `admin` are bound in every
    /// tenant; `sudo` makes this kubeconfig a sudoer's, whose holder may act as admin for one
    /// command by impersonating its user into `vcp:sudo` (`kubectl --as=<user>
    /// --as-group=vcp:sudo`) until the kubeconfig is revoked or expires (other kubeconfigs
    /// of the user may not); others are the tenant's to bind.
    #[serde(default)]
    #[schema(value_type = Vec<SubjectSchema>, max_items = 16, example = json!(["view"]))]
    pub groups: Vec<String>,
    /// The default is 8h; any lifetime is capped at the server's maximum (168h unless
    /// configured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TtlSchema>)]
    pub ttl: Option<String>,
}

/// An issued kubeconfig; the only time its private key leaves the server.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigIssued {
    /// kubeconfig YAML with the client certificate and key embedded.
    pub kubeconfig: String,
    /// Serial number of the client certificate (hex).
    pub serial: String,
    pub user: String,
    pub groups: Vec<String>,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: OffsetDateTime,
}

impl std::fmt::Debug for KubeconfigIssued {
    // The kubeconfig embeds a private key: never printed, not even by a stray `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeconfigIssued")
            .field("kubeconfig", &"<redacted>")
            .field("serial", &self.serial)
            .field("user", &self.user)
            .field("groups", &self.groups)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// A kubeconfig as the inventory remembers it: never its key.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigView {
    pub user: String,
    pub groups: Vec<String>,
    pub serial: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: OffsetDateTime,
    /// The token that issued it.
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    /// When it was revoked; the tenant apiserver refuses it from then on (within 60 s).
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<OffsetDateTime>,
    /// A break-glass kubeconfig: it cannot be revoked, only expire.
    #[serde(default)]
    pub break_glass: bool,
}

/// `POST /v1/tenants/{name}/break-glass` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BreakGlassRequest {
    /// Why, for the audit trail: 1 to 200 characters, no NUL.
    #[schema(min_length = 1, max_length = 200, pattern = "^[^\\u0000]*$")]
    pub reason: String,
    /// Lifetime like 15m or 1h, default 30m; a longer one is cut to 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<TtlSchema>)]
    pub ttl: Option<String>,
}

impl From<KubeconfigRow> for KubeconfigView {
    fn from(r: KubeconfigRow) -> KubeconfigView {
        KubeconfigView {
            user: r.username,
            groups: r.groups,
            serial: r.serial,
            expires_at: r.expires_at,
            created_by: r.created_by,
            created_at: r.created_at,
            revoked_at: r.revoked_at,
            break_glass: r.break_glass,
        }
    }
}

/// `GET /v1/tenants/{name}/kubeconfigs` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigList {
    pub items: Vec<KubeconfigView>,
}
