//! etcd as vcp's tool commands reach it: where the members are and the client certificate to
//! connect with ([`EtcdConnection`], flags of every `vcp tool` command that talks to etcd), and
//! a client of etcd's JSON gateway on the client port ([`Gateway`]) for the calls that are not
//! a stream: a shared datastore's administration ([`crate::datastore::tool`]) and the logical
//! export and import of a tenant's keys ([`crate::snapshots::transfer`]).
//!
//! Once a store's authentication is on, the gateway refuses any client certificate that names
//! a user (etcd: "CommonName of client sending a request against gateway will be ignored"), so
//! the certificates used here carry no common name and the user is who its password says
//! ([`Gateway::authenticate`]).

use crate::{Error, Result};
use base64::Engine as _;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

fn fail(m: impl Into<String>) -> Error {
    Error::Etcd(m.into())
}

/// Where etcd is and the client certificate to reach it with.
#[derive(Debug, clap::Args)]
pub struct EtcdConnection {
    /// etcd client URLs, tried in order until one answers.
    #[arg(
        long,
        env = "VCP_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    pub endpoints: Vec<String>,
    /// CA bundle that signed etcd's serving certificate.
    #[arg(long, env = "VCP_ETCD_CA_FILE")]
    pub ca_file: PathBuf,
    /// Client certificate and key for etcd.
    #[arg(long, env = "VCP_ETCD_CERT_FILE")]
    pub cert_file: PathBuf,
    #[arg(long, env = "VCP_ETCD_KEY_FILE")]
    pub key_file: PathBuf,
}

impl EtcdConnection {
    /// The CA bundle, and the client certificate with its key as one PEM.
    pub fn read(&self) -> Result<(Vec<u8>, Vec<u8>)> {
        let read =
            |p: &PathBuf| std::fs::read(p).map_err(|e| fail(format!("{}: {e}", p.display())));
        let mut identity = read(&self.cert_file)?;
        identity.push(b'\n');
        identity.extend(read(&self.key_file)?);
        Ok((read(&self.ca_file)?, identity))
    }

    /// A gateway client over these members.
    pub fn gateway(&self) -> Result<Gateway> {
        let (ca, identity) = self.read()?;
        Gateway::new(&ca, &identity, self.endpoints.clone())
    }
}

/// Reads a password file (its trailing newline dropped).
pub fn read_password(path: &std::path::Path) -> Result<String> {
    let text = std::fs::read(path).map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let text = String::from_utf8(text)
        .map_err(|_| fail(format!("{}: the password is not UTF-8", path.display())))?;
    Ok(text.trim_end().to_owned())
}

/// Base64 of bytes, as the gateway writes keys and values.
pub fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Bytes of a base64 field of a gateway answer (absent: empty).
pub fn unb64(v: &Value) -> Result<Vec<u8>> {
    match v.as_str() {
        None => Ok(Vec::new()),
        Some(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| fail(format!("etcd sent a field that is not base64: {e}"))),
    }
}

/// A number of a gateway answer: int64 fields come as strings, absent ones are zero.
pub fn int(v: &Value) -> i64 {
    match v {
        Value::String(s) => s.parse().unwrap_or(0),
        Value::Number(n) => n.as_i64().unwrap_or(0),
        _ => 0,
    }
}

/// etcd's JSON gateway on the members' client port.
pub struct Gateway {
    http: reqwest::Client,
    endpoints: Vec<String>,
}

impl Gateway {
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
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| fail(format!("etcd client: {e}")))?;
        Ok(Gateway { http, endpoints })
    }

    /// A token for `user`.
    pub async fn authenticate(&self, user: &str, password: &str) -> Result<String> {
        let answer = self
            .call(
                "/v3/auth/authenticate",
                json!({"name": user, "password": password}),
                None,
            )
            .await?;
        answer["token"]
            .as_str()
            .map(str::to_owned)
            .ok_or_else(|| fail(format!("etcd authenticated {user} without a token")))
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
    pub async fn call_tolerating(
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateway_numbers_and_bytes_are_read_as_etcd_writes_them() {
        assert_eq!(int(&json!("42")), 42);
        assert_eq!(int(&json!(7)), 7);
        assert_eq!(int(&Value::Null), 0);
        assert_eq!(unb64(&json!(b64(b"/vcp/a/x"))).unwrap(), b"/vcp/a/x");
        assert!(unb64(&Value::Null).unwrap().is_empty());
        assert!(unb64(&json!("not base64!")).is_err());
    }
}
