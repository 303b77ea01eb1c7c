//! Rotations of a tenant's CAs, service-account key and etcd encryption key:
//! `POST /v1/tenants/{name}/rotate`
//! (admins) records one in phase `trust` and the tenant's passes walk it through `sign`,
//! `serve` and `retire` to `done` (see [`crate::pki::rotation`]); `GET .../rotations` shows
//! where each stands and, for the cluster CA, which kubeconfigs must be reissued.

use crate::http::problem::{BodyRefused, NoSuchTenant, Problem, ProblemBody, Unauthorized};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, body, caller_and_tenant};
use crate::kubeconfigs::types::KubeconfigView;
use crate::pki::rotation::{MAX_OVERLAP, Target};
use crate::rotations::store::{RotationRow, StartRefused};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tracing::field::Empty;
use utoipa::ToSchema;
use vcp_core::lifecycle::Desired;

/// What to rotate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum RotationTarget {
    /// The cluster CA: apiserver serving and client CA, components' certificates, the kubelet
    /// pair, user kubeconfigs.
    Ca,
    /// etcd's CA.
    EtcdCa,
    /// The front-proxy CA (aggregated APIs).
    FrontProxyCa,
    /// The service-account token signing key.
    ServiceAccountKey,
    /// The key the tenant apiserver encrypts Secrets with in etcd; phase `serve` rewrites
    /// every encrypted object with the new key.
    EncryptionKey,
}

impl From<RotationTarget> for Target {
    fn from(t: RotationTarget) -> Target {
        match t {
            RotationTarget::Ca => Target::Ca,
            RotationTarget::EtcdCa => Target::EtcdCa,
            RotationTarget::FrontProxyCa => Target::FrontProxyCa,
            RotationTarget::ServiceAccountKey => Target::ServiceAccountKey,
            RotationTarget::EncryptionKey => Target::EncryptionKey,
        }
    }
}

/// `POST /v1/tenants/{name}/rotate` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateTenant {
    pub target: RotationTarget,
    /// How long phase `sign` lasts at least, like `0s`, `90m`, `12h` or `7d`; a longer one than
    /// `30d` is cut to `30d`:
    /// for `ca`, the time users have to fetch new kubeconfigs before the old ones stop
    /// working; for `service-account-key`, how long tokens signed by the old key (other than
    /// pods' own, which are reissued at once) may still be presented. Default: `24h` for both
    /// (the longest token lifetime), `0s` for `etcd-ca`, `front-proxy-ca` and `encryption-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(pattern = "^[0-9]+[smhd]?$", examples("1h"))]
    pub overlap: Option<String>,
}

/// One rotation.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RotationView {
    pub id: i64,
    pub target: RotationTarget,
    /// `trust` (both trusted, old signs), `sign` (new signs; for `ca` the apiserver still
    /// serves with the old), `serve` (everything new; kubeconfigs issued before `sign` stop
    /// working; for `encryption-key`, every encrypted object is rewritten with the new key),
    /// `retire` (only the new is trusted), `done`.
    #[schema(pattern = "^(trust|sign|serve|retire|done)$")]
    pub phase: String,
    pub overlap_seconds: i64,
    pub requested_by: String,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub phase_since: OffsetDateTime,
    /// When phase `sign` began; kubeconfigs issued from then on survive a `ca` rotation.
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub signing_since: Option<OffsetDateTime>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub finished_at: Option<OffsetDateTime>,
    /// For `ca`: the unrevoked, unexpired kubeconfigs that hold only the old CA and stop
    /// working in phase `serve`; issue their users new ones after `signing_since`. Empty for
    /// other targets.
    pub reissue: Vec<KubeconfigView>,
}

/// `GET /v1/tenants/{name}/rotations` answer, newest first.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RotationList {
    pub items: Vec<RotationView>,
}

impl From<Target> for RotationTarget {
    fn from(t: Target) -> RotationTarget {
        match t {
            Target::Ca => RotationTarget::Ca,
            Target::EtcdCa => RotationTarget::EtcdCa,
            Target::FrontProxyCa => RotationTarget::FrontProxyCa,
            Target::ServiceAccountKey => RotationTarget::ServiceAccountKey,
            Target::EncryptionKey => RotationTarget::EncryptionKey,
        }
    }
}

fn view(r: RotationRow, reissue: Vec<KubeconfigView>) -> Result<RotationView, Problem> {
    // The table's CHECK keeps targets to known names.
    let target = r
        .target
        .parse::<Target>()
        .map_err(|_| Problem::opaque())?
        .into();
    Ok(RotationView {
        id: r.id,
        target,
        phase: r.phase,
        overlap_seconds: r.overlap_seconds,
        requested_by: r.requested_by,
        created_at: r.created_at,
        phase_since: r.phase_since,
        signing_since: r.signing_since,
        finished_at: r.finished_at,
        reissue,
    })
}

/// The overlap a request asks for: `0` or a duration, cut to [`MAX_OVERLAP`].
fn overlap(req: &RotateTenant) -> Result<time::Duration, Problem> {
    let target = Target::from(req.target);
    let Some(text) = req.overlap.as_deref() else {
        return Ok(target.default_overlap());
    };
    let d = crate::names::parse_duration(text);
    // Cut to the cap, as a kubeconfig's ttl is: a huge overlap means "as long as allowed".
    let d = d
        .map(|d| time::Duration::try_from(d).map_or(MAX_OVERLAP, |d| d.min(MAX_OVERLAP)))
        .ok_or_else(|| Problem::invalid("overlap", "a duration like 0s, 90m, 12h or 7d"))?;
    Ok(d)
}

pub(crate) async fn with_reissue(s: &AppState, r: RotationRow) -> Result<RotationView, Problem> {
    let reissue = s
        .inventory
        .to_reissue(&r)
        .await
        .map_err(|e| Problem::internal(&e))?;
    view(r, reissue.into_iter().map(Into::into).collect())
}

/// Rotates one of the tenant's CAs, its service-account key or its etcd encryption key without
/// downtime (admins only). Every component trusts the new CA or key before anything is signed
/// (or encrypted) with it, and everything is signed with it before the old one is retired;
/// pods' service-account tokens are reissued under the new key while both are trusted, and
/// every encrypted object is rewritten with the new encryption key before the old is dropped.
/// For `ca`, kubeconfigs issued before phase `sign` hold only the old CA and stop working in
/// phase `serve`, after the overlap: the answer lists them (`reissue`); kubeconfigs issued
/// from `sign` on keep working.
/// Follow the phases with `GET .../rotations`. 409 while another rotation of the tenant runs
/// or before the tenant is Ready.
#[utoipa::path(post, path = "/v1/tenants/{name}/rotate", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = RotateTenant, responses(
    (status = 202, description = "rotation started in phase trust", body = RotationView),
    BodyRefused,
    Unauthorized,
    (status = 403, description = "only admins rotate a tenant's keys", body = ProblemBody, content_type = "application/problem+json"),
    NoSuchTenant,
    (status = 409, description = "another rotation of the tenant is under way (`rotation-in-progress`), or the tenant is not Ready or is being deleted", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "unknown target, or an overlap that is not a duration", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn rotate_tenant(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<RotateTenant>, JsonRejection>,
) -> Result<(StatusCode, Json<RotationView>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins rotate a tenant's keys"));
    }
    let req = body(req)?;
    let overlap = overlap(&req)?;
    let not_ready = |why: &str| Problem::conflict("target", &format!("tenant {:?} {why}", t.name));
    if t.desired == Desired::Absent {
        return Err(not_ready("is being deleted"));
    }
    if t.phase != vcp_core::lifecycle::Phase::Ready {
        return Err(not_ready(&format!(
            "is {}; a rotation starts from Ready",
            t.phase
        )));
    }
    let started = s
        .inventory
        .start_rotation(&t, req.target.into(), overlap, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    match started {
        Ok(r) => Ok((StatusCode::ACCEPTED, Json(with_reissue(&s, r).await?))),
        Err(StartRefused::NotPresent) => Err(not_ready("is being deleted")),
        Err(StartRefused::InProgress(r)) => Err(Problem::new(
            StatusCode::CONFLICT,
            "rotation-in-progress",
            "a rotation is under way",
            &format!(
                "tenant {:?} is rotating its {} (rotation {}, phase {}); one rotation at a time",
                t.name, r.target, r.id, r.phase
            ),
            Some("target"),
        )),
    }
}

/// The tenant's rotations, newest first, each with its phase and, for the cluster CA, the
/// kubeconfigs to reissue.
#[utoipa::path(get, path = "/v1/tenants/{name}/rotations", tag = "tenants",
    security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    responses(
    (status = 200, description = "rotations, newest first", body = RotationList),
    Unauthorized,
    NoSuchTenant,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn list_rotations(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<RotationList>, Problem> {
    let (_, t) = caller_and_tenant(&s, &headers, name).await?;
    let rows = s
        .inventory
        .rotations(t.id)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let mut items = Vec::with_capacity(rows.len());
    for r in rows {
        items.push(with_reissue(&s, r).await?);
    }
    Ok(Json(RotationList { items }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(target: RotationTarget, overlap: Option<&str>) -> RotateTenant {
        RotateTenant {
            target,
            overlap: overlap.map(str::to_owned),
        }
    }

    #[test]
    fn the_documented_overlap_pattern_is_the_parsers() {
        let doc = serde_json::to_value(crate::api::openapi()).unwrap();
        assert_eq!(
            doc["components"]["schemas"]["RotateTenant"]["properties"]["overlap"]["pattern"],
            crate::names::DURATION_PATTERN
        );
    }

    #[test]
    fn overlaps_default_per_target_accept_zero_cut_long_ones_and_refuse_garbage() {
        assert_eq!(
            overlap(&req(RotationTarget::Ca, None)).unwrap(),
            time::Duration::hours(24)
        );
        assert_eq!(
            overlap(&req(RotationTarget::EtcdCa, None)).unwrap(),
            time::Duration::ZERO
        );
        for zero in ["0", "0s", "00m", "0d"] {
            assert_eq!(
                overlap(&req(RotationTarget::Ca, Some(zero))).unwrap(),
                time::Duration::ZERO,
                "{zero}"
            );
        }
        assert_eq!(
            overlap(&req(RotationTarget::Ca, Some("90m"))).unwrap(),
            time::Duration::minutes(90)
        );
        assert_eq!(
            overlap(&req(RotationTarget::Ca, Some("30d"))).unwrap(),
            MAX_OVERLAP
        );
        for long in ["31d", "99999999999999999999d"] {
            assert_eq!(
                overlap(&req(RotationTarget::Ca, Some(long))).unwrap(),
                MAX_OVERLAP,
                "{long} is cut"
            );
        }
        for bad in ["", "s", "-1s", "1x", "0x", "1h30m", "0ss"] {
            let e = overlap(&req(RotationTarget::Ca, Some(bad))).unwrap_err();
            assert_eq!(e.field(), Some("overlap"), "{bad}");
        }
    }
}
