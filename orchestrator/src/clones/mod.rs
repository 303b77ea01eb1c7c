//! Clones: a new tenant created from an uploaded snapshot of another tenant, live or deleted
//! (`POST /v1/tenants {"from_snapshot": "TENANT/N"}`, `vcp tenant create NEW --from-snapshot
//! TENANT/N`).
//!
//! Data flow: the API ([`api`]) resolves the source and its snapshot and opens the etcd
//! encryption key the snapshot's values were written with; the inventory ([`store`]) creates
//! the clone in one transaction with a copy of the snapshot's row as its snapshot 1 (the
//! object itself is shared, never copied) and that key re-sealed as the clone's first key, so
//! its apiserver reads the restored Secrets. The clone is brought up as any tenant; its first
//! pass with everything Ready starts a restore of snapshot 1 through the restore machinery
//! ([`host`]), whose Job fetches the object with the source's backup key. Once restored, an
//! encryption-key rotation gives the clone a key of its own and rewrites its data with it.
//!
//! This module is the pure part: what `from_snapshot` means, and which of the source's keys
//! a snapshot needs.

pub mod api;
pub mod host;
pub mod store;

use crate::encryption::store::KeyRow;
use crate::names::TenantName;
use time::OffsetDateTime;

/// `TENANT/N` of `from_snapshot`: a tenant (its name among the caller's live tenants, or its
/// key, which also names a deleted one) and the number of one of its snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRef {
    pub tenant: String,
    pub number: i64,
}

impl SnapshotRef {
    pub fn parse(s: &str) -> Result<SnapshotRef, String> {
        let (tenant, number) = s.split_once('/').ok_or_else(|| {
            format!("{s:?} is not TENANT/N (a tenant's name or key, a snapshot's number)")
        })?;
        TenantName::parse(tenant).map_err(|e| format!("tenant {tenant:?}: {e}"))?;
        let number = number
            .parse::<i64>()
            .ok()
            .filter(|n| *n > 0 && number.starts_with(|c: char| ('1'..='9').contains(&c)))
            .ok_or_else(|| format!("snapshot {number:?} is not a positive number"))?;
        Ok(SnapshotRef {
            tenant: tenant.to_owned(),
            number,
        })
    }
}

/// The source's encryption keys whose values a snapshot may hold: made before it was taken and
/// not retired before it was asked for (a rotation's `retire` follows the rewrite, so a key
/// retired earlier encrypts nothing in it). `taken` is when the snapshot was asked for and
/// when it finished.
pub fn keys_in_use(keys: &[KeyRow], taken: (OffsetDateTime, OffsetDateTime)) -> Vec<&KeyRow> {
    let (asked, finished) = taken;
    keys.iter()
        .filter(|k| k.created_at <= finished && k.retired_at.is_none_or(|r| r > asked))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::Duration;

    #[test]
    fn a_snapshot_ref_is_a_tenant_and_a_positive_number() {
        assert_eq!(
            SnapshotRef::parse("bk/3"),
            Ok(SnapshotRef {
                tenant: "bk".into(),
                number: 3
            })
        );
        assert_eq!(
            SnapshotRef::parse("bkx4f9a2k/12").unwrap().tenant,
            "bkx4f9a2k"
        );
        for bad in [
            "",
            "bk",
            "bk/",
            "/3",
            "bk/0",
            "bk/-1",
            "bk/+1",
            "bk/1/2",
            "BK/1",
            "bk/x",
            "b k/1",
            "bk/01",
            "bk/99999999999999999999",
        ] {
            assert!(SnapshotRef::parse(bad).is_err(), "{bad:?}");
        }
    }

    fn key(name: &str, created: i64, retired: Option<i64>) -> KeyRow {
        let at = |m: i64| OffsetDateTime::UNIX_EPOCH + Duration::minutes(m);
        KeyRow {
            id: created,
            tenant_id: 1,
            name: name.into(),
            kek_id: "k".into(),
            nonce: vec![],
            ciphertext: vec![],
            rotation_id: None,
            created_at: at(created),
            retired_at: retired.map(at),
        }
    }

    fn names(keys: &[KeyRow], asked: i64, finished: i64) -> Vec<&str> {
        let at = |m: i64| OffsetDateTime::UNIX_EPOCH + Duration::minutes(m);
        keys_in_use(keys, (at(asked), at(finished)))
            .into_iter()
            .map(|k| k.name.as_str())
            .collect()
    }

    #[test]
    fn a_snapshot_needs_the_keys_live_while_it_was_taken() {
        // key1 from minute 0, retired at 50 by a rotation whose key2 came at 40.
        let keys = [key("key1", 0, Some(50)), key("key2", 40, None)];
        assert_eq!(names(&keys, 10, 11), ["key1"]);
        assert_eq!(names(&keys, 60, 61), ["key2"]);
        // Taken during the rotation: both may hold values.
        assert_eq!(names(&keys, 45, 46), ["key1", "key2"]);
        // Asked for before the retirement, finished after: key1 may still be in it.
        assert_eq!(names(&keys, 49, 51), ["key1", "key2"]);
        // Before any key (a tenant from before encryption at rest): none, plaintext.
        assert!(names(&[key("key1", 30, None)], 10, 11).is_empty());
    }
}
