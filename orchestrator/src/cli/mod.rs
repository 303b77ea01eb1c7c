//! The client commands of `vcp` put together: each feature's command is in its folder
//! (`tenants::cli` for `vcp tenant`, with the subcommands of usage, rotations, upgrades and
//! kubeconfigs it carries; `upgrades::cli`, `kubeconfigs::cli`, `tokens::cli`,
//! `snapshots::cli`, `audit::cli`), on what they share in [`crate::client`]. They read the
//! server from `VCP_API_URL` and the bearer token from `VCP_TOKEN`, decode answers into the
//! same types the server encodes ([`crate::api::types`]), and print them. API problems come
//! back as [`crate::Error::Api`] with the server's detail and field. This file holds
//! `vcp version`.

use crate::Result;
use crate::api::types::VersionList;
use crate::client::output::{self, Format, table};
use crate::client::{Client, Connection, OutputArgs, print};

/// `vcp version ...`
#[derive(Debug, clap::Subcommand)]
pub enum VersionCommand {
    /// Kubernetes versions tenants can run.
    List(OutputArgs),
}

pub async fn version(conn: &Connection, cmd: VersionCommand) -> Result<()> {
    let client = Client::new(conn)?;
    let VersionCommand::List(o) = cmd;
    let v: VersionList = client.get("/v1/versions").await?;
    match o.output {
        Format::Table => print(&versions_table(&v, output::terminal_width())),
        f => print(&output::structured(&v, f)),
    }
}

pub fn versions_table(v: &VersionList, width: usize) -> String {
    let rows: Vec<Vec<String>> = v
        .versions
        .iter()
        .map(|v| {
            vec![
                v.minor.clone(),
                v.kubernetes.clone(),
                v.class.as_str().to_owned(),
                if v.default { "*" } else { "" }.to_owned(),
            ]
        })
        .collect();
    table(&["MINOR", "KUBERNETES", "CLASS", "DEFAULT"], &rows, width)
}
