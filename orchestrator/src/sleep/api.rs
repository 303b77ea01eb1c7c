//! Sleep and wake through the API: owners and admins put a tenant to sleep and wake it
//! (`POST /v1/tenants/{name}/sleep`, `/wake`); the gateway, with its own token, reports which
//! tenants had connections (`POST /v1/gateway/activity`) and wakes an asleep tenant when a
//! connection for it arrives (`POST /v1/gateway/wake`). Every change is in the audit trail.

use crate::http::auth::authenticate_gateway;
use crate::http::problem::{
    BodyRefused, NoBodyTaken, NoSuchTenant, Problem, ProblemBody, Unauthorized,
};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, NoBody, body, caller_and_tenant};
use crate::sleep::store::Asked;
use crate::tenants::types::TenantView;
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tracing::field::Empty;
use utoipa::ToSchema;
use vcp_core::lifecycle::Sleep;
use vcp_core::naming::TenantKey;

/// Most tenants one activity report names: what fits the API's 64 KiB body limit with room to
/// spare (a gateway replica sends as many reports as the tenants it saw since its last need).
pub const MAX_ACTIVITY: usize = 500;

/// Puts the tenant to sleep: its control plane scales to zero (etcd keeps its volume); its
/// workloads on the host keep running, and CoreDNS with them while any runs. Phase `Sleeping`
/// once the control-plane pods are gone. A wake, or the first connection through the
/// gateway, starts it again. 409 unless the tenant is Ready with no upgrade, restore or
/// rotation going. Idempotent: asking an asleep tenant to sleep changes nothing. No body.
#[utoipa::path(post, path = "/v1/tenants/{name}/sleep", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    responses(
    (status = 202, description = "asked to sleep; poll `phase` for `Sleeping`", body = TenantView),
    (status = 409, description = "not Ready, or an upgrade, restore or rotation is going", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    NoSuchTenant,
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn sleep_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    ask(s, headers, name, none, Sleep::Asleep).await
}

/// Wakes the tenant: its control plane starts again on its data, through the same steps as a
/// creation (poll `phase` for `Ready`). Idempotent. No body.
#[utoipa::path(post, path = "/v1/tenants/{name}/wake", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    responses(
    (status = 202, description = "asked to wake; poll `phase` for `Ready`", body = TenantView),
    Unauthorized,
    NoSuchTenant,
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn wake_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    ask(s, headers, name, none, Sleep::Awake).await
}

async fn ask(
    s: AppState,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    none: Result<NoBody, Problem>,
    to: Sleep,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    none?;
    let why = format!("asked by {}", caller.0.name);
    let asked = s
        .inventory
        .ask_sleep(&t, to, &caller.0.name, &why)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let t = match asked {
        Asked::Changed(t) | Asked::Unchanged(t) => *t,
        other => return Err(refused(other, &t.name, to)),
    };
    let view = crate::tenants::api::view(&s, t).await?;
    Ok((StatusCode::ACCEPTED, Json(view)))
}

fn refused(asked: Asked, name: &str, to: Sleep) -> Problem {
    match asked {
        Asked::Busy(phase) => Problem::conflict(
            "phase",
            &format!(
                "tenant {name:?} is {phase}: only a Ready tenant with no upgrade, restore or \
                 rotation going goes to {}",
                if to == Sleep::Asleep { "sleep" } else { "wake" }
            ),
        ),
        _ => Problem::not_found(&format!("no tenant named {name:?}")),
    }
}

/// One tenant in an activity report.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Seen {
    /// The tenant's key (the first label of its host name behind the gateway).
    #[schema(pattern = "^[a-z][a-z0-9]{0,19}$", max_length = 20)]
    pub key: String,
    /// When the gateway last had a connection for it open.
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub at: OffsetDateTime,
}

/// `POST /v1/gateway/activity` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActivityReport {
    /// At most 500 tenants; a key named twice counts its latest time.
    #[schema(max_items = 500)]
    pub tenants: Vec<Seen>,
}

/// `POST /v1/gateway/activity` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ActivityRecorded {
    /// Tenants whose last activity moved (unknown keys and older times move nothing).
    pub moved: u64,
}

/// The gateway's report of which tenants had connections, and when last: where each tenant's
/// idle time starts. The gateway's token or an admin's.
#[utoipa::path(post, path = "/v1/gateway/activity", tag = "gateway",
    security(("bearer" = [])),
    request_body = ActivityReport,
    responses(
    (status = 200, description = "recorded", body = ActivityRecorded),
    (status = 403, description = "neither the gateway's token nor an admin's", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "a key that is no tenant key, or more than 500 tenants", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    BodyRefused,
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn gateway_activity(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<ActivityReport>, JsonRejection>,
) -> Result<Json<ActivityRecorded>, Problem> {
    authenticate_gateway(&s, &headers).await?;
    let req = body(req)?;
    if req.tenants.len() > MAX_ACTIVITY {
        return Err(Problem::invalid(
            "tenants",
            &format!("at most {MAX_ACTIVITY} tenants per report"),
        ));
    }
    for t in &req.tenants {
        if TenantKey::new(&t.key).is_err() {
            return Err(Problem::invalid(
                "tenants",
                &format!("{:?} is not a tenant key", truncated(&t.key)),
            ));
        }
    }
    // A clock ahead of vcp's would keep a tenant awake for longer than its plan says.
    let now = OffsetDateTime::now_utc();
    // A key named twice counts its latest time.
    let mut latest = std::collections::BTreeMap::new();
    for t in req.tenants {
        let at = crate::http::in_utc(t.at).min(now);
        let e = latest.entry(t.key).or_insert(at);
        *e = (*e).max(at);
    }
    let report: Vec<(String, OffsetDateTime)> = latest.into_iter().collect();
    let moved = s
        .inventory
        .record_activity(&report)
        .await
        .map_err(|e| Problem::internal(&e))?;
    Ok(Json(ActivityRecorded { moved }))
}

fn truncated(s: &str) -> String {
    s.chars().take(64).collect()
}

/// `POST /v1/gateway/wake` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GatewayWake {
    /// The key of the tenant a connection arrived for.
    #[schema(pattern = "^[a-z][a-z0-9]{0,19}$", max_length = 20)]
    pub key: String,
}

/// `POST /v1/gateway/wake` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GatewayWoken {
    /// Whether this call woke it (false: it was awake already).
    pub woken: bool,
}

/// Wakes the tenant a connection arrived for at the gateway, which holds the connection until
/// the apiserver answers. The gateway's token or an admin's.
#[utoipa::path(post, path = "/v1/gateway/wake", tag = "gateway",
    security(("bearer" = [])),
    request_body = GatewayWake,
    responses(
    (status = 202, description = "awake or waking", body = GatewayWoken),
    (status = 403, description = "neither the gateway's token nor an admin's", body = ProblemBody, content_type = "application/problem+json"),
    (status = 404, description = "no live tenant has the key", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "not a tenant key", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    BodyRefused,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, key = Empty))]
pub(crate) async fn gateway_wake(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<GatewayWake>, JsonRejection>,
) -> Result<(StatusCode, Json<GatewayWoken>), Problem> {
    let caller = authenticate_gateway(&s, &headers).await?;
    let req = body(req)?;
    if TenantKey::new(&req.key).is_err() {
        return Err(Problem::invalid(
            "key",
            &format!("{:?} is not a tenant key", truncated(&req.key)),
        ));
    }
    tracing::Span::current().record("key", req.key.as_str());
    let internal = |e: crate::Error| Problem::internal(&e);
    let t = s
        .inventory
        .tenant_by_key(&req.key)
        .await
        .map_err(internal)?
        .ok_or_else(|| Problem::not_found(&format!("no tenant has key {:?}", req.key)))?;
    let asked = s
        .inventory
        .ask_sleep(
            &t,
            Sleep::Awake,
            &caller.0.name,
            "a connection through the gateway",
        )
        .await
        .map_err(internal)?;
    match asked {
        Asked::Changed(_) => Ok((StatusCode::ACCEPTED, Json(GatewayWoken { woken: true }))),
        Asked::Unchanged(_) => Ok((StatusCode::ACCEPTED, Json(GatewayWoken { woken: false }))),
        other => Err(refused(other, &req.key, Sleep::Awake)),
    }
}
