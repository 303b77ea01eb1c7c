//! `vcp tool datastore ...`: what vcp's admin Jobs run in a shared datastore's namespace, as
//! root, through etcd's JSON gateway: a client certificate to connect, root's password for a
//! token. The gateway does not pass a certificate's name on as the user, and once
//! authentication is on it refuses any certificate that names one, so the Jobs' names none.
//!
//! - `init` puts the root user and role in place and turns authentication on; done once, and
//!   a no-op when authentication is already on.
//! - `grant` gives a tenant its user and a role that reads and writes exactly the tenant's key
//!   range. Its apiserver is that user by its client certificate's common name (etcd's gRPC
//!   port maps it); vcp's snapshot Jobs are, through the gateway, by its password, which both
//!   vcp and this command derive from root's ([`crate::render::datastore::tenant_password`]),
//!   so no tenant password is stored anywhere but in the tenant's own control-plane namespace.
//! - `revoke` deletes the tenant's keys (unless `--keep-data`), then its user and role.
//!
//! Every step is idempotent, so a Job killed half-way finishes on its retry.

use crate::Result;
use crate::etcd::{Gateway, b64};
use crate::render::datastore::tenant_password;
use serde_json::json;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The members, and a client certificate with no common name (see above).
    #[command(flatten)]
    pub etcd: crate::etcd::EtcdConnection,
    /// Root's password.
    #[arg(long, env = "VCP_ETCD_PASSWORD_FILE")]
    pub password_file: PathBuf,
    #[command(subcommand)]
    pub step: Step,
}

#[derive(Debug, clap::Subcommand)]
pub enum Step {
    /// The root user and role, then authentication on.
    Init,
    /// A tenant's user and its role over one key range.
    Grant(Range),
    /// A tenant's keys, user and role gone.
    Revoke {
        #[command(flatten)]
        range: Range,
        /// Keep the tenant's keys (only the user and role go).
        #[arg(long, env = "VCP_DATASTORE_KEEP_DATA")]
        keep_data: bool,
    },
}

#[derive(Debug, clap::Args)]
pub struct Range {
    /// The tenant's etcd user (and role).
    #[arg(long, env = "VCP_DATASTORE_USER")]
    pub user: String,
    /// The first key of the tenant's range.
    #[arg(long, env = "VCP_DATASTORE_RANGE_START")]
    pub range_start: String,
    /// The key after its range.
    #[arg(long, env = "VCP_DATASTORE_RANGE_END")]
    pub range_end: String,
}

/// Runs one step; prints what it did.
pub async fn run(a: Args) -> Result<()> {
    let etcd = a.etcd.gateway()?;
    let password = crate::etcd::read_password(&a.password_file)?;
    let password = password.as_str();
    match &a.step {
        Step::Init => {
            let done = init(&etcd, password).await?;
            println!("{done}");
        }
        Step::Grant(r) => {
            let token = etcd.authenticate(super::ROOT, password).await?;
            grant(&etcd, &token, r, &tenant_password(password, &r.user)).await?;
            println!("granted {} [{}, {})", r.user, r.range_start, r.range_end);
        }
        Step::Revoke { range, keep_data } => {
            let token = etcd.authenticate(super::ROOT, password).await?;
            let deleted = revoke(&etcd, &token, range, *keep_data).await?;
            println!("revoked {}; {deleted} keys deleted", range.user);
        }
    }
    Ok(())
}

/// Turns authentication on with root in place; says what it found.
pub async fn init(etcd: &Gateway, password: &str) -> Result<&'static str> {
    match etcd.authenticate(super::ROOT, password).await {
        Ok(_) => return Ok("authentication already on"),
        Err(e) if !e.to_string().contains("authentication is not enabled") => return Err(e),
        Err(_) => {}
    }
    let none = None;
    etcd.call_tolerating(
        "/v3/auth/user/add",
        json!({"name": super::ROOT, "password": password}),
        none,
        "already exists",
    )
    .await?;
    etcd.call_tolerating(
        "/v3/auth/role/add",
        json!({"name": super::ROOT}),
        none,
        "already exists",
    )
    .await?;
    etcd.call_tolerating(
        "/v3/auth/user/grant",
        json!({"user": super::ROOT, "role": super::ROOT}),
        none,
        "already",
    )
    .await?;
    etcd.call("/v3/auth/enable", json!({}), none).await?;
    Ok("authentication turned on")
}

/// Gives `r.user` its password and a role over exactly its range.
pub async fn grant(etcd: &Gateway, token: &str, r: &Range, password: &str) -> Result<()> {
    let t = Some(token);
    let add = json!({"name": r.user, "password": password});
    etcd.call_tolerating("/v3/auth/user/add", add.clone(), t, "already exists")
        .await?;
    etcd.call(
        "/v3/auth/user/changepw",
        json!({"name": r.user, "password": password}),
        t,
    )
    .await?;
    etcd.call_tolerating(
        "/v3/auth/role/add",
        json!({"name": r.user}),
        t,
        "already exists",
    )
    .await?;
    // Granting the same permission again replaces it: idempotent.
    etcd.call(
        "/v3/auth/role/grant",
        json!({"name": r.user, "perm": {
            "permType": "READWRITE",
            "key": b64(r.range_start.as_bytes()),
            "range_end": b64(r.range_end.as_bytes()),
        }}),
        t,
    )
    .await?;
    let give_role = || {
        etcd.call_tolerating(
            "/v3/auth/user/grant",
            json!({"user": r.user, "role": r.user}),
            t,
            "already",
        )
    };
    give_role().await?;
    // A user granted before passwords were (added with none) keeps having none through
    // changepw: made again, with its role, the apiserver's certificate finds it unchanged.
    if etcd.authenticate(&r.user, password).await.is_err() {
        etcd.call("/v3/auth/user/delete", json!({"name": r.user}), t)
            .await?;
        etcd.call("/v3/auth/user/add", add, t).await?;
        give_role().await?;
        etcd.authenticate(&r.user, password).await?;
    }
    Ok(())
}

/// Takes `r.user` away (its keys first, unless kept); the number of keys deleted.
pub async fn revoke(etcd: &Gateway, token: &str, r: &Range, keep_data: bool) -> Result<u64> {
    let t = Some(token);
    let mut deleted = 0;
    if !keep_data {
        let answer = etcd
            .call(
                "/v3/kv/deleterange",
                json!({"key": b64(r.range_start.as_bytes()), "range_end": b64(r.range_end.as_bytes())}),
                t,
            )
            .await?;
        deleted = answer["deleted"]
            .as_str()
            .and_then(|d| d.parse().ok())
            .unwrap_or(0);
    }
    etcd.call_tolerating(
        "/v3/auth/user/delete",
        json!({"name": r.user}),
        t,
        "not found",
    )
    .await?;
    etcd.call_tolerating(
        "/v3/auth/role/delete",
        json!({"role": r.user}),
        t,
        "not found",
    )
    .await?;
    Ok(deleted)
}
