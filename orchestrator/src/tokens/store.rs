//! API tokens in the inventory (`api_tokens`): stored as SHA-256 hashes, never in the clear.
//!
//! Data flow: `vcp serve` ensures the admin token at start ([`Inventory::ensure_admin_token`]);
//! admins create and revoke owner tokens through the API; every request's bearer token is
//! hashed and looked up (`Inventory::token_by_hash`, beside the tenants in the inventory, since every request needs it). Creating and revoking are audited.

use crate::inventory::{Inventory, Token, audit_in, unique_violation};
use crate::{Error, Result};
use time::OffsetDateTime;

/// What [`Inventory::ensure_admin_token`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminTokenChange {
    /// There was none of that name: created.
    Created,
    /// Another secret was stored under the name: replaced, and live.
    Replaced,
    /// The same secret, live: nothing changed.
    Unchanged,
    /// The same secret, revoked: it stays revoked.
    StillRevoked,
}

impl Inventory {
    /// Every token (live and revoked), by name.
    pub async fn tokens(&self) -> Result<Vec<Token>> {
        Ok(sqlx::query_as(
            "SELECT id, name, role, created_at, revoked_at FROM api_tokens ORDER BY name",
        )
        .fetch_all(self.pool())
        .await?)
    }

    /// Stores a token's hash; a duplicate name is [`Error::Duplicate`].
    pub async fn create_token(
        &self,
        name: &str,
        role: &str,
        hash: &[u8],
        actor: &str,
    ) -> Result<Token> {
        let mut tx = self.pool().begin().await?;
        let t: Token = sqlx::query_as(
            "INSERT INTO api_tokens (name, role, hash) VALUES ($1, $2, $3)
             RETURNING id, name, role, created_at, revoked_at",
        )
        .bind(name)
        .bind(role)
        .bind(hash)
        .fetch_one(&mut *tx)
        .await
        .map_err(|e| match unique_violation(&e) {
            Some(_) => Error::Duplicate(name.to_owned()),
            None => Error::Database(e),
        })?;
        audit_in(
            &mut tx,
            actor,
            "token.create",
            None,
            serde_json::json!({"name": name, "role": role}),
        )
        .await?;
        tx.commit().await?;
        Ok(t)
    }

    /// Revokes a token by name; false if there was no live one.
    pub async fn revoke_token(&self, name: &str, actor: &str) -> Result<bool> {
        let mut tx = self.pool().begin().await?;
        let r = sqlx::query(
            "UPDATE api_tokens SET revoked_at = now() WHERE name = $1 AND revoked_at IS NULL",
        )
        .bind(name)
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() == 1 {
            audit_in(
                &mut tx,
                actor,
                "token.revoke",
                None,
                serde_json::json!({"name": name}),
            )
            .await?;
        }
        tx.commit().await?;
        Ok(r.rows_affected() == 1)
    }

    /// Makes `hash` the admin token named `name` (the configured admin token, or one vcp
    /// generated at its first start), and records in the audit trail, as `actor`, what changed.
    /// A configured token that was revoked stays revoked when it is configured again (a restart
    /// must not undo a revocation); a different one replaces it and is live.
    pub async fn ensure_admin_token(
        &self,
        name: &str,
        hash: &[u8],
        actor: &str,
    ) -> Result<AdminTokenChange> {
        let mut tx = self.pool().begin().await?;
        let stored: Option<(Vec<u8>, Option<OffsetDateTime>)> =
            sqlx::query_as("SELECT hash, revoked_at FROM api_tokens WHERE name = $1 FOR UPDATE")
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
        let change = match stored {
            None => AdminTokenChange::Created,
            Some((h, Some(_))) if h == hash => AdminTokenChange::StillRevoked,
            Some((h, None)) if h == hash => AdminTokenChange::Unchanged,
            Some(_) => AdminTokenChange::Replaced,
        };
        let action = match change {
            AdminTokenChange::Created => "token.admin-bootstrap",
            AdminTokenChange::Replaced => "token.admin-replace",
            AdminTokenChange::Unchanged | AdminTokenChange::StillRevoked => {
                tx.commit().await?;
                return Ok(change);
            }
        };
        sqlx::query(
            "INSERT INTO api_tokens (name, role, hash) VALUES ($1, 'admin', $2)
             ON CONFLICT (name) DO UPDATE SET hash = EXCLUDED.hash, role = 'admin', revoked_at = NULL",
        )
        .bind(name)
        .bind(hash)
        .execute(&mut *tx)
        .await?;
        audit_in(
            &mut tx,
            actor,
            action,
            None,
            serde_json::json!({"name": name}),
        )
        .await?;
        tx.commit().await?;
        Ok(change)
    }

    /// Number of live admin tokens.
    pub async fn admin_tokens(&self) -> Result<i64> {
        Ok(sqlx::query_scalar(
            "SELECT count(*) FROM api_tokens WHERE role = 'admin' AND revoked_at IS NULL",
        )
        .fetch_one(self.pool())
        .await?)
    }
}
