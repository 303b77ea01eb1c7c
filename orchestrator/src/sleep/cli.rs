//! `vcp tenant sleep` and `vcp tenant wake`.

use crate::client::{Client, WaitArgs, name, print, progress};
use crate::tenants::cli::follow;
use crate::tenants::types::TenantView;
use crate::{Error, Result};
use vcp_core::lifecycle::{Phase, Sleep};

/// `vcp tenant sleep|wake NAME`
#[derive(Debug, clap::Args)]
pub struct TenantSleep {
    /// Tenant name.
    pub name: String,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Asks the tenant to sleep (`to` asleep) or wake, and with `--wait` follows it to `Sleeping`
/// or `Ready`.
pub async fn ask(client: &Client, a: TenantSleep, to: Sleep) -> Result<()> {
    let (verb, phase) = match to {
        Sleep::Asleep => ("sleep", Phase::Sleeping),
        Sleep::Awake => ("wake", Phase::Ready),
    };
    let path = format!("/v1/tenants/{}/{verb}", name(&a.name)?);
    let _: Option<TenantView> = client
        .call(reqwest::Method::POST, &path, None::<&()>)
        .await?;
    if !a.wait.wait {
        return print(&format!("tenant {}: asked to {verb}\n", a.name));
    }
    progress(&format!(
        "tenant {}: asked to {verb}; waiting for {phase}",
        a.name
    ));
    // Asleep means no control-plane pod left, which the condition's message says.
    let done = |t: &TenantView| {
        t.phase == phase
            && (to == Sleep::Awake || t.conditions.iter().any(|c| c.message.starts_with("asleep")))
    };
    match follow(client, &a.name, &a.wait, done).await? {
        Some(_) => print(&format!("tenant {} {phase}\n", a.name)),
        None => Err(Error::Client(format!("tenant {} is gone", a.name))),
    }
}
