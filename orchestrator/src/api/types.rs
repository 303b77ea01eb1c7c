//! Request and response bodies of the platform API.
//!
//! The server serializes these, the `vcp` client commands deserialize them, and the OpenAPI
//! document is derived from them: one definition for all three.

use crate::inventory::{KubeconfigRow, Tenant, Token, UsageSample};
pub use crate::lifecycle::{Condition, Phase};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
pub use vcp_policy::quota::{Hard, Usage};

/// `POST /v1/tenants` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    /// `[a-z]([a-z0-9-]*[a-z0-9])?`, up to 40 characters, unique among live tenants.
    #[schema(example = "team-a")]
    pub name: String,
    /// A minor from `GET /v1/versions` (e.g. `1.37`); the default minor when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Free-form labels (keys up to 253, values up to 63 characters of `[A-Za-z0-9-_./]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// A placement plan configured on the server; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
}

/// A tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantView {
    pub name: String,
    /// Short immutable key: host names of the tenant's objects start with it.
    pub key: String,
    /// The token that created the tenant.
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    /// The Kubernetes minor (`1.37`).
    pub version: String,
    /// The exact Kubernetes release of that minor (`v1.37.1`).
    pub kubernetes_version: Option<String>,
    pub plan: String,
    pub phase: Phase,
    /// One condition per provisioning step, in order, then `Ready`.
    pub conditions: Vec<Condition>,
    /// `https://host:port` of the tenant apiserver once exposed.
    pub endpoint: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    /// The latest usage sample against the plan's quota; null before the first sample (vcp
    /// samples Ready tenants every `--usage-interval-seconds`).
    pub usage: Option<TenantUsage>,
}

/// What a tenant held at its latest sample, and its plan's limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct TenantUsage {
    /// When vcp counted the tenant's host objects.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
    /// The plan's quota now (null: unlimited; all null if the plan is no longer configured).
    pub limits: Hard,
}

impl TenantView {
    pub fn new(
        t: Tenant,
        kubernetes_version: Option<String>,
        usage: Option<TenantUsage>,
    ) -> TenantView {
        TenantView {
            usage,
            kubernetes_version,
            phase: t.phase,
            name: t.name,
            key: t.key.into(),
            owner: t.owner,
            labels: t.labels.0,
            version: t.version,
            plan: t.plan,
            conditions: t.conditions.0,
            endpoint: t.endpoint,
            generation: t.generation,
            observed_generation: t.observed_generation,
            created_at: t.created_at,
        }
    }
}

/// `GET /v1/tenants` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TenantList {
    pub items: Vec<TenantView>,
}

/// `DELETE /v1/tenants/{name}` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Keep the etcd volumes (their reclaim policy becomes `Retain`).
    #[serde(default)]
    pub retain_data: bool,
}

/// `GET /v1/tenants/{name}/usage` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UsageQuery {
    /// Start of the range, inclusive: an RFC 3339 time (`2026-01-01T00:00:00Z`); default
    /// `until` minus 24 hours. At most `until`.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-01-01T00:00:00Z")]
    pub since: Option<String>,
    /// End of the range, exclusive: an RFC 3339 time; default now.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-02-01T00:00:00Z")]
    pub until: Option<String>,
    /// Most samples in one answer, 1 to 10000 (default 1000); `next_since` pages on.
    #[param(minimum = 1, maximum = 10000, example = 1000)]
    pub limit: Option<u32>,
}

/// One usage sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct UsageSampleView {
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
}

impl From<UsageSample> for UsageSampleView {
    fn from(s: UsageSample) -> UsageSampleView {
        UsageSampleView {
            sampled_at: s.sampled_at,
            used: s.used,
        }
    }
}

/// `GET /v1/tenants/{name}/usage` answer: a tenant's samples in `[since, until)`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageSamples {
    /// The range answered (defaults filled in): `since` inclusive.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub since: OffsetDateTime,
    /// `until` exclusive.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub until: OffsetDateTime,
    /// Samples, oldest first, at most `limit`. A sample holds from its `sampled_at` until the
    /// next one; gaps are times the tenant was not Ready (or vcp was not running).
    pub items: Vec<UsageSampleView>,
    /// Set when the range holds more than `limit` samples: ask again with this as `since`
    /// (and the same `until`) for the next page. Null on the last page.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub next_since: Option<OffsetDateTime>,
    /// The plan's quota now (null: unlimited).
    pub limits: Hard,
}

/// `POST /v1/tenants/{name}/kubeconfigs` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct IssueKubeconfig {
    /// The user name (certificate CN): 1 to 128 printable characters, not `system:...`.
    #[schema(example = "alice")]
    pub user: String,
    /// Groups (certificate O). `view`, `edit` and `admin` are bound in every tenant; others
    /// are the tenant's to bind. At most 16, none `system:...`.
    #[serde(default)]
    #[schema(example = json!(["view"]))]
    pub groups: Vec<String>,
    /// Lifetime like `90m`, `12h` or `30d` (default 24h), capped by the server's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "12h")]
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
        }
    }
}

/// `GET /v1/tenants/{name}/kubeconfigs` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KubeconfigList {
    pub items: Vec<KubeconfigView>,
}

/// Who a token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees and changes every tenant, and manages tokens.
    Admin,
    /// Sees and changes only the tenants it created.
    Owner,
}

impl Role {
    /// The role of an inventory row (the database allows only these two).
    pub fn of(name: &str) -> Role {
        if name == "admin" {
            Role::Admin
        } else {
            Role::Owner
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
}

/// `POST /v1/tokens` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Like a tenant name: `[a-z]([a-z0-9-]*[a-z0-9])?`, up to 40 characters.
    #[schema(example = "team-a")]
    pub name: String,
    pub role: Role,
}

/// A new token: the secret is in this answer and nowhere else.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub name: String,
    pub role: Role,
    /// The bearer secret; only its hash is stored.
    pub token: String,
}

impl std::fmt::Debug for TokenCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCreated")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A token without its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub name: String,
    pub role: Role,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<OffsetDateTime>,
}

impl From<Token> for TokenView {
    fn from(t: Token) -> TokenView {
        TokenView {
            role: Role::of(&t.role),
            name: t.name,
            created_at: t.created_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// `GET /v1/tokens` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<TokenView>,
}

/// One Kubernetes minor the server can provision.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionView {
    #[schema(example = "1.37")]
    pub minor: String,
    #[schema(example = "v1.37.1")]
    pub kubernetes: String,
    pub default: bool,
}

/// `GET /v1/versions` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VersionList {
    pub default: String,
    pub versions: Vec<VersionView>,
}
