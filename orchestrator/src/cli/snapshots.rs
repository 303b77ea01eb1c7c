//! `vcp snapshot ...`: etcd snapshots of a tenant and restores from them.

use super::client::{Client, Connection, name};
use super::output::{self, Format};
use super::{OutputArgs, WaitArgs, print};
use crate::api::{
    RestoreState, RestoreTenant, RestoreView, SnapshotList, SnapshotState, SnapshotView,
};
use crate::{Error, Result};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

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
                Format::Table => print(&output::snapshots_table(&[s], &[], now, width)),
                f => print(&output::structured(&s, f)),
            }
        }
        SnapshotCommand::List { name: n, output: o } => {
            let l: SnapshotList = client
                .get(&format!("/v1/tenants/{}/snapshots", name(&n)?))
                .await?;
            match o.output {
                Format::Table => print(&output::snapshots_table(
                    &l.snapshots,
                    &l.restores,
                    now,
                    width,
                )),
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
                Format::Table => print(&output::snapshots_table(&[], &[r], now, width)),
                f => print(&output::structured(&r, f)),
            }
        }
    }
}
