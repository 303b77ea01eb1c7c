//! API tokens: roles, the create request, the created token (secret never printed in
//! `Debug`), the views.

use crate::http::schema::NameSchema;
use crate::inventory::Token;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::ToSchema;

/// Who a token speaks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Sees and changes every tenant, and manages tokens.
    Admin,
    /// Sees and changes only the tenants it created.
    Owner,
}

impl Role {
    /// The role of an inventory row (the database allows only these two).
    pub fn of(name: &str) -> Role {
        if name == "admin" {
            Role::Admin
        } else {
            Role::Owner
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Owner => "owner",
        }
    }
}

/// `POST /v1/tokens` body.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateToken {
    /// Unique among tokens, live and revoked.
    #[schema(value_type = NameSchema)]
    pub name: String,
    pub role: Role,
}

/// A new token: the secret is in this answer and nowhere else.
#[derive(Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenCreated {
    pub name: String,
    pub role: Role,
    /// The bearer secret; only its hash is stored.
    pub token: String,
}

impl std::fmt::Debug for TokenCreated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenCreated")
            .field("name", &self.name)
            .field("role", &self.role)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A token without its secret.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    pub name: String,
    pub role: Role,
    #[serde(with = "time::serde::rfc3339")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: OffsetDateTime,
    #[serde(default, with = "time::serde::rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub revoked_at: Option<OffsetDateTime>,
}

impl From<Token> for TokenView {
    fn from(t: Token) -> TokenView {
        TokenView {
            role: Role::of(&t.role),
            name: t.name,
            created_at: t.created_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// `GET /v1/tokens` answer.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub items: Vec<TokenView>,
}
