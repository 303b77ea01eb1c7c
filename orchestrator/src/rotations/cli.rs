//! `vcp tenant rotate` and `vcp tenant rotations`: CA and key rotations of a tenant (its etcd
//! encryption key too).

use crate::client::output::{self, Format, age, table};
use crate::client::{Client, OutputArgs, WaitArgs, name, now, print};
use crate::rotations::api::{RotateTenant, RotationList, RotationTarget, RotationView};
use crate::{Error, Result};
use std::time::{Duration, Instant};
use time::OffsetDateTime;

/// `vcp tenant rotate NAME --target ...`
#[derive(Debug, clap::Args)]
pub struct TenantRotate {
    /// Tenant name.
    pub name: String,
    /// What to rotate.
    #[arg(long, env = "VCP_ROTATE_TARGET", value_enum)]
    pub target: RotateTargetArg,
    /// How long phase `sign` lasts at least (e.g. 0s, 90m, 12h; a longer one than 30d is cut to 30d): for `ca`, the
    /// time users have to fetch new kubeconfigs. Default: the server's per target.
    #[arg(long, env = "VCP_ROTATE_OVERLAP")]
    pub overlap: Option<String>,
    #[command(flatten)]
    pub wait: WaitArgs,
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `--target` of `vcp tenant rotate`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RotateTargetArg {
    Ca,
    EtcdCa,
    FrontProxyCa,
    ServiceAccountKey,
    EncryptionKey,
}

impl From<RotateTargetArg> for RotationTarget {
    fn from(t: RotateTargetArg) -> RotationTarget {
        use crate::pki::rotation::Target;
        match t {
            RotateTargetArg::Ca => Target::Ca,
            RotateTargetArg::EtcdCa => Target::EtcdCa,
            RotateTargetArg::FrontProxyCa => Target::FrontProxyCa,
            RotateTargetArg::ServiceAccountKey => Target::ServiceAccountKey,
            RotateTargetArg::EncryptionKey => Target::EncryptionKey,
        }
        .into()
    }
}

/// Rotations: target, phase and for how long, and the kubeconfigs a CA rotation ends.
pub fn rotations_table(rotations: &[RotationView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = rotations
        .iter()
        .map(|r| {
            vec![
                r.id.to_string(),
                serde_json::to_value(r.target)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                r.phase.clone(),
                age(r.phase_since, now),
                format!("{}s", r.overlap_seconds),
                r.requested_by.clone(),
                if r.reissue.is_empty() {
                    String::new()
                } else {
                    r.reissue
                        .iter()
                        .map(|k| format!("{} ({})", k.serial, k.user))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]
        })
        .collect();
    table(
        &["ID", "TARGET", "PHASE", "SINCE", "OVERLAP", "BY", "REISSUE"],
        &rows,
        width,
    )
}

/// Starts a rotation and, with `--wait`, follows it to its end.
pub(crate) async fn rotate(client: &Client, a: TenantRotate, width: usize) -> Result<()> {
    let seg = self::name(&a.name)?;
    let req = RotateTenant {
        target: a.target.into(),
        overlap: a.overlap.clone(),
    };
    let mut r: RotationView = client
        .post(&format!("/v1/tenants/{seg}/rotate"), &req)
        .await?;
    let start = Instant::now();
    let mut shown = String::new();
    while a.wait.wait && r.finished_at.is_none() {
        if r.phase != shown {
            eprintln!("rotation {} of {}: phase {}", r.id, a.name, r.phase);
            shown = r.phase.clone();
        }
        if start.elapsed() > a.wait.timeout {
            return Err(Error::Client(format!(
                "rotation {} of {} still in phase {} after {:?}",
                r.id, a.name, r.phase, a.wait.timeout
            )));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let l: RotationList = client.get(&format!("/v1/tenants/{seg}/rotations")).await?;
        if let Some(x) = l.items.into_iter().find(|x| x.id == r.id) {
            r = x;
        }
    }
    match a.output.output {
        Format::Table => print(&rotations_table(&[r], now(), width)),
        f => print(&output::structured(&r, f)),
    }
}

/// Lists a tenant's rotations, newest first.
pub(crate) async fn rotations(
    client: &Client,
    name: &str,
    o: OutputArgs,
    width: usize,
) -> Result<()> {
    let l: RotationList = client
        .get(&format!("/v1/tenants/{}/rotations", self::name(name)?))
        .await?;
    match o.output {
        Format::Table => print(&rotations_table(&l.items, now(), width)),
        f => print(&output::structured(&l, f)),
    }
}
