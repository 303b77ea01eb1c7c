//! The platform API (axum): tenants (with their quota usage), kubeconfigs, tokens, versions,
//! health and metrics.
//!
//! Every caller presents a bearer token; the inventory holds only its hash. Admins see the
//! whole fleet; an owner token sees only tenants it created (others answer 404, so tenant
//! names do not leak). Errors are RFC 7807 `application/problem+json` with a stable `type`
//! and, for caller mistakes, the `field` at fault; a 500 says nothing about internals.

mod problem;
mod types;

use crate::inventory::{Inventory, NewTenant, Tenant, Token};
use crate::names::TenantName;
pub use crate::names::parse_ttl;
use crate::provision::Provisioner;
use crate::serve::{key_suffix, new_token, token_hash};
use crate::{Error, pki, render};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Secret;
use problem::{AdminOnly, BodyRefused, NoSuchTenant, Unauthorized};
pub use problem::{Problem, ProblemBody};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
pub use types::*;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Counters behind `/metrics`.
#[derive(Debug, Default)]
pub struct Metrics {
    passes: AtomicU64,
    pass_errors: AtomicU64,
    pass_micros: AtomicU64,
    requests: AtomicU64,
    client_errors: AtomicU64,
    server_errors: AtomicU64,
    usage_samples: AtomicU64,
    usage_errors: AtomicU64,
}

impl Metrics {
    pub fn pass(&self, took: Duration, error: bool) {
        self.passes.fetch_add(1, Ordering::Relaxed);
        self.pass_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        if error {
            self.pass_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A usage sampling round: samples recorded, tenants (or whole rounds) that failed.
    pub fn usage_round(&self, recorded: usize, failed: usize) {
        self.usage_samples
            .fetch_add(recorded as u64, Ordering::Relaxed);
        self.usage_errors
            .fetch_add(failed as u64, Ordering::Relaxed);
    }
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub inventory: Inventory,
    pub provisioner: Provisioner,
    pub metrics: Arc<Metrics>,
    pub max_kubeconfig_ttl: Duration,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "vcp platform API",
        description = "Self-service Kubernetes control planes: tenants, kubeconfigs, tokens.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    components(schemas(ProblemBody)),
)]
struct ApiDoc;

/// Declares the `bearer` scheme the operations refer to.
struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "an API token from `vcp token create` or the admin token",
                    ))
                    .build(),
            ),
        );
    }
}

/// Routes and their OpenAPI operations come from the same `routes!` calls, so the document
/// cannot list a route the server does not serve (or miss one it does).
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(healthz))
        .routes(routes!(readyz))
        .routes(routes!(metrics_text))
        .routes(routes!(versions))
        .routes(routes!(create_tenant, list_tenants))
        .routes(routes!(get_tenant, delete_tenant))
        .routes(routes!(tenant_usage))
        .routes(routes!(issue_kubeconfig, list_kubeconfigs))
        .routes(routes!(create_token, list_tokens))
        .routes(routes!(revoke_token))
        .routes(routes!(openapi_json))
}

/// The OpenAPI document of a server with the built-in versions and plans: `vcp openapi` and
/// docs/openapi.json.
pub fn openapi() -> utoipa::openapi::OpenApi {
    let plans = crate::render::parse_plans("{}").unwrap_or_default();
    openapi_for(
        &crate::render::Catalog::builtin(),
        plans.into_keys().collect(),
    )
}

/// The OpenAPI document of a server with these versions and plans, which it states as the
/// values `POST /v1/tenants` takes.
pub fn openapi_for(
    catalog: &crate::render::Catalog,
    plans: Vec<String>,
) -> utoipa::openapi::OpenApi {
    let mut doc = api_routes().into_openapi();
    types::with_choices(&mut doc, catalog.spellings(), plans);
    doc
}

/// This document (no token needed: it describes the API, not the fleet), with this server's
/// versions and plans.
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "the OpenAPI document of this API", body = Object)))]
async fn openapi_json(State(s): State<AppState>) -> Json<utoipa::openapi::OpenApi> {
    let config = &s.provisioner.config;
    Json(openapi_for(
        &config.catalog,
        config.plans.keys().cloned().collect(),
    ))
}

/// The router.
pub fn router(state: AppState) -> Router {
    let metrics = state.metrics.clone();
    let (routes, _) = api_routes().split_for_parts();
    routes
        .fallback(|| async { Problem::not_found("no such route") })
        .method_not_allowed_fallback(|| async {
            Problem::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "method not allowed",
                "this route does not take that method; see /openapi.json",
                None,
            )
        })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        // A bug in a handler answers 500 problem+json instead of dropping the connection.
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            |_: Box<dyn std::any::Any + Send>| {
                tracing::error!("request handler panicked");
                Problem::opaque().into_response()
            },
        ))
        .layer(axum::middleware::map_response(move |r: Response| {
            let m = metrics.clone();
            async move {
                m.requests.fetch_add(1, Ordering::Relaxed);
                if r.status().is_client_error() {
                    m.client_errors.fetch_add(1, Ordering::Relaxed);
                } else if r.status().is_server_error() {
                    m.server_errors.fetch_add(1, Ordering::Relaxed);
                }
                r
            }
        }))
        .with_state(state)
}

/// The caller, from its bearer token.
struct Caller(Token);

impl Caller {
    fn admin(&self) -> bool {
        self.0.role == "admin"
    }
    /// Owner filter for tenant queries: none for admins.
    fn scope(&self) -> Option<&str> {
        (!self.admin()).then_some(self.0.name.as_str())
    }
}

async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, Problem> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Problem::unauthorized("a bearer token is required"))?;
    match state
        .inventory
        .token_by_hash(&token_hash(token.trim()))
        .await
    {
        Ok(Some(t)) => Ok(Caller(t)),
        Ok(None) => Err(Problem::unauthorized("the token is unknown or revoked")),
        Err(e) => Err(Problem::internal(&e)),
    }
}

fn body<T>(r: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    r.map(|Json(v)| v).map_err(Problem::from_rejection)
}

/// Tenants as the API shows them: with their release and their latest usage sample (one
/// query for all of them).
async fn views(s: &AppState, tenants: Vec<Tenant>) -> Result<Vec<TenantView>, Problem> {
    let ids: Vec<i64> = tenants.iter().map(|t| t.id).collect();
    let mut latest = s
        .inventory
        .latest_usage(&ids)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let config = &s.provisioner.config;
    Ok(tenants
        .into_iter()
        .map(|t| {
            let kubernetes = config.catalog.get(&t.version).map(|v| v.kubernetes.clone());
            let usage = latest.remove(&t.id).map(|u| TenantUsage {
                sampled_at: u.sampled_at,
                used: u.used,
                limits: crate::usage::limits(&config.plans, &t.plan),
            });
            TenantView::new(t, kubernetes, usage)
        })
        .collect())
}

async fn view(s: &AppState, t: Tenant) -> Result<TenantView, Problem> {
    Ok(views(s, vec![t]).await?.remove(0))
}

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the inventory answers.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "ready", body = String, content_type = "text/plain"),
    (status = 503, description = "the inventory does not answer", body = String, content_type = "text/plain"),
))]
async fn readyz(State(s): State<AppState>) -> Response {
    if s.inventory.ping().await {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "inventory unavailable").into_response()
    }
}

/// Prometheus metrics of this replica.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
async fn metrics_text(State(s): State<AppState>) -> Response {
    let m = &s.metrics;
    let mut out = String::new();
    let mut counter = |name: &str, help: &str, v: u64| {
        out.push_str(&format!(
            "# HELP {name} {help}\n# TYPE {name} counter\n{name} {v}\n"
        ));
    };
    counter(
        "vcp_reconcile_passes_total",
        "Reconcile passes run by this replica.",
        m.passes.load(Ordering::Relaxed),
    );
    counter(
        "vcp_reconcile_pass_errors_total",
        "Passes that ended with a step in error.",
        m.pass_errors.load(Ordering::Relaxed),
    );
    counter(
        "vcp_reconcile_pass_seconds_total",
        "Time spent in reconcile passes.",
        m.pass_micros.load(Ordering::Relaxed) / 1_000_000,
    );
    counter(
        "vcp_http_requests_total",
        "API requests served.",
        m.requests.load(Ordering::Relaxed),
    );
    counter(
        "vcp_http_client_errors_total",
        "API requests answered 4xx.",
        m.client_errors.load(Ordering::Relaxed),
    );
    counter(
        "vcp_http_server_errors_total",
        "API requests answered 5xx.",
        m.server_errors.load(Ordering::Relaxed),
    );
    counter(
        "vcp_usage_samples_total",
        "Tenant usage samples this replica recorded.",
        m.usage_samples.load(Ordering::Relaxed),
    );
    counter(
        "vcp_usage_sample_errors_total",
        "Tenants (or whole rounds) whose usage this replica could not sample.",
        m.usage_errors.load(Ordering::Relaxed),
    );
    out.push_str("# HELP vcp_tenants Live tenants by phase.\n# TYPE vcp_tenants gauge\n");
    if let Ok(counts) = s.inventory.phase_counts().await {
        for (phase, n) in counts {
            out.push_str(&format!("vcp_tenants{{phase=\"{phase}\"}} {n}\n"));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

/// The Kubernetes versions tenants can run.
#[utoipa::path(get, path = "/v1/versions", tag = "versions", security(("bearer" = [])), responses(
    (status = 200, body = VersionList),
    Unauthorized,
))]
async fn versions(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<VersionList>, Problem> {
    authenticate(&s, &headers).await?;
    let c = &s.provisioner.config.catalog;
    Ok(Json(VersionList {
        default: c.default.clone(),
        versions: c
            .versions
            .iter()
            .map(|v| VersionView {
                minor: v.minor.clone(),
                kubernetes: v.kubernetes.clone(),
                default: v.minor == c.default,
            })
            .collect(),
    }))
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Problem> {
    use crate::names::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_LABELS};
    if labels.len() > MAX_LABELS {
        return Err(Problem::invalid(
            "labels",
            &format!("at most {MAX_LABELS} labels"),
        ));
    }
    for (k, v) in labels {
        if !crate::names::is_label_key(k) || !crate::names::is_label_value(v) {
            return Err(Problem::invalid(
                "labels",
                &format!(
                    "label {k:?}: keys of 1 to {MAX_LABEL_KEY_LEN} and values of up to \
                     {MAX_LABEL_VALUE_LEN} characters of [A-Za-z0-9-_./]"
                ),
            ));
        }
    }
    Ok(())
}

/// Creates a tenant; provisioning continues in the background (poll its `phase`).
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])),
    request_body = CreateTenant, responses(
    (status = 201, description = "accepted; phase Pending", body = TenantView),
    BodyRefused,
    Unauthorized,
    (status = 409, description = "a live tenant has this name", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid name, version, plan or labels", body = ProblemBody, content_type = "application/problem+json"),
))]
async fn create_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateTenant>, JsonRejection>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let req = body(req)?;
    let name =
        TenantName::parse(&req.name).map_err(|e| Problem::invalid("name", &e.to_string()))?;
    let config = &s.provisioner.config;
    let version = config
        .catalog
        .resolve(req.version.as_deref())
        .map_err(|e| Problem::invalid("version", &e.to_string()))?;
    let plan = req.plan.unwrap_or_else(|| "default".into());
    if !config.plans.contains_key(&plan) {
        return Err(Problem::invalid(
            "plan",
            &format!(
                "unknown plan {plan:?}; configured: {}",
                config.plans.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    check_labels(&req.labels)?;
    // A random key could collide with a live one; a few tries make that vanishingly rare.
    for _ in 0..5 {
        let new = NewTenant {
            name: name.to_string(),
            key: name.key(key_suffix()),
            owner: caller.0.name.clone(),
            labels: req.labels.clone(),
            version: version.minor.clone(),
            plan: plan.clone(),
        };
        match s.inventory.create_tenant(&new, &caller.0.name).await {
            Ok(t) => return Ok((StatusCode::CREATED, Json(view(&s, t).await?))),
            Err(Error::KeyCollision) => continue,
            Err(Error::Duplicate(n)) => {
                return Err(Problem::conflict(
                    "name",
                    &format!("a tenant named {n:?} already exists"),
                ));
            }
            Err(e) => return Err(Problem::internal(&e)),
        }
    }
    Err(Problem::internal(&Error::KeyCollision))
}

/// The caller's tenants (every tenant for an admin).
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])), responses(
    (status = 200, body = TenantList),
    Unauthorized,
))]
async fn list_tenants(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<TenantList>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let tenants = s
        .inventory
        .list_tenants(caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?;
    let items = views(&s, tenants).await?;
    Ok(Json(TenantList { items }))
}

/// The `{name}` of a path, with a problem+json rejection (a name that is not UTF-8, say).
struct Name(String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Name {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Name, Problem> {
        match Path::<String>::from_request_parts(parts, state).await {
            Ok(Path(n)) => Ok(Name(n)),
            Err(e) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed",
                "malformed path",
                &e.body_text(),
                Some("name"),
            )),
        }
    }
}

/// A name from a URL path. One that no tenant or token could have answers 404 before it
/// reaches the database (a NUL byte, say, is not even valid text there).
fn existing_name(name: &str, what: &str) -> Result<(), Problem> {
    TenantName::parse(name)
        .map(|_| ())
        .map_err(|_| Problem::not_found(&format!("no {what} named {name:?}")))
}

async fn find(s: &AppState, caller: &Caller, name: &str) -> Result<Tenant, Problem> {
    existing_name(name, "tenant")?;
    s.inventory
        .get_tenant(name, caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {name:?}")))
}

/// One tenant, with its latest quota usage sample (`usage`, null before the first).
#[utoipa::path(get, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")), responses(
    (status = 200, body = TenantView),
    Unauthorized,
    NoSuchTenant,
))]
async fn get_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<TenantView>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Name(name) = name?;
    let t = find(&s, &caller, &name).await?;
    Ok(Json(view(&s, t).await?))
}

/// Deletes a tenant: its control plane, its workloads on the host and (unless retained) its
/// data. The name is free again once the tenant is gone from the list.
#[utoipa::path(delete, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name"), DeleteQuery), responses(
    (status = 202, description = "deletion started; phase Deleting", body = TenantView),
    (status = 400, description = "malformed query", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    NoSuchTenant,
))]
async fn delete_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    q: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Name(name) = name?;
    let Query(q) = q.map_err(|e| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            "malformed query",
            &e.body_text(),
            Some("retain_data"),
        )
    })?;
    existing_name(&name, "tenant")?;
    let t = s
        .inventory
        .request_delete(&name, caller.scope(), q.retain_data, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {name:?}")))?;
    Ok((StatusCode::ACCEPTED, Json(view(&s, t).await?)))
}

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

/// `t` in UTC, within the years an RFC 3339 time can be written in (0000 to 9999):
/// `9999-12-31T23:59:59-01:00` is in the year 10000 in UTC, `0000-01-01T00:00:00+01:00` in
/// the year -1. Clamping them changes no answer (no sample is that old or that new) and keeps
/// the answer's `since` and `until` writable.
fn in_utc(t: time::OffsetDateTime) -> time::OffsetDateTime {
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

/// Checks a usage query; `now` is the default `until`.
fn check_usage_query(q: &UsageQuery, now: time::OffsetDateTime) -> Result<UsageRange, Problem> {
    let time = |field: &str, v: &Option<String>| -> Result<Option<time::OffsetDateTime>, Problem> {
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
    };
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
async fn tenant_usage(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    q: Result<Query<UsageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<UsageSamples>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Name(name) = name?;
    // The tenant first: another owner's tenant answers 404 whatever the query.
    let t = find(&s, &caller, &name).await?;
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
        limits: crate::usage::limits(&s.provisioner.config.plans, &t.plan),
    }))
}

/// Checks a kubeconfig request; the `ttl` it asks for, capped at `max`.
fn check_kubeconfig(req: &IssueKubeconfig, max: Duration) -> Result<Duration, Problem> {
    use crate::names::{MAX_GROUPS, MAX_SUBJECT_LEN, is_subject};
    if !is_subject(&req.user) {
        return Err(Problem::invalid(
            "user",
            &format!(
                "1 to {MAX_SUBJECT_LEN} printable ASCII characters without spaces, not \
                 starting with \"system:\" or \"vcp:\""
            ),
        ));
    }
    if req.groups.len() > MAX_GROUPS || !req.groups.iter().all(|g| is_subject(g)) {
        return Err(Problem::invalid(
            "groups",
            &format!(
                "at most {MAX_GROUPS} groups of 1 to {MAX_SUBJECT_LEN} printable ASCII \
                 characters, none starting with \"system:\" or \"vcp:\""
            ),
        ));
    }
    let ttl = match req.ttl.as_deref() {
        None => Duration::from_secs(24 * 3600),
        Some(x) => parse_ttl(x)
            .ok_or_else(|| Problem::invalid("ttl", "a duration like 90m, 12h or 30d"))?,
    };
    Ok(ttl.min(max))
}

/// Issues a kubeconfig: a client certificate signed by the tenant's CA, user as CN and
/// groups as O. The key is in this answer only; the inventory keeps serial, subject and
/// expiry.
#[utoipa::path(post, path = "/v1/tenants/{name}/kubeconfigs", tag = "kubeconfigs", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = IssueKubeconfig, responses(
    (status = 201, body = KubeconfigIssued),
    BodyRefused,
    Unauthorized,
    NoSuchTenant,
    (status = 409, description = "the tenant is not Ready", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid user, groups or ttl", body = ProblemBody, content_type = "application/problem+json"),
))]
async fn issue_kubeconfig(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<IssueKubeconfig>, JsonRejection>,
) -> Result<(StatusCode, Json<KubeconfigIssued>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Name(name) = name?;
    // The tenant first: another owner's tenant answers 404 whatever the body.
    let t = find(&s, &caller, &name).await?;
    let req = body(req)?;
    let ttl = check_kubeconfig(&req, s.max_kubeconfig_ttl)?;
    let Some(endpoint) = t.endpoint.clone().filter(|_| t.phase == "Ready") else {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-ready",
            "tenant not ready",
            &format!(
                "tenant {name:?} is {}; kubeconfigs are issued once it is Ready",
                t.phase
            ),
            None,
        ));
    };
    let ns = crate::names::control_plane_namespace(&t.key);
    let secrets: kube::Api<Secret> = kube::Api::namespaced(s.provisioner.host.clone(), &ns);
    let ca_secret = secrets
        .get("ca")
        .await
        .map_err(|e| Problem::internal(&Error::kube("read the tenant CA", e)))?;
    let field = |k: &str| {
        ca_secret
            .data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .unwrap_or_default()
    };
    let ca = pki::Ca::load(&pki::CertKey {
        cert_pem: field("tls.crt"),
        key_pem: field("tls.key"),
    })
    .map_err(|e| Problem::internal(&Error::Pki(e)))?;
    let groups: Vec<&str> = req.groups.iter().map(String::as_str).collect();
    let now = time::OffsetDateTime::now_utc();
    let pair = ca
        .issue(
            &pki::LeafSpec::client(&req.user, &groups),
            now,
            time::Duration::try_from(ttl)
                .map_err(|_| Problem::invalid("ttl", "longer than this server can represent"))?,
        )
        .map_err(|e| Problem::internal(&Error::Pki(e)))?;
    let info = pki::inspect("kubeconfig", &pair.cert_pem)
        .map_err(|e| Problem::internal(&Error::Pki(e)))?;
    s.inventory
        .record_kubeconfig(
            t.id,
            &req.user,
            &req.groups,
            &info.serial,
            info.not_after,
            &caller.0.name,
        )
        .await
        .map_err(|e| Problem::internal(&e))?;
    let kubeconfig = render::kubeconfig::embedded(
        &t.name,
        &endpoint,
        &ca.cert_key().cert_pem,
        &req.user,
        &pair.cert_pem,
        &pair.key_pem,
    );
    Ok((
        StatusCode::CREATED,
        Json(KubeconfigIssued {
            kubeconfig,
            serial: info.serial,
            user: req.user,
            groups: req.groups,
            expires_at: info.not_after,
        }),
    ))
}

/// The kubeconfigs issued for a tenant (serial, subject, groups, expiry; never keys).
#[utoipa::path(get, path = "/v1/tenants/{name}/kubeconfigs", tag = "kubeconfigs", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")), responses(
    (status = 200, body = KubeconfigList),
    Unauthorized,
    NoSuchTenant,
))]
async fn list_kubeconfigs(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<KubeconfigList>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Name(name) = name?;
    let t = find(&s, &caller, &name).await?;
    let items = s
        .inventory
        .kubeconfigs(t.id)
        .await
        .map_err(|e| Problem::internal(&e))?
        .into_iter()
        .map(KubeconfigView::from)
        .collect();
    Ok(Json(KubeconfigList { items }))
}

/// Creates an API token (admins only). The secret is shown in this answer once.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])),
    request_body = CreateToken, responses(
    (status = 201, body = TokenCreated),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 409, description = "a token has this name", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid name or role", body = ProblemBody, content_type = "application/problem+json"),
))]
async fn create_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateToken>, JsonRejection>,
) -> Result<(StatusCode, Json<TokenCreated>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins create tokens"));
    }
    let req = body(req)?;
    if TenantName::parse(&req.name).is_err() {
        return Err(Problem::invalid(
            "name",
            &format!(
                "a lowercase name like a tenant's: {}, up to {} characters",
                crate::names::NAME_PATTERN,
                crate::names::MAX_NAME_LEN
            ),
        ));
    }
    let secret = new_token();
    let t = match s
        .inventory
        .create_token(
            &req.name,
            req.role.as_str(),
            &token_hash(&secret),
            &caller.0.name,
        )
        .await
    {
        Ok(t) => t,
        Err(Error::Duplicate(n)) => {
            return Err(Problem::conflict(
                "name",
                &format!("a token named {n:?} exists"),
            ));
        }
        Err(e) => return Err(Problem::internal(&e)),
    };
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            role: Role::of(&t.role),
            name: t.name,
            token: secret,
        }),
    ))
}

/// Every token, live and revoked, without secrets (admins only).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])), responses(
    (status = 200, body = TokenList),
    Unauthorized,
    AdminOnly,
))]
async fn list_tokens(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<TokenList>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins list tokens"));
    }
    let items = s
        .inventory
        .tokens()
        .await
        .map_err(|e| Problem::internal(&e))?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { items }))
}

/// Revokes a token (admins only): it answers 401 from then on.
#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "tokens", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "token name")), responses(
    (status = 204, description = "revoked"),
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no live token of that name", body = ProblemBody, content_type = "application/problem+json"),
))]
async fn revoke_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<StatusCode, Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins revoke tokens"));
    }
    let Name(name) = name?;
    existing_name(&name, "live token")?;
    match s.inventory.revoke_token(&name, &caller.0.name).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(Problem::not_found(&format!("no live token named {name:?}"))),
        Err(e) => Err(Problem::internal(&e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// docs/openapi.json is the published contract; it must be what the server serves.
    /// `VCP_UPDATE_GOLDEN=1 cargo test -p vcp-orchestrator --lib openapi` rewrites it.
    #[test]
    fn the_committed_openapi_document_is_current() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
        let now = format!("{}\n", openapi().to_pretty_json().unwrap());
        if std::env::var_os("VCP_UPDATE_GOLDEN").is_some() {
            std::fs::write(&path, &now).unwrap();
        }
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            committed == now,
            "docs/openapi.json is stale; run with VCP_UPDATE_GOLDEN=1 to rewrite it"
        );
    }

    #[test]
    fn every_v1_operation_requires_a_token_and_documents_its_bodies() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut ops = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                if !path.starts_with("/v1/") {
                    continue;
                }
                ops += 1;
                assert_eq!(
                    op["security"][0]["bearer"],
                    serde_json::json!([]),
                    "{method} {path}"
                );
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.contains_key("401"), "{method} {path}");
                for (code, r) in responses {
                    if code != "204" {
                        assert!(
                            r["content"].is_object(),
                            "{method} {path} {code} has no body"
                        );
                    }
                }
                if method == "post" {
                    assert!(
                        op["requestBody"]["content"]["application/json"].is_object(),
                        "{path}"
                    );
                    assert!(responses.contains_key("422"), "{path}");
                }
            }
        }
        assert_eq!(ops, 11);
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    #[test]
    fn the_document_states_the_limits_the_server_checks() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let groups = &schemas["IssueKubeconfig"]["properties"]["groups"];
        assert_eq!(groups["maxItems"], crate::names::MAX_GROUPS);
        assert_eq!(groups["items"]["$ref"], "#/components/schemas/Subject");
        let usage = &doc["paths"]["/v1/tenants/{name}/usage"]["get"]["parameters"];
        let limit = usage
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == "limit")
            .unwrap();
        assert_eq!(limit["schema"]["minimum"], 1);
        assert_eq!(limit["schema"]["maximum"], MAX_USAGE_PAGE);
        // Every name in a path is a Name, and every string field of a request body that the
        // server checks by a rule refers to its schema.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    if p["in"] == "path" {
                        assert_eq!(
                            p["schema"]["$ref"], "#/components/schemas/Name",
                            "{method} {path}"
                        );
                    }
                }
            }
        }
        let body = |name: &str, field: &str| schemas[name]["properties"][field].to_string();
        for (schema, field, rule) in [
            ("CreateTenant", "name", "Name"),
            ("CreateTenant", "labels", "Labels"),
            ("CreateTenant", "version", "KubernetesVersion"),
            ("CreateTenant", "plan", "Plan"),
            ("CreateToken", "name", "Name"),
            ("CreateToken", "role", "Role"),
            ("IssueKubeconfig", "user", "Subject"),
            ("IssueKubeconfig", "ttl", "Ttl"),
        ] {
            assert!(
                body(schema, field).contains(&format!("#/components/schemas/{rule}")),
                "{schema}.{field}: {}",
                body(schema, field)
            );
        }
    }

    #[test]
    fn a_server_documents_its_own_versions_and_plans() {
        let catalog = crate::render::Catalog::builtin();
        let doc = openapi_for(&catalog, vec!["default".into(), "gold".into()]);
        let doc = serde_json::to_value(doc).unwrap();
        let schemas = &doc["components"]["schemas"];
        assert_eq!(
            schemas["Plan"]["enum"],
            serde_json::json!(["default", "gold"])
        );
        assert_eq!(
            schemas["KubernetesVersion"]["enum"],
            serde_json::json!(catalog.spellings())
        );
    }

    fn req(user: &str, groups: &[&str], ttl: Option<&str>) -> IssueKubeconfig {
        IssueKubeconfig {
            user: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ttl: ttl.map(str::to_owned),
        }
    }

    #[test]
    fn kubeconfig_requests_are_checked_before_anything_is_signed() {
        let max = Duration::from_secs(30 * 86_400);
        let field = |r: Result<Duration, Problem>| r.unwrap_err().field().map(str::to_owned);
        assert_eq!(
            check_kubeconfig(&req("alice", &["view", "ops"], Some("2h")), max).unwrap(),
            Duration::from_secs(7200)
        );
        // The server's cap wins over a longer request; no TTL means a day.
        assert_eq!(
            check_kubeconfig(&req("a", &[], Some("400d")), max).unwrap(),
            max
        );
        assert_eq!(
            check_kubeconfig(&req("a", &[], None), max).unwrap(),
            Duration::from_secs(86_400)
        );
        for user in [
            "",
            "system:admin",
            "vcp:coredns",
            "a b",
            "a\u{0}b",
            "é",
            &"u".repeat(129),
        ] {
            assert_eq!(
                field(check_kubeconfig(&req(user, &[], None), max)).as_deref(),
                Some("user"),
                "{user:?}"
            );
        }
        let many: Vec<String> = (0..17).map(|i| format!("g{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for groups in [
            &["system:masters"][..],
            &["vcp:syncer"],
            &[""],
            &["a\u{0}b"],
            &["line\nbreak"],
            &["\u{1b}[31mred"],
            &many,
        ] {
            assert_eq!(
                field(check_kubeconfig(&req("u", groups, None), max)).as_deref(),
                Some("groups"),
                "{groups:?}"
            );
        }
        assert_eq!(
            field(check_kubeconfig(&req("u", &[], Some("1w")), max)).as_deref(),
            Some("ttl")
        );
    }

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
