//! The audit trail, read back (`GET /v1/audit`): admins read every entry, owners the entries of
//! their own tenants ([`super::store`] says exactly which). Filters by tenant, actor,
//! action (exact, or a prefix ending in a dot) and time range; pages by entry id.

use crate::audit::store::{ActionFilter, AuditEntry, AuditFilter};
use crate::audit::types::{AuditEntryView, AuditPage, AuditQuery};
use crate::http::problem::{Problem, ProblemBody, Unauthorized};
use crate::http::{AppState, query_time};
use crate::names::TenantName;
use axum::Json;
use axum::extract::{Query, State};
use axum::http::HeaderMap;
use tracing::field::Empty;

/// Most entries one answer holds.
pub const MAX_AUDIT_PAGE: u32 = 1_000;

/// Entries per answer when the caller does not say.
const DEFAULT_AUDIT_PAGE: u32 = 100;

/// Longest action filter.
pub(crate) const MAX_ACTION: usize = 64;

/// Longest actor filter.
pub(crate) const MAX_ACTOR: usize = 128;

/// Whether `a` is an action name (`tenant.create`, `token.admin-bootstrap`) or, ending with a
/// dot, a prefix of some (`tenant.`).
pub(crate) fn is_action(a: &str) -> bool {
    let body = a.strip_suffix('.').unwrap_or(a);
    !body.is_empty()
        && a.len() <= MAX_ACTION
        && body.split('.').all(|part| {
            let mut chars = part.chars();
            chars.next().is_some_and(|c| c.is_ascii_lowercase())
                && chars.all(|c| c.is_ascii_lowercase() || c == '_' || c == '-')
        })
}

/// Checks an audit query into the inventory's filter; `owner` scopes it to an owner's tenants.
fn check_audit_query(q: &AuditQuery, owner: Option<&str>) -> Result<AuditFilter, Problem> {
    if let Some(t) = &q.tenant {
        TenantName::parse(t).map_err(|e| Problem::invalid("tenant", &e.to_string()))?;
    }
    if let Some(a) = &q.actor
        && (a.is_empty()
            || a.chars().count() > MAX_ACTOR
            || a.chars().any(|c| c < ' ' || c == '\x7f'))
    {
        return Err(Problem::invalid(
            "actor",
            &format!(
                "an actor is 1 to {MAX_ACTOR} characters, none of them U+0000 to U+001F or U+007F"
            ),
        ));
    }
    let action = match &q.action {
        None => None,
        Some(a) if !is_action(a) => {
            return Err(Problem::invalid(
                "action",
                &format!(
                    "{a:?} is not an action (lowercase words joined by dots, like tenant.create, \
                     or a prefix ending in a dot, like tenant.; at most {MAX_ACTION} characters)"
                ),
            ));
        }
        Some(a) if a.ends_with('.') => Some(ActionFilter::StartingWith(a.clone())),
        Some(a) => Some(ActionFilter::Exactly(a.clone())),
    };
    // A `since` at or after `until` is an empty range, answered as one: how two parameters
    // relate is not something the OpenAPI document can state, so the server does not refuse it.
    let since = query_time("since", &q.since)?;
    let until = query_time("until", &q.until)?;
    let after = q.after.unwrap_or(0);
    if after < 0 {
        return Err(Problem::invalid("after", "after is an entry id, 0 or more"));
    }
    let limit = q.limit.unwrap_or(DEFAULT_AUDIT_PAGE);
    if !(1..=MAX_AUDIT_PAGE).contains(&limit) {
        return Err(Problem::invalid(
            "limit",
            &format!("limit must be 1 to {MAX_AUDIT_PAGE}"),
        ));
    }
    Ok(AuditFilter {
        owner: owner.map(str::to_owned),
        tenant: q.tenant.clone(),
        actor: q.actor.clone(),
        action,
        since,
        until,
        after,
        limit,
    })
}

impl From<AuditEntry> for AuditEntryView {
    fn from(e: AuditEntry) -> Self {
        AuditEntryView {
            id: e.id,
            at: e.at,
            actor: e.actor,
            action: e.action,
            tenant: e.tenant,
            detail: e.detail.0,
        }
    }
}

/// The audit trail, oldest first: every entry for an admin; for an owner, the entries of its
/// own tenants (deleted ones too). Pages of at most `limit`; `next_after` continues.
#[utoipa::path(get, path = "/v1/audit", tag = "audit", security(("bearer" = [])),
    params(AuditQuery), responses(
    (status = 200, body = AuditPage),
    (status = 400, description = "malformed query (`after` or `limit` not a number, a parameter given twice); `field` names it", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    (status = 422, description = "`tenant` not a tenant name, `actor` empty, too long or with control characters, `action` not an action or prefix, `since` or `until` not RFC 3339, `after` negative, or `limit` outside 1 to 1000; `field` names it", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn audit(
    State(s): State<AppState>,
    headers: HeaderMap,
    q: Result<Query<AuditQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AuditPage>, Problem> {
    let caller = crate::http::auth::authenticate(&s, &headers).await?;
    let Query(q) = q.map_err(Problem::from_query_rejection)?;
    let mut f = check_audit_query(&q, caller.scope())?;
    // One more than asked: whether another page follows.
    let limit = f.limit;
    f.limit += 1;
    let mut items = s
        .inventory
        .audit(&f)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let next_after = if items.len() > limit as usize {
        items.truncate(limit as usize);
        items.last().map(|e| e.id)
    } else {
        None
    };
    Ok(Json(AuditPage {
        items: items.into_iter().map(AuditEntryView::from).collect(),
        next_after,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn q(set: &[(&str, &str)]) -> AuditQuery {
        let mut q = AuditQuery::default();
        for (k, v) in set {
            let v = Some((*v).to_owned());
            match *k {
                "tenant" => q.tenant = v,
                "actor" => q.actor = v,
                "action" => q.action = v,
                "since" => q.since = v,
                "until" => q.until = v,
                "after" => q.after = v.and_then(|v| v.parse().ok()),
                "limit" => q.limit = v.and_then(|v| v.parse().ok()),
                _ => unreachable!("{k}"),
            }
        }
        q
    }

    #[test]
    fn audit_queries_become_filters_scoped_to_the_owner() {
        let f = check_audit_query(&q(&[]), None).unwrap();
        assert_eq!((f.owner, f.after, f.limit), (None, 0, 100));
        let f = check_audit_query(
            &q(&[
                ("tenant", "shop"),
                ("actor", "reconciler/vcp-7d9f-x"),
                ("action", "tenant."),
                ("since", "2026-01-01T01:00:00+01:00"),
                ("until", "2026-01-02T00:00:00Z"),
                ("after", "41"),
                ("limit", "1000"),
            ]),
            Some("team-a"),
        )
        .unwrap();
        assert_eq!(f.owner.as_deref(), Some("team-a"));
        assert_eq!(f.tenant.as_deref(), Some("shop"));
        assert_eq!(f.action, Some(ActionFilter::StartingWith("tenant.".into())));
        assert_eq!(
            f.since.map(|t| t.unix_timestamp()),
            Some(1_767_225_600),
            "in UTC"
        );
        assert_eq!((f.after, f.limit), (41, 1000));
        let f = check_audit_query(&q(&[("action", "token.admin-bootstrap")]), None).unwrap();
        assert_eq!(
            f.action,
            Some(ActionFilter::Exactly("token.admin-bootstrap".into()))
        );
    }

    #[test]
    fn audit_queries_that_make_no_sense_are_refused_naming_the_field() {
        for (set, field) in [
            (vec![("tenant", "Shop")], "tenant"),
            (vec![("tenant", "-x")], "tenant"),
            (vec![("actor", "")], "actor"),
            (vec![("actor", "a\nb")], "actor"),
            (vec![("actor", &"a".repeat(129))], "actor"),
            (vec![("action", "")], "action"),
            (vec![("action", ".")], "action"),
            (vec![("action", "Tenant.create")], "action"),
            (vec![("action", "tenant..create")], "action"),
            (vec![("action", "tenant.*")], "action"),
            (vec![("action", "1tenant")], "action"),
            (vec![("action", &"a".repeat(65))], "action"),
            (vec![("since", "yesterday")], "since"),
            (vec![("until", "2026-13-01T00:00:00Z")], "until"),
            (vec![("after", "-1")], "after"),
            (vec![("limit", "0")], "limit"),
            (vec![("limit", "1001")], "limit"),
        ] {
            let p = check_audit_query(&q(&set), None).unwrap_err();
            assert_eq!(p.status(), StatusCode::UNPROCESSABLE_ENTITY, "{set:?}");
            assert_eq!(p.field(), Some(field), "{set:?}");
        }
        // A reversed range is an empty one, not a mistake.
        assert!(
            check_audit_query(
                &q(&[
                    ("since", "2026-01-02T00:00:00Z"),
                    ("until", "2026-01-01T00:00:00Z")
                ]),
                None
            )
            .is_ok()
        );
        // The longest accepted.
        assert!(check_audit_query(&q(&[("actor", &"a".repeat(128))]), None).is_ok());
        assert!(check_audit_query(&q(&[("action", &"a".repeat(64))]), None).is_ok());
    }
}
