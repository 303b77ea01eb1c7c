//! Upgrades of one tenant's control plane, and its upgrade settings (maintenance window,
//! fleet upgrade opt-out, automatic patch updates): `PATCH /v1/tenants/{name}` checks the request
//! against the skew rules (`crate::lifecycle::skew`) and records the upgrade with its first hop;
//! the reconcile workers roll it, gate it and, if a gate fails, roll it back (poll the tenant's
//! `phase` and `upgrade`).

use crate::http::problem::{BodyRefused, NoSuchTenant, Problem, ProblemBody, Unauthorized};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, caller_and_tenant, object_body};
use crate::inventory::TenantSettings;
use crate::lifecycle::skew::{self, Allow};
use crate::tenants::api::view;
use crate::tenants::types::TenantView;
use crate::upgrades::store::NewUpgrade;
use crate::upgrades::types::UpgradeTenant;
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use tracing::field::Empty;
use vcp_core::lifecycle::Phase;

/// Upgrades a tenant's control plane to another minor (`version`), one hop per minor, and/or
/// changes its upgrade settings (`maintenance_window`, `fleet_upgrades`, `auto_update`); a
/// body with neither changes nothing. An upgrade is refused with 422 when the skew rules forbid it (the detail names the
/// rule: `no-downgrade`, `one-minor-per-hop`, `no-expired-target`, `preview-on-request`,
/// `chain-through-catalog`, `unchanged`, `apiserver-first`, `etcd-one-minor`); 409 unless the
/// tenant is Ready with no upgrade moving it. Each hop is gated (every component rolled out
/// and ready, the tenant API answering a write, a canary carried to the host) and rolled back
/// if a gate fails. Settings alone answer 200; with a `version`, 202 (the settings are
/// written only if the upgrade is accepted).
#[utoipa::path(patch, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = UpgradeTenant, responses(
    (status = 200, description = "settings changed (or nothing asked); no upgrade asked for", body = TenantView),
    (status = 202, description = "upgrade started; phase Upgrading", body = TenantView),
    BodyRefused,
    Unauthorized,
    NoSuchTenant,
    (status = 409, description = "the tenant is not Ready, or an upgrade already moves it", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "unknown version, or a skew rule refuses it (`field` is `version` and the detail names the rule); a malformed `maintenance_window`, `fleet_upgrades` or `auto_update`", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn upgrade_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    let req: UpgradeTenant = object_body(req)?;
    let settings = TenantSettings {
        maintenance_window: req.maintenance_window.clone(),
        fleet_upgrades: req.fleet_upgrades,
        auto_update: req.auto_update,
    };
    let Some(version) = &req.version else {
        if settings.is_empty() {
            // Nothing asked: the tenant as it is (a PATCH of no fields changes nothing).
            return Ok((StatusCode::OK, Json(view(&s, t).await?)));
        }
        let t = s
            .inventory
            .update_tenant_settings(&t, caller.scope(), &settings, &caller.0.name)
            .await
            .map_err(|e| Problem::internal(&e))?
            .ok_or_else(|| Problem::not_found(&format!("no tenant named {:?}", t.name)))?;
        return Ok((StatusCode::OK, Json(view(&s, t).await?)));
    };
    let catalog = &s.provisioner.config.catalog;
    let target = catalog
        .resolve(Some(version))
        .map_err(|e| Problem::invalid("version", &e.to_string()))?;
    let allow = Allow {
        chain: req.chain,
        preview: req.allow_preview,
    };
    let hops = skew::plan_hops(catalog, &t.version, &target.minor, allow)
        .map_err(|e| Problem::invalid("version", &e.to_string()))?;
    // Preflight: an upgrade starts from a healthy control plane.
    if t.phase != Phase::Ready {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-ready",
            "tenant not ready",
            &format!(
                "tenant {:?} is {}; upgrades start from Ready",
                t.name, t.phase
            ),
            None,
        ));
    }
    let new = NewUpgrade {
        target: target.minor.clone(),
        chain: req.chain,
        first_hop: hops[0].minor.clone(),
        to_release: Some(hops[0].kubernetes.clone()),
        expect_release: None,
    };
    let started = s
        .inventory
        .start_upgrade(&t, caller.scope(), &new, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    match started {
        Some((t, _)) => {
            let t = if settings.is_empty() {
                t
            } else {
                s.inventory
                    .update_tenant_settings(&t, caller.scope(), &settings, &caller.0.name)
                    .await
                    .map_err(|e| Problem::internal(&e))?
                    .unwrap_or(t)
            };
            Ok((StatusCode::ACCEPTED, Json(view(&s, t).await?)))
        }
        None => Err(Problem::conflict(
            "version",
            &format!(
                "tenant {:?} changed meanwhile or an upgrade already moves it; read it and retry",
                t.name
            ),
        )),
    }
}
