//! The ingest: where tenant apiservers' audit webhooks post their events
//! (`POST /audit/v1/events` on `--audit-listen`, a listener of its own that serves nothing
//! else, so no owner-facing route is reachable there and the control-plane network policy
//! can allow just its port).
//!
//! request -> ingest token (the bearer over https; over plain http, where client-go sends no
//! credentials, the last path segment, `POST /audit/v1/events/<token>`) -> SHA-256 -> the one live tenant holding it
//! ([`Inventory::audit_token_tenant`]; no token, or an unknown one: 401, nothing read) -> body
//! (at most [`MAX_BODY`]) -> [`parse_batch`] (not an EventList: 400, nothing stored; more than
//! [`MAX_BATCH_EVENTS`] events: 413) -> rows stored under that tenant, copies of events
//! already stored skipped (the webhook retries a batch it could not deliver). The tenant is
//! the token's, never anything in the events.

use crate::http::auth::token_hash;
use crate::http::problem::Problem;
use crate::inventory::Inventory;
use crate::tenant_audit::events::{BatchError, MAX_BATCH_EVENTS, MAX_BODY, parse_batch};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;

/// The ingest's path.
pub const PATH: &str = "/audit/v1/events";

/// The ingest's router.
pub fn router(inventory: Inventory) -> Router {
    Router::new()
        .route(PATH, post(ingest))
        .route(&format!("{PATH}/{{token}}"), post(ingest_by_path))
        .fallback(|| async { Problem::not_found("no such route") })
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(inventory)
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// `POST /audit/v1/events` with the token as bearer.
async fn ingest(State(inv): State<Inventory>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(token) = bearer(&headers) else {
        tracing::info!("audit events without an ingest token refused");
        return Problem::unauthorized("an ingest token is required").into_response();
    };
    store(&inv, token, &body).await
}

/// `POST /audit/v1/events/<token>`: the webhook over plain http.
async fn ingest_by_path(
    State(inv): State<Inventory>,
    Path(token): Path<String>,
    body: Bytes,
) -> Response {
    store(&inv, &token, &body).await
}

/// Stores a batch for the tenant whose token `token` is.
#[tracing::instrument(skip_all, fields(tenant_id = tracing::field::Empty))]
async fn store(inv: &Inventory, token: &str, body: &[u8]) -> Response {
    let tenant = match inv.audit_token_tenant(&token_hash(token)).await {
        Ok(Some(t)) => t,
        Ok(None) => {
            tracing::info!("audit events with an unknown ingest token refused");
            return Problem::unauthorized("unknown ingest token").into_response();
        }
        Err(e) => return Problem::internal(&e).into_response(),
    };
    tracing::Span::current().record("tenant_id", tenant);
    let batch = match parse_batch(body) {
        Ok(b) => b,
        Err(BatchError::Malformed(why)) => {
            tracing::warn!(tenant_id = tenant, %why, "malformed audit batch refused");
            return Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed-events",
                "malformed audit events",
                &format!("the body is not an audit.k8s.io/v1 EventList: {why}"),
                None,
            )
            .into_response();
        }
        Err(BatchError::TooMany(n)) => {
            return Problem::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "too-many-events",
                "too many audit events",
                &format!("{n} events in one batch; at most {MAX_BATCH_EVENTS}"),
                None,
            )
            .into_response();
        }
    };
    match inv.insert_audit_events(tenant, &batch.rows).await {
        Ok(stored) => {
            tracing::debug!(
                tenant_id = tenant,
                inserted = stored.inserted,
                duplicates = stored.duplicates,
                other_stages = batch.other_stages,
                malformed = batch.malformed,
                "audit events stored"
            );
            if batch.malformed > 0 {
                tracing::warn!(
                    tenant_id = tenant,
                    malformed = batch.malformed,
                    "audit events without their identity skipped"
                );
            }
            (
                StatusCode::OK,
                axum::Json(serde_json::json!({
                    "stored": stored.inserted,
                    "duplicates": stored.duplicates,
                    "skipped": batch.other_stages + batch.malformed,
                })),
            )
                .into_response()
        }
        Err(e) => Problem::internal(&e).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_bearer_token_is_a_token() {
        let h = |v: &str| {
            let mut m = HeaderMap::new();
            m.insert(header::AUTHORIZATION, v.parse().unwrap());
            m
        };
        assert_eq!(bearer(&h("Bearer abc")), Some("abc"));
        assert_eq!(bearer(&h("Bearer ")), None);
        assert_eq!(bearer(&h("Basic abc")), None);
        assert_eq!(bearer(&HeaderMap::new()), None);
    }
}
