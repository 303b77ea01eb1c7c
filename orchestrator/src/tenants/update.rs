//! Upgrades of one tenant's control plane, and its upgrade settings (maintenance window,
//! fleet upgrade opt-out, automatic patch updates): `PATCH /v1/tenants/{name}` checks the request
//! against the skew rules (`crate::lifecycle::skew`) and records the upgrade with its first hop;
//! the reconcile workers roll it, gate it and, if a gate fails, roll it back (poll the tenant's
//! `phase` and `upgrade`).

use crate::http::auth::Caller;
use crate::http::problem::{BodyRefused, NoSuchTenant, Problem, ProblemBody, Unauthorized};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, caller_and_tenant, object_body};
use crate::inventory::{Tenant, TenantSettings};
use crate::lifecycle::skew::{self, Allow};
use crate::tenants::api::view;
use crate::tenants::plan_change::{Change, classify};
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
/// changes its settings (`maintenance_window`, `fleet_upgrades`, `auto_update`, `backups`); or,
/// alone, changes its plan (`plan`: in place, 200, or a move of its data to another store,
/// 202); a body with none of them changes nothing. An upgrade is refused with 422 when the skew rules forbid it (the detail names the
/// rule: `no-downgrade`, `one-minor-per-hop`, `no-expired-target`, `preview-on-request`,
/// `chain-through-catalog`, `unchanged`, `apiserver-first`, `etcd-one-minor`); 409 unless the
/// tenant is Ready with no upgrade moving it. Each hop is gated (every component rolled out
/// and ready, the tenant API answering a write, a canary carried to the host) and rolled back
/// if a gate fails. Settings alone answer 200; with a `version`, 202 (the settings are
/// written only if the upgrade is accepted).
#[utoipa::path(patch, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = UpgradeTenant, responses(
    (status = 200, description = "settings or plan changed in place (or nothing asked); no upgrade asked for", body = TenantView),
    (status = 202, description = "upgrade started (phase Upgrading), or a plan change that moves the tenant's data started (phase Restoring)", body = TenantView),
    BodyRefused,
    Unauthorized,
    NoSuchTenant,
    (status = 409, description = "the tenant is not Ready, or an upgrade or restore already moves it; for `plan`: the tenant's last usage sample does not fit the plan's quota (the detail names each resource, used > limit), or the plan has fewer members for the tenant's own etcd (more are added one at a time while it serves)", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "unknown version, or a skew rule refuses it (`field` is `version` and the detail names the rule); a malformed `maintenance_window`, `fleet_upgrades`, `auto_update` or `backups` (each count 0 to 1000); an unknown `plan`, or `plan` with anything else", body = ProblemBody, content_type = "application/problem+json"),
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
        backups: req.backups,
    };
    if let Some(Some(b)) = &req.backups {
        b.validate().map_err(|e| Problem::invalid("backups", &e))?;
    }
    if let Some(plan) = &req.plan {
        if req.version.is_some() || !settings.is_empty() {
            return Err(Problem::invalid(
                "plan",
                "a plan change is asked alone, without a version or settings in the same request",
            ));
        }
        return change_plan(&s, &caller, t, plan).await;
    }
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

/// `PATCH` with `plan`: decided by [`classify`], then changed in place or moved.
async fn change_plan(
    s: &AppState,
    caller: &Caller,
    t: Tenant,
    to: &str,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let config = &s.provisioner.config;
    let to_plan = config
        .plans
        .get(to)
        .ok_or_else(|| Problem::invalid("plan", &format!("no plan named {to:?}")))?;
    let from_plan = config.plans.get(&t.plan).ok_or_else(|| {
        Problem::conflict(
            "plan",
            &format!("the tenant's plan {:?} is not configured here", t.plan),
        )
    })?;
    let used = s
        .inventory
        .latest_usage(&[t.id])
        .await
        .map_err(|e| Problem::internal(&e))?
        .remove(&t.id)
        .map(|u| u.used);
    let change = classify(&t.plan, from_plan, to, to_plan, used.as_ref())
        .map_err(|r| Problem::conflict("plan", &r.to_string()))?;
    if change == Change::Unchanged {
        return Ok((StatusCode::OK, Json(view(s, t).await?)));
    }
    let busy = |t: &Tenant| {
        Problem::conflict(
            "plan",
            &format!(
                "tenant {:?} is {}; a plan changes from Ready with no upgrade or restore moving it",
                t.name, t.phase
            ),
        )
    };
    if t.phase != Phase::Ready {
        return Err(busy(&t));
    }
    let actor = &caller.0.name;
    match change {
        Change::Move => {
            let moved = s
                .inventory
                .start_move(&t, &t.plan, to, actor)
                .await
                .map_err(|e| Problem::internal(&e))?;
            if moved.is_none() {
                return Err(busy(&t));
            }
            let t = s
                .inventory
                .tenant_by_id(t.id)
                .await
                .map_err(|e| Problem::internal(&e))?
                .ok_or_else(|| Problem::not_found(&format!("no tenant named {:?}", t.name)))?;
            Ok((StatusCode::ACCEPTED, Json(view(s, t).await?)))
        }
        _ => {
            let changed = s
                .inventory
                .change_plan(&t, caller.scope(), to, actor)
                .await
                .map_err(|e| Problem::internal(&e))?
                .ok_or_else(|| busy(&t))?;
            Ok((StatusCode::OK, Json(view(s, changed).await?)))
        }
    }
}
