//! `from_snapshot` of `POST /v1/tenants`: which snapshot of which tenant the caller may clone,
//! checked before anything is written. Every refusal is a 422 on `from_snapshot` that says
//! why, and a source the caller may not see is refused exactly as one that does not exist.

use crate::clones::store::Seed;
use crate::clones::{SnapshotRef, keys_in_use};
use crate::http::AppState;
use crate::http::auth::Caller;
use crate::http::problem::Problem;
use crate::pki::seal::associated_data;
use crate::render::encryption::DataKey;
use crate::snapshots::offsite;
use vcp_core::lifecycle::SnapshotState;

const FIELD: &str = "from_snapshot";

/// The seed `raw` (`TENANT/N`) names, with the source's key opened.
pub(crate) async fn seed(s: &AppState, caller: &Caller, raw: &str) -> Result<Seed, Problem> {
    let r = SnapshotRef::parse(raw).map_err(|e| Problem::invalid(FIELD, &e))?;
    let internal = |e: crate::Error| Problem::internal(&e);
    // A live tenant's name first, then any tenant's key (a deleted one's too): keys are never
    // reused, so a key names one tenant for ever.
    let mut named = s
        .inventory
        .tenants_named(&r.tenant, caller.scope())
        .await
        .map_err(internal)?;
    let source = match named.len() {
        0 => s
            .inventory
            .tenant_keyed(&r.tenant, caller.scope())
            .await
            .map_err(internal)?
            .ok_or_else(|| {
                Problem::invalid(
                    FIELD,
                    &format!(
                        "no tenant of yours is named {:?} or has that key (a deleted tenant is named by its key)",
                        r.tenant
                    ),
                )
            })?,
        1 => named.remove(0),
        _ => {
            return Err(Problem::invalid(
                FIELD,
                &format!(
                    "tenants of several owners are named {:?}; name the source by its key",
                    r.tenant
                ),
            ));
        }
    };
    let snapshot = s
        .inventory
        .numbered_snapshot(source.id, r.number)
        .await
        .map_err(internal)?
        .filter(|x| x.state == SnapshotState::Succeeded && x.pruned_at.is_none())
        .ok_or_else(|| {
            Problem::invalid(
                FIELD,
                &format!(
                    "tenant {:?} has no taken snapshot {} that retention has not pruned",
                    r.tenant, r.number
                ),
            )
        })?;
    if offsite::parse_location(&snapshot.location).is_none() || snapshot.backup_key_id.is_none() {
        return Err(Problem::invalid(
            FIELD,
            &format!(
                "snapshot {} of {:?} is kept only on its tenant's claim ({}); only an uploaded snapshot (an s3:// location) seeds a clone",
                r.number, r.tenant, snapshot.location
            ),
        ));
    }
    if s.provisioner.config.backups.is_none() {
        return Err(Problem::invalid(
            FIELD,
            "this vcp has no backup store (--backup-store) to fetch the snapshot from",
        ));
    }
    let keys = s
        .inventory
        .encryption_keys(source.id)
        .await
        .map_err(internal)?;
    let taken = (
        snapshot.created_at,
        snapshot.finished_at.unwrap_or(snapshot.created_at),
    );
    let key = match keys_in_use(&keys, taken).as_slice() {
        [] => None,
        [k] => {
            let kek = &s.provisioner.config.inventory_key;
            let what = format!("encryption key {} of tenant {}", k.name, source.id);
            let bytes = kek
                .open(&what, &k.sealed(), &associated_data(source.id, &k.name))
                .map_err(|e| internal(e.into()))?;
            let secret: [u8; 32] = bytes.as_slice().try_into().map_err(|_| {
                internal(crate::Error::Backup(format!(
                    "{what} is {} bytes, not 32",
                    bytes.len()
                )))
            })?;
            Some(DataKey {
                name: k.name.clone(),
                secret,
            })
        }
        several => {
            let names: Vec<&str> = several.iter().map(|k| k.name.as_str()).collect();
            return Err(Problem::invalid(
                FIELD,
                &format!(
                    "snapshot {} of {:?} was taken during an encryption-key rotation (its values may be under {}); clone from one taken before or after it",
                    r.number,
                    r.tenant,
                    names.join(" and ")
                ),
            ));
        }
    };
    Ok(Seed {
        source,
        snapshot,
        key,
    })
}
