//! `vcp snapshot ...`: etcd snapshots of a tenant and restores from them.

use crate::client::output::{self, Format, age, bytes, table};
use crate::client::{Client, Connection, OutputArgs, WaitArgs, name, print};
use crate::snapshots::types::{RestoreTenant, RestoreView, SnapshotList, SnapshotView};
use crate::{Error, Result};
use std::time::{Duration, Instant};
use time::OffsetDateTime;
use vcp_core::lifecycle::RestoreState;
use vcp_core::lifecycle::SnapshotState;

/// `vcp version ...`
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Take an etcd snapshot of a tenant (and with --wait, until it is taken).
    Create {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List a tenant's snapshots and restores.
    List {
        /// Tenant name.
        name: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Restore a tenant's etcd from one of its snapshots (admins; and with --wait, until the
    /// tenant is Ready again).
    Restore {
        /// Tenant name.
        name: String,
        /// The snapshot's id (`vcp snapshot list`).
        #[arg(long, env = "VCP_SNAPSHOT")]
        snapshot: i64,
        #[command(flatten)]
        wait: WaitArgs,
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `vcp snapshot ...`
pub async fn snapshot(conn: &Connection, cmd: SnapshotCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let now = OffsetDateTime::now_utc();
    let width = output::terminal_width();
    match cmd {
        SnapshotCommand::Create {
            name: n,
            wait,
            output: o,
        } => {
            let path = format!("/v1/tenants/{}/snapshots", name(&n)?);
            let mut s: SnapshotView = client.post(&path, &serde_json::json!({})).await?;
            let start = Instant::now();
            while wait.wait && s.state == SnapshotState::Pending {
                if start.elapsed() > wait.timeout {
                    return Err(Error::Client(format!(
                        "snapshot {} of {n} still Pending after {:?}",
                        s.id, wait.timeout
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let l: SnapshotList = client.get(&path).await?;
                if let Some(x) = l.snapshots.into_iter().find(|x| x.id == s.id) {
                    s = x;
                }
            }
            if s.state == SnapshotState::Failed {
                return Err(Error::Client(format!(
                    "snapshot {} of {n} failed: {}",
                    s.id,
                    s.reason.unwrap_or_default()
                )));
            }
            match o.output {
                Format::Table => print(&snapshots_table(&[s], &[], now, width)),
                f => print(&output::structured(&s, f)),
            }
        }
        SnapshotCommand::List { name: n, output: o } => {
            let l: SnapshotList = client
                .get(&format!("/v1/tenants/{}/snapshots", name(&n)?))
                .await?;
            match o.output {
                Format::Table => print(&snapshots_table(&l.snapshots, &l.restores, now, width)),
                f => print(&output::structured(&l, f)),
            }
        }
        SnapshotCommand::Restore {
            name: n,
            snapshot,
            wait,
            output: o,
        } => {
            let seg = name(&n)?;
            let r: RestoreView = client
                .post(
                    &format!("/v1/tenants/{seg}/restore"),
                    &RestoreTenant { snapshot },
                )
                .await?;
            let mut r = r;
            let start = Instant::now();
            while wait.wait && r.state == RestoreState::Running {
                if start.elapsed() > wait.timeout {
                    return Err(Error::Client(format!(
                        "restore {} of {n} still running after {:?}",
                        r.id, wait.timeout
                    )));
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                let l: SnapshotList = client.get(&format!("/v1/tenants/{seg}/snapshots")).await?;
                if let Some(x) = l.restores.into_iter().find(|x| x.id == r.id) {
                    r = x;
                }
            }
            if r.state == RestoreState::Failed {
                return Err(Error::Client(format!(
                    "restore {} of {n} failed: {}",
                    r.id,
                    r.reason.unwrap_or_default()
                )));
            }
            match o.output {
                Format::Table => print(&snapshots_table(&[], &[r], now, width)),
                f => print(&output::structured(&r, f)),
            }
        }
    }
}

/// Snapshots, then restores (each table only when it has rows).
pub fn snapshots_table(
    snapshots: &[SnapshotView],
    restores: &[RestoreView],
    now: OffsetDateTime,
    width: usize,
) -> String {
    let opt = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_default();
    let mut out = String::new();
    if !snapshots.is_empty() || restores.is_empty() {
        let rows: Vec<Vec<String>> = snapshots
            .iter()
            .map(|s| {
                vec![
                    s.id.to_string(),
                    s.state.as_str().to_owned(),
                    s.version.clone(),
                    opt(s.revision),
                    s.size_bytes
                        .map(|b| bytes(b.max(0) as u64))
                        .unwrap_or_default(),
                    s.upgrade
                        .map(|u| format!("upgrade {u}"))
                        .unwrap_or_else(|| s.requested_by.clone()),
                    age(s.created_at, now),
                    s.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "ID", "STATE", "VERSION", "REVISION", "SIZE", "BY", "AGE", "REASON",
            ],
            &rows,
            width,
        ));
    }
    if !restores.is_empty() {
        let rows: Vec<Vec<String>> = restores
            .iter()
            .map(|r| {
                vec![
                    r.id.to_string(),
                    r.snapshot.to_string(),
                    r.state.as_str().to_owned(),
                    r.requested_by.clone(),
                    age(r.started_at, now),
                    r.reason.clone().unwrap_or_default(),
                ]
            })
            .collect();
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&table(
            &["RESTORE", "SNAPSHOT", "STATE", "BY", "AGE", "REASON"],
            &rows,
            width,
        ));
    }
    out
}
