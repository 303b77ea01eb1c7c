//! Routes without a token: liveness, readiness, metrics and the OpenAPI document.

use crate::api::openapi_for;
use crate::http::AppState;
use crate::metrics;
use axum::Json;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// Liveness: the process serves requests.
#[utoipa::path(get, path = "/healthz", tag = "health",
    responses((status = 200, description = "alive", body = String, content_type = "text/plain")))]
pub(super) async fn healthz() -> &'static str {
    "ok"
}

/// Readiness: the inventory answers, and the replica is not stopping.
#[utoipa::path(get, path = "/readyz", tag = "health", responses(
    (status = 200, description = "ready", body = String, content_type = "text/plain"),
    (status = 503, description = "the inventory does not answer, or the replica is stopping (it serves requests for --drain-seconds after SIGTERM, so balancers take it out first)", body = String, content_type = "text/plain"),
))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    if s.draining.load(std::sync::atomic::Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "stopping").into_response()
    } else if s.inventory.ping().await {
        "ok".into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "inventory unavailable").into_response()
    }
}

/// Prometheus metrics of this replica (OpenMetrics text).
#[utoipa::path(get, path = "/metrics", tag = "health",
    responses((status = 200, description = "Prometheus metrics in the OpenMetrics text format", body = String,
        content_type = "application/openmetrics-text; version=1.0.0; charset=utf-8")))]
#[tracing::instrument(level = "debug", skip_all)]
pub(super) async fn metrics_text(State(s): State<AppState>) -> Response {
    // The tenant counts are the inventory's, read at every scrape; the rest counts itself.
    let counts = s.inventory.phase_counts().await.ok();
    s.metrics.tenants(counts.as_deref());
    let usage: Option<Vec<_>> = s.inventory.live_latest_usage().await.ok().map(|rows| {
        rows.into_iter()
            .map(|r| (r.owner, r.tenant, r.sample.used))
            .collect()
    });
    s.metrics.usage(usage.as_deref());
    (
        [(header::CONTENT_TYPE, metrics::CONTENT_TYPE)],
        s.metrics.encode(),
    )
        .into_response()
}

/// This document (no token needed: it describes the API, not the fleet), with this server's
/// versions and plans.
#[utoipa::path(get, path = "/openapi.json", tag = "health",
    responses((status = 200, description = "the OpenAPI document of this API", body = Object)))]
pub(super) async fn openapi_json(State(s): State<AppState>) -> Json<utoipa::openapi::OpenApi> {
    let config = &s.provisioner.config;
    Json(openapi_for(
        &config.catalog,
        config.plans.keys().cloned().collect(),
    ))
}
