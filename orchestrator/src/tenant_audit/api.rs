//! A tenant's audit log, read by its owner (`GET /v1/tenants/{name}/audit-events`): the
//! tenant is resolved as every tenant route resolves it (another owner's answers 404), the
//! query is checked into an [`EventFilter`] for that tenant's id alone ([`check_query`]), and
//! pages follow the keyset (request time, id) in an opaque `cursor`.

use crate::http::problem::{NoSuchTenant, Problem, ProblemBody, Unauthorized};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, caller_and_tenant, query_time};
use crate::names::is_dns_label;
use crate::tenant_audit::events::break_glass_admin;
use crate::tenant_audit::store::{EventFilter, EventRecord};
use crate::tenant_audit::types::{AuditEventPage, AuditEventView, AuditEventsQuery};
use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use time::OffsetDateTime;
use tracing::field::Empty;

/// Most events one answer holds.
pub const MAX_EVENTS_PAGE: u32 = 1_000;

/// Events per answer when the caller does not say.
const DEFAULT_EVENTS_PAGE: u32 = 100;

/// Longest `user` filter, in characters.
pub(crate) const MAX_USER: usize = 256;

/// Longest `verb` filter.
pub(crate) const MAX_VERB: usize = 32;

/// Longest `resource` filter.
pub(crate) const MAX_RESOURCE: usize = 253;

/// The cursor continuing after an event at `at` with id `id`: `<microseconds since the
/// epoch>-<id>`.
pub fn cursor(at: OffsetDateTime, id: i64) -> String {
    let micros = at.unix_timestamp_nanos() / 1_000;
    format!("{micros}-{id}")
}

/// The last microsecond an RFC 3339 time can name (9999-12-31T23:59:59.999999Z).
const LAST_MICROS: u64 = 253_402_300_799_999_999;

/// Reads a [`cursor`] back. Every cursor the document's pattern allows is taken: one past the
/// last time or id there can be (no page ever ends there) reads as that last one, after which
/// nothing follows.
fn parse_cursor(c: &str) -> Option<(OffsetDateTime, i64)> {
    let (micros, id) = c.split_once('-')?;
    let digits = |s: &str| (1..=19).contains(&s.len()) && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(micros) || !digits(id) {
        return None;
    }
    // 19 digits always fit in a u64.
    let micros = micros.parse::<u64>().ok()?.min(LAST_MICROS);
    let at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1_000).ok()?;
    let id = i64::try_from(id.parse::<u64>().ok()?).unwrap_or(i64::MAX);
    Some((at, id))
}

/// Checks a query into the filter of tenant `tenant_id`.
pub(crate) fn check_query(q: &AuditEventsQuery, tenant_id: i64) -> Result<EventFilter, Problem> {
    if let Some(u) = &q.user
        && (u.is_empty()
            || u.chars().count() > MAX_USER
            || u.chars().any(|c| c < ' ' || c == '\x7f'))
    {
        return Err(Problem::invalid(
            "user",
            &format!(
                "a user is 1 to {MAX_USER} characters, none of them U+0000 to U+001F or U+007F"
            ),
        ));
    }
    if let Some(v) = &q.verb
        && (v.is_empty() || v.len() > MAX_VERB || !v.bytes().all(|b| b.is_ascii_lowercase()))
    {
        return Err(Problem::invalid(
            "verb",
            &format!("a verb is 1 to {MAX_VERB} lowercase letters, like create"),
        ));
    }
    let (resource, group) = match &q.resource {
        None => (None, None),
        Some(r) if r.len() > MAX_RESOURCE || !r.split('.').all(is_dns_label) => {
            return Err(Problem::invalid(
                "resource",
                &format!(
                    "{r:?} is not <resource> or <resource>.<group> (lowercase DNS labels joined \
                     by dots, at most {MAX_RESOURCE} characters)"
                ),
            ));
        }
        Some(r) => match r.split_once('.') {
            Some((res, group)) => (Some(res.to_owned()), Some(group.to_owned())),
            None => (Some(r.clone()), None),
        },
    };
    // A `since` at or after `until` is an empty range, answered as one (as `GET /v1/audit`).
    let since = query_time("since", &q.since)?;
    let until = query_time("until", &q.until)?;
    let after = match &q.cursor {
        None => None,
        Some(c) => Some(parse_cursor(c).ok_or_else(|| {
            Problem::invalid(
                "cursor",
                "not a cursor: give a page's next_cursor as it was given",
            )
        })?),
    };
    let limit = q.limit.unwrap_or(DEFAULT_EVENTS_PAGE);
    if !(1..=MAX_EVENTS_PAGE).contains(&limit) {
        return Err(Problem::invalid(
            "limit",
            &format!("limit must be 1 to {MAX_EVENTS_PAGE}"),
        ));
    }
    Ok(EventFilter {
        tenant_id,
        user: q.user.clone(),
        verb: q.verb.clone(),
        resource,
        group,
        since,
        until,
        after,
        limit,
    })
}

impl From<EventRecord> for AuditEventView {
    fn from(e: EventRecord) -> Self {
        AuditEventView {
            break_glass_by: break_glass_admin(&e.username).map(str::to_owned),
            time: e.at,
            audit_id: e.audit_id,
            stage: e.stage,
            user: e.username,
            groups: e.groups,
            impersonated_user: e.impersonated_user,
            impersonated_groups: e.impersonated_groups,
            verb: e.verb,
            api_group: e.api_group,
            resource: e.resource,
            subresource: e.subresource,
            namespace: e.namespace,
            name: e.name,
            request_uri: e.request_uri,
            response_code: e.response_code,
            event: e.event.0,
        }
    }
}

/// The tenant apiserver's audit log, oldest first: who (the real user, and whom it acted as
/// under sudo; the admin behind a break-glass certificate), what, on which object, with which
/// answer. The tenant's owner or an admin; kept as long as the tenant's plan says. Pages of at
/// most `limit`; `next_cursor` continues.
#[utoipa::path(get, path = "/v1/tenants/{name}/audit-events", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name"), AuditEventsQuery), responses(
    (status = 200, body = AuditEventPage),
    (status = 400, description = "malformed query (`limit` not a number, a parameter given twice); `field` names it", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    NoSuchTenant,
    (status = 422, description = "`user` empty, too long or with control characters, `verb` not 1 to 32 lowercase letters, `resource` not `<resource>[.<group>]`, `since` or `until` not RFC 3339, `cursor` not a page's `next_cursor`, or `limit` outside 1 to 1000; `field` names it", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn tenant_audit_events(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    q: Result<Query<AuditEventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditEventPage>, Problem> {
    let (_caller, t) = caller_and_tenant(&s, &headers, name).await?;
    let Query(q) = q.map_err(Problem::from_query_rejection)?;
    let mut f = check_query(&q, t.id)?;
    // One more than asked: whether another page follows.
    let limit = f.limit;
    f.limit += 1;
    let mut items = s
        .inventory
        .audit_events(&f)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let next_cursor = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|e| cursor(e.at, e.id))
    } else {
        None
    };
    Ok(Json(AuditEventPage {
        items: items.into_iter().map(AuditEventView::from).collect(),
        next_cursor,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn q(set: &[(&str, &str)]) -> AuditEventsQuery {
        let mut q = AuditEventsQuery::default();
        for (k, v) in set {
            let v = Some((*v).to_owned());
            match *k {
                "user" => q.user = v,
                "verb" => q.verb = v,
                "resource" => q.resource = v,
                "since" => q.since = v,
                "until" => q.until = v,
                "cursor" => q.cursor = v,
                "limit" => q.limit = v.and_then(|v| v.parse().ok()),
                _ => unreachable!("{k}"),
            }
        }
        q
    }

    #[test]
    fn queries_become_filters_of_the_one_tenant() {
        let f = check_query(&q(&[]), 7).unwrap();
        assert_eq!((f.tenant_id, f.limit, f.after), (7, 100, None));
        let f = check_query(
            &q(&[
                ("user", "system:serviceaccount:a:b"),
                ("verb", "create"),
                ("resource", "deployments.apps"),
                ("since", "2026-01-01T01:00:00+01:00"),
                ("until", "2026-01-02T00:00:00Z"),
                ("limit", "1000"),
            ]),
            7,
        )
        .unwrap();
        assert_eq!(f.user.as_deref(), Some("system:serviceaccount:a:b"));
        assert_eq!(f.verb.as_deref(), Some("create"));
        assert_eq!(
            (f.resource.as_deref(), f.group.as_deref()),
            (Some("deployments"), Some("apps"))
        );
        assert_eq!(f.since.map(|t| t.unix_timestamp()), Some(1_767_225_600));
        let f = check_query(&q(&[("resource", "secrets")]), 7).unwrap();
        assert_eq!((f.resource.as_deref(), f.group), (Some("secrets"), None));
        let f = check_query(&q(&[("resource", "widgets.example.com")]), 7).unwrap();
        assert_eq!(f.group.as_deref(), Some("example.com"));
    }

    #[test]
    fn cursors_read_back_to_where_the_page_ended() {
        let at = OffsetDateTime::from_unix_timestamp_nanos(1_772_366_400_123_456_000).unwrap();
        let c = cursor(at, 42);
        assert_eq!(c, "1772366400123456-42");
        assert_eq!(parse_cursor(&c), Some((at, 42)));
        let f = check_query(&q(&[("cursor", &c)]), 1).unwrap();
        assert_eq!(f.after, Some((at, 42)));
        for bad in [
            "",
            "1",
            "-1-2",
            "1-",
            "-2",
            "1-2-3",
            "a-1",
            "1-b",
            "99999999999999999999-1",
        ] {
            assert_eq!(parse_cursor(bad), None, "{bad}");
        }
        // What the pattern allows past the last time or id reads as the last.
        let (at, id) = parse_cursor("9999999999999999999-9999999999999999999").unwrap();
        assert_eq!((at.year(), id), (9999, i64::MAX));
    }

    #[test]
    fn queries_that_make_no_sense_are_refused_naming_the_field() {
        for (set, field) in [
            (vec![("user", "")], "user"),
            (vec![("user", "a\nb")], "user"),
            (vec![("user", &"a".repeat(257))], "user"),
            (vec![("verb", "")], "verb"),
            (vec![("verb", "Create")], "verb"),
            (vec![("verb", &"a".repeat(33))], "verb"),
            (vec![("resource", "")], "resource"),
            (vec![("resource", "Secrets")], "resource"),
            (vec![("resource", "secrets.")], "resource"),
            (vec![("resource", "*.apps")], "resource"),
            (vec![("resource", &"a.".repeat(127))], "resource"),
            (vec![("since", "yesterday")], "since"),
            (vec![("until", "2026-13-01T00:00:00Z")], "until"),
            (vec![("cursor", "next")], "cursor"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "1001")], "limit"),
        ] {
            let p = check_query(&q(&set), 1).unwrap_err();
            assert_eq!(p.status(), StatusCode::UNPROCESSABLE_ENTITY, "{set:?}");
            assert_eq!(p.field(), Some(field), "{set:?}");
        }
        assert!(check_query(&q(&[("user", &"é".repeat(256))]), 1).is_ok());
        assert!(check_query(&q(&[("verb", &"a".repeat(32))]), 1).is_ok());
    }

    #[test]
    fn a_break_glass_event_names_the_admin_it_was_issued_to() {
        let rec = EventRecord {
            id: 1,
            at: OffsetDateTime::UNIX_EPOCH,
            audit_id: "a".into(),
            stage: "ResponseComplete".into(),
            username: "vcp:break-glass:ops".into(),
            groups: vec!["system:masters".into()],
            impersonated_user: None,
            impersonated_groups: None,
            verb: "delete".into(),
            api_group: None,
            resource: Some("pods".into()),
            subresource: None,
            namespace: Some("a".into()),
            name: Some("x".into()),
            request_uri: "/api/v1/namespaces/a/pods/x".into(),
            response_code: Some(200),
            event: sqlx::types::Json(serde_json::json!({})),
        };
        let v = AuditEventView::from(rec);
        assert_eq!(v.break_glass_by.as_deref(), Some("ops"));
        assert_eq!(v.user, "vcp:break-glass:ops");
    }
}
