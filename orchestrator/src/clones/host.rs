//! What a pass does for a clone beyond any tenant's bring-up: once its seed is restored, it
//! starts the encryption-key rotation that replaces the key it shares with its source (a new
//! key, every object rewritten with it, the shared one retired), as vcp starts a tenant's
//! first key for tenants from before encryption at rest.

use crate::Result;
use crate::host::Provisioner;
use crate::inventory::Tenant;
use crate::rotations::store::RotationRow;

impl Provisioner {
    /// The rotation that gives a restored clone a key of its own, started now if it is due.
    pub(crate) async fn start_own_key(
        &self,
        t: &Tenant,
        actor: &str,
    ) -> Result<Option<RotationRow>> {
        if !self.inventory.own_key_due(t).await? {
            return Ok(None);
        }
        tracing::info!(tenant = %t.name, "the clone's data is restored: rotating to a key of its own");
        self.start_key_rotation(t, actor).await
    }
}
