//! Who is calling: bearer tokens, their hashes, and the caller a token speaks for.
//!
//! A token is `vcp_` plus random characters ([`new_token`]), shown once; the inventory keeps
//! only its SHA-256 ([`token_hash`]), which [`authenticate`] looks up on every `/v1` request.
//! Admins see the whole fleet; an owner token sees only the tenants it created
//! ([`Caller::scope`]).

use crate::http::AppState;
use crate::http::problem::Problem;
use crate::inventory::Token;
use axum::http::{HeaderMap, header};
use sha2::{Digest, Sha256};

pub use vcp_pki::new_token;

/// SHA-256 of a token: what the inventory stores.
pub fn token_hash(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// The caller, from its bearer token.
pub(crate) struct Caller(pub(crate) Token);

impl Caller {
    pub(crate) fn admin(&self) -> bool {
        self.0.role == "admin"
    }
    /// Owner filter for tenant queries: none for admins.
    pub(crate) fn scope(&self) -> Option<&str> {
        (!self.admin()).then_some(self.0.name.as_str())
    }
}

/// The role of the gateway's token ([`authenticate_gateway`]).
pub const GATEWAY_ROLE: &str = "gateway";

/// The caller a request's bearer token speaks for: 401 without one, or for an unknown or
/// revoked one; 403 for the gateway's token, which speaks for nobody's tenants.
pub(crate) async fn authenticate(state: &AppState, headers: &HeaderMap) -> Result<Caller, Problem> {
    let caller = token_caller(state, headers).await?;
    if caller.0.role == GATEWAY_ROLE {
        return Err(Problem::forbidden(
            "the gateway's token may only report activity and ask for wakes (/v1/gateway/...)",
        ));
    }
    Ok(caller)
}

/// The caller of a `/v1/gateway/...` route: the gateway's token or an admin's; 403 for an
/// owner's.
pub(crate) async fn authenticate_gateway(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Caller, Problem> {
    let caller = token_caller(state, headers).await?;
    if caller.0.role != GATEWAY_ROLE && !caller.admin() {
        return Err(Problem::forbidden("only the gateway's token or an admin's"));
    }
    Ok(caller)
}

async fn token_caller(state: &AppState, headers: &HeaderMap) -> Result<Caller, Problem> {
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| Problem::unauthorized("a bearer token is required"))?;
    match state
        .inventory
        .token_by_hash(&token_hash(token.trim()))
        .await
    {
        Ok(Some(t)) => {
            tracing::Span::current().record("caller", t.name.as_str());
            Ok(Caller(t))
        }
        Ok(None) => Err(Problem::unauthorized("the token is unknown or revoked")),
        Err(e) => Err(Problem::internal(&e)),
    }
}

/// Declares the `bearer` scheme the operations refer to.
pub(crate) struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "an API token from `vcp token create` or the admin token",
                    ))
                    .build(),
            ),
        );
    }
}
