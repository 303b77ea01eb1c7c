//! The HTTP client the commands share: where the API is, the bearer token, the owner a call
//! acts for, and how answers and problems decode.

use crate::api::{ProblemBody, TenantView};
use crate::{Error, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// Where the API is and who calls it.
#[derive(Clone, clap::Args)]
pub struct Connection {
    /// Base URL of the platform API.
    #[arg(
        long,
        env = "VCP_API_URL",
        default_value = "http://127.0.0.1:8080",
        global = true
    )]
    pub api_url: String,
    /// Bearer token (admin or owner).
    #[arg(long, env = "VCP_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// For commands that name a tenant: whose tenant of that name (a token name). Tenant
    /// names are unique per owner, so an admin needs it when several owners have a tenant of
    /// the name; an owner sees only its own tenants.
    #[arg(long, env = "VCP_OWNER", global = true)]
    pub owner: Option<String>,
}

impl std::fmt::Debug for Connection {
    // The token is a bearer secret: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("api_url", &self.api_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("owner", &self.owner)
            .finish()
    }
}

/// A client of the platform API.
#[derive(Clone)]
pub struct Client {
    base: String,
    token: String,
    /// `--owner`, checked: added to every request about one tenant ([`with_owner`]).
    owner: Option<String>,
    http: reqwest::Client,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Client {
    pub fn new(c: &Connection) -> Result<Client> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|source| Error::Http {
                url: c.api_url.clone(),
                source,
            })?;
        let token = c
            .token
            .clone()
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| Error::Client("no token: set VCP_TOKEN or pass --token".into()))?;
        let owner = c.owner.as_deref().map(name).transpose()?;
        Ok(Client {
            base: c.api_url.trim_end_matches('/').to_owned(),
            token,
            owner,
            http,
        })
    }

    pub(super) async fn call<T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&impl Serialize>,
    ) -> Result<Option<T>> {
        let url = format!("{}{}", self.base, with_owner(path, self.owner.as_deref()));
        let mut req = self
            .http
            .request(method, &url)
            .bearer_auth(&self.token)
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            req = req.json(b);
        }
        let http = |source| Error::Http {
            url: url.clone(),
            source,
        };
        let resp = req.send().await.map_err(http)?;
        let status = resp.status();
        let text = resp.text().await.map_err(http)?;
        if status.is_success() {
            if status == reqwest::StatusCode::NO_CONTENT || text.is_empty() {
                return Ok(None);
            }
            return serde_json::from_str(&text)
                .map(Some)
                .map_err(|source| Error::Answer { url, source });
        }
        Err(match serde_json::from_str::<ProblemBody>(&text) {
            Ok(p) => Error::Api {
                status: p.status,
                detail: p.detail,
                field: p.field,
            },
            Err(_) => Error::Api {
                status: status.as_u16(),
                detail: text.chars().take(200).collect(),
                field: None,
            },
        })
    }

    pub(super) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(reqwest::Method::GET, path, None::<&()>)
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    pub(super) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T> {
        self.call(reqwest::Method::POST, path, Some(body))
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    /// This client for the tenants of `owner` (a name the server gave).
    pub(super) fn owned_by(&self, owner: &str) -> Client {
        Client {
            owner: Some(segment(owner)),
            ..self.clone()
        }
    }

    pub async fn tenant(&self, name: &str) -> Result<TenantView> {
        self.get(&format!("/v1/tenants/{}", self::name(name)?))
            .await
    }
}

/// A tenant or token name checked before it goes into a URL: the server would refuse a bad
/// one anyway, but a name like `..` must never become a different path.
pub(super) fn name(name: &str) -> Result<String> {
    crate::names::TenantName::parse(name)
        .map(|_| segment(name))
        .map_err(|e| Error::Client(format!("{name:?}: {e}")))
}

/// `path` with `owner=` added when it is about one tenant (`/v1/tenants/<name>...`): in one
/// place, so every command that names a tenant (and every `--wait` that polls one) means the
/// same owner's. `owner` is already a checked, escaped name.
pub(super) fn with_owner(path: &str, owner: Option<&str>) -> String {
    let one_tenant = path
        .strip_prefix("/v1/tenants/")
        .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('?'));
    match owner {
        Some(o) if one_tenant => {
            let sep = if path.contains('?') { '&' } else { '?' };
            format!("{path}{sep}owner={o}")
        }
        _ => path.to_owned(),
    }
}

/// A name as one URL path segment: anything outside the name alphabet is escaped.
pub(super) fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
