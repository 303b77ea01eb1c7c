//! API tokens (admins only): create (the secret is shown once), list, revoke.

use crate::Error;
use crate::http::auth::{authenticate, new_token, token_hash};
use crate::http::problem::{
    AdminOnly, BodyRefused, NoBodyTaken, Problem, ProblemBody, Unauthorized,
};
use crate::http::schema::NameSchema;
use crate::http::{AppState, Name, NoBody, body, existing_name};
use crate::names::TenantName;
use crate::tokens::types::{CreateToken, Role, TokenCreated, TokenList, TokenView};
use axum::Json;
use axum::extract::State;
use axum::extract::rejection::JsonRejection;
use axum::http::{HeaderMap, StatusCode};
use tracing::field::Empty;

/// Creates an API token (admins only). The secret is shown in this answer once.
#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])),
    request_body = CreateToken, responses(
    (status = 201, body = TokenCreated),
    BodyRefused,
    Unauthorized,
    AdminOnly,
    (status = 409, description = "a token has this name", body = ProblemBody, content_type = "application/problem+json"),
    (status = 422, description = "invalid name or role", body = ProblemBody, content_type = "application/problem+json"),
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn create_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    req: Result<Json<CreateToken>, JsonRejection>,
) -> Result<(StatusCode, Json<TokenCreated>), Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins create tokens"));
    }
    let req = body(req)?;
    if TenantName::parse(&req.name).is_err() {
        return Err(Problem::invalid(
            "name",
            &format!(
                "a lowercase name like a tenant's: {}, up to {} characters",
                crate::names::NAME_PATTERN,
                crate::names::MAX_NAME_LEN
            ),
        ));
    }
    let secret = new_token();
    let t = match s
        .inventory
        .create_token(
            &req.name,
            req.role.as_str(),
            &token_hash(&secret),
            &caller.0.name,
        )
        .await
    {
        Ok(t) => t,
        Err(Error::Duplicate(n)) => {
            return Err(Problem::conflict(
                "name",
                &format!("a token named {n:?} exists"),
            ));
        }
        Err(e) => return Err(Problem::internal(&e)),
    };
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            role: Role::of(&t.role),
            name: t.name,
            token: secret,
        }),
    ))
}

/// Every token, live and revoked, without secrets (admins only).
#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", security(("bearer" = [])), responses(
    (status = 200, body = TokenList),
    Unauthorized,
    AdminOnly,
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn list_tokens(
    State(s): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<TokenList>, Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins list tokens"));
    }
    let items = s
        .inventory
        .tokens()
        .await
        .map_err(|e| Problem::internal(&e))?
        .into_iter()
        .map(TokenView::from)
        .collect();
    Ok(Json(TokenList { items }))
}

/// Revokes a token (admins only): it answers 401 from then on.
#[utoipa::path(delete, path = "/v1/tokens/{name}", tag = "tokens", security(("bearer" = [])),
    params(("name" = NameSchema, Path, description = "token name")), responses(
    (status = 204, description = "revoked"),
    Unauthorized,
    AdminOnly,
    (status = 404, description = "no live token of that name", body = ProblemBody, content_type = "application/problem+json"),
    NoBodyTaken,
))]
#[tracing::instrument(skip_all, fields(caller = Empty))]
pub(crate) async fn revoke_token(
    State(s): State<AppState>,
    headers: HeaderMap,
    name: Result<Name, Problem>,
    none: Result<NoBody, Problem>,
) -> Result<StatusCode, Problem> {
    let caller = authenticate(&s, &headers).await?;
    if !caller.admin() {
        return Err(Problem::forbidden("only admins revoke tokens"));
    }
    let name = name?.name;
    existing_name(&name, "live token")?;
    none?;
    match s.inventory.revoke_token(&name, &caller.0.name).await {
        Ok(true) => Ok(StatusCode::NO_CONTENT),
        Ok(false) => Err(Problem::not_found(&format!("no live token named {name:?}"))),
        Err(e) => Err(Problem::internal(&e)),
    }
}
