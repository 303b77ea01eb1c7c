//! The web console (`/ui`): one HTML page, one script and one style sheet, compiled into the
//! binary (`include_bytes!`) and served by `vcp serve` on the API's port (docs/console.md).
//!
//! Data flow: the browser loads the page without a token (it holds no data), asks the user for
//! an API token, keeps it in `sessionStorage`, and from then on reads and acts only through the
//! public `/v1` API with that token, as `vcp` and any other client do. So the console needs no
//! authorization of its own: an admin's token sees the fleet, an owner's only its tenants, and
//! every action (revoking a kubeconfig, pausing a fleet upgrade) is in the audit trail because
//! the API writes it there. Nothing here reads the inventory.
//!
//! The assets are answered with a strict Content-Security-Policy ([`CONTENT_SECURITY_POLICY`]):
//! scripts, styles and connections from this origin only, no inline script, no framing, no
//! form submission. Tenant names, labels and condition messages are user input shown on the
//! page; the script builds the page with `textContent` and `createElement` only, and the CSP is
//! the second line should that ever slip (a tenant's message can never become script). The
//! routes are not in the OpenAPI document: they are not the JSON API, and schemathesis and the
//! API's own checks (problem+json answers, a bearer token on every `/v1` route) do not apply to
//! a page ([`ROUTES`] is the list the API test holds them to instead).

use axum::Router;
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// One file of the console.
#[derive(Debug)]
pub struct Asset {
    /// Where it is served.
    pub path: &'static str,
    pub content_type: &'static str,
    pub body: &'static [u8],
}

/// The page, where every view starts (hash routes: `/ui#/tenants/shop`).
pub const PAGE: &str = "/ui";

/// Every file of the console, in the order [`ROUTES`] lists them.
pub const ASSETS: [Asset; 3] = [
    Asset {
        path: PAGE,
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("assets/index.html"),
    },
    Asset {
        path: "/ui/app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("assets/app.css"),
    },
    Asset {
        path: "/ui/app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("assets/app.js"),
    },
];

/// Every route the console adds to the server (`GET`, and `HEAD` with it): its files, and
/// `/ui/`, which redirects to the page (people type it; the page's own links are absolute, so
/// either would work, but one URL per page keeps bookmarks and logs alike).
pub const ROUTES: [&str; 4] = [PAGE, "/ui/", "/ui/app.css", "/ui/app.js"];

/// The policy every console answer carries. `default-src 'self'` with nothing inline: the
/// page's script and style are files of this origin, and it connects only to this origin's
/// API. `form-action 'none'`: the login form is handled by the script, and if the script did
/// not run, submitting it must not put the token into a URL (and so into logs and history).
/// `frame-ancestors 'none'`: no other site may frame the console to trick a click on Revoke.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self'; connect-src 'self'; object-src 'none'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

/// `no-cache`: a browser may keep the files but must ask again before each use (answered 304
/// by [`ETAGS`] while they are the same). They change with vcp's version under the same URL, so
/// no answer may be taken as fresh without asking: after an upgrade of vcp, an old script must
/// never run against the new API.
pub const CACHE_CONTROL: &str = "no-cache";

/// Each asset's entity tag: the start of its SHA-256, computed once.
static ETAGS: LazyLock<[String; 3]> = LazyLock::new(|| ASSETS.each_ref().map(|a| etag(a.body)));

fn etag(body: &[u8]) -> String {
    let digest = Sha256::digest(body);
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("\"{hex}\"")
}

/// The asset served at `path`, if any.
pub fn asset(path: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|a| a.path == path)
}

/// The console's routes, for [`crate::api::router`] to merge beside the API's (they need no
/// state: the files are in the binary).
pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut r = Router::new().route(
        "/ui/",
        get(|| async { (StatusCode::PERMANENT_REDIRECT, [(header::LOCATION, PAGE)]) }),
    );
    for a in &ASSETS {
        r = r.route(a.path, get(serve_asset));
    }
    r
}

/// One of the console's files, with its security headers; 304 when the browser's copy is
/// current.
#[tracing::instrument(level = "debug", skip_all, fields(path = %uri.path()))]
async fn serve_asset(uri: Uri, headers: HeaderMap) -> Response {
    match ASSETS.iter().position(|a| a.path == uri.path()) {
        Some(i) => respond(&ASSETS[i], &ETAGS[i], headers.get(header::IF_NONE_MATCH)),
        // Routed only for the paths of ASSETS; kept total rather than trusting that.
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The answer to a request for `a` whose entity tag is `etag`: 304 without a body when
/// `If-None-Match` names it (or is `*`), else 200 with the file. Both carry the security
/// headers, since a 304 updates the headers of the copy the browser keeps.
pub fn respond(a: &Asset, etag: &str, if_none_match: Option<&HeaderValue>) -> Response {
    let current = if_none_match
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').map(str::trim).any(|t| t == etag || t == "*"));
    let mut h = HeaderMap::new();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static(CACHE_CONTROL),
    );
    // For browsers that predate `frame-ancestors`.
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // The page's URL says which tenant is looked at; no other site needs to learn it.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // Hex in quotes is always a valid header value; were it not, the answer would only lose
    // its caching.
    if let Ok(v) = HeaderValue::from_str(etag) {
        h.insert(header::ETAG, v);
    }
    if current {
        return (StatusCode::NOT_MODIFIED, h).into_response();
    }
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(a.content_type),
    );
    (StatusCode::OK, h, a.body).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn text(a: &Asset) -> &'static str {
        std::str::from_utf8(a.body).expect("assets are UTF-8")
    }

    async fn get_path(path: &str, inm: Option<&str>) -> Response {
        let mut req = Request::get(path);
        if let Some(v) = inm {
            req = req.header(header::IF_NONE_MATCH, v);
        }
        router::<()>()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn every_asset_is_served_with_its_type_and_the_security_headers() {
        for a in &ASSETS {
            let r = get_path(a.path, None).await;
            assert_eq!(r.status(), StatusCode::OK, "{}", a.path);
            let h = r.headers();
            assert_eq!(h[header::CONTENT_TYPE], a.content_type, "{}", a.path);
            assert_eq!(h[header::CONTENT_SECURITY_POLICY], CONTENT_SECURITY_POLICY);
            assert_eq!(h[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
            assert_eq!(h[header::CACHE_CONTROL], "no-cache");
            assert_eq!(h[header::X_FRAME_OPTIONS], "DENY");
            let body = axum::body::to_bytes(r.into_body(), usize::MAX)
                .await
                .unwrap();
            assert_eq!(&body[..], a.body, "{}", a.path);
        }
        let types: Vec<&str> = ASSETS.iter().map(|a| a.content_type).collect();
        assert!(types[0].starts_with("text/html") && types[2].starts_with("text/javascript"));
    }

    #[tokio::test]
    async fn a_current_copy_is_answered_304_and_a_stale_one_the_file() {
        let r = get_path("/ui/app.js", None).await;
        let tag = r.headers()[header::ETAG].to_str().unwrap().to_owned();
        assert!(
            tag.starts_with('"') && tag.ends_with('"') && tag.len() == 26,
            "{tag}"
        );
        for inm in [tag.clone(), format!("\"old\", {tag}"), "*".to_owned()] {
            let r = get_path("/ui/app.js", Some(&inm)).await;
            assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{inm}");
            assert_eq!(
                r.headers()[header::CONTENT_SECURITY_POLICY],
                CONTENT_SECURITY_POLICY
            );
        }
        let r = get_path("/ui/app.js", Some("\"old\"")).await;
        assert_eq!(r.status(), StatusCode::OK);
        // Each file has a tag of its own.
        let tags: std::collections::BTreeSet<&String> = ETAGS.iter().collect();
        assert_eq!(tags.len(), ASSETS.len());
    }

    #[tokio::test]
    async fn the_routes_are_the_assets_and_a_redirect_and_nothing_else() {
        let r = get_path("/ui/", None).await;
        assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(r.headers()[header::LOCATION], PAGE);
        for other in [
            "/ui/index.html",
            "/ui/app.js.map",
            "/ui/../v1/tenants",
            "/uix",
        ] {
            assert_eq!(
                get_path(other, None).await.status(),
                StatusCode::NOT_FOUND,
                "{other}"
            );
        }
        let mut routes: Vec<&str> = ASSETS.iter().map(|a| a.path).collect();
        routes.insert(1, "/ui/");
        assert_eq!(routes, ROUTES);
        assert!(asset("/ui/app.css").is_some() && asset("/ui/").is_none());
    }

    /// The page runs only its own files: no inline script or style, no handler attributes, and
    /// every file it names is one the server has (the CSP would block anything else, and the
    /// page would break silently).
    #[test]
    fn the_page_loads_only_its_own_files_and_has_nothing_inline() {
        let html = text(&ASSETS[0]);
        let lower = html.to_lowercase();
        assert!(!lower.contains("<style"), "inline style element");
        assert!(!lower.contains(" style="), "inline style attribute");
        let handler = fancy_regex::Regex::new(r"\son[a-z]+\s*=").unwrap();
        assert!(!handler.is_match(&lower).unwrap(), "handler attribute");
        for script in lower.split("<script").skip(1) {
            let (open, rest) = script.split_once('>').unwrap();
            assert!(open.contains("src=\"/ui/"), "a script without src: {open}");
            assert!(rest.starts_with("</script>"), "inline script body");
        }
        let mut named = Vec::new();
        for attr in ["src=\"", "href=\""] {
            for part in html.split(attr).skip(1) {
                let url = part.split('"').next().unwrap();
                if !url.starts_with('#') {
                    named.push(url.to_owned());
                }
            }
        }
        named.sort();
        assert_eq!(named, ["/ui/app.css", "/ui/app.js"]);
    }

    /// What the script puts into the page is text: it never parses strings as HTML or code,
    /// and it calls the API from one function, which records every request for the tests.
    #[test]
    fn the_script_never_parses_data_as_html_and_fetches_in_one_place() {
        let js = text(&ASSETS[2]);
        let code: String = js
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for banned in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
            "new Function",
            "setAttribute('style'",
            "setAttribute(\"style\"",
            "javascript:",
        ] {
            assert!(!code.contains(banned), "app.js uses {banned}");
        }
        assert_eq!(code.matches("fetch(").count(), 1, "one place calls fetch");
        assert!(code.contains("window.vcpRequests"));
        assert!(code.contains("sessionStorage"));
        assert!(
            !code.contains("localStorage"),
            "the token must not outlive the tab"
        );
    }

    #[test]
    fn the_policy_allows_nothing_inline_and_nothing_foreign() {
        let p = CONTENT_SECURITY_POLICY;
        assert!(p.starts_with("default-src 'self';"));
        for d in p.split(';').map(str::trim) {
            assert!(!d.contains("unsafe"), "{d}");
            assert!(!d.contains("http") && !d.contains('*'), "{d}");
        }
        for must in [
            "script-src 'self'",
            "object-src 'none'",
            "frame-ancestors 'none'",
            "form-action 'none'",
            "base-uri 'none'",
        ] {
            assert!(p.contains(must), "{must}");
        }
    }
}
