//! The platform API (axum), one module per resource: [`tenants`] (with their quota
//! [`usage`] and their [`upgrades`]), [`fleet`] upgrades, [`kubeconfigs`], [`tokens`],
//! [`versions`], the [`audit`] trail, and [`health`] (liveness, readiness,
//! metrics, the OpenAPI document); [`auth`] says who is calling.
//!
//! Every `/v1` caller presents a bearer token; the inventory holds only its hash. Admins see
//! the whole fleet; an owner token sees only tenants it created (others answer 404, so tenant
//! names do not leak). Errors are RFC 7807 `application/problem+json` with a stable `type`
//! and, for caller mistakes, the `field` at fault; a 500 says nothing about internals.
//!
//! Handlers validate, authorize and call the module that owns the I/O: the inventory for
//! state, the provisioner for anything on the host (signing a kubeconfig reads the tenant CA
//! there). `vcp serve` builds the [`router`]; nothing here depends on it.

mod audit;
pub mod auth;
pub mod conn;
mod fleet;
mod health;
mod kubeconfigs;
mod problem;
mod snapshots;
mod tenants;
mod tokens;
mod types;
mod upgrades;
mod usage;
mod versions;

use crate::inventory::{Inventory, Tenant};
use crate::metrics::Metrics;
use crate::names::TenantName;
pub use crate::names::parse_ttl;
use crate::provision::Provisioner;
pub use audit::MAX_AUDIT_PAGE;
use auth::{BearerAuth, Caller};
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
pub use problem::{Problem, ProblemBody};
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use types::*;
pub use usage::MAX_USAGE_PAGE;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

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

/// Routes and their OpenAPI operations come from the same `routes!` calls, so the document
/// cannot list a route the server does not serve (or miss one it does).
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(health::healthz))
        .routes(routes!(health::readyz))
        .routes(routes!(health::metrics_text))
        .routes(routes!(versions::versions))
        .routes(routes!(tenants::create_tenant, tenants::list_tenants))
        .routes(routes!(
            tenants::get_tenant,
            tenants::delete_tenant,
            upgrades::upgrade_tenant
        ))
        .routes(routes!(usage::tenant_usage))
        .routes(routes!(
            snapshots::create_snapshot,
            snapshots::list_snapshots
        ))
        .routes(routes!(snapshots::restore_tenant))
        .routes(routes!(
            kubeconfigs::issue_kubeconfig,
            kubeconfigs::list_kubeconfigs
        ))
        .routes(routes!(kubeconfigs::revoke_kubeconfig))
        .routes(routes!(kubeconfigs::revoke_user))
        .routes(routes!(kubeconfigs::break_glass))
        .routes(routes!(tokens::create_token, tokens::list_tokens))
        .routes(routes!(tokens::revoke_token))
        .routes(routes!(audit::audit))
        .routes(routes!(
            fleet::create_fleet_upgrade,
            fleet::list_fleet_upgrades
        ))
        .routes(routes!(fleet::get_fleet_upgrade))
        .routes(routes!(fleet::pause_fleet_upgrade))
        .routes(routes!(fleet::resume_fleet_upgrade))
        .routes(routes!(fleet::cancel_fleet_upgrade))
        .routes(routes!(health::openapi_json))
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
    types::with_choices(
        &mut doc,
        catalog.spellings(),
        types::target_spellings(catalog),
        plans,
    );
    doc
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
        // Outermost, so panics and refused bodies are counted and timed too.
        .layer(axum::middleware::from_fn_with_state(metrics, measure))
        .with_state(state)
}

/// Counts and times every request by method, route template (never the path: names must
/// not become label values) and status.
async fn measure(State(metrics): State<Arc<Metrics>>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let method = req.method().clone();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned());
    let r = next.run(req).await;
    metrics.request(&method, route.as_deref(), r.status(), start.elapsed());
    r
}

fn body<T>(r: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    r.map(|Json(v)| v).map_err(Problem::from_rejection)
}

/// A body that must be a JSON object, decoded into `T` with the same problems as [`body`].
/// serde's derive also takes a struct written as an array of its fields, which no client
/// means, and which a body of optional fields only would take as "change nothing".
fn object_body<T: serde::de::DeserializeOwned>(
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

/// A tenant name and the path segment after it (a serial, a user), from a URL path.
struct NameAnd(Name, String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for NameAnd {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<NameAnd, Problem> {
        match Path::<(String, String)>::from_request_parts(parts, state).await {
            Ok(Path((n, x))) => Ok(NameAnd(Name(n), x)),
            Err(e) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed",
                "malformed path",
                &e.body_text(),
                None,
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

/// A live tenant the caller may see, by the name in a path; 404 otherwise.
async fn find(s: &AppState, caller: &Caller, name: &str) -> Result<Tenant, Problem> {
    existing_name(name, "tenant")?;
    tracing::Span::current().record("tenant", name);
    s.inventory
        .get_tenant(name, caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {name:?}")))
}

/// Who calls and the live tenant named in the path, if the caller may see it: 401 without a
/// valid token, 400 for a malformed path, 404 for a tenant that does not exist or is another
/// owner's. Called first in every handler of `/v1/tenants/{name}/...`, so a caller learns
/// nothing of other owners' tenants from any later check.
async fn caller_and_tenant(
    s: &AppState,
    headers: &axum::http::HeaderMap,
    name: Result<Name, Problem>,
) -> Result<(Caller, Tenant), Problem> {
    let caller = auth::authenticate(s, headers).await?;
    let Name(name) = name?;
    let t = find(s, &caller, &name).await?;
    Ok((caller, t))
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
                // Asking for a snapshot takes nothing but the tenant's name.
                let bodyless = path == "/v1/tenants/{name}/snapshots";
                if (method == "post" || method == "patch") && !bodyless {
                    assert!(
                        op["requestBody"]["content"]["application/json"].is_object(),
                        "{path}"
                    );
                    assert!(responses.contains_key("422"), "{path}");
                }
            }
        }
        assert_eq!(ops, 25);
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
        let audit = &doc["paths"]["/v1/audit"]["get"]["parameters"];
        let param = |name: &str| {
            audit
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap()["schema"]
                .clone()
        };
        assert_eq!(param("limit")["maximum"], MAX_AUDIT_PAGE);
        assert_eq!(param("limit")["minimum"], 1);
        assert_eq!(param("after")["minimum"], 0);
        assert_eq!(param("actor")["maxLength"], audit::MAX_ACTOR);
        assert_eq!(param("action")["maxLength"], audit::MAX_ACTION);
        assert!(
            param("tenant")
                .to_string()
                .contains("#/components/schemas/Name"),
            "{}",
            param("tenant")
        );
        // The action pattern takes what the server takes, and refuses what it refuses.
        let pattern =
            fancy_regex::Regex::new(param("action")["pattern"].as_str().unwrap()).unwrap();
        for a in [
            "tenant.create",
            "tenant.",
            "token.admin-bootstrap",
            "fleet.tenant.start",
            "x",
        ] {
            assert!(pattern.is_match(a).unwrap() && audit::is_action(a), "{a}");
        }
        for a in [
            "",
            ".",
            "Tenant",
            "tenant..x",
            "tenant.*",
            "1x",
            "tenant.-x",
        ] {
            assert!(!pattern.is_match(a).unwrap() && !audit::is_action(a), "{a}");
        }
        // Every name in a path is a Name (and every id a positive integer), and every string
        // field of a request body that the server checks by a rule refers to its schema.
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                for p in op["parameters"].as_array().into_iter().flatten() {
                    if p["in"] == "path" && p["name"] == "id" {
                        assert_eq!(p["schema"]["type"], "integer", "{method} {path}");
                        assert_eq!(p["schema"]["minimum"], 1, "{method} {path}");
                    } else if p["in"] == "path" {
                        let schema = match p["name"].as_str() {
                            Some("serial") => "Serial",
                            Some("user") => "Subject",
                            _ => "Name",
                        };
                        assert_eq!(
                            p["schema"]["$ref"],
                            format!("#/components/schemas/{schema}"),
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
            ("CreateFleetUpgrade", "target", "UpgradeTarget"),
            ("FleetSelector", "names", "Name"),
            ("FleetSelector", "version", "KubernetesVersion"),
            ("CreateTenant", "maintenance_window", "MaintenanceWindow"),
            ("UpgradeTenant", "version", "KubernetesVersion"),
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
}
