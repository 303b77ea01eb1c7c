//! Usage samples by time range: a tenant's (`GET /v1/tenants/{name}/usage`) and the fleet's
//! (`GET /v1/usage`, JSON or CSV, every tenant for admins and the caller's own for owners):
//! the billing exports.

use crate::http::problem::{NoSuchTenant, Problem, ProblemBody, Unauthorized};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, caller_and_tenant, in_utc, query_time};
use crate::usage::export;
use crate::usage::types::{
    FleetUsage, FleetUsageItem, FleetUsageQuery, UsageFormat, UsageQuery, UsageSampleView,
    UsageSamples,
};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use tracing::field::Empty;

/// Most samples one `GET /v1/tenants/{name}/usage` answer holds.
pub const MAX_USAGE_PAGE: u32 = 10_000;

/// Samples per answer when the caller does not say.
const DEFAULT_USAGE_PAGE: u32 = 1_000;

/// A checked usage range: `[since, until)` and the page size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct UsageRange {
    since: time::OffsetDateTime,
    until: time::OffsetDateTime,
    limit: u32,
}

/// Checks a usage query; `now` is the default `until`.
fn check_usage_query(q: &UsageQuery, now: time::OffsetDateTime) -> Result<UsageRange, Problem> {
    let time = query_time;
    let until = time("until", &q.until)?.unwrap_or(now);
    let since = time("since", &q.since)?
        .unwrap_or_else(|| until.checked_sub(time::Duration::DAY).map_or(until, in_utc));
    if since > until {
        return Err(Problem::invalid(
            "since",
            "since must not be after until (the range is [since, until))",
        ));
    }
    let limit = q.limit.unwrap_or(DEFAULT_USAGE_PAGE);
    if !(1..=MAX_USAGE_PAGE).contains(&limit) {
        return Err(Problem::invalid(
            "limit",
            &format!("limit must be 1 to {MAX_USAGE_PAGE}"),
        ));
    }
    Ok(UsageRange {
        since,
        until,
        limit,
    })
}

/// A tenant's usage samples in `[since, until)`, oldest first, with its plan's limits: the
/// billing export. Pages of at most `limit` samples; `next_since` continues.
#[utoipa::path(get, path = "/v1/tenants/{name}/usage", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name"), UsageQuery), responses(
    (status = 200, body = UsageSamples),
    (status = 400, description = "malformed query (`limit` not a number, a parameter given twice); `field` names it", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    NoSuchTenant,
    (status = 422, description = "`since` or `until` not RFC 3339, `since` after `until`, or `limit` outside 1 to 10000; `field` names it", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn tenant_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    q: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageSamples>, Problem> {
    let (_caller, t) = caller_and_tenant(&s, &headers, name).await?;
    let Query(q) = q.map_err(Problem::from_query_rejection)?;
    let r = check_usage_query(&q, time::OffsetDateTime::now_utc())?;
    // One more than asked: whether another page follows, and where it starts.
    let mut items = s
        .inventory
        .usage_between(t.id, r.since, r.until, r.limit + 1)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let next_since = if items.len() > r.limit as usize {
        items.pop().map(|u| u.sampled_at)
    } else {
        None
    };
    Ok(Json(UsageSamples {
        since: r.since,
        until: r.until,
        items: items.into_iter().map(UsageSampleView::from).collect(),
        next_since,
        limits: crate::usage::sampler::limits(&s.provisioner.config.plans, &t.plan),
    }))
}

/// The header that carries a CSV page's next cursor.
pub const NEXT_CURSOR_HEADER: &str = "vcp-next-cursor";

/// Every tenant's usage samples in `[since, until)` the caller may see (an admin: all, deleted
/// tenants' included until pruned; an owner: its own), by time, then tenant: the fleet's
/// billing export. `format=csv` answers `text/csv` (a header line, then `sampled_at,owner,
/// tenant` and each resource per sample; CPU in millicores, memory and storage in bytes) with
/// the next page's cursor in the `Vcp-Next-Cursor` header; JSON carries it as `next_cursor`.
#[utoipa::path(get, path = "/v1/usage", tag = "tenants", security(("bearer" = [])),
    params(FleetUsageQuery), responses(
    (status = 200, description = "the samples (JSON, or CSV with `format=csv`; the next page's cursor in `next_cursor` or the `Vcp-Next-Cursor` header)",
        content((FleetUsage = "application/json"), (String = "text/csv")),
        headers(("vcp-next-cursor" = String, description = "CSV only: the next page's cursor, absent on the last page"))),
    (status = 400, description = "malformed query (`limit` not a number, an unknown `format`, a parameter given twice); `field` names it", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    (status = 422, description = "`since` or `until` not RFC 3339, `since` after `until`, `limit` outside 1 to 10000, or a `cursor` that is not one; `field` names it", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn fleet_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<FleetUsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, Problem> {
    let caller = crate::http::auth::authenticate(&s, &headers).await?;
    tracing::Span::current().record("caller", caller.0.name.as_str());
    let Query(q) = q.map_err(Problem::from_query_rejection)?;
    let range = UsageQuery {
        since: q.since.clone(),
        until: q.until.clone(),
        limit: q.limit,
    };
    let r = check_usage_query(&range, time::OffsetDateTime::now_utc())?;
    let after = match &q.cursor {
        None => None,
        Some(c) => Some(export::parse_cursor(c).ok_or_else(|| {
            Problem::invalid(
                "cursor",
                "not a cursor of this export (`next_cursor` of a page)",
            )
        })?),
    };
    let mut rows = s
        .inventory
        .fleet_usage_between(caller.scope(), r.since, r.until, after, r.limit + 1)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let next_cursor = if rows.len() > r.limit as usize {
        rows.pop();
        rows.last()
            .map(|l| export::cursor(l.sample.sampled_at, l.tenant_id))
    } else {
        None
    };
    let items: Vec<FleetUsageItem> = rows
        .into_iter()
        .map(|f| FleetUsageItem {
            owner: f.owner,
            tenant: f.tenant,
            sampled_at: f.sample.sampled_at,
            used: f.sample.used,
        })
        .collect();
    Ok(match q.format.unwrap_or_default() {
        UsageFormat::Json => Json(FleetUsage {
            since: r.since,
            until: r.until,
            items,
            next_cursor,
        })
        .into_response(),
        UsageFormat::Csv => {
            let mut resp = export::csv(&items).into_response();
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/csv; charset=utf-8"),
            );
            if let Some(c) = next_cursor.and_then(|c| HeaderValue::from_str(&c).ok()) {
                h.insert(NEXT_CURSOR_HEADER, c);
            }
            resp
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    #[test]
    fn usage_ranges_default_to_the_last_day_and_refuse_what_makes_no_sense() {
        let at = |s: &str| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap()
        };
        let now = at("2026-03-01T12:00:00Z");
        let q = |since: Option<&str>, until: Option<&str>, limit: Option<u32>| UsageQuery {
            since: since.map(str::to_owned),
            until: until.map(str::to_owned),
            limit,
        };
        assert_eq!(
            check_usage_query(&q(None, None, None), now).unwrap(),
            UsageRange {
                since: at("2026-02-28T12:00:00Z"),
                until: now,
                limit: 1000
            }
        );
        let r = check_usage_query(
            &q(
                Some("2026-01-01T00:00:00+02:00"),
                Some("2026-02-01T00:00:00Z"),
                Some(10_000),
            ),
            now,
        )
        .unwrap();
        assert_eq!(r.since, at("2025-12-31T22:00:00Z"));
        assert_eq!(r.since.offset(), time::UtcOffset::UTC, "answered in UTC");
        assert_eq!((r.until, r.limit), (at("2026-02-01T00:00:00Z"), 10_000));
        // An empty range is fine; `until` alone moves the default `since` with it.
        let t = "2026-01-01T00:00:00Z";
        assert!(check_usage_query(&q(Some(t), Some(t), None), now).is_ok());
        assert_eq!(
            check_usage_query(&q(None, Some(t), None), now)
                .unwrap()
                .since,
            at("2025-12-31T00:00:00Z")
        );
        // Times whose UTC falls outside the years RFC 3339 writes are clamped to them.
        let r = check_usage_query(&q(None, Some("9999-12-31T23:59:59-23:59"), None), now).unwrap();
        assert_eq!(r.until, at("9999-12-31T23:59:59.999999999Z"));
        let r = check_usage_query(&q(None, Some("0000-01-01T12:00:00Z"), None), now).unwrap();
        assert_eq!(r.since, at("0000-01-01T00:00:00Z"));
        let r = check_usage_query(&q(Some("0000-01-01T00:00:00+23:59"), Some(t), None), now);
        assert_eq!(r.unwrap().since, at("0000-01-01T00:00:00Z"));
        let field = |r: Result<UsageRange, Problem>| {
            let p = r.unwrap_err();
            assert_eq!(p.status(), StatusCode::UNPROCESSABLE_ENTITY, "{p:?}");
            p.field().map(str::to_owned)
        };
        for (since, until, limit, want) in [
            (Some("2026-02-01T00:00:00Z"), Some(t), None, "since"),
            (Some("yesterday"), None, None, "since"),
            (Some("2026-01-01"), None, None, "since"),
            (None, Some("2026-13-01T00:00:00Z"), None, "until"),
            (None, Some("1767225600"), None, "until"),
            (None, None, Some(0), "limit"),
            (None, None, Some(10_001), "limit"),
        ] {
            assert_eq!(
                field(check_usage_query(&q(since, until, limit), now)).as_deref(),
                Some(want),
                "{since:?} {until:?} {limit:?}"
            );
        }
    }
}
