//! `vcp tool datastore ...`: what vcp's admin Jobs run in a shared datastore's namespace, as
//! root, through etcd's JSON gateway: a client certificate to connect, root's password for a
//! token. The gateway does not pass a certificate's name on as the user, and once
//! authentication is on it refuses any certificate that names one, so the Jobs' names none.
//!
//! - `init` puts the root user and role in place and turns authentication on; done once, and
//!   a no-op when authentication is already on.
//! - `grant` gives a tenant its user (no password: the client certificate's common name is the
//!   user) and a role that reads and writes exactly the tenant's key range.
//! - `revoke` deletes the tenant's keys (unless `--keep-data`), then its user and role.
//!
//! Every step is idempotent, so a Job killed half-way finishes on its retry.

use crate::{Error, Result};
use base64::Engine as _;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The members, and a client certificate with no common name (see above).
    #[command(flatten)]
    pub etcd: crate::snapshots::tool::EtcdConnection,
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

fn fail(m: impl Into<String>) -> Error {
    Error::Datastore(m.into())
}

fn read(p: &Path) -> Result<Vec<u8>> {
    std::fs::read(p).map_err(|e| fail(format!("{}: {e}", p.display())))
}

/// Runs one step; prints what it did.
pub async fn run(a: Args) -> Result<()> {
    let etcd = Gateway::connect(&a)?;
    let password = String::from_utf8(read(&a.password_file)?)
        .map_err(|_| fail("the root password is not UTF-8"))?;
    let password = password.trim_end();
    match &a.step {
        Step::Init => {
            let done = init(&etcd, password).await?;
            println!("{done}");
        }
        Step::Grant(r) => {
            let token = etcd.authenticate(password).await?;
            grant(&etcd, &token, r).await?;
            println!("granted {} [{}, {})", r.user, r.range_start, r.range_end);
        }
        Step::Revoke { range, keep_data } => {
            let token = etcd.authenticate(password).await?;
            let deleted = revoke(&etcd, &token, range, *keep_data).await?;
            println!("revoked {}; {deleted} keys deleted", range.user);
        }
    }
    Ok(())
}

/// Turns authentication on with root in place; says what it found.
pub async fn init(etcd: &Gateway, password: &str) -> Result<&'static str> {
    match etcd.authenticate(password).await {
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

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s.as_bytes())
}

/// Gives `r.user` a role over exactly its range.
pub async fn grant(etcd: &Gateway, token: &str, r: &Range) -> Result<()> {
    let t = Some(token);
    etcd.call_tolerating(
        "/v3/auth/user/add",
        json!({"name": r.user, "options": {"no_password": true}}),
        t,
        "already exists",
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
            "key": b64(&r.range_start),
            "range_end": b64(&r.range_end),
        }}),
        t,
    )
    .await?;
    etcd.call_tolerating(
        "/v3/auth/user/grant",
        json!({"user": r.user, "role": r.user}),
        t,
        "already",
    )
    .await?;
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
                json!({"key": b64(&r.range_start), "range_end": b64(&r.range_end)}),
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

/// etcd's JSON gateway on the members' client port, with root's client certificate.
pub struct Gateway {
    http: reqwest::Client,
    endpoints: Vec<String>,
}

impl Gateway {
    pub fn connect(a: &Args) -> Result<Gateway> {
        let (ca, identity) = a.etcd.read()?;
        Gateway::new(&ca, &identity, a.etcd.endpoints.clone())
    }

    /// `identity`: a certificate and its key, PEM.
    pub fn new(ca: &[u8], identity: &[u8], endpoints: Vec<String>) -> Result<Gateway> {
        let http = reqwest::Client::builder()
            .add_root_certificate(
                reqwest::Certificate::from_pem(ca).map_err(|e| fail(format!("ca file: {e}")))?,
            )
            .identity(
                reqwest::Identity::from_pem(identity)
                    .map_err(|e| fail(format!("client certificate: {e}")))?,
            )
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| fail(format!("etcd client: {e}")))?;
        Ok(Gateway { http, endpoints })
    }

    /// A token for root.
    pub async fn authenticate(&self, password: &str) -> Result<String> {
        let answer = self
            .call(
                "/v3/auth/authenticate",
                json!({"name": super::ROOT, "password": password}),
                None,
            )
            .await?;
        answer["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| fail("etcd authenticated root without a token"))
    }

    /// One call, to the first member that answers; etcd's refusal is an error with its message.
    pub async fn call(&self, path: &str, body: Value, token: Option<&str>) -> Result<Value> {
        let mut unreachable = Vec::new();
        for endpoint in &self.endpoints {
            let mut req = self
                .http
                .post(format!("{}{path}", endpoint.trim_end_matches('/')))
                .json(&body);
            if let Some(t) = token {
                req = req.header("authorization", t);
            }
            let resp = match req.send().await {
                Ok(r) => r,
                Err(e) => {
                    unreachable.push(format!("{endpoint}: {}", crate::chain(&e)));
                    continue;
                }
            };
            let status = resp.status();
            let answer: Value = resp
                .json()
                .await
                .map_err(|e| fail(format!("{path}: {e}")))?;
            if status.is_success() && answer.get("error").is_none() {
                return Ok(answer);
            }
            let message = answer["message"]
                .as_str()
                .or(answer["error"].as_str())
                .unwrap_or("no message");
            return Err(fail(format!("{path}: {message} (HTTP {status})")));
        }
        Err(fail(format!(
            "{path}: no member answered: {}",
            unreachable.join("; ")
        )))
    }

    /// [`Gateway::call`], with a refusal whose message holds `benign` taken as done.
    async fn call_tolerating(
        &self,
        path: &str,
        body: Value,
        token: Option<&str>,
        benign: &str,
    ) -> Result<()> {
        match self.call(path, body, token).await {
            Ok(_) => Ok(()),
            Err(e) if e.to_string().contains(benign) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
