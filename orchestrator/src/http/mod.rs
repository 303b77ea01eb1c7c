//! HTTP plumbing every feature's handlers share: the state they are given ([`AppState`]),
//! who is calling ([`auth`]), RFC 7807 answers ([`problem`]), the schemas of strings the server
//! checks by a rule ([`schema`]), connection limits ([`conn`]), and the extractors: a body read
//! as JSON with the problem a malformed one deserves, a tenant `{name}` path with its `owner`
//! query, and [`find`], which resolves them to the one tenant the caller may see (others
//! answer 404, so names do not leak). The router that puts the features' handlers together is
//! [`crate::api`], above every feature.

pub mod auth;
pub mod conn;
pub mod problem;
pub mod schema;

use crate::host::Provisioner;
use crate::inventory::{Inventory, Tenant};
use crate::metrics::Metrics;
use crate::names::TenantName;
pub use crate::names::parse_ttl;
use auth::Caller;
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, Request};
use axum::http::StatusCode;
pub use problem::{Problem, ProblemBody};
use std::sync::Arc;
use std::time::Duration;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub inventory: Inventory,
    pub provisioner: Provisioner,
    pub metrics: Arc<Metrics>,
    pub max_kubeconfig_ttl: Duration,
    /// Set at SIGTERM: `/readyz` answers 503 while the replica drains.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

pub(crate) fn body<T>(r: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    r.map(|Json(v)| v).map_err(Problem::from_rejection)
}

/// A body that must be a JSON object, decoded into `T` with the same problems as [`body`].
/// serde's derive also takes a struct written as an array of its fields, which no client
/// means, and which a body of optional fields only would take as "change nothing".
pub(crate) fn object_body<T: serde::de::DeserializeOwned>(
    r: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<T, Problem> {
    let v = body(r)?;
    if !v.is_object() {
        return Err(Problem::invalid("body", "the body must be a JSON object"));
    }
    // Decoded again from its bytes, so a wrong field is named as for any other body.
    let bytes = serde_json::to_vec(&v).map_err(|_| Problem::opaque())?;
    Json::<T>::from_bytes(&bytes)
        .map(|Json(t)| t)
        .map_err(Problem::from_rejection)
}

/// The body of a route that takes none (a POST that starts something, a DELETE): nothing, or
/// an empty JSON object (`{}`, which clients that always send a body send). Anything else is
/// refused with 422 rather than ignored, as an unknown field of a route that takes a body is:
/// a caller who sends `{"location": ...}` to `POST .../snapshots` believes it chose something.
/// Handlers check it after the caller and the tenant, so 401 and 404 come first.
pub(crate) struct NoBody;

impl<S: Send + Sync> axum::extract::FromRequest<S> for NoBody {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<NoBody, Problem> {
        let bytes = axum::body::Bytes::from_request(req, state)
            .await
            .map_err(|e| match e.status() {
                StatusCode::PAYLOAD_TOO_LARGE => Problem::new(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "too-large",
                    "request body too large",
                    &e.body_text(),
                    Some("body"),
                ),
                _ => Problem::new(
                    StatusCode::BAD_REQUEST,
                    "malformed",
                    "malformed request body",
                    &e.body_text(),
                    Some("body"),
                ),
            })?;
        no_body(&bytes)
    }
}

/// [`NoBody`] from the bytes of a body: `Ok` for none (or only whitespace) and `{}`; 422
/// naming a field of an object with fields (the first in order), or `body` for anything else.
pub(crate) fn no_body(bytes: &[u8]) -> Result<NoBody, Problem> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(NoBody);
    }
    let takes_none = "this route takes no body (none, or {})";
    match serde_json::from_slice::<serde_json::Value>(bytes) {
        Ok(serde_json::Value::Object(o)) => match o.keys().next() {
            None => Ok(NoBody),
            Some(k) => Err(Problem::invalid(
                k,
                &format!("unknown field `{k}`: {takes_none}"),
            )),
        },
        _ => Err(Problem::invalid("body", takes_none)),
    }
}

/// The `{name}` of a path, with a problem+json rejection (a name that is not UTF-8, say), and
/// the request's query string, from which the tenant routes read `owner` ([`Name::owner`]):
/// every handler that takes a `Name` gets it without a parameter of its own. The token route
/// that also takes a `Name` never reads it.
pub(crate) struct Name {
    pub(crate) name: String,
    pub(crate) uri: axum::http::Uri,
}

/// The `owner` query parameter of the tenant routes; their other parameters are their own.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub(crate) struct OwnerQuery {
    /// The owner (token name) whose tenant of this name is meant. Names are unique per owner,
    /// so an admin needs it when live tenants of several owners have the name (409
    /// `ambiguous-name` otherwise); an owner may give only its own name (any other answers
    /// 404: an owner sees only its own tenants).
    #[param(value_type = Option<schema::NameSchema>)]
    owner: Option<String>,
}

impl Name {
    /// The `owner` the caller asked for: 400 for a malformed query (`owner` given twice, say),
    /// 422 for an owner no token could be named (token names are tenant names).
    fn owner(&self) -> Result<Option<String>, Problem> {
        let axum::extract::Query(q) = axum::extract::Query::<OwnerQuery>::try_from_uri(&self.uri)
            .map_err(Problem::from_query_rejection)?;
        if let Some(o) = &q.owner {
            TenantName::parse(o).map_err(|e| {
                Problem::invalid("owner", &format!("{o:?} is not a token name: {e}"))
            })?;
        }
        Ok(q.owner)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Name {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Name, Problem> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(name)) => Ok(Name {
                name,
                uri: parts.uri.clone(),
            }),
            Err(e) => Err(malformed_path(&e, Some("name"))),
        }
    }
}

/// 400 for a path axum could not take apart (a segment that is not UTF-8, say).
pub(crate) fn malformed_path(
    e: &axum::extract::rejection::PathRejection,
    field: Option<&str>,
) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "malformed",
        "malformed path",
        &e.body_text(),
        field,
    )
}

/// A tenant name and the path segment after it (a serial, a user), from a URL path.
pub(crate) struct NameAnd(pub(crate) Name, pub(crate) String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for NameAnd {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<NameAnd, Problem> {
        match Path::<(String, String)>::from_request_parts(parts, state).await {
            Ok(Path((name, x))) => Ok(NameAnd(
                Name {
                    name,
                    uri: parts.uri.clone(),
                },
                x,
            )),
            Err(e) => Err(malformed_path(&e, None)),
        }
    }
}

/// A name from a URL path. One that no tenant or token could have answers 404 before it
/// reaches the database (a NUL byte, say, is not even valid text there).
pub(crate) fn existing_name(name: &str, what: &str) -> Result<(), Problem> {
    TenantName::parse(name)
        .map(|_| ())
        .map_err(|_| Problem::not_found(&format!("no {what} named {name:?}")))
}

/// Whose tenants a lookup by name searches: `Some(None)` every owner's (an admin without
/// `owner`), `Some(Some(o))` only `o`'s, `None` nobody's (an owner asking for another owner's,
/// answered 404 as if it did not exist, so owners learn nothing of each other).
pub(crate) fn owner_filter<'a>(
    scope: Option<&'a str>,
    asked: Option<&'a str>,
) -> Option<Option<&'a str>> {
    match (scope, asked) {
        (Some(me), Some(o)) if o != me => None,
        (Some(me), _) => Some(Some(me)),
        (None, o) => Some(o),
    }
}

/// The one tenant of `found` (the live tenants named `name` the caller may see): 404 for
/// none; 409 `ambiguous-name` for several, which only an admin without `owner` can meet
/// (names are unique per owner), naming their owners so it can pick one.
pub(crate) fn the_one(name: &str, mut found: Vec<Tenant>) -> Result<Tenant, Problem> {
    match found.len() {
        0 => Err(Problem::not_found(&format!("no tenant named {name:?}"))),
        1 => Ok(found.remove(0)),
        _ => {
            let owners: Vec<&str> = found.iter().map(|t| t.owner.as_str()).collect();
            Err(Problem::new(
                StatusCode::CONFLICT,
                "ambiguous-name",
                "ambiguous tenant name",
                &format!(
                    "tenants of several owners are named {name:?} (owners: {}); add \
                     ?owner=<owner> to pick one",
                    owners.join(", ")
                ),
                Some("owner"),
            ))
        }
    }
}

/// A live tenant the caller may see, by the name in a path and the `owner` query parameter;
/// 404 otherwise, 409 when an admin's name matches several owners' tenants.
pub(crate) async fn find(s: &AppState, caller: &Caller, name: &Name) -> Result<Tenant, Problem> {
    let asked = name.owner()?;
    let name = name.name.as_str();
    existing_name(name, "tenant")?;
    tracing::Span::current().record("tenant", name);
    let Some(owner) = owner_filter(caller.scope(), asked.as_deref()) else {
        return Err(Problem::not_found(&format!("no tenant named {name:?}")));
    };
    let found = s
        .inventory
        .tenants_named(name, owner)
        .await
        .map_err(|e| Problem::internal(&e))?;
    the_one(name, found)
}

/// Who calls and the live tenant named in the path, if the caller may see it: 401 without a
/// valid token, 400 for a malformed path or query, 422 for a malformed `owner`, 404 for a
/// tenant that does not exist or is another owner's, 409 for an admin's name that several
/// owners hold. Called first in every handler of `/v1/tenants/{name}/...`, so a caller learns
/// nothing of other owners' tenants from any later check.
pub(crate) async fn caller_and_tenant(
    s: &AppState,
    headers: &axum::http::HeaderMap,
    name: Result<Name, Problem>,
) -> Result<(Caller, Tenant), Problem> {
    let caller = auth::authenticate(s, headers).await?;
    let name = name?;
    let t = find(s, &caller, &name).await?;
    Ok((caller, t))
}

/// `t` in UTC, within the years an RFC 3339 time can be written in (0000 to 9999):
/// `9999-12-31T23:59:59-01:00` is in the year 10000 in UTC, `0000-01-01T00:00:00+01:00` in
/// the year -1. Clamping them changes no answer (no sample is that old or that new) and keeps
/// the answer's `since` and `until` writable.
pub(crate) fn in_utc(t: time::OffsetDateTime) -> time::OffsetDateTime {
    use time::{Date, Month};
    let first = Date::from_calendar_date(0, Month::January, 1).map(|d| d.midnight());
    let last = Date::from_calendar_date(9999, Month::December, 31)
        .and_then(|d| d.with_hms_nano(23, 59, 59, 999_999_999));
    let (first, last) = (
        first.expect("a valid date").assume_utc(),
        last.expect("a valid time").assume_utc(),
    );
    t.checked_to_offset(time::UtcOffset::UTC)
        .unwrap_or(if t.year() > 0 { last } else { first })
        .clamp(first, last)
}

/// The RFC 3339 time of query parameter `field`, in UTC; 422 naming `field` for anything else.
pub(crate) fn query_time(
    field: &str,
    v: &Option<String>,
) -> Result<Option<time::OffsetDateTime>, Problem> {
    v.as_deref()
        .map(|s| {
            time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map(in_utc)
                .map_err(|_| {
                    Problem::invalid(
                        field,
                        &format!("{s:?} is not an RFC 3339 time like 2026-01-01T00:00:00Z"),
                    )
                })
        })
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_searches_only_its_own_tenants_and_an_admin_whose_it_names() {
        assert_eq!(owner_filter(None, None), Some(None), "admin: every owner's");
        assert_eq!(owner_filter(None, Some("b")), Some(Some("b")));
        assert_eq!(owner_filter(Some("a"), None), Some(Some("a")));
        assert_eq!(owner_filter(Some("a"), Some("a")), Some(Some("a")));
        assert_eq!(owner_filter(Some("a"), Some("b")), None, "404, never b's");
    }

    #[test]
    fn owner_is_read_from_the_query_and_checked() {
        let owner = |uri: &str| {
            Name {
                name: "t".into(),
                uri: uri.parse().unwrap(),
            }
            .owner()
        };
        assert_eq!(owner("/v1/tenants/t").unwrap(), None);
        assert_eq!(
            owner("/v1/tenants/t/usage?limit=5&owner=team-a").unwrap(),
            Some("team-a".into())
        );
        let e = owner("/v1/tenants/t?owner=Team_A").unwrap_err();
        assert_eq!(
            (e.status(), e.field()),
            (StatusCode::UNPROCESSABLE_ENTITY, Some("owner"))
        );
        let e = owner("/v1/tenants/t?owner=").unwrap_err();
        assert_eq!(e.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let e = owner("/v1/tenants/t?owner=a&owner=b").unwrap_err();
        assert_eq!(
            (e.status(), e.field()),
            (StatusCode::BAD_REQUEST, Some("owner"))
        );
    }
}
