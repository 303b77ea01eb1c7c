//! Certificates and kubeconfigs issued, and their revocation, in the inventory
//! (`certificates`, `kubeconfigs`).
//!
//! Data flow: the provisioner records every certificate it signs for a tenant
//! ([`Inventory::record_certificate`]) and every user kubeconfig it issues
//! ([`Inventory::record_kubeconfig`]: serial, user, groups and expiry, never the key).
//! Revoking one kubeconfig, or every kubeconfig of a user, marks the rows (audited); the
//! provisioner then writes the revoked serials ([`Inventory::revoked_serials`]) to the
//! ConfigMap the tenant's syncer enforces, and the live sudoers
//! ([`Inventory::live_sudoers`]) to the tenant's RBAC.

use crate::Result;
use crate::inventory::{Inventory, audit_in};
use crate::pki::CertInfo;
use time::OffsetDateTime;

/// An issued kubeconfig as the inventory records it (never its key).
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct KubeconfigRow {
    pub username: String,
    pub groups: Vec<String>,
    pub serial: String,
    pub expires_at: OffsetDateTime,
    pub created_by: String,
    pub created_at: OffsetDateTime,
    pub revoked_at: Option<OffsetDateTime>,
    /// A break-glass kubeconfig: not revocable, short-lived.
    pub break_glass: bool,
}

/// A certificate record.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct CertificateRow {
    pub purpose: String,
    pub serial: String,
    pub fingerprint: String,
    pub subject: String,
    pub not_after: OffsetDateTime,
}

impl Inventory {
    /// Records a certificate once (idempotent on tenant, purpose and serial).
    pub async fn record_certificate(
        &self,
        tenant_id: i64,
        purpose: &str,
        c: &CertInfo,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO certificates (tenant_id, purpose, serial, fingerprint, subject, not_before, not_after)
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (tenant_id, purpose, serial) DO NOTHING",
        )
        .bind(tenant_id)
        .bind(purpose)
        .bind(&c.serial)
        .bind(&c.fingerprint)
        .bind(&c.subject)
        .bind(c.not_before)
        .bind(c.not_after)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// Every certificate recorded for a tenant, oldest first.
    pub async fn certificates(&self, tenant_id: i64) -> Result<Vec<CertificateRow>> {
        Ok(sqlx::query_as(
            "SELECT purpose, serial, fingerprint, subject, not_after FROM certificates
             WHERE tenant_id = $1 ORDER BY id",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Records an issued kubeconfig; `break_glass`: the reason of a break-glass one.
    #[allow(clippy::too_many_arguments)]
    pub async fn record_kubeconfig(
        &self,
        tenant_id: i64,
        user: &str,
        groups: &[String],
        serial: &str,
        expires_at: OffsetDateTime,
        actor: &str,
        break_glass: Option<&str>,
    ) -> Result<()> {
        let mut tx = self.pool().begin().await?;
        sqlx::query(
            "INSERT INTO kubeconfigs
               (tenant_id, username, groups, serial, expires_at, created_by, break_glass)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(tenant_id)
        .bind(user)
        .bind(groups)
        .bind(serial)
        .bind(expires_at)
        .bind(actor)
        .bind(break_glass.is_some())
        .execute(&mut *tx)
        .await?;
        let (action, detail) = match break_glass {
            None => (
                "kubeconfig.issue",
                serde_json::json!({"user": user, "groups": groups, "serial": serial}),
            ),
            Some(reason) => (
                "kubeconfig.break-glass",
                serde_json::json!({"user": user, "groups": groups, "serial": serial,
                    "expires_at": expires_at.format(&time::format_description::well_known::Rfc3339).ok(),
                    "reason": reason}),
            ),
        };
        audit_in(&mut tx, actor, action, Some(tenant_id), detail).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The kubeconfigs issued for a tenant, oldest first.
    pub async fn kubeconfigs(&self, tenant_id: i64) -> Result<Vec<KubeconfigRow>> {
        Ok(sqlx::query_as(
            "SELECT username, groups, serial, expires_at, created_by, created_at, revoked_at, break_glass
             FROM kubeconfigs WHERE tenant_id = $1 ORDER BY created_at, id",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// Revokes one kubeconfig of a tenant, by serial, and audits it. `None` if the tenant has
    /// no kubeconfig of that serial; one already revoked keeps its first revocation time (and
    /// is not audited again).
    pub async fn revoke_kubeconfig(
        &self,
        tenant_id: i64,
        serial: &str,
        actor: &str,
    ) -> Result<Option<KubeconfigRow>> {
        self.revoke_where(tenant_id, Some(serial), None, actor)
            .await
            .map(|rows| rows.into_iter().next())
    }

    /// Revokes every kubeconfig issued to `user` in a tenant (already revoked ones too, which
    /// keep their time), and audits it; the user's kubeconfigs, oldest first.
    pub async fn revoke_user(
        &self,
        tenant_id: i64,
        user: &str,
        actor: &str,
    ) -> Result<Vec<KubeconfigRow>> {
        self.revoke_where(tenant_id, None, Some(user), actor).await
    }

    /// Revokes the tenant's kubeconfigs of one serial or of one user.
    async fn revoke_where(
        &self,
        tenant_id: i64,
        serial: Option<&str>,
        user: Option<&str>,
        actor: &str,
    ) -> Result<Vec<KubeconfigRow>> {
        let mut tx = self.pool().begin().await?;
        // Row locks first, so two revocations of one kubeconfig audit it once.
        let newly: Vec<String> = sqlx::query_scalar(
            "UPDATE kubeconfigs SET revoked_at = now()
             WHERE tenant_id = $1 AND ($2::text IS NULL OR serial = $2)
               AND ($3::text IS NULL OR username = $3) AND revoked_at IS NULL
               AND NOT break_glass
             RETURNING serial",
        )
        .bind(tenant_id)
        .bind(serial)
        .bind(user)
        .fetch_all(&mut *tx)
        .await?;
        let rows: Vec<KubeconfigRow> = sqlx::query_as(
            "SELECT username, groups, serial, expires_at, created_by, created_at, revoked_at, break_glass
             FROM kubeconfigs WHERE tenant_id = $1 AND ($2::text IS NULL OR serial = $2)
               AND ($3::text IS NULL OR username = $3)
             ORDER BY created_at, id",
        )
        .bind(tenant_id)
        .bind(serial)
        .bind(user)
        .fetch_all(&mut *tx)
        .await?;
        if !newly.is_empty() {
            let mut serials = newly;
            serials.sort();
            let (action, detail) = match user {
                Some(user) => (
                    "user.revoke",
                    serde_json::json!({"user": user, "serials": serials}),
                ),
                None => (
                    "kubeconfig.revoke",
                    serde_json::json!({"serial": serial, "user": rows.first().map(|r| &r.username)}),
                ),
            };
            audit_in(&mut tx, actor, action, Some(tenant_id), detail).await?;
        }
        tx.commit().await?;
        Ok(rows)
    }

    /// The serials of a tenant's revoked kubeconfigs that have not expired yet: what its
    /// apiserver must refuse (an expired certificate is refused anyway).
    pub async fn revoked_serials(&self, tenant_id: i64) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(
            "SELECT serial FROM kubeconfigs
             WHERE tenant_id = $1 AND revoked_at IS NOT NULL AND expires_at > now()
             ORDER BY serial",
        )
        .bind(tenant_id)
        .fetch_all(self.pool())
        .await?)
    }

    /// A tenant's live sudo kubeconfigs (neither revoked nor expired, with the group
    /// [`crate::kubeconfigs::access::SUDO_GROUP`]), by serial: the ones that keep a sudo role in the tenant.
    pub async fn live_sudoers(
        &self,
        tenant_id: i64,
    ) -> Result<Vec<crate::kubeconfigs::access::Sudoer>> {
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT username, serial FROM kubeconfigs
             WHERE tenant_id = $1 AND revoked_at IS NULL AND expires_at > now()
               AND NOT break_glass AND $2 = ANY (groups)
             ORDER BY serial",
        )
        .bind(tenant_id)
        .bind(crate::kubeconfigs::access::SUDO_GROUP)
        .fetch_all(self.pool())
        .await?;
        Ok(rows
            .into_iter()
            .map(|(user, serial)| crate::kubeconfigs::access::Sudoer { user, serial })
            .collect())
    }
}
