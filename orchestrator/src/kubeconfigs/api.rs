//! Kubeconfigs of tenant users: issuing (a client certificate from the tenant's CA, signed by
//! the provisioner, which owns the host where the CA lives), listing what was issued, and
//! revoking one kubeconfig or all of a user's: the inventory records it first, then the
//! provisioner writes the tenant's revoked serials to the host, where the revocation
//! authorizer in the tenant apiserver's pod refuses them (`vcp_core::revocation`).

use crate::http::problem::{
    BodyRefused, NoBodyTaken, NoSuchTenant, Problem, ProblemBody, Unauthorized,
};
use crate::http::schema::{NameSchema, SerialSchema, SubjectSchema};
use crate::http::{AppState, Name, NameAnd, NoBody, body, caller_and_tenant};
use crate::kubeconfigs::types::{
    BreakGlassRequest, IssueKubeconfig, KubeconfigIssued, KubeconfigList, KubeconfigView,
};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use std::time::Duration;
use tracing::field::Empty;
use vcp_core::lifecycle::{Desired, Phase};

/// A kubeconfig's lifetime when the request names none: a working day (why:
/// docs/orchestrator.md, "Revoking access").
pub const DEFAULT_TTL: Duration = Duration::from_secs(8 * 3600);

/// Checks a kubeconfig request; the `ttl` it asks for, capped at `max`.
fn check_kubeconfig(req: &IssueKubeconfig, max: Duration) -> Result<Duration, Problem> {
    use crate::names::{MAX_GROUPS, MAX_SUBJECT_LEN, is_subject, parse_ttl};
    if !is_subject(&req.user) {
        return Err(Problem::invalid(
            "user",
            &format!(
                "1 to {MAX_SUBJECT_LEN} printable ASCII characters without spaces, not \
                 starting with \"system:\" or \"vcp:\""
            ),
        ));
    }
    if req.groups.len() > MAX_GROUPS || !req.groups.iter().all(|g| is_subject(g)) {
        return Err(Problem::invalid(
            "groups",
            &format!(
                "at most {MAX_GROUPS} groups of 1 to {MAX_SUBJECT_LEN} printable ASCII \
                 characters, none starting with \"system:\" or \"vcp:\""
            ),
        ));
    }
    let ttl = match req.ttl.as_deref() {
        None => DEFAULT_TTL,
        Some(x) => parse_ttl(x)
            .ok_or_else(|| Problem::invalid("ttl", "a duration like 90m, 12h or 30d"))?,
    };
    Ok(ttl.min(max))
}

/// Issues a kubeconfig: a client certificate signed by the tenant's CA, user as CN and
/// groups as O. The groups `view`, `edit` and `admin` are bound in the tenant; `sudo` lets the
/// holder of this kubeconfig act as admin for one command by impersonating its user into the
/// group `vcp:sudo` (`kubectl --as=<user> --as-group=vcp:sudo`), until it is revoked or
/// expires. The key is in this answer only; the inventory keeps serial, subject and expiry.
#[utoipa::path(post, path = "/v1/tenants/{name}/kubeconfigs", tag = "kubeconfigs", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = IssueKubeconfig, responses(
    (status = 201, body = KubeconfigIssued),
    BodyRefused,
    Unauthorized,
    NoSuchTenant,
    (status = 409, description = "the tenant has not been Ready yet, or is being deleted", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid user, groups or ttl", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn issue_kubeconfig(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<IssueKubeconfig>, JsonRejection>,
) -> Result<(StatusCode, Json<KubeconfigIssued>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    let req = body(req)?;
    let ttl = check_kubeconfig(&req, s.max_kubeconfig_ttl)?;
    let ttl = time::Duration::try_from(ttl)
        .map_err(|_| Problem::invalid("ttl", "longer than this server can represent"))?;
    // Once Ready, a tenant's CA and endpoint exist for good: a later pass that finds its
    // control plane rolling (a rotation, an upgrade, a plan change) or briefly unreachable
    // makes it Provisioning, Upgrading or Restoring for a while, and its owner still gets
    // kubeconfigs then. A sleeping tenant's first call through the gateway wakes it.
    let issuable = t.first_ready_at.is_some() && t.phase != Phase::Deleting;
    let Some(endpoint) = t.endpoint.clone().filter(|_| issuable) else {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "not-ready",
            "tenant not ready",
            &if t.phase == Phase::Deleting {
                format!("tenant {:?} is being deleted", t.name)
            } else {
                format!(
                    "tenant {:?} is {} and has not been Ready yet; kubeconfigs are issued once it has been",
                    t.name, t.phase
                )
            },
            None,
        ));
    };
    let now = time::OffsetDateTime::now_utc();
    let signed = s
        .provisioner
        .sign_kubeconfig(&t, &endpoint, &req.user, &req.groups, now, ttl)
        .await
        .map_err(|e| Problem::internal(&e))?;
    let cert = signed.certificate;
    s.inventory
        .record_kubeconfig(
            t.id,
            &req.user,
            &req.groups,
            &cert.serial,
            cert.not_after,
            &caller.0.name,
            None,
        )
        .await
        .map_err(|e| Problem::internal(&e))?;
    // A sudoer's rights exist in the tenant before its kubeconfig leaves, and are bound to
    // this kubeconfig alone. Recorded first, so a provisioning pass that meets the role
    // finds its kubeconfig live and leaves it ([`crate::host::Provisioner::reconcile_sudo`]).
    if req
        .groups
        .iter()
        .any(|g| g == crate::kubeconfigs::access::SUDO_GROUP)
        && let Err(e) = s
            .provisioner
            .grant_sudo(&t, &endpoint, &req.user, &cert.serial)
            .await
    {
        // Nobody holds this kubeconfig: revoked, so the inventory does not list it as live
        // (and no pass writes its role after all).
        if let Err(r) = s
            .inventory
            .revoke_kubeconfig(t.id, &cert.serial, &caller.0.name)
            .await
        {
            tracing::warn!(error = %r.public(), serial = %cert.serial,
                "revoking a kubeconfig whose sudo role could not be written failed");
        }
        return Err(Problem::internal(&e));
    }
    Ok((
        StatusCode::CREATED,
        Json(KubeconfigIssued {
            kubeconfig: signed.kubeconfig,
            serial: cert.serial,
            user: req.user,
            groups: req.groups,
            expires_at: cert.not_after,
        }),
    ))
}

/// The kubeconfigs issued for a tenant (serial, subject, groups, expiry; never keys).
#[utoipa::path(get, path = "/v1/tenants/{name}/kubeconfigs", tag = "kubeconfigs", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")), responses(
    (status = 200, body = KubeconfigList),
    Unauthorized,
    NoSuchTenant,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn list_kubeconfigs(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
) -> Result<Json<KubeconfigList>, Problem> {
    let (_caller, t) = caller_and_tenant(&s, &headers, name).await?;
    let items = s
        .inventory
        .kubeconfigs(t.id)
        .await
        .map_err(|e| Problem::internal(&e))?
        .into_iter()
        .map(KubeconfigView::from)
        .collect();
    Ok(Json(KubeconfigList { items }))
}

/// Who calls, the tenant and the second path segment, in the order every handler checks them
/// (401, then 400, then 404 for a tenant the caller may not see, as in
/// [`crate::http::caller_and_tenant`]).
pub(crate) async fn caller_tenant_and(
    s: &AppState,
    headers: &HeaderMap,
    path: Result<NameAnd, Problem>,
) -> Result<(crate::http::auth::Caller, crate::inventory::Tenant, String), Problem> {
    let caller = crate::http::auth::authenticate(s, headers).await?;
    let NameAnd(name, rest) = path?;
    let t = crate::http::find(s, &caller, &name).await?;
    Ok((caller, t, rest))
}

/// Writes the tenant's revoked serials to the host after a revocation was recorded. The
/// inventory already holds it and every provisioning pass writes the list again, but the
/// caller is told when the tenant does not enforce it yet, and retrying does no harm.
pub(crate) async fn deliver(s: &AppState, t: &crate::inventory::Tenant) -> Result<(), Problem> {
    s.provisioner
        .write_revocations(t)
        .await
        .map(|_| ())
        .map_err(|e| {
            tracing::warn!(error = %e.public(), "delivering a revocation to the host failed");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "not-delivered",
                "revocation recorded, not yet enforced",
                "the revocation is recorded, but could not be passed to the tenant yet; vcp \
             retries on its own, and repeating this request retries now",
                None,
            )
        })
}

/// Deletes the sudo roles of kubeconfigs no longer live, right after a revocation is recorded
/// and before it is delivered. Sudo is bound to each kubeconfig's own serial, so the
/// revocation takes it along; but a revocation is enforced only once it reached the tenant's
/// authorizer, and RBAC without the role holds whether it did or not. Best effort:
/// the tenant's next pass retries what fails here.
pub(crate) async fn forget_sudo(s: &AppState, t: &crate::inventory::Tenant) {
    if s.provisioner.config.simulate {
        return;
    }
    if let Err(e) = s.provisioner.reconcile_sudo(t, t.endpoint.as_deref()).await {
        tracing::warn!(error = %e.public(), "removing sudo roles after a revocation failed");
    }
}

/// Revokes one kubeconfig: the tenant apiserver refuses it within 60 s (the authorizer in its
/// pod reads the revocation within seconds, and the apiserver caches an answer for 10 s),
/// whether the tenant's syncer runs or not. Revoking one
/// already revoked changes nothing and answers the same.
#[utoipa::path(delete, path = "/v1/tenants/{name}/kubeconfigs/{serial}", tag = "kubeconfigs", security(("bearer" = [])),
    params(
        ("name" = NameSchema, Path, description = "tenant name"),
        ("serial" = SerialSchema, Path, description = "the kubeconfig's certificate serial, as issued and listed"),
    ),
    responses(
    (status = 200, description = "revoked", body = KubeconfigView),
    (status = 400, description = "malformed path", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    (status = 404, description = "no such tenant (or another owner's), or no kubeconfig of that serial in it", body = ProblemBody, content_type = "application/problem+json"),
    (status = 409, description = "a break-glass kubeconfig: it cannot be revoked, only expire", body = ProblemBody, content_type = "application/problem+json"),
    (status = 503, description = "recorded, not yet passed to the tenant: retry", body = ProblemBody, content_type = "application/problem+json"),
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn revoke_kubeconfig(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<NameAnd, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<Json<KubeconfigView>, Problem> {
    let (caller, t, serial) = caller_tenant_and(&s, &headers, path).await?;
    none?;
    let none = || {
        Problem::not_found(&format!(
            "no kubeconfig of serial {serial:?} in tenant {:?}",
            t.name
        ))
    };
    if !vcp_core::revocation::is_serial(&serial) {
        return Err(none());
    }
    let row = s
        .inventory
        .revoke_kubeconfig(t.id, &serial, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?
        .ok_or_else(none)?;
    if row.break_glass {
        return Err(Problem::new(
            StatusCode::CONFLICT,
            "break-glass",
            "a break-glass kubeconfig cannot be revoked",
            &format!(
                "kubeconfig {serial} is a break-glass one: nothing checks it, and it expires at {}",
                row.expires_at
                    .format(&time::format_description::well_known::Rfc3339)
                    .unwrap_or_default()
            ),
            None,
        ));
    }
    forget_sudo(&s, &t).await;
    deliver(&s, &t).await?;
    Ok(Json(KubeconfigView::from(row)))
}

/// Revokes every kubeconfig issued to a user in the tenant; the answer lists them. Within
/// 60 s the tenant apiserver refuses each. A kubeconfig issued to the user later is not
/// affected: revoke it too, or stop issuing.
#[utoipa::path(delete, path = "/v1/tenants/{name}/users/{user}", tag = "kubeconfigs", security(("bearer" = [])),
    params(
        ("name" = NameSchema, Path, description = "tenant name"),
        ("user" = SubjectSchema, Path, description = "the user the kubeconfigs were issued to (percent-encoded)"),
    ),
    responses(
    (status = 200, description = "every kubeconfig of the user, all revoked", body = KubeconfigList),
    (status = 400, description = "malformed path", body = ProblemBody, content_type = "application/problem+json"),
    Unauthorized,
    (status = 404, description = "no such tenant (or another owner's), or no kubeconfig was issued to that user in it", body = ProblemBody, content_type = "application/problem+json"),
    (status = 503, description = "recorded, not yet passed to the tenant: retry", body = ProblemBody, content_type = "application/problem+json"),
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn revoke_user(
    State(s): State<AppState>,
    headers: HeaderMap,
    path: Result<NameAnd, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<Json<KubeconfigList>, Problem> {
    let (caller, t, user) = caller_tenant_and(&s, &headers, path).await?;
    none?;
    let none = || {
        Problem::not_found(&format!(
            "no kubeconfig was issued to user {user:?} in tenant {:?}",
            t.name
        ))
    };
    if !crate::names::is_subject(&user) {
        return Err(none());
    }
    let rows = s
        .inventory
        .revoke_user(t.id, &user, &caller.0.name)
        .await
        .map_err(|e| Problem::internal(&e))?;
    if rows.is_empty() {
        return Err(none());
    }
    forget_sudo(&s, &t).await;
    deliver(&s, &t).await?;
    Ok(Json(KubeconfigList {
        items: rows.into_iter().map(KubeconfigView::from).collect(),
    }))
}

/// The longest and the default lifetime of a break-glass kubeconfig.
pub const BREAK_GLASS_MAX_TTL: Duration = Duration::from_secs(3600);
pub const BREAK_GLASS_TTL: Duration = Duration::from_secs(1800);

/// Checks a break-glass request; its lifetime.
fn check_break_glass(req: &BreakGlassRequest) -> Result<Duration, Problem> {
    let n = req.reason.chars().count();
    if n == 0 || n > 200 || req.reason.contains('\0') {
        return Err(Problem::invalid(
            "reason",
            "1 to 200 characters, and no NUL: say why, for the audit trail",
        ));
    }
    match req.ttl.as_deref() {
        None => Ok(BREAK_GLASS_TTL),
        // Cut to the cap, as a kubeconfig's is: a shorter credential than asked for is safe.
        Some(x) => crate::names::parse_ttl(x)
            .map(|d| d.min(BREAK_GLASS_MAX_TTL))
            .ok_or_else(|| Problem::invalid("ttl", "a duration like 15m or 1h")),
    }
}

/// A tenant too early in its bring-up, or too late in its deletion, for a break-glass
/// kubeconfig: `why` completes "tenant <name> ...".
fn no_endpoint(name: &str, why: &str) -> Problem {
    Problem::new(
        StatusCode::CONFLICT,
        "no-endpoint",
        "tenant has no endpoint",
        &format!("tenant {name:?} {why}"),
        None,
    )
}

/// Issues a break-glass kubeconfig (admins only): a plain certificate for
/// `vcp:break-glass:<token>` in `system:masters`, valid at most an hour (a longer `ttl` is
/// cut to that). It works when the
/// tenant's revocation authorizer cannot answer and whatever the tenant did to its RBAC, and vcp need not be up to
/// use it; it cannot be revoked. Every one is in the audit trail with its reason
/// (`kubeconfig.break-glass`). Issued in any phase once the tenant has an endpoint.
#[utoipa::path(post, path = "/v1/tenants/{name}/break-glass", tag = "kubeconfigs", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "tenant name")),
    request_body = BreakGlassRequest, responses(
    (status = 201, body = KubeconfigIssued),
    BodyRefused,
    Unauthorized,
    (status = 403, description = "only admins issue break-glass kubeconfigs", body = ProblemBody, content_type = "application/problem+json"),
    NoSuchTenant,
    (status = 409, description = "the tenant has no endpoint or CA yet, or is being deleted", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid reason or ttl", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty, tenant = Empty))]
pub(crate) async fn break_glass(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    req: Result<Json<BreakGlassRequest>, JsonRejection>,
) -> Result<(StatusCode, Json<KubeconfigIssued>), Problem> {
    let (caller, t) = caller_and_tenant(&s, &headers, name).await?;
    if !caller.admin() {
        return Err(Problem::forbidden(
            "only admins issue break-glass kubeconfigs",
        ));
    }
    let req = body(req)?;
    let ttl = check_break_glass(&req)?;
    let ttl = time::Duration::try_from(ttl).map_err(|_| Problem::opaque())?;
    // Break-glass does not wait for Ready (it is for a tenant that is broken), but it
    // needs the tenant CA, which a deletion takes away and a first pass may not have made yet.
    if t.desired == Desired::Absent {
        return Err(no_endpoint(&t.name, "is being deleted"));
    }
    let Some(endpoint) = t.endpoint.clone() else {
        return Err(no_endpoint(&t.name, "has no apiserver endpoint yet"));
    };
    let now = time::OffsetDateTime::now_utc();
    let signed = s
        .provisioner
        .sign_break_glass(&t, &endpoint, &caller.0.name, now, ttl)
        .await
        .map_err(|e| match e {
            crate::Error::NoCa(_) => no_endpoint(&t.name, "has no CA on the host yet"),
            e => Problem::internal(&e),
        })?;
    let cert = signed.certificate;
    let user = format!(
        "{}{}",
        crate::kubeconfigs::sign::BREAK_GLASS_USER_PREFIX,
        caller.0.name
    );
    let groups = vec!["system:masters".to_owned()];
    s.inventory
        .record_kubeconfig(
            t.id,
            &user,
            &groups,
            &cert.serial,
            cert.not_after,
            &caller.0.name,
            Some(&req.reason),
        )
        .await
        .map_err(|e| Problem::internal(&e))?;
    tracing::warn!(serial = %cert.serial, "break-glass kubeconfig issued");
    Ok((
        StatusCode::CREATED,
        Json(KubeconfigIssued {
            kubeconfig: signed.kubeconfig,
            serial: cert.serial,
            user,
            groups,
            expires_at: cert.not_after,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(user: &str, groups: &[&str], ttl: Option<&str>) -> IssueKubeconfig {
        IssueKubeconfig {
            user: user.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ttl: ttl.map(str::to_owned),
        }
    }

    #[test]
    fn break_glass_requests_need_a_reason_and_live_at_most_an_hour() {
        let r = |reason: &str, ttl: Option<&str>| BreakGlassRequest {
            reason: reason.into(),
            ttl: ttl.map(str::to_owned),
        };
        let field = |x: Result<Duration, Problem>| x.unwrap_err().field().map(str::to_owned);
        assert_eq!(
            check_break_glass(&r("syncer down", None)).unwrap(),
            BREAK_GLASS_TTL
        );
        assert_eq!(
            check_break_glass(&r("x", Some("1h"))).unwrap(),
            BREAK_GLASS_MAX_TTL
        );
        assert_eq!(
            check_break_glass(&r("x", Some("61m"))).unwrap(),
            BREAK_GLASS_MAX_TTL
        );
        assert_eq!(
            field(check_break_glass(&r("x", Some("soon")))).as_deref(),
            Some("ttl")
        );
        for reason in ["", "a\0b", &"r".repeat(201)] {
            assert_eq!(
                field(check_break_glass(&r(reason, None))).as_deref(),
                Some("reason")
            );
        }
    }

    #[test]
    fn kubeconfig_requests_are_checked_before_anything_is_signed() {
        let max = Duration::from_secs(30 * 86_400);
        let field = |r: Result<Duration, Problem>| r.unwrap_err().field().map(str::to_owned);
        assert_eq!(
            check_kubeconfig(&req("alice", &["view", "ops"], Some("2h")), max).unwrap(),
            Duration::from_secs(7200)
        );
        // The server's cap wins over a longer request; no TTL means a working day, and a cap
        // below that wins over it too.
        assert_eq!(
            check_kubeconfig(&req("a", &[], Some("400d")), max).unwrap(),
            max
        );
        assert_eq!(
            check_kubeconfig(&req("a", &[], None), max).unwrap(),
            Duration::from_secs(8 * 3600)
        );
        assert_eq!(
            check_kubeconfig(&req("a", &[], None), Duration::from_secs(3600)).unwrap(),
            Duration::from_secs(3600)
        );
        // The rule itself is `names::is_subject`'s, tested there; here, that it is applied.
        for user in ["", "system:admin", &"u".repeat(129)] {
            assert_eq!(
                field(check_kubeconfig(&req(user, &[], None), max)).as_deref(),
                Some("user"),
                "{user:?}"
            );
        }
        let many: Vec<String> = (0..17).map(|i| format!("g{i}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        for groups in [
            &["system:masters"][..],
            &["vcp:syncer"],
            &[""],
            &["a\u{0}b"],
            &["line\nbreak"],
            &["\u{1b}[31mred"],
            &many,
        ] {
            assert_eq!(
                field(check_kubeconfig(&req("u", groups, None), max)).as_deref(),
                Some("groups"),
                "{groups:?}"
            );
        }
        assert_eq!(
            field(check_kubeconfig(&req("u", &[], Some("1w")), max)).as_deref(),
            Some("ttl")
        );
    }
}
