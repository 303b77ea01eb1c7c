//! Fleet upgrades (admins only): `POST /v1/upgrades` checks the request and plans it
//! (`crate::lifecycle::fleet::plan`, over every live tenant), the inventory stores the plan,
//! and the fleet worker of any replica steps it; `GET` shows its progress, and
//! `pause`, `resume` and `cancel` change its state.

use crate::http::auth::{Caller, authenticate};
use crate::http::problem::{AdminOnly, BodyRefused, Problem, ProblemBody, Unauthorized};
use crate::http::{AppState, body, object_body};
use crate::lifecycle::fleet::{self, Candidate, Request, Selector};
use crate::names::TenantName;
use crate::upgrades::fleet_store::{ActionOutcome, FleetAction, FleetRow, FleetSummary, NewFleet};
use crate::upgrades::types::{
    CreateFleetUpgrade, FleetProgress, FleetSelector, FleetTenantView, FleetUpgradeAction,
    FleetUpgradeDetail, FleetUpgradeList, FleetUpgradeView,
};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::time::Duration;
use tracing::field::Empty;
use vcp_core::lifecycle::FleetEntryState;

/// The `{id}` of a fleet upgrade's path, with a problem+json rejection.
pub(crate) struct FleetId(i64);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for FleetId {
    type Rejection = Problem;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<FleetId, Problem> {
        match Path::<i64>::from_request_parts(parts, state).await {
            Ok(Path(n)) => Ok(FleetId(n)),
            Err(e) => Err(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed",
                "malformed path",
                &e.body_text(),
                Some("id"),
            )),
        }
    }
}

pub(crate) async fn admin(s: &AppState, headers: &HeaderMap) -> Result<Caller, Problem> {
    let caller = authenticate(s, headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins run fleet upgrades"));
    }
    Ok(caller)
}

/// The request, checked field by field into what the planner takes.
fn request(s: &AppState, req: &CreateFleetUpgrade) -> Result<Request, Problem> {
    let catalog = &s.provisioner.config.catalog;
    let target = catalog
        .resolve(Some(&req.target))
        .map_err(|e| Problem::invalid("target", &e.to_string()))?;
    if target.class == crate::render::catalog::Class::Expired {
        return Err(Problem::invalid(
            "target",
            &crate::lifecycle::skew::SkewError::ExpiredTarget(target.minor.clone()).to_string(),
        ));
    }
    let bounded = |field: &str, v: u32, lo: u32, hi: u32| {
        if (lo..=hi).contains(&v) {
            Ok(v)
        } else {
            Err(Problem::invalid(field, &format!("{field} is {lo} to {hi}")))
        }
    };
    bounded("canary", req.canary, 1, fleet::MAX_CANARY)?;
    bounded("max_parallel", req.max_parallel, 1, fleet::MAX_PARALLEL)?;
    bounded(
        "failure_budget",
        req.failure_budget,
        0,
        fleet::MAX_FAILURE_BUDGET,
    )?;
    bounded("soak_seconds", req.soak_seconds, 0, fleet::MAX_SOAK_SECONDS)?;
    let sel = &req.selector;
    let labels = match &sel.labels {
        Some(l) => {
            fleet::parse_label_selector(l).map_err(|e| Problem::invalid("selector.labels", &e))?
        }
        None => Default::default(),
    };
    let names = match &sel.names {
        Some(n) if n.len() > 1000 => {
            return Err(Problem::invalid("selector.names", "at most 1000 names"));
        }
        Some(n) => {
            for name in n {
                TenantName::parse(name)
                    .map_err(|e| Problem::invalid("selector.names", &format!("{name:?}: {e}")))?;
            }
            Some(n.iter().cloned().collect())
        }
        None => None,
    };
    let version = sel
        .version
        .as_deref()
        .map(|v| {
            catalog
                .resolve(Some(v))
                .map(|v| v.minor.clone())
                .map_err(|e| Problem::invalid("selector.version", &e.to_string()))
        })
        .transpose()?;
    Ok(Request {
        target: target.minor.clone(),
        selector: Selector {
            labels,
            names,
            version,
        },
        chain: req.chain,
        allow_preview: req.allow_preview,
        canary: req.canary,
    })
}

/// A fleet upgrade as the API shows it.
fn view(f: FleetRow, sum: FleetSummary) -> FleetUpgradeView {
    let c = sum.counts;
    let max_parallel = u32::try_from(f.max_parallel).unwrap_or(1);
    let remaining = c.pending + c.running;
    let eta = fleet::eta(
        remaining,
        max_parallel,
        sum.mean_seconds.map(Duration::from_secs_f64),
    );
    let u = |v: i32| u32::try_from(v).unwrap_or(0);
    FleetUpgradeView {
        id: f.id,
        target: f.target_version,
        state: f.state,
        selector: serde_json::from_value::<FleetSelector>(f.selector.0).unwrap_or_default(),
        chain: f.chain,
        canary: u(f.canary),
        max_parallel,
        failure_budget: u(f.failure_budget),
        soak_seconds: u(f.soak_seconds),
        respect_maintenance_windows: f.respect_maintenance_windows,
        current_wave: u(f.current_wave),
        waves: sum.waves,
        soak_until: f.soak_until,
        reason: f.reason,
        created_by: f.created_by,
        created_at: f.created_at,
        finished_at: f.finished_at,
        progress: FleetProgress {
            total: c.pending + c.running + c.succeeded + c.failed + c.skipped,
            pending: c.pending,
            running: c.running,
            succeeded: c.succeeded,
            failed: c.failed,
            skipped: c.skipped,
            eta_seconds: eta.map(|d| d.as_secs()),
        },
    }
}

pub(crate) async fn detail(s: &AppState, f: FleetRow) -> Result<FleetUpgradeDetail, Problem> {
    let internal = |e: crate::Error| Problem::internal(&e);
    let sum = s
        .inventory
        .fleet_summaries(&[f.id])
        .await
        .map_err(internal)?
        .remove(&f.id)
        .unwrap_or_default();
    let tenants: Vec<FleetTenantView> = s
        .inventory
        .fleet_entries(f.id)
        .await
        .map_err(internal)?
        .into_iter()
        .map(|e| FleetTenantView {
            name: e.name,
            owner: e.owner,
            wave: u32::try_from(e.wave).unwrap_or(0),
            from: e.from_version,
            target: e.target_version,
            state: e.state,
            upgrade_id: e.upgrade_id,
            upgrade_state: e.upgrade_state,
            forced: e.forced,
            reason: e.reason,
            started_at: e.started_at,
            finished_at: e.finished_at,
        })
        .collect();
    let failures = tenants
        .iter()
        .filter(|t| t.state == FleetEntryState::Failed)
        .cloned()
        .collect();
    Ok(FleetUpgradeDetail {
        upgrade: view(f, sum),
        tenants,
        failures,
    })
}

pub(crate) async fn found(s: &AppState, id: i64) -> Result<FleetRow, Problem> {
    s.inventory
        .fleet(id)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no fleet upgrade {id}")))
}

/// Starts a fleet upgrade (admins only): the selected tenants below the target, plus every
/// tenant on an `expired` version (moved one minor, opted out or not), in waves: a canary of
/// `canary` tenants, then waves twice the size of the one before, at most `max_parallel`
/// moving at once, each tenant inside its maintenance window, `soak_seconds` between waves.
/// More than `failure_budget` failed tenants in one wave stop it. Each tenant's upgrade is
/// the one `PATCH /v1/tenants/{name}` starts (gated hops, automatic rollback). Every refusal
/// names the field at fault. 422: an unknown or `expired` `target` (rule
/// `no-expired-target`), a malformed `selector.labels`, a value out of range, an unknown
/// field (in `selector` too). 409, against the catalog and the tenants the server has: a
/// `preview` target without `allow_preview` (`target`, rule `preview-on-request`); a
/// `selector.version` the skew rules do not allow to the target (`no-downgrade`,
/// `unchanged`, `one-minor-per-hop` without `chain`); a named tenant the rules do not allow
/// (`selector.names`, or `chain` for a skip); no tenant to upgrade (`selector`). 404: a named
/// tenant that does not exist (`selector.names`).
#[utoipa::path(post, path = "/v1/upgrades", tag = "upgrades", security(("bearer" = [])),
    request_body = CreateFleetUpgrade, responses(
    (status = 201, description = "planned and started; state Running", body = FleetUpgradeDetail),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 404, description = "a tenant in `selector.names` does not exist", body = ProblemBody, content_type = "application/problem+json"),
    (status = 409, description = "the skew rules refuse the request against the server's catalog or tenants (`target`, `selector.version`, `selector.names`, `chain`), or no tenant is to be upgraded (`selector`); the detail names the rule", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "a field the server refuses; `field` names it (`target`, `selector.labels`, `canary`, `max_parallel`, `failure_budget`, `soak_seconds`, `selector.<unknown>`, ...) and the detail the rule", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn create_fleet_upgrade(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateFleetUpgrade>, JsonRejection>,
) -> Result<(StatusCode, Json<FleetUpgradeDetail>), Problem> {
    let caller = admin(&s, &headers).await?;
    let req = body(req)?;
    let r = request(&s, &req)?;
    let tenants = s
        .inventory
        .list_tenants(None)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let candidates: Vec<Candidate> = tenants
        .into_iter()
        .filter(|t| t.desired == vcp_core::lifecycle::Desired::Present)
        .map(|t| Candidate {
            id: t.id,
            name: t.name,
            version: t.version,
            labels: t.labels.0,
            fleet_upgrades: t.fleet_upgrades,
        })
        .collect();
    // What the plan refuses depends on the tenants and the catalog the server has: a named
    // tenant that does not exist is a 404, the rest conflicts with them (409); both name the
    // field at fault.
    let planned = fleet::plan(&s.provisioner.config.catalog, &r, &candidates).map_err(|e| {
        let status = if e.unknown_name() {
            StatusCode::NOT_FOUND
        } else {
            StatusCode::CONFLICT
        };
        Problem::new(
            status,
            "refused",
            "refused",
            &e.to_string(),
            Some(e.field()),
        )
    })?;
    let new = NewFleet {
        target: r.target.clone(),
        selector: serde_json::to_value(&req.selector).unwrap_or_default(),
        chain: req.chain,
        canary: req.canary,
        max_parallel: req.max_parallel,
        failure_budget: req.failure_budget,
        soak_seconds: req.soak_seconds,
        respect_maintenance_windows: req.respect_maintenance_windows,
        entries: planned,
    };
    let f = s
        .inventory
        .create_fleet(&new, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    tracing::info!(fleet_upgrade = f.id, target = %f.target_version, tenants = new.entries.len(), "fleet upgrade created");
    Ok((StatusCode::CREATED, Json(detail(&s, f).await?)))
}

/// Every fleet upgrade, newest first, with its progress (admins only).
#[utoipa::path(get, path = "/v1/upgrades", tag = "upgrades", security(("bearer" = [])), responses(
    (status = 200, body = FleetUpgradeList),
    Unauthorized,
    AdminOnly,
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn list_fleet_upgrades(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<FleetUpgradeList>, Problem> {
    admin(&s, &headers).await?;
    let internal = |e: crate::Error| Problem::internal(&e);
    let rows = s.inventory.fleets().await.map_err(internal)?;
    let ids: Vec<i64> = rows.iter().map(|f| f.id).collect();
    let mut sums = s.inventory.fleet_summaries(&ids).await.map_err(internal)?;
    let items = rows
        .into_iter()
        .map(|f| {
            let sum = sums.remove(&f.id).unwrap_or_default();
            view(f, sum)
        })
        .collect();
    Ok(Json(FleetUpgradeList { items }))
}

/// One fleet upgrade with every tenant's state, its progress, and its failures with their
/// reasons (admins only).
#[utoipa::path(get, path = "/v1/upgrades/{id}", tag = "upgrades", security(("bearer" = [])),
    params(("id" = i64, Path, minimum = 1, description = "fleet upgrade id")), responses(
    (status = 200, body = FleetUpgradeDetail),
    (status = 400, description = "the id is not a number", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no such fleet upgrade", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn get_fleet_upgrade(
    State(s): State<AppState>,
    headers: HeaderMap,
    id: Result<FleetId, Problem>,
) -> Result<Json<FleetUpgradeDetail>, Problem> {
    admin(&s, &headers).await?;
    let FleetId(id) = id?;
    let f = found(&s, id).await?;
    Ok(Json(detail(&s, f).await?))
}

pub(crate) async fn act(
    s: AppState,
    headers: HeaderMap,
    id: Result<FleetId, Problem>,
    req: Result<Json<serde_json::Value>, JsonRejection>,
    action: FleetAction,
) -> Result<Json<FleetUpgradeDetail>, Problem> {
    let caller = admin(&s, &headers).await?;
    let FleetId(id) = id?;
    let req: FleetUpgradeAction = object_body(req)?;
    if req
        .reason
        .as_ref()
        .is_some_and(|r| r.chars().count() > 200 || r.contains('\0'))
    {
        return Err(Problem::invalid(
            "reason",
            "at most 200 characters, and no NUL",
        ));
    }
    let done = s
        .inventory
        .fleet_action(id, action, req.reason.as_deref(), &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    match done {
        ActionOutcome::Done(f) => {
            tracing::info!(fleet_upgrade = id, action = action.as_str(), state = %f.state, "fleet upgrade changed");
            Ok(Json(detail(&s, f).await?))
        }
        ActionOutcome::NoSuchFleet => Err(Problem::not_found(&format!("no fleet upgrade {id}"))),
        ActionOutcome::Refused(state) => Err(Problem::new(
            StatusCode::CONFLICT,
            "conflict",
            "conflict",
            &format!(
                "fleet upgrade {id} is {state}; {} applies to {}",
                action.as_str(),
                match action {
                    FleetAction::Pause => "a Running one",
                    FleetAction::Resume => "a Paused one",
                    FleetAction::Cancel => "a Running or Paused one",
                }
            ),
            Some("state"),
        )),
    }
}

/// Holds a running fleet upgrade: no tenant starts; those already moving finish (admins
/// only). 409 unless it is Running.
#[utoipa::path(post, path = "/v1/upgrades/{id}/pause", tag = "upgrades", security(("bearer" = [])),
    params(("id" = i64, Path, minimum = 1, description = "fleet upgrade id")),
    request_body = FleetUpgradeAction, responses(
    (status = 200, description = "now Paused", body = FleetUpgradeDetail),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no such fleet upgrade", body = ProblemBody, content_type = "application/problem+json"),
    (status = 409, description = "not Running", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "a reason over 200 characters, or an unknown field", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn pause_fleet_upgrade(
    State(s): State<AppState>,
    headers: HeaderMap,
    id: Result<FleetId, Problem>,
    req: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Json<FleetUpgradeDetail>, Problem> {
    act(s, headers, id, req, FleetAction::Pause).await
}

/// Resumes a paused fleet upgrade where it was (admins only). 409 unless it is Paused.
#[utoipa::path(post, path = "/v1/upgrades/{id}/resume", tag = "upgrades", security(("bearer" = [])),
    params(("id" = i64, Path, minimum = 1, description = "fleet upgrade id")),
    request_body = FleetUpgradeAction, responses(
    (status = 200, description = "Running again", body = FleetUpgradeDetail),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no such fleet upgrade", body = ProblemBody, content_type = "application/problem+json"),
    (status = 409, description = "not Paused", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "a reason over 200 characters, or an unknown field", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn resume_fleet_upgrade(
    State(s): State<AppState>,
    headers: HeaderMap,
    id: Result<FleetId, Problem>,
    req: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Json<FleetUpgradeDetail>, Problem> {
    act(s, headers, id, req, FleetAction::Resume).await
}

/// Cancels a fleet upgrade (admins only): tenants not started are skipped; those already
/// moving finish their own upgrades (or roll back). 409 unless it is Running or Paused.
#[utoipa::path(post, path = "/v1/upgrades/{id}/cancel", tag = "upgrades", security(("bearer" = [])),
    params(("id" = i64, Path, minimum = 1, description = "fleet upgrade id")),
    request_body = FleetUpgradeAction, responses(
    (status = 200, description = "Cancelled", body = FleetUpgradeDetail),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no such fleet upgrade", body = ProblemBody, content_type = "application/problem+json"),
    (status = 409, description = "already finished", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "a reason over 200 characters, or an unknown field", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn cancel_fleet_upgrade(
    State(s): State<AppState>,
    headers: HeaderMap,
    id: Result<FleetId, Problem>,
    req: Result<Json<serde_json::Value>, JsonRejection>,
) -> Result<Json<FleetUpgradeDetail>, Problem> {
    act(s, headers, id, req, FleetAction::Cancel).await
}
