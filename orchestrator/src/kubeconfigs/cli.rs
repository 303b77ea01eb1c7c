//! `vcp kubeconfig ...` and `vcp user ...`: issuing, listing and revoking user kubeconfigs.

use crate::client::output::{self, Format, age, table};
use crate::client::{Client, Connection, OutputArgs, name, print, progress, segment};
use crate::kubeconfigs::types::{
    IssueKubeconfig, KubeconfigIssued, KubeconfigList, KubeconfigView,
};
use crate::{Error, Result};
use std::io::Write as _;
use std::path::PathBuf;
use time::OffsetDateTime;

/// `vcp kubeconfig NAME ...`
#[derive(Debug, clap::Args)]
pub struct KubeconfigArgs {
    /// Tenant name.
    #[arg(required = true)]
    pub name: Option<String>,
    /// User name in the certificate (CN).
    #[arg(long, env = "VCP_KUBECONFIG_USER", required = true)]
    pub user: Option<String>,
    /// Group (O); repeatable. view, edit and admin are bound in every tenant.
    #[arg(long = "group", env = "VCP_KUBECONFIG_GROUPS", value_delimiter = ',')]
    pub groups: Vec<String>,
    /// Lifetime such as 90m, 12h or 7d; the server's default is 8h, and it caps it (a week
    /// unless configured).
    #[arg(long, env = "VCP_KUBECONFIG_TTL")]
    pub ttl: Option<String>,
    /// Write the kubeconfig here (mode 0600); `-` prints it.
    #[arg(
        short = 'o',
        long = "output",
        env = "VCP_KUBECONFIG_OUTPUT",
        default_value = "-"
    )]
    pub output: PathBuf,
}

/// `vcp kubeconfig revoke ...`
#[derive(Debug, clap::Subcommand)]
pub enum KubeconfigCommand {
    /// Revoke one kubeconfig by its certificate serial (`vcp tenant kubeconfigs` lists them):
    /// the tenant apiserver refuses it within 60 s.
    Revoke {
        /// Tenant name.
        tenant: String,
        /// The certificate serial (hex).
        serial: String,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Issue a break-glass kubeconfig (admins only): `system:masters` for at most an hour,
    /// for when vcp or the tenant's syncer is down; it cannot be revoked, and is audited.
    BreakGlass {
        /// Tenant name.
        tenant: String,
        /// Why, for the audit trail.
        #[arg(long, env = "VCP_BREAK_GLASS_REASON")]
        reason: String,
        /// Lifetime such as 15m (at most 1h; default 30m).
        #[arg(long, env = "VCP_BREAK_GLASS_TTL")]
        ttl: Option<String>,
        /// Write the kubeconfig here (mode 0600); `-` prints it.
        #[arg(
            short = 'o',
            long = "output",
            env = "VCP_KUBECONFIG_OUTPUT",
            default_value = "-"
        )]
        output: PathBuf,
    },
}

/// `vcp user ...`
#[derive(Debug, clap::Subcommand)]
pub enum UserCommand {
    /// Revoke every kubeconfig issued to a user in a tenant: the tenant apiserver refuses
    /// each within 60 s.
    Revoke {
        /// Tenant name.
        tenant: String,
        /// The user (certificate CN).
        user: String,
        #[command(flatten)]
        output: OutputArgs,
    },
}

pub async fn kubeconfig(conn: &Connection, a: KubeconfigArgs) -> Result<()> {
    let client = Client::new(conn)?;
    // clap requires both unless a subcommand is given.
    let (Some(tenant), Some(user)) = (a.name, a.user) else {
        return Err(Error::Client(
            "a tenant name and --user are required".into(),
        ));
    };
    let req = IssueKubeconfig {
        user,
        groups: a.groups,
        ttl: a.ttl,
    };
    let issued: KubeconfigIssued = client
        .post(&format!("/v1/tenants/{}/kubeconfigs", name(&tenant)?), &req)
        .await?;
    save_kubeconfig(&issued, &a.output)
}

/// Prints an issued kubeconfig (`-`) or writes it to a file only its owner reads, saying so.
fn save_kubeconfig(issued: &KubeconfigIssued, output: &std::path::Path) -> Result<()> {
    if output.as_os_str() == "-" {
        return print(&issued.kubeconfig);
    }
    write_private(output, issued.kubeconfig.as_bytes())?;
    let expires = issued
        .expires_at
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default();
    progress(&format!(
        "wrote {} (user {}, groups {}, expires {expires}, serial {})",
        output.display(),
        issued.user,
        if issued.groups.is_empty() {
            "-".to_owned()
        } else {
            issued.groups.join(",")
        },
        issued.serial
    ));
    Ok(())
}

/// Prints revoked kubeconfigs: a line each in a table, or the API's answer.
fn print_revoked(
    items: &[KubeconfigView],
    answer: &impl serde::Serialize,
    f: Format,
) -> Result<()> {
    match f {
        Format::Table => {
            let mut out = String::new();
            for k in items {
                out.push_str(&format!(
                    "revoked kubeconfig {} of user {} (the tenant refuses it within 60s)\n",
                    k.serial, k.user
                ));
            }
            print(&out)
        }
        f => print(&output::structured(answer, f)),
    }
}

/// `vcp kubeconfig revoke ...`
pub async fn kubeconfig_command(conn: &Connection, action: KubeconfigCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match action {
        KubeconfigCommand::Revoke {
            tenant,
            serial,
            output: o,
        } => {
            let view: Option<KubeconfigView> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!(
                        "/v1/tenants/{}/kubeconfigs/{}",
                        name(&tenant)?,
                        segment(&serial)
                    ),
                    None::<&()>,
                )
                .await?;
            let view = view.ok_or_else(|| Error::Client("no answer".into()))?;
            print_revoked(std::slice::from_ref(&view), &view, o.output)
        }
        KubeconfigCommand::BreakGlass {
            tenant,
            reason,
            ttl,
            output,
        } => {
            let issued: KubeconfigIssued = client
                .post(
                    &format!("/v1/tenants/{}/break-glass", name(&tenant)?),
                    &super::types::BreakGlassRequest { reason, ttl },
                )
                .await?;
            save_kubeconfig(&issued, &output)
        }
    }
}

/// `vcp user ...`
pub async fn user(conn: &Connection, action: UserCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match action {
        UserCommand::Revoke {
            tenant,
            user,
            output: o,
        } => {
            let list: Option<KubeconfigList> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/tenants/{}/users/{}", name(&tenant)?, segment(&user)),
                    None::<&()>,
                )
                .await?;
            let list = list.ok_or_else(|| Error::Client("no answer".into()))?;
            print_revoked(&list.items, &list, o.output)
        }
    }
}

/// Writes a file only its owner can read: it holds a private key.
fn write_private(path: &std::path::Path, data: &[u8]) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt as _;
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io)?;
    // An existing file keeps its mode on open; tighten it too.
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(io)?;
    f.write_all(data).map_err(io)
}

pub fn kubeconfigs_table(items: &[KubeconfigView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|k| {
            let left = if k.revoked_at.is_some() {
                "revoked".to_owned()
            } else if k.expires_at <= now {
                "expired".to_owned()
            } else {
                age(now, k.expires_at)
            };
            vec![
                k.user.clone(),
                if k.groups.is_empty() {
                    "-".into()
                } else {
                    k.groups.join(",")
                },
                left,
                k.created_by.clone(),
                k.serial.clone(),
            ]
        })
        .collect();
    table(
        &["USER", "GROUPS", "EXPIRES IN", "ISSUED BY", "SERIAL"],
        &rows,
        width,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::output::fixtures::at;

    #[test]
    fn a_kubeconfig_listing_says_revoked_before_expired() {
        let k = |expires: i64, revoked: Option<i64>| KubeconfigView {
            user: "alice".into(),
            groups: vec!["edit".into()],
            serial: "0abc".into(),
            expires_at: at(expires),
            created_by: "admin".into(),
            created_at: at(0),
            revoked_at: revoked.map(at),
            break_glass: false,
        };
        let out = kubeconfigs_table(
            &[
                k(7200, None),
                k(7200, Some(60)),
                k(-1, Some(-60)),
                k(-1, None),
            ],
            at(0),
            80,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[1].contains(" 2h "), "{out}");
        assert!(
            lines[2].contains("revoked") && lines[3].contains("revoked"),
            "{out}"
        );
        assert!(lines[4].contains("expired"), "{out}");
    }
}
