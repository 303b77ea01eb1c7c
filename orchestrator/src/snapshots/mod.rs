//! etcd snapshots of tenants and restores from them: the names, the report and the restore's
//! state machine (pure), and the `vcp tool` commands that run in the tenant's control-plane
//! namespace ([`tool`]).
//!
//! Data flow: a snapshot is asked for through the API (or by an upgrade before each hop) and
//! recorded `Pending` in the inventory. The tenant's next reconcile pass, once its etcd is up,
//! applies a Job from `templates/etcd-snapshot.yaml` in the control-plane namespace: `vcp tool
//! etcd-snapshot` streams the snapshot from etcd's own Maintenance API onto the
//! `etcd-snapshots` claim and writes a [`Report`] (revision, size, SHA-256) as the container's
//! termination message. The pass reads it back from the Job's pod and records the snapshot
//! `Succeeded` (or `Failed` with the reason).
//!
//! A restore stops the control plane ([`RestoreStep::Stop`]: the components rendered with no
//! replicas), runs one Job per etcd member from `templates/etcd-restore.yaml` (verify the
//! file's hash, `etcdutl snapshot restore` into a staging directory with the revision bumped
//! and compacted so every client relists, then swap it in for the member's data), and starts
//! the control plane again; [`restore_step`] says which, from what the pass observed.

pub mod api;
pub mod backup_keys;
pub mod cli;
pub mod jobs;
pub mod logical;
pub mod moves;
pub mod offsite;
pub mod schedule;
pub mod sealed;
pub mod store;
pub mod tool;
pub mod transfer;
pub mod types;

use serde::{Deserialize, Serialize};

/// The claim in a tenant's control-plane namespace that holds its snapshots.
pub const CLAIM: &str = "etcd-snapshots";
/// Where the snapshot Jobs mount [`CLAIM`].
pub const MOUNT: &str = "/snapshots";
/// How far a restore moves etcd's revision forward, so that no client's remembered
/// resourceVersion is ahead of the restored store (with the old revisions marked compacted,
/// watches from before the restore end with "too old" and their clients relist).
pub const REVISION_BUMP: u64 = 1_000_000_000;

/// The snapshot file of the tenant's snapshot `number`, inside [`MOUNT`] (one claim per
/// tenant, so the tenant's own numbering keeps them apart).
pub fn file_name(number: i64) -> String {
    format!("snapshot-{number}.db")
}

/// Where the inventory says the tenant's snapshot `number` lives.
pub fn location(namespace: &str, number: i64) -> String {
    format!("pvc://{namespace}/{CLAIM}/{}", file_name(number))
}

/// The file of the tenant's logical snapshot `number` ([`logical`]), inside [`MOUNT`].
pub fn logical_file_name(number: i64) -> String {
    format!("snapshot-{number}.vcpl")
}

/// Where a snapshot recorded at `location` lives once it turned out logical.
pub fn logical_location(location: &str) -> String {
    match location.strip_suffix(".db") {
        Some(stem) => format!("{stem}.vcpl"),
        None => location.to_owned(),
    }
}

/// Whether a snapshot with this storage version is a logical one.
pub fn is_logical(storage_version: &str) -> bool {
    storage_version == logical::FORMAT
}

/// The Job, in the tenant's control-plane namespace, that takes its snapshot `number`.
pub fn snapshot_job(number: i64) -> String {
    format!("etcd-snapshot-{number}")
}

/// The Job that restores etcd member `member` from restore `id`.
pub fn restore_job(id: i64, member: u8) -> String {
    format!("etcd-restore-{id}-{member}")
}

/// What `vcp tool etcd-snapshot` reports about the file it wrote (its termination message).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// The store's revision when the snapshot started (writes racing the start may be in it).
    pub revision: i64,
    /// Bytes of the file, etcd's integrity trailer included.
    pub size: i64,
    /// SHA-256 of the whole file, hex.
    pub sha256: String,
    /// etcd's storage version as the snapshot stream stated it.
    #[serde(default)]
    pub storage_version: String,
    /// Where the sealed copy went (`s3://bucket/key`), when it was uploaded
    /// ([`offsite`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object: Option<String>,
    /// The backup key that sealed that copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_key: Option<i64>,
}

impl Report {
    /// Reads a report from a termination message; `None` unless it is one.
    pub fn parse(message: &str) -> Option<Report> {
        let r: Report = serde_json::from_str(message.trim()).ok()?;
        let hex = r.sha256.len() == 64 && r.sha256.bytes().all(|b| b.is_ascii_hexdigit());
        (hex && r.size > 0 && r.revision > 0).then_some(r)
    }
}

/// How a Job the pass runs is doing, from its pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobState {
    /// Not created yet.
    Absent,
    /// Created, not finished.
    Running,
    /// Its pod succeeded; its termination message.
    Succeeded(String),
    /// Its pod failed (or the Job gave up); why.
    Failed(String),
}

/// What a restore needs next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreStep {
    /// Render the control plane with no replicas and wait for its pods to be gone.
    Stop,
    /// Run (or wait for) the restore Job of each member.
    Restore,
    /// Render the control plane as usual and wait for it to be Ready.
    Start,
    /// Done: the control plane serves the restored data.
    Done,
    /// Cannot continue; why. The control plane is started again on whatever data each member
    /// has (the swap is the last thing a restore Job does, so a member whose Job failed still
    /// has its data from before the restore).
    Failed(String),
}

/// What the pass observed of a restore.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreView {
    /// Every restore Job succeeded at some pass (recorded in the inventory).
    pub restored: bool,
    /// Control-plane pods (etcd, apiserver, controller-manager, syncer) still running.
    pub pods_left: usize,
    /// The restore Jobs, one per member.
    pub jobs: Vec<JobState>,
    /// Every bring-up step is Ready (only meaningful once restored).
    pub ready: bool,
}

/// The next step of a restore, from what the pass observed.
pub fn restore_step(v: &RestoreView) -> RestoreStep {
    if v.restored {
        return if v.ready {
            RestoreStep::Done
        } else {
            RestoreStep::Start
        };
    }
    if let Some(why) = v.jobs.iter().find_map(|j| match j {
        JobState::Failed(m) => Some(m.clone()),
        _ => None,
    }) {
        return RestoreStep::Failed(why);
    }
    if v.pods_left > 0 && v.jobs.iter().all(|j| *j == JobState::Absent) {
        return RestoreStep::Stop;
    }
    if !v.jobs.is_empty() && v.jobs.iter().all(|j| matches!(j, JobState::Succeeded(_))) {
        return RestoreStep::Start;
    }
    RestoreStep::Restore
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_read_back_only_when_it_is_whole() {
        let r = Report {
            revision: 42,
            size: 20_512,
            sha256: "ab".repeat(32),
            storage_version: "3.6.0".into(),
            object: None,
            backup_key: None,
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(Report::parse(&format!("{text}\n")), Some(r));
        for bad in [
            "",
            "Error: context deadline exceeded",
            r#"{"revision":42,"size":1,"sha256":"xyz"}"#,
            r#"{"revision":0,"size":1,"sha256":"abababababababababababababababababababababababababababababababab"}"#,
        ] {
            assert_eq!(Report::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn names_are_per_id_and_member() {
        assert_eq!(
            location("vcp-cp-abc", 7),
            "pvc://vcp-cp-abc/etcd-snapshots/snapshot-7.db"
        );
        assert_eq!(
            logical_location(&location("vcp-cp-abc", 7)),
            format!("pvc://vcp-cp-abc/etcd-snapshots/{}", logical_file_name(7))
        );
        assert!(is_logical(logical::FORMAT) && !is_logical("3.6.0"));
        assert_eq!(snapshot_job(7), "etcd-snapshot-7");
        assert_ne!(restore_job(7, 0), restore_job(7, 1));
        assert_ne!(restore_job(7, 1), restore_job(71, 0));
    }

    fn view(restored: bool, pods_left: usize, jobs: Vec<JobState>, ready: bool) -> RestoreView {
        RestoreView {
            restored,
            pods_left,
            jobs,
            ready,
        }
    }

    #[test]
    fn a_restore_stops_restores_and_starts_in_that_order() {
        use JobState::*;
        let ok = || Succeeded(String::new());
        assert_eq!(
            restore_step(&view(false, 4, vec![Absent, Absent], false)),
            RestoreStep::Stop
        );
        assert_eq!(
            restore_step(&view(false, 0, vec![Absent, Absent], false)),
            RestoreStep::Restore
        );
        // Once a Job runs, pods that reappear do not send it back to stopping.
        assert_eq!(
            restore_step(&view(false, 1, vec![ok(), Running], false)),
            RestoreStep::Restore
        );
        assert_eq!(
            restore_step(&view(false, 0, vec![ok(), ok()], false)),
            RestoreStep::Start
        );
        assert_eq!(
            restore_step(&view(true, 3, vec![], false)),
            RestoreStep::Start
        );
        assert_eq!(
            restore_step(&view(true, 3, vec![], true)),
            RestoreStep::Done
        );
        assert_eq!(
            restore_step(&view(
                false,
                0,
                vec![ok(), Failed("hash mismatch".into())],
                false
            )),
            RestoreStep::Failed("hash mismatch".into())
        );
    }
}
