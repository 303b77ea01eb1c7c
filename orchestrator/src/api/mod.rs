//! The platform API (axum), put together: the router and the OpenAPI document over every
//! feature's handlers (`tenants::api`, `tenants::update`, `usage::api`, `tenant_audit::api`, `snapshots::api`,
//! `rotations::api`, `sleep::api`, `kubeconfigs::api`, `tokens::api`, `audit::api`, `upgrades::api`), the
//! catalog ([`versions`]) and [`health`] (liveness, readiness, metrics, the OpenAPI document);
//! beside them, outside the document, the web console's files (`console`, `/ui`).
//! [`types`] gathers the features' bodies for the client and the tests.
//!
//! Every `/v1` caller presents a bearer token; the inventory holds only its hash
//! ([`crate::http::auth`]). Admins see the whole fleet; an owner token sees only tenants it
//! created (others answer 404, so tenant names do not leak). Errors are RFC 7807
//! `application/problem+json` with a stable `type` and, for caller mistakes, the `field` at
//! fault; a 500 says nothing about internals ([`crate::http::problem`]).
//!
//! Handlers validate, authorize and call the module that owns the I/O: their feature's store
//! for state, the provisioner's handle for anything on the host (signing a kubeconfig reads
//! the tenant CA there). `vcp serve` builds the [`router`]; nothing here depends on it.

mod health;
pub mod types;
mod versions;

use crate::http::auth::BearerAuth;
use crate::http::problem::{Problem, ProblemBody};
use crate::http::{AppState, MAX_BODY};
use crate::metrics::Metrics;
use crate::{
    audit, console, kubeconfigs, rotations, sleep, snapshots, tenant_audit, tenants, tokens,
    upgrades, usage,
};
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::time::Instant;
pub use types::*;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

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
        .routes(routes!(
            tenants::api::create_tenant,
            tenants::api::list_tenants
        ))
        .routes(routes!(
            tenants::api::get_tenant,
            tenants::api::delete_tenant,
            tenants::update::upgrade_tenant
        ))
        .routes(routes!(usage::api::tenant_usage))
        .routes(routes!(usage::api::fleet_usage))
        .routes(routes!(tenant_audit::api::tenant_audit_events))
        .routes(routes!(
            snapshots::api::create_snapshot,
            snapshots::api::list_snapshots
        ))
        .routes(routes!(snapshots::api::restore_tenant))
        .routes(routes!(sleep::api::sleep_tenant))
        .routes(routes!(sleep::api::wake_tenant))
        .routes(routes!(sleep::api::gateway_activity))
        .routes(routes!(sleep::api::gateway_wake))
        .routes(routes!(rotations::api::rotate_tenant))
        .routes(routes!(rotations::api::list_rotations))
        .routes(routes!(
            kubeconfigs::api::issue_kubeconfig,
            kubeconfigs::api::list_kubeconfigs
        ))
        .routes(routes!(kubeconfigs::api::revoke_kubeconfig))
        .routes(routes!(kubeconfigs::api::revoke_user))
        .routes(routes!(kubeconfigs::api::break_glass))
        .routes(routes!(tokens::api::create_token, tokens::api::list_tokens))
        .routes(routes!(tokens::api::revoke_token))
        .routes(routes!(audit::api::audit))
        .routes(routes!(
            upgrades::api::create_fleet_upgrade,
            upgrades::api::list_fleet_upgrades
        ))
        .routes(routes!(upgrades::api::get_fleet_upgrade))
        .routes(routes!(upgrades::api::pause_fleet_upgrade))
        .routes(routes!(upgrades::api::resume_fleet_upgrade))
        .routes(routes!(upgrades::api::cancel_fleet_upgrade))
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
/// adds: [`crate::http::Name`] reads it for all of them, so the document adds it to all of them in one place
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
                crate::http::OwnerQuery::into_params(|| Some(ParameterIn::Query))
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
        // The web console's page and files: served beside the API, on its port, and not in
        // its document (they are not the JSON API; `console::ROUTES` lists them instead).
        .merge(console::router())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::api::MAX_AUDIT_PAGE;
    use crate::http::no_body;
    use crate::usage::api::MAX_USAGE_PAGE;

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
                // Asking for a snapshot, a sleep or a wake takes nothing but the tenant's name.
                let bodyless = [
                    "/v1/tenants/{name}/snapshots",
                    "/v1/tenants/{name}/sleep",
                    "/v1/tenants/{name}/wake",
                ]
                .contains(&path.as_str());
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
        assert_eq!(ops, 33);
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
        let events = &doc["paths"]["/v1/tenants/{name}/audit-events"]["get"]["parameters"];
        let event_param = |name: &str| {
            events
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == name)
                .unwrap()["schema"]
                .clone()
        };
        use crate::tenant_audit::api as ta;
        assert_eq!(event_param("limit")["maximum"], ta::MAX_EVENTS_PAGE);
        assert_eq!(event_param("limit")["minimum"], 1);
        assert_eq!(event_param("user")["maxLength"], ta::MAX_USER);
        assert_eq!(event_param("verb")["maxLength"], ta::MAX_VERB);
        assert_eq!(event_param("resource")["maxLength"], ta::MAX_RESOURCE);
        assert_eq!(param("limit")["maximum"], MAX_AUDIT_PAGE);
        assert_eq!(param("limit")["minimum"], 1);
        assert_eq!(param("after")["minimum"], 0);
        assert_eq!(param("actor")["maxLength"], crate::audit::api::MAX_ACTOR);
        assert_eq!(param("action")["maxLength"], crate::audit::api::MAX_ACTION);
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
            assert!(
                pattern.is_match(a).unwrap() && audit::api::is_action(a),
                "{a}"
            );
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
            assert!(
                !pattern.is_match(a).unwrap() && !audit::api::is_action(a),
                "{a}"
            );
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
        assert_eq!(ops, 17);
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
