//! Tenants: create, list, show, delete. Requests are checked here and written to the
//! inventory as desired state; the reconcile workers do the rest (poll `phase`).

use crate::Error;
use crate::http::auth::authenticate;
use crate::http::problem::{
    BodyRefused, NoBodyTaken, NoSuchTenant, Problem, ProblemBody, Unauthorized,
};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, NoBody, body, caller_and_tenant, find};
use crate::inventory::{NewTenant, Tenant};
use crate::names::TenantName;
use crate::tenants::types::{CreateTenant, DeleteQuery, TenantList, TenantUsage, TenantView};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::BTreeMap;
use tracing::field::Empty;
use vcp_core::lifecycle::FleetUpgrades;

/// Random bytes for a tenant key suffix.
fn key_suffix() -> [u8; crate::names::KEY_SUFFIX_LEN] {
    let mut b = [0u8; crate::names::KEY_SUFFIX_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut b)
        .expect("the system random source works");
    b
}

/// Tenants as the API shows them: with their release and their latest usage sample (one
/// query for all of them).
pub(crate) async fn views(s: &AppState, tenants: Vec<Tenant>) -> Result<Vec<TenantView>, Problem> {
    let ids: Vec<i64> = tenants.iter().map(|t| t.id).collect();
    let mut latest = s
        .inventory
        .latest_usage(&ids)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let mut upgrades = s
        .inventory
        .latest_upgrades(&ids)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let config = &s.provisioner.config;
    Ok(tenants
        .into_iter()
        .map(|t| {
            // The release its control plane is rendered from: its own, or the minor's when
            // this replica's catalog no longer lists it.
            let kubernetes = config
                .catalog
                .at_release(&t.version, t.release.as_deref())
                .map(|v| v.kubernetes)
                .or_else(|| t.release.clone());
            let auto = crate::upgrades::auto::effective(
                t.auto_update,
                config.plans.get(&t.plan).and_then(|p| p.auto_update),
            );
            let usage = latest.remove(&t.id).map(|u| TenantUsage {
                sampled_at: u.sampled_at,
                used: u.used,
                limits: crate::usage::sampler::limits(&config.plans, &t.plan),
            });
            let upgrade = upgrades.remove(&t.id).map(Into::into);
            TenantView::new(t, kubernetes, usage, upgrade, auto)
        })
        .collect())
}

pub(crate) async fn view(s: &AppState, t: Tenant) -> Result<TenantView, Problem> {
    Ok(views(s, vec![t]).await?.remove(0))
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), Problem> {
    use crate::names::{MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_LABELS};
    if labels.len() > MAX_LABELS {
        return Err(Problem::invalid(
            "labels",
            &format!("at most {MAX_LABELS} labels"),
        ));
    }
    for (k, v) in labels {
        if !crate::names::is_label_key(k) || !crate::names::is_label_value(v) {
            return Err(Problem::invalid(
                "labels",
                &format!(
                    "label {k:?}: keys of 1 to {MAX_LABEL_KEY_LEN} and values of up to \
                     {MAX_LABEL_VALUE_LEN} characters of [A-Za-z0-9-_./]"
                ),
            ));
        }
    }
    Ok(())
}

/// Creates a tenant; provisioning continues in the background (poll its `phase`). With
/// `from_snapshot`, a clone: the tenant comes up with the data of another tenant's uploaded
/// snapshot (restored before it is `Ready`), then rotates to an encryption key of its own.
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])),
    request_body = CreateTenant, responses(
    (status = 201, description = "accepted; phase Pending", body = TenantView),
    BodyRefused,
    Unauthorized,
    (status = 409, description = "the caller already has a live tenant of this name (names are unique per owner; another owner's tenant of the same name does not conflict)", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid name, version, plan, labels, maintenance_window, fleet_upgrades or from_snapshot (malformed; no such tenant of the caller's, or no such taken, uploaded and unpruned snapshot of it; one taken during an encryption-key rotation; no backup store; a version other than the snapshot's; an etcd snapshot for a plan on a shared datastore)", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn create_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateTenant>, JsonRejection>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let req = body(req)?;
    let name =
        TenantName::parse(&req.name).map_err(|e| Problem::invalid("name", &e.to_string()))?;
    tracing::Span::current().record("tenant", name.to_string());
    let config = &s.provisioner.config;
    let seed = match req.from_snapshot.as_deref() {
        Some(raw) => Some(crate::clones::api::seed(&s, &caller, raw).await?),
        None => None,
    };
    // A clone runs the version its snapshot was taken on: its data is that version's.
    let asked = match (&seed, req.version.as_deref()) {
        (Some(seed), Some(v)) if v != seed.snapshot.version => {
            return Err(Problem::invalid(
                "version",
                &format!(
                    "a clone runs its snapshot's version {}, not {v}",
                    seed.snapshot.version
                ),
            ));
        }
        (Some(seed), _) => Some(seed.snapshot.version.as_str()),
        (None, v) => v,
    };
    let (version, release) = config
        .catalog
        .resolve_new(asked, req.allow_preview)
        .map_err(|e| Problem::invalid("version", &e.to_string()))?;
    let plan = req.plan.unwrap_or_else(|| "default".into());
    let Some(p) = config.plans.get(&plan) else {
        return Err(Problem::invalid(
            "plan",
            &format!(
                "unknown plan {plan:?}; configured: {}",
                config.plans.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        ));
    };
    if let Some(seed) = &seed
        && let (Some(d), false) = (
            &p.datastore,
            seed.snapshot
                .storage_version
                .as_deref()
                .is_some_and(crate::snapshots::is_logical),
        )
    {
        return Err(Problem::invalid(
            "plan",
            &format!(
                "plan {plan:?} keeps data on shared datastore {d}, which restores only logical snapshots; snapshot {} is an etcd snapshot",
                seed.snapshot.number
            ),
        ));
    }
    check_labels(&req.labels)?;
    // A random key could collide with a live one; a few tries make that vanishingly rare.
    for _ in 0..5 {
        let new = NewTenant {
            name: name.to_string(),
            key: name.key(key_suffix()),
            owner: caller.0.name.clone(),
            labels: req.labels.clone(),
            version: version.minor.clone(),
            plan: plan.clone(),
            maintenance_window: req.maintenance_window.clone(),
            fleet_upgrades: req.fleet_upgrades.unwrap_or(FleetUpgrades::Include),
            auto_update: req.auto_update,
            release: release.to_owned(),
        };
        let created = match &seed {
            Some(seed) => {
                s.inventory
                    .create_clone(&new, seed, &config.inventory_key, &caller.0.name)
                    .await
            }
            None => s.inventory.create_tenant(&new, &caller.0.name).await,
        };
        match created {
            Ok(t) => return Ok((StatusCode::CREATED, Json(view(&s, t).await?))),
            Err(Error::KeyCollision) => continue,
            // Only the caller's own tenants count: names are unique per owner, so another
            // owner's tenant of this name neither blocks this one nor shows here.
            Err(Error::Duplicate(n)) => {
                return Err(Problem::conflict(
                    "name",
                    &format!("a tenant named {n:?} of yours already exists"),
                ));
            }
            Err(e) => return Err(Problem::internal(&e)),
        }
    }
    Err(Problem::internal(&Error::KeyCollision))
}

/// The caller's tenants (every tenant for an admin).
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])), responses(
    (status = 200, body = TenantList),
    Unauthorized,
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn list_tenants(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<TenantList>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    let tenants = s
        .inventory
        .list_tenants(caller.scope())
        .await
        .map_err(|e| Problem::internal(&e))?;
    let items = views(&s, tenants).await?;
    Ok(Json(TenantList { items }))
}

/// One tenant, with its latest quota usage sample (`usage`, null before the first).
#[utoipa::path(get, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")), responses(
    (status = 200, body = TenantView),
    Unauthorized,
    NoSuchTenant,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn get_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<TenantView>, Problem> {
    let (_caller, t) = caller_and_tenant(&s, &headers, name).await?;
    Ok(Json(view(&s, t).await?))
}

/// Deletes a tenant: its control plane, its workloads on the host and (unless retained) its
/// data. The name is free again once the tenant is gone from the list.
#[utoipa::path(delete, path = "/v1/tenants/{name}", tag = "tenants", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name"), DeleteQuery), responses(
    (status = 202, description = "deletion started; phase Deleting", body = TenantView),
    (status = 400, description = "malformed query", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    NoSuchTenant,
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn delete_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    q: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
    none: Result<NoBody, Problem>,
) -> Result<(StatusCode, Json<TenantView>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    let name = name?;
    let Query(q) = q.map_err(|e| {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "malformed",
            "malformed query",
            &e.body_text(),
            Some("retain_data"),
        )
    })?;
    let t = find(&s, &caller, &name).await?;
    none?;
    let t = s
        .inventory
        .request_delete(&t, q.retain_data, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {:?}", t.name)))?;
    Ok((StatusCode::ACCEPTED, Json(view(&s, t).await?)))
}
