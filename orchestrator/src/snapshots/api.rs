//! etcd snapshots of one tenant, and restores from them: `POST /v1/tenants/{name}/snapshots`
//! records a snapshot to take and the tenant's next pass takes it (poll the list);
//! `POST /v1/tenants/{name}/restore` (admins) stops the control plane, restores every etcd
//! member from the snapshot and starts it again (poll the tenant's `phase` and the list).

use crate::http::problem::{
    AdminOnly, BodyRefused, NoBodyTaken, NoSuchTenant, Problem, ProblemBody, Unauthorized,
};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, NoBody, body, caller_and_tenant};
use crate::snapshots::types::{RestoreTenant, RestoreView, SnapshotList, SnapshotView};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use tracing::field::Empty;
use vcp_core::lifecycle::{Phase, SnapshotState};

/// Asks for an etcd snapshot of the tenant, taken through etcd's snapshot API by a Job in the
/// tenant's control-plane namespace onto its `etcd-snapshots` volume, and recorded with the
/// store's revision, the file's size and SHA-256. `Pending` until the tenant's next pass. A
/// tenant on a shared datastore gets a logical snapshot instead: its own keys, exported as its
/// etcd user (storage version `vcp-logical-v1`, a `.vcpl` file).
/// It takes no body: none, or `{}` (vcp chooses where a snapshot goes).
#[utoipa::path(post, path = "/v1/tenants/{name}/snapshots", tag = "snapshots",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    responses(
    (status = 202, description = "snapshot recorded as Pending", body = SnapshotView),
    Unauthorized,
    NoSuchTenant,
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn create_snapshot(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<(StatusCode, Json<SnapshotView>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    none?;
    let row = s
        .inventory
        .request_snapshot(&t, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(|| Problem::not_found(&format!("no tenant named {:?}", t.name)))?;
    Ok((StatusCode::ACCEPTED, Json(row.into())))
}

/// The tenant's snapshots and restores, newest first.
#[utoipa::path(get, path = "/v1/tenants/{name}/snapshots", tag = "snapshots",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    responses(
    (status = 200, description = "snapshots and restores", body = SnapshotList),
    Unauthorized,
    NoSuchTenant,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn list_snapshots(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<SnapshotList>, Problem> {
    let (_, t) = caller_and_tenant(&s, &headers, name).await?;
    let internal = |e: crate::Error| Problem::internal(&e);
    let snapshots = s.inventory.snapshots(t.id).await.map_err(internal)?;
    let restores = s.inventory.restores(t.id).await.map_err(internal)?;
    Ok(Json(SnapshotList {
        snapshots: snapshots.into_iter().map(Into::into).collect(),
        restores: restores.into_iter().map(Into::into).collect(),
    }))
}

/// Restores the tenant's etcd from one of its `Succeeded` snapshots (admins only): the
/// control plane stops (phase `Restoring`; its API is down meanwhile, its workloads on the
/// host keep running), each member's data is replaced by the snapshot's after the file is
/// checked against its recorded SHA-256 (the old data is kept beside it), the revision moves
/// forward so every client relists, and the control plane starts again. Objects written after
/// the snapshot are gone; objects deleted after it are back. A logical snapshot is put back
/// by one Job with only etcd's clients stopped (the tenant's keys deleted, the snapshot's put
/// under its prefix). A snapshot uploaded to the backup store (an `s3://` location) is
/// fetched from there, opened with the tenant's backup key and checked against its SHA-256
/// first. 409 unless the tenant is Ready with no upgrade or restore moving it; 422 for a
/// snapshot that is not a taken one of this tenant, one whose copy retention pruned, or an
/// etcd snapshot for a tenant on a shared datastore (which restores only from logical ones).
#[utoipa::path(post, path = "/v1/tenants/{name}/restore", tag = "snapshots",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = RestoreTenant, responses(
    (status = 202, description = "restore started; phase Restoring", body = RestoreView),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    NoSuchTenant,
    (status = 409, description = "the tenant is not Ready, or an upgrade or restore moves it", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "no taken snapshot of this tenant has that id, retention pruned it, or an etcd snapshot for a tenant on a shared datastore; `field` is `snapshot`", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn restore_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<RestoreTenant>, JsonRejection>,
) -> Result<(StatusCode, Json<RestoreView>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("restoring a tenant is for admins"));
    }
    let req = body(req)?;
    let snap = s
        .inventory
        .numbered_snapshot(t.id, req.snapshot)
        .await
        .map_err(|e| Problem::internal(&e))?
        .filter(|x| x.state == SnapshotState::Succeeded && x.pruned_at.is_none())
        .ok_or_else(|| {
            Problem::invalid(
                "snapshot",
                &format!(
                    "tenant {:?} has no taken snapshot {} that retention has not pruned",
                    t.name, req.snapshot
                ),
            )
        })?;
    let config = &s.provisioner.config;
    let shared = config
        .plans
        .get(&t.plan)
        .and_then(|p| config.settings.placement(p, &t.key));
    let logical = snap
        .storage_version
        .as_deref()
        .is_some_and(crate::snapshots::is_logical);
    if let (Some(p), false) = (shared, logical) {
        return Err(Problem::invalid(
            "snapshot",
            &format!(
                "snapshot {} is an etcd snapshot; tenant {:?} keeps its data on shared datastore {} and restores only from its logical snapshots",
                req.snapshot, t.name, p.name
            ),
        ));
    }
    let conflict = || {
        Problem::conflict(
            "snapshot",
            &format!(
                "tenant {:?} is {}; a restore starts from Ready with no upgrade or restore moving it",
                t.name, t.phase
            ),
        )
    };
    if t.phase != Phase::Ready {
        return Err(conflict());
    }
    let started = s
        .inventory
        .start_restore(&t, &snap, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    match started {
        Some(r) => Ok((StatusCode::ACCEPTED, Json(r.into()))),
        None => Err(conflict()),
    }
}
