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
mod rotations;
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
pub use rotations::{RotateTenant, RotationList, RotationTarget, RotationView};
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
    /// Set at SIGTERM: `/readyz` answers 503 while the replica drains.
    pub draining: Arc<std::sync::atomic::AtomicBool>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "vcp platform API",
        description = "Self-service Kubernetes control planes: tenants, kubeconfigs, tokens.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    modifiers(&BearerAuth),
    // Serial is referred to by path parameters only, which utoipa does not collect.
    components(schemas(ProblemBody, types::SerialSchema)),
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
        .routes(routes!(rotations::rotate_tenant))
        .routes(routes!(rotations::list_rotations))
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
    with_owner(&mut doc);
    types::with_choices(
        &mut doc,
        catalog.spellings(),
        types::target_spellings(catalog),
        plans,
    );
    doc
}

/// Documents the `owner` query parameter on every route of one tenant, with the answers it
/// adds: [`Name`] reads it for all of them, so the document adds it to all of them in one place
/// rather than in a dozen annotations that could drift from the extractor.
fn with_owner(doc: &mut utoipa::openapi::OpenApi) {
    use utoipa::IntoParams;
    use utoipa::openapi::path::ParameterIn;
    for (path, item) in doc.paths.paths.iter_mut() {
        if !path.starts_with("/v1/tenants/{name}") {
            continue;
        }
        let ops = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for op in ops.into_iter().flatten() {
            op.parameters.get_or_insert_with(Vec::new).extend(
                OwnerQuery::into_params(|| Some(ParameterIn::Query))
                    .into_iter()
                    .map(utoipa::openapi::RefOr::T),
            );
            let answers = &mut op.responses.responses;
            answer(answers, "400", "malformed query (`owner` given twice)");
            answer(
                answers,
                "409",
                "an admin named a tenant that live tenants of several owners have without \
                 `owner` (`ambiguous-name`; the detail names the owners)",
            );
            answer(
                answers,
                "422",
                "`owner` not a token name (`field` is `owner`)",
            );
        }
    }
}

/// Adds `why` to the documented answer `status`, or documents it as a problem.
fn answer(
    answers: &mut std::collections::BTreeMap<
        String,
        utoipa::openapi::RefOr<utoipa::openapi::Response>,
    >,
    status: &str,
    why: &str,
) {
    use utoipa::openapi::{ContentBuilder, Ref, RefOr, ResponseBuilder};
    match answers.get_mut(status) {
        Some(RefOr::T(r)) => r.description = format!("{}; or {why}", r.description),
        _ => {
            let problem = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ProblemBody")))
                .build();
            answers.insert(
                status.to_owned(),
                RefOr::T(
                    ResponseBuilder::new()
                        .description(why)
                        .content("application/problem+json", problem)
                        .build(),
                ),
            );
        }
    }
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

/// The body of a route that takes none (a POST that starts something, a DELETE): nothing, or
/// an empty JSON object (`{}`, which clients that always send a body send). Anything else is
/// refused with 422 rather than ignored, as an unknown field of a route that takes a body is:
/// a caller who sends `{"location": ...}` to `POST .../snapshots` believes it chose something.
/// Handlers check it after the caller and the tenant, so 401 and 404 come first.
struct NoBody;

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
fn no_body(bytes: &[u8]) -> Result<NoBody, Problem> {
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
struct Name {
    name: String,
    uri: axum::http::Uri,
}

/// The `owner` query parameter of the tenant routes; their other parameters are their own.
#[derive(serde::Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct OwnerQuery {
    /// The owner (token name) whose tenant of this name is meant. Names are unique per owner,
    /// so an admin needs it when live tenants of several owners have the name (409
    /// `ambiguous-name` otherwise); an owner may give only its own name (any other answers
    /// 404: an owner sees only its own tenants).
    #[param(value_type = Option<types::NameSchema>)]
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
fn malformed_path(e: &axum::extract::rejection::PathRejection, field: Option<&str>) -> Problem {
    Problem::new(
        StatusCode::BAD_REQUEST,
        "malformed",
        "malformed path",
        &e.body_text(),
        field,
    )
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
fn existing_name(name: &str, what: &str) -> Result<(), Problem> {
    TenantName::parse(name)
        .map(|_| ())
        .map_err(|_| Problem::not_found(&format!("no {what} named {name:?}")))
}

/// Whose tenants a lookup by name searches: `Some(None)` every owner's (an admin without
/// `owner`), `Some(Some(o))` only `o`'s, `None` nobody's (an owner asking for another owner's,
/// answered 404 as if it did not exist, so owners learn nothing of each other).
fn owner_filter<'a>(scope: Option<&'a str>, asked: Option<&'a str>) -> Option<Option<&'a str>> {
    match (scope, asked) {
        (Some(me), Some(o)) if o != me => None,
        (Some(me), _) => Some(Some(me)),
        (None, o) => Some(o),
    }
}

/// The one tenant of `found` (the live tenants named `name` the caller may see): 404 for
/// none; 409 `ambiguous-name` for several, which only an admin without `owner` can meet
/// (names are unique per owner), naming their owners so it can pick one.
fn the_one(name: &str, mut found: Vec<Tenant>) -> Result<Tenant, Problem> {
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
async fn find(s: &AppState, caller: &Caller, name: &Name) -> Result<Tenant, Problem> {
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
async fn caller_and_tenant(
    s: &AppState,
    headers: &axum::http::HeaderMap,
    name: Result<Name, Problem>,
) -> Result<(Caller, Tenant), Problem> {
    let caller = auth::authenticate(s, headers).await?;
    let name = name?;
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
                }
                // Every write refuses what it does not take, documented: a field of its body
                // it does not know, or any body at all when it takes none.
                if method != "get" {
                    assert!(responses.contains_key("422"), "{method} {path}");
                }
            }
        }
        assert_eq!(ops, 27);
        assert_eq!(
            doc["components"]["securitySchemes"]["bearer"]["scheme"],
            "bearer"
        );
    }

    #[test]
    fn a_route_without_a_body_takes_nothing_or_an_empty_object() {
        for ok in [&b""[..], b"  \n", b"{}", b" { } "] {
            assert!(no_body(ok).is_ok(), "{:?}", String::from_utf8_lossy(ok));
        }
        let field = |b: &[u8]| {
            let p = no_body(b).err().expect("refused");
            assert_eq!(p.status(), StatusCode::UNPROCESSABLE_ENTITY);
            p.field().map(str::to_owned)
        };
        assert_eq!(
            field(br#"{"location": "s3://elsewhere"}"#).as_deref(),
            Some("location")
        );
        for other in [&b"[]"[..], b"null", b"\"x\"", b"{\"a\":", b"\xff"] {
            assert_eq!(field(other).as_deref(), Some("body"));
        }
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
                    } else if p["in"] == "query" && p["name"] == "owner" {
                        assert_eq!(
                            p["schema"]["$ref"], "#/components/schemas/Name",
                            "{method} {path}"
                        );
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
            ("BreakGlassRequest", "ttl", "Ttl"),
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

    /// Every route of one tenant takes `owner` and documents what it may answer for it; no
    /// other route takes it.
    #[test]
    fn every_route_of_one_tenant_documents_owner() {
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut ops = 0;
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let takes_owner = op["parameters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|p| p["name"] == "owner" && p["in"] == "query");
                let one_tenant = path.starts_with("/v1/tenants/{name}");
                assert_eq!(takes_owner, one_tenant, "{method} {path}");
                if one_tenant {
                    ops += 1;
                    let r = &op["responses"];
                    assert!(r["400"]["description"].to_string().contains("`owner`"));
                    assert!(
                        r["409"]["description"]
                            .to_string()
                            .contains("ambiguous-name"),
                        "{method} {path}"
                    );
                    assert!(r["422"]["description"].to_string().contains("`owner`"));
                }
            }
        }
        assert_eq!(ops, 14);
    }

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

    /// Every `$ref` names a schema the document has (a path parameter's schema is not
    /// collected on its own: schemathesis could not resolve `Serial`).
    #[test]
    fn every_reference_resolves() {
        fn refs(v: &serde_json::Value, out: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if let Some(r) = m.get("$ref").and_then(|r| r.as_str()) {
                        out.push(r.to_owned());
                    }
                    m.values().for_each(|v| refs(v, out));
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
                _ => {}
            }
        }
        let doc = serde_json::to_value(openapi()).unwrap();
        let mut all = Vec::new();
        refs(&doc, &mut all);
        assert!(!all.is_empty());
        for r in all {
            let name = r.strip_prefix("#/components/schemas/").unwrap();
            assert!(
                doc["components"]["schemas"][name].is_object(),
                "{r} is not in the document"
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
