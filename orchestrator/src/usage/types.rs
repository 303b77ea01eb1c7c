//! Usage samples of a tenant: the range query and the samples.

use crate::usage::store::UsageSample;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};
use vcp_policy::quota::{Hard, Usage};

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

/// How `GET /v1/usage` answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UsageFormat {
    /// [`FleetUsage`].
    #[default]
    Json,
    /// `text/csv`: a header line, then one line per sample (see [`crate::usage::export`]);
    /// the next page's cursor in the `Vcp-Next-Cursor` header.
    Csv,
}

/// `GET /v1/usage` query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct FleetUsageQuery {
    /// Start of the range, inclusive: an RFC 3339 time; default `until` minus 24 hours.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-01-01T00:00:00Z")]
    pub since: Option<String>,
    /// End of the range, exclusive: an RFC 3339 time; default now.
    #[param(value_type = Option<String>, format = DateTime, example = "2026-02-01T00:00:00Z")]
    pub until: Option<String>,
    /// Most samples in one answer, 1 to 10000 (default 1000).
    #[param(minimum = 1, maximum = 10000, example = 1000)]
    pub limit: Option<u32>,
    /// Where the page starts: the `next_cursor` of the page before (same range); absent: at
    /// `since`.
    #[param(value_type = Option<String>, pattern = "^[0-9]{1,20}-[0-9]{1,19}$")]
    pub cursor: Option<String>,
    /// `json` (default) or `csv`.
    #[param(value_type = Option<String>, pattern = "^(json|csv)$")]
    pub format: Option<UsageFormat>,
}

/// One sample of the fleet export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct FleetUsageItem {
    /// The tenant's owner (the token name that created it).
    pub owner: String,
    /// The tenant's name (unique per owner).
    pub tenant: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub sampled_at: OffsetDateTime,
    pub used: Usage,
}

/// `GET /v1/usage` answer (JSON): the samples of every tenant the caller sees in
/// `[since, until)`, by time, then tenant.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FleetUsage {
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub since: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub until: OffsetDateTime,
    pub items: Vec<FleetUsageItem>,
    /// Set when more samples follow: ask again with it as `cursor` (same range).
    pub next_cursor: Option<String>,
}
