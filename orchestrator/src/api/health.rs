//! Routes without a token: liveness, readiness, metrics and the OpenAPI document.

use super::{AppState, openapi};
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use std::sync::atomic::Ordering;

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the inventory answers.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "ready", body = String, content_type = "text/plain"),
    (status = 503, description = "the inventory does not answer", body = String, content_type = "text/plain"),
))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    if s.inventory.ping().await {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "inventory unavailable").into_response()
    }
}

/// Prometheus metrics of this replica.
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus text format", body = String, content_type = "text/plain")))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn metrics_text(State(s): State<AppState>) -> Response {
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

/// This document (no token needed: it describes the API, not the fleet).
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "the OpenAPI document of this API", body = Object)))]
pub(super) async fn openapi_json() -> Json<&'static utoipa::openapi::OpenApi> {
    static DOC: std::sync::OnceLock<utoipa::openapi::OpenApi> = std::sync::OnceLock::new();
    Json(DOC.get_or_init(openapi))
}
