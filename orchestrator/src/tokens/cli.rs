//! `vcp token ...`: the API tokens of owners and admins (admins only).

use crate::Result;
use crate::client::output::{self, Format, age, table};
use crate::client::{Client, Connection, OutputArgs, name, now, print, progress};
use crate::tokens::types::{CreateToken, Role, TokenCreated, TokenList, TokenView};
use time::OffsetDateTime;

/// `vcp token ...`
#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create a token (admins only); its secret is printed once.
    Create {
        /// Token name: lowercase letters, digits and '-'.
        name: String,
        /// admin or owner.
        #[arg(long, env = "VCP_TOKEN_ROLE", value_enum, default_value = "owner")]
        role: RoleArg,
        #[command(flatten)]
        output: OutputArgs,
    },
    /// List tokens without their secrets (admins only).
    List(OutputArgs),
    /// Revoke a token (admins only).
    Revoke {
        /// Token name.
        name: String,
    },
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum RoleArg {
    Admin,
    Owner,
}

pub async fn token(conn: &Connection, cmd: TokenCommand) -> Result<()> {
    let client = Client::new(conn)?;
    match cmd {
        TokenCommand::Create { name, role, output } => {
            let role = match role {
                RoleArg::Admin => Role::Admin,
                RoleArg::Owner => Role::Owner,
            };
            let t: TokenCreated = client
                .post("/v1/tokens", &CreateToken { name, role })
                .await?;
            match output.output {
                Format::Table => {
                    progress(&format!(
                        "token {} ({}) created; its secret is shown this once:",
                        t.name,
                        t.role.as_str()
                    ));
                    print(&format!("{}\n", t.token))
                }
                f => print(&output::structured(&t, f)),
            }
        }
        TokenCommand::List(o) => {
            let list: TokenList = client.get("/v1/tokens").await?;
            match o.output {
                Format::Table => print(&tokens_table(&list.items, now(), output::terminal_width())),
                f => print(&output::structured(&list, f)),
            }
        }
        TokenCommand::Revoke { name } => {
            let _: Option<()> = client
                .call(
                    reqwest::Method::DELETE,
                    &format!("/v1/tokens/{}", self::name(&name)?),
                    None::<&()>,
                )
                .await?;
            print(&format!("token {name} revoked\n"))
        }
    }
}

pub fn tokens_table(items: &[TokenView], now: OffsetDateTime, width: usize) -> String {
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|t| {
            vec![
                t.name.clone(),
                t.role.as_str().to_owned(),
                if t.revoked_at.is_some() {
                    "revoked"
                } else {
                    "live"
                }
                .to_owned(),
                age(t.created_at, now),
            ]
        })
        .collect();
    table(&["NAME", "ROLE", "STATE", "AGE"], &rows, width)
}
