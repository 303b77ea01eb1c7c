//! The platform API (axum): tenants, kubeconfigs, tokens, versions, health and metrics.
//!
//! Every caller presents a bearer token; the inventory holds only its hash. Admins see the
//! whole fleet; an owner token sees only tenants it created (others answer 404, so tenant
//! names do not leak). Errors are RFC 7807 `application/problem+json` with a stable `type`
//! and, for caller mistakes, the `field` at fault; a 500 says nothing about internals.

mod problem;

use crate::inventory::{Inventory, NewTenant, Tenant, Token};
use crate::names::TenantName;
use crate::provision::Provisioner;
use crate::serve::{key_suffix, new_token, token_hash};
use crate::{Error, pki, render};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Secret;
pub use problem::Problem;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

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
}

/// Shared state of the handlers.
#[derive(Debug, Clone)]
pub struct AppState {
    pub inventory: Inventory,
    pub provisioner: Provisioner,
    pub metrics: Arc<Metrics>,
    pub max_kubeconfig_ttl: Duration,
}

/// The router.
pub fn router(state: AppState) -> Router {
    let metrics = state.metrics.clone();
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .route("/v1/versions", get(versions))
        .route("/v1/tenants", post(create_tenant).get(list_tenants))
        .route("/v1/tenants/{name}", get(get_tenant).delete(delete_tenant))
        .route("/v1/tenants/{name}/kubeconfigs", post(issue_kubeconfig))
        .route("/v1/tokens", post(create_token))
        .route("/v1/tokens/{name}", axum::routing::delete(revoke_token))
        .fallback(|| async { Problem::not_found("no such route") })
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

async fn readyz(State(s): State<AppState>) -> Response {
    if s.inventory.ping().await {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "inventory unavailable").into_response()
    }
}

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
    out.push_str("# HELP vcp_tenants Live tenants by phase.\n# TYPE vcp_tenants gauge\n");
    if let Ok(counts) = s.inventory.phase_counts().await {
        for (phase, n) in counts {
            out.push_str(&format!("vcp_tenants{{phase=\"{phase}\"}} {n}\n"));
        }
    }
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out).into_response()
}

async fn versions(State(s): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, Problem> {
    authenticate(&s, &headers).await?;
    let c = &s.provisioner.config.catalog;
    Ok(Json(json!({
        "default": c.default,
        "versions": c.versions.iter().map(|v| json!({
            "minor": v.minor, "kubernetes": v.kubernetes, "default": v.minor == c.default,
        })).collect::<Vec<_>>(),
    })))
}

/// `POST /v1/tenants` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTenant {
    pub name: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub plan: Option<String>,
}

/// A tenant as the API shows it.
#[derive(Debug, Serialize)]
pub struct TenantView {
    pub name: String,
    pub key: String,
    pub owner: String,
    pub labels: BTreeMap<String, String>,
    pub version: String,
    pub kubernetes_version: Option<String>,
    pub plan: String,
    pub phase: String,
    pub conditions: Vec<crate::inventory::Condition>,
    pub endpoint: Option<String>,
    pub generation: i64,
    pub observed_generation: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: time::OffsetDateTime,
}

fn view(s: &AppState, t: Tenant) -> TenantView {
    TenantView {
        kubernetes_version: s
            .provisioner
            .config
            .catalog
            .get(&t.version)
            .map(|v| v.kubernetes.clone()),
        name: t.name,
        key: t.key,
        owner: t.owner,
        labels: t.labels.0,
        version: t.version,
        plan: t.plan,
        phase: t.phase,
        conditions: t.conditions.0,
        endpoint: t.endpoint,
        generation: t.generation,
        observed_generation: t.observed_generation,
        created_at: t.created_at,
    }
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Problem> {
    let ok = |s: &str, max: usize| {
        s.len() <= max
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
    };
    if labels.len() > 64 {
        return Err(Problem::invalid("labels", "at most 64 labels"));
    }
    for (k, v) in labels {
        if k.is_empty() || !ok(k, 253) || !ok(v, 63) {
            return Err(Problem::invalid(
                "labels",
                &format!(
                    "label {k:?}: keys up to 253 and values up to 63 characters of [A-Za-z0-9-_./]"
                ),
            ));
        }
    }
    Ok(())
}

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
            Ok(t) => return Ok((StatusCode::CREATED, Json(view(&s, t)))),
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

async fn list_tenants(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<Value>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let items: Vec<TenantView> = s
        .inventory
        .list_tenants(caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?
        .into_iter()
        .map(|t| view(&s, t))
        .collect();
    Ok(Json(json!({ "items": items })))
}

async fn find(s: &AppState, caller: &Caller, name: &str) -> Result<Tenant, Problem> {
    s.inventory
        .get_tenant(name, caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {name:?}")))
}

async fn get_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<TenantView>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let t = find(&s, &caller, &name).await?;
    Ok(Json(view(&s, t)))
}

#[derive(Debug, Deserialize)]
struct DeleteQuery {
    #[serde(default)]
    retain_data: bool,
}

async fn delete_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    q: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let Query(q) = q.map_err(|e| Problem::invalid("retain_data", &e.body_text()))?;
    let t = s
        .inventory
        .request_delete(&name, caller.scope(), q.retain_data, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {name:?}")))?;
    Ok((StatusCode::ACCEPTED, Json(view(&s, t))))
}

/// `POST /v1/tenants/{name}/kubeconfigs` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IssueKubeconfig {
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub ttl: Option<String>,
}

/// Parses `90m`, `12h`, `30d` (or plain seconds).
pub fn parse_ttl(s: &str) -> Option<Duration> {
    let (n, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = n.parse().ok()?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        "d" => n.checked_mul(86_400)?,
        _ => return None,
    };
    (secs > 0).then(|| Duration::from_secs(secs))
}

async fn issue_kubeconfig(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
    req: Result<Json<IssueKubeconfig>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let req = body(req)?;
    let t = find(&s, &caller, &name).await?;
    let user_ok = !req.user.is_empty()
        && req.user.len() <= 128
        && !req.user.starts_with("system:")
        && req.user.chars().all(|c| c.is_ascii_graphic());
    if !user_ok {
        return Err(Problem::invalid(
            "user",
            "1 to 128 printable characters, not starting with \"system:\"",
        ));
    }
    if req
        .groups
        .iter()
        .any(|g| g.starts_with("system:") || g.is_empty())
    {
        return Err(Problem::invalid(
            "groups",
            "groups may not be empty or start with \"system:\"",
        ));
    }
    if req.groups.len() > 16 || req.groups.iter().any(|g| g.len() > 128) {
        return Err(Problem::invalid(
            "groups",
            "at most 16 groups of up to 128 characters",
        ));
    }
    let ttl = match req.ttl.as_deref() {
        None => Duration::from_secs(24 * 3600),
        Some(x) => parse_ttl(x)
            .ok_or_else(|| Problem::invalid("ttl", "a duration like 90m, 12h or 30d"))?,
    }
    .min(s.max_kubeconfig_ttl);
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
            time::Duration::try_from(ttl).unwrap_or(time::Duration::HOUR),
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
        Json(json!({
            "kubeconfig": kubeconfig,
            "serial": info.serial,
            "expires_at": info.not_after.format(&time::format_description::well_known::Rfc3339).unwrap_or_default(),
        })),
    ))
}

/// `POST /v1/tokens` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    pub name: String,
    pub role: String,
}

async fn create_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateToken>, JsonRejection>,
) -> Result<(StatusCode, Json<Value>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins create tokens"));
    }
    let req = body(req)?;
    if TenantName::parse(&req.name).is_err() {
        return Err(Problem::invalid(
            "name",
            "a lowercase name like a tenant's: [a-z]([a-z0-9-]*[a-z0-9])?, up to 40 characters",
        ));
    }
    if !matches!(req.role.as_str(), "admin" | "owner") {
        return Err(Problem::invalid("role", "\"admin\" or \"owner\""));
    }
    let secret = new_token();
    let t = match s
        .inventory
        .create_token(&req.name, &req.role, &token_hash(&secret), &caller.0.name)
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
        Json(json!({"name": t.name, "role": t.role, "token": secret})),
    ))
}

async fn revoke_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<StatusCode, Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins revoke tokens"));
    }
    match s.inventory.revoke_token(&name, &caller.0.name).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(Problem::not_found(&format!("no live token named {name:?}"))),
        Err(e) => Err(Problem::internal(&e)),
    }
}
