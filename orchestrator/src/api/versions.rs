//! The Kubernetes versions tenants can run: this replica's catalog.

use crate::api::types::{VersionList, VersionView};
use crate::http::AppState;
use crate::http::auth::authenticate;
use crate::http::problem::{Problem, Unauthorized};
use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;

/// The Kubernetes versions tenants can run.
#[utoipa::path(get, path = "/v1/versions", tag = "versions", security(("bearer" = [])), responses(
    (status = 200, body = VersionList),
    Unauthorized,
))]
#[tracing::instrument(skip_all)]
pub(super) async fn versions(
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
                class: v.class,
                default: v.minor == c.default,
            })
            .collect(),
    }))
}
