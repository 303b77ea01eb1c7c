//! What the client commands share, below every feature's command: the HTTP client (where the
//! API is, the bearer token, the owner a call acts for, and how answers and problems decode),
//! the `--output` and `--wait` flags, and the parsing of labels, windows, durations and times.
//! [`output`] lays out tables and structured output.

pub mod output;

use crate::http::problem::ProblemBody;
use crate::window::MaintenanceWindow;
use crate::{Error, Result};
use output::Format;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::io::Write as _;
use std::time::Duration;
use time::OffsetDateTime;

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

    pub(crate) async fn call<T: DeserializeOwned>(
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

    pub(crate) async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.call(reqwest::Method::GET, path, None::<&()>)
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    pub(crate) async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<T> {
        self.call(reqwest::Method::POST, path, Some(body))
            .await?
            .ok_or_else(|| Error::Client(format!("empty answer from {path}")))
    }

    /// This client for the tenants of `owner` (a name the server gave).
    pub(crate) fn owned_by(&self, owner: &str) -> Client {
        Client {
            owner: Some(segment(owner)),
            ..self.clone()
        }
    }
}

/// A tenant or token name checked before it goes into a URL: the server would refuse a bad
/// one anyway, but a name like `..` must never become a different path.
pub fn name(name: &str) -> Result<String> {
    crate::names::TenantName::parse(name)
        .map(|_| segment(name))
        .map_err(|e| Error::Client(format!("{name:?}: {e}")))
}

/// `path` with `owner=` added when it is about one tenant (`/v1/tenants/<name>...`): in one
/// place, so every command that names a tenant (and every `--wait` that polls one) means the
/// same owner's. `owner` is already a checked, escaped name.
pub fn with_owner(path: &str, owner: Option<&str>) -> String {
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
pub fn segment(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Output format flag shared by the listing commands.
#[derive(Debug, Clone, clap::Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(
        short = 'o',
        long = "output",
        env = "VCP_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: Format,
}

#[derive(Debug, Clone, clap::Args)]
pub struct WaitArgs {
    /// Wait until done, showing progress on stderr.
    #[arg(long, env = "VCP_WAIT")]
    pub wait: bool,
    /// Give up waiting after this long (e.g. 90s, 10m).
    #[arg(long, env = "VCP_WAIT_TIMEOUT", default_value = "10m", value_parser = duration)]
    pub timeout: Duration,
}

pub fn window(s: &str) -> Result<MaintenanceWindow, String> {
    s.parse()
        .map_err(|e: crate::window::WindowError| e.to_string())
}

pub fn duration(s: &str) -> Result<Duration, String> {
    crate::names::parse_ttl(s).ok_or_else(|| format!("{s:?} is not a duration like 90s, 10m or 1h"))
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
pub fn print(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Error::Client(format!("cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

pub fn progress(line: &str) {
    eprintln!("{line}");
}

pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

pub fn labels(pairs: &[String]) -> Result<BTreeMap<String, String>> {
    pairs
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
            _ => Err(Error::Client(format!("--label {p:?}: expected KEY=VALUE"))),
        })
        .collect()
}

/// Follows a paged listing from its start: `fetch(cursor, page_size)` asks for one page
/// (`cursor` `None` for the first) and answers its items and the cursor of the next page, if
/// any. Stops after `limit` items (0: every page), asking for at most `max_page` at a time.
/// The items, and the cursor the listing stopped at (`None`: nothing more matched).
pub async fn pages<T, C, F, Fut>(
    limit: usize,
    max_page: usize,
    mut fetch: F,
) -> Result<(Vec<T>, Option<C>)>
where
    C: Clone,
    F: FnMut(Option<C>, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, Option<C>)>>,
{
    let mut all = Vec::new();
    let mut cursor = None;
    loop {
        let left = if limit == 0 {
            max_page
        } else {
            limit - all.len()
        };
        let (items, next) = fetch(cursor, left.min(max_page)).await?;
        all.extend(items);
        match next {
            Some(n) if limit == 0 || all.len() < limit => cursor = Some(n),
            next => return Ok((all, next)),
        }
    }
}

/// A `--since`/`--until` value as the API takes it: an RFC 3339 time as given, or an age
/// (`12h`) as the time that long before `now`.
pub fn instant(flag: &str, v: &str, now: OffsetDateTime) -> Result<String> {
    let rfc3339 = &time::format_description::well_known::Rfc3339;
    if OffsetDateTime::parse(v, rfc3339).is_ok() {
        return Ok(v.to_owned());
    }
    crate::names::parse_ttl(v)
        .and_then(|d| time::Duration::try_from(d).ok())
        .and_then(|d| now.checked_sub(d))
        .and_then(|t| t.format(rfc3339).ok())
        .ok_or_else(|| {
            Error::Client(format!(
                "{flag} {v:?}: expected an RFC 3339 time (2026-01-01T00:00:00Z) or an age (90m, 12h, 30d)"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_stay_one_path_segment() {
        assert_eq!(segment("team-a"), "team-a");
        assert_eq!(segment("../tokens"), "%2E%2E%2Ftokens");
        assert!(name("..").is_err());
        assert_eq!(name("team-a").unwrap(), "team-a");
        assert_eq!(segment("a b?c"), "a%20b%3Fc");
    }

    #[test]
    fn usage_range_flags_take_rfc3339_times_or_ages() {
        let now = OffsetDateTime::from_unix_timestamp(1_800_000_000).unwrap();
        assert_eq!(
            instant("--since", "2026-01-01T00:00:00+02:00", now).unwrap(),
            "2026-01-01T00:00:00+02:00",
            "a time goes to the server as given"
        );
        assert_eq!(
            instant("--since", "12h", now).unwrap(),
            "2027-01-14T20:00:00Z"
        );
        for bad in ["yesterday", "2026-01-01", "-1h", ""] {
            let e = instant("--until", bad, now).unwrap_err().to_string();
            assert!(e.starts_with("--until"), "{bad}: {e}");
        }
        // `+` in an offset must survive the query string.
        assert_eq!(
            segment("2026-01-01T00:00:00+02:00"),
            "2026-01-01T00%3A00%3A00%2B02%3A00"
        );
    }

    #[test]
    fn owner_goes_with_every_request_about_one_tenant() {
        let o = Some("team-b");
        assert_eq!(with_owner("/v1/tenants/a", o), "/v1/tenants/a?owner=team-b");
        assert_eq!(
            with_owner("/v1/tenants/a?retain_data=true", o),
            "/v1/tenants/a?retain_data=true&owner=team-b"
        );
        assert_eq!(
            with_owner("/v1/tenants/a/kubeconfigs/0f", o),
            "/v1/tenants/a/kubeconfigs/0f?owner=team-b"
        );
        // Not about one tenant: the list, creating one, tokens, the fleet.
        for p in [
            "/v1/tenants",
            "/v1/tenants/",
            "/v1/tokens/a",
            "/v1/fleet-upgrades",
        ] {
            assert_eq!(with_owner(p, o), p);
        }
        assert_eq!(with_owner("/v1/tenants/a", None), "/v1/tenants/a");
    }

    #[test]
    fn labels_parse_as_key_value() {
        let l = labels(&["team=a".into(), "tier=".into()]).unwrap();
        assert_eq!(l["team"], "a");
        assert_eq!(l["tier"], "");
        assert!(labels(&["=x".into()]).is_err());
        assert!(labels(&["novalue".into()]).is_err());
    }
}
