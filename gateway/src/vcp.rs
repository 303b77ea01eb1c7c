//! The gateway's two calls to vcp's API, the I/O edge of sleep mode.
//!
//! Data flow: [`crate::wake`] calls [`Vcp::wake`] (`POST /v1/gateway/wake`, `{"key"}`) when a
//! connection arrives for an asleep tenant, and [`crate::activity`] calls [`Vcp::report`]
//! (`POST /v1/gateway/activity`, `{"tenants":[{"key","at"}]}`) every interval. Both carry the
//! gateway's bearer token, and each call is bounded by [`CALL_TIMEOUT`]: a vcp that hangs
//! delays a wake or a report, never the proxy. The answers become plain values ([`Woken`], the
//! count of moved tenants) or an [`Error`]; what to do about an error is the caller's.

use crate::route::TenantKey;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, SystemTime};

/// Bound on each call to vcp, from connecting to the last byte of the answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most tenants one activity report may name (vcp's `MAX_ACTIVITY`).
pub const MAX_REPORT: usize = 500;

const WAKE: &str = "/v1/gateway/wake";
const ACTIVITY: &str = "/v1/gateway/activity";

/// vcp's base URL (`http://vcp.vcp-system.svc:8080`): http or https, no query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VcpUrl(String);

impl VcpUrl {
    pub fn new(s: &str) -> Result<VcpUrl, String> {
        let url = reqwest::Url::parse(s).map_err(|e| format!("not a URL: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err("must be an http or https URL".into());
        }
        if url.query().is_some() || url.fragment().is_some() || url.cannot_be_a_base() {
            return Err("must be a base URL, without a query or fragment".into());
        }
        // The routes are appended to it: `http://vcp/` and `http://vcp` are the same base.
        Ok(VcpUrl(url.as_str().trim_end_matches('/').to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for VcpUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The gateway's bearer token for vcp. Its `Debug` hides it, so no log line or panic message
/// can carry it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A token as given, less surrounding whitespace (the newline a Secret file often ends
    /// with); [`Vcp::new`] checks it. Parsing never fails, so no error message can quote it.
    pub fn unchecked(s: &str) -> Token {
        Token(s.trim().to_owned())
    }

    /// Whether it fits an `Authorization` header: printable ASCII without spaces, not empty.
    pub fn is_valid(&self) -> bool {
        !self.0.is_empty() && self.0.bytes().all(|b| b.is_ascii_graphic())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// What vcp answered a wake.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// 202: the tenant is waking (`woken`: this call woke it) or was awake already.
    Waking { woken: bool },
    /// 404: no live tenant has the key.
    NotFound,
}

/// One tenant in an activity report: its key and when it last had a connection open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub key: TenantKey,
    pub at: SystemTime,
}

#[derive(Serialize)]
struct WakeBody<'a> {
    key: &'a str,
}

#[derive(Deserialize)]
struct WakeAnswer {
    woken: bool,
}

#[derive(Serialize)]
struct ReportBody<'a> {
    tenants: Vec<SeenBody<'a>>,
}

#[derive(Serialize)]
struct SeenBody<'a> {
    key: &'a str,
    at: String,
}

#[derive(Deserialize)]
struct ReportAnswer {
    moved: u64,
}

/// RFC 3339 in UTC, as vcp's API takes it.
pub fn rfc3339(at: SystemTime) -> String {
    let at = time::OffsetDateTime::from(at);
    // Formatting a UTC time as RFC 3339 fails only for years outside 0..=9999.
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_owned())
}

/// A client of vcp's gateway routes.
#[derive(Debug, Clone)]
pub struct Vcp {
    http: reqwest::Client,
    url: VcpUrl,
    token: Token,
}

impl Vcp {
    pub fn new(url: VcpUrl, token: Token) -> Result<Vcp> {
        if !token.is_valid() {
            return Err(Error::Token);
        }
        // reqwest is built without a bundled provider (rustls-no-provider): ring, as kube
        // uses. Installing twice is refused and harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            // vcp is the cluster's own Service: a proxy from the environment is for the way
            // out, not for it, and a redirect could only take the token somewhere else.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(Error::HttpClient)?;
        Ok(Vcp { http, url, token })
    }

    pub fn url(&self) -> &VcpUrl {
        &self.url
    }

    async fn post(&self, call: &'static str, body: &impl Serialize) -> Result<reqwest::Response> {
        let fail = |source| Error::VcpCall { call, source };
        self.http
            .post(format!("{}{call}", self.url))
            .bearer_auth(&self.token.0)
            .json(body)
            .send()
            .await
            .map_err(fail)
    }

    /// Asks vcp to wake the tenant with `key` (`POST /v1/gateway/wake`).
    pub async fn wake(&self, key: &TenantKey) -> Result<Woken> {
        let answer = self.post(WAKE, &WakeBody { key: key.as_str() }).await?;
        match answer.status().as_u16() {
            200..=299 => {
                let body: WakeAnswer = answer
                    .json()
                    .await
                    .map_err(|source| Error::VcpCall { call: WAKE, source })?;
                Ok(Woken::Waking { woken: body.woken })
            }
            404 => Ok(Woken::NotFound),
            status => Err(refused(WAKE, status)),
        }
    }

    /// Tells vcp when the tenants of `tenants` last had connections (`POST
    /// /v1/gateway/activity`; at most [`MAX_REPORT`], each key once); how many tenants' last
    /// activity moved.
    pub async fn report(&self, tenants: &[Seen]) -> Result<u64> {
        let body = ReportBody {
            tenants: tenants
                .iter()
                .map(|s| SeenBody {
                    key: s.key.as_str(),
                    at: rfc3339(s.at),
                })
                .collect(),
        };
        let answer = self.post(ACTIVITY, &body).await?;
        match answer.status().as_u16() {
            200..=299 => {
                let body: ReportAnswer = answer.json().await.map_err(|source| Error::VcpCall {
                    call: ACTIVITY,
                    source,
                })?;
                Ok(body.moved)
            }
            status => Err(refused(ACTIVITY, status)),
        }
    }
}

fn refused(call: &'static str, status: u16) -> Error {
    match status {
        401 | 403 => Error::VcpToken { call, status },
        _ => Error::VcpStatus { call, status },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_a_base_the_routes_are_appended_to() {
        let url = VcpUrl::new("http://vcp.vcp-system.svc:8080/").unwrap();
        assert_eq!(url.as_str(), "http://vcp.vcp-system.svc:8080");
        let prefixed = VcpUrl::new("https://example.test/vcp/").unwrap();
        assert_eq!(prefixed.as_str(), "https://example.test/vcp");
        for bad in ["", "vcp:8080", "ftp://vcp", "http://vcp/?a=1", "mailto:a@b"] {
            assert!(VcpUrl::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_token_is_never_printed_and_must_fit_a_header() {
        let token = Token::unchecked("s3cret-token\n");
        assert!(
            token.is_valid(),
            "the trailing newline of a Secret file is dropped"
        );
        assert!(!format!("{token:?}").contains("s3cret"));
        for bad in ["", "  ", "s3cret token", "a\nb", "\u{e9}"] {
            assert!(!Token::unchecked(bad).is_valid(), "{bad:?}");
        }
        let url = VcpUrl::new("http://127.0.0.1:1").unwrap();
        let refused = Vcp::new(url, Token::unchecked("s3cret token")).unwrap_err();
        assert!(!vcp_core::chain(&refused).contains("s3cret"));
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_250);
        assert_eq!(rfc3339(at), "2023-11-14T22:13:20.25Z");
        assert_eq!(rfc3339(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn a_refused_token_is_told_from_other_refusals() {
        assert!(matches!(refused(WAKE, 401), Error::VcpToken { .. }));
        assert!(matches!(refused(WAKE, 403), Error::VcpToken { .. }));
        assert!(matches!(
            refused(ACTIVITY, 500),
            Error::VcpStatus { status: 500, .. }
        ));
    }
}
