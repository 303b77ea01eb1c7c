//! The HTTP API of a real `vcp serve` (no reconcile workers, so nothing is provisioned):
//! authentication, owner isolation, and bad input answered with 4xx problem+json.

use reqwest::Method;
use serde_json::{Value, json};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::postgres::EphemeralPostgres;

/// Owner tokens of these names, created by `admin`; a client with each.
async fn owner_tokens(admin: &ApiClient, names: &[&str]) -> anyhow::Result<Vec<ApiClient>> {
    let mut owners = Vec::new();
    for name in names {
        let (s, b) = admin
            .raw(
                Method::POST,
                "/v1/tokens",
                Some(&json!({"name": name, "role": "owner"})),
            )
            .await?;
        assert_eq!(s, 201, "{b}");
        owners.push(admin.with_token(b["token"].as_str().unwrap()));
    }
    Ok(owners)
}

fn assert_problem(status: u16, body: &Value, want: u16, field: Option<&str>) {
    assert_eq!(status, want, "{body}");
    assert!(
        body["type"]
            .as_str()
            .is_some_and(|t| t.starts_with("https://vcp.dev/problems/")),
        "not a problem document: {body}"
    );
    assert_eq!(body["status"], want, "{body}");
    if let Some(f) = field {
        assert_eq!(body["field"], f, "{body}");
    }
}

#[tokio::test]
async fn tokens_roles_isolation_and_bad_input() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api", 0).await?;
    let (orch, admin) = (&p.orchestrator, &p.admin);
    let admin_token = p.admin_token.clone();

    // Authentication.
    let anonymous = admin.with_token("");
    let (s, b) = anonymous.raw(Method::GET, "/v1/tenants", None).await?;
    assert_problem(s, &b, 401, None);
    let (s, b) = admin
        .with_token("vcp_nope")
        .raw(Method::GET, "/v1/tenants", None)
        .await?;
    assert_problem(s, &b, 401, None);

    // Owner tokens: created by an admin, shown once.
    let owners = owner_tokens(admin, &["team-a", "team-b"]).await?;
    let (a, b) = (&owners[0], &owners[1]);
    let (s, body) = a
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "x", "role": "admin"})),
        )
        .await?;
    assert_problem(s, &body, 403, None);
    let (s, body) = a.raw(Method::GET, "/v1/tokens", None).await?;
    assert_problem(s, &body, 403, None);
    let (s, body) = a.raw(Method::DELETE, "/v1/tokens/team-b", None).await?;
    assert_problem(s, &body, 403, None);
    let (s, body) = admin
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "team-a", "role": "owner"})),
        )
        .await?;
    assert_problem(s, &body, 409, Some("name"));
    let (s, body) = admin
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "t", "role": "root"})),
        )
        .await?;
    assert_problem(s, &body, 422, Some("role"));

    // Owners see and change only their own tenants; others answer 404.
    let (s, t) = a
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": "shop", "labels": {"env": "dev"}})),
        )
        .await?;
    assert_eq!(s, 201, "{t}");
    assert_eq!(
        (t["phase"].as_str(), t["owner"].as_str()),
        (Some("Pending"), Some("team-a"))
    );
    assert_eq!(t["kubernetes_version"], "v1.37.1");
    let (s, _) = b
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": "blog", "version": "1.36"})),
        )
        .await?;
    assert_eq!(s, 201);
    for (method, path, body) in [
        (Method::GET, "/v1/tenants/shop", None),
        (Method::DELETE, "/v1/tenants/shop", None),
        (
            Method::POST,
            "/v1/tenants/shop/kubeconfigs",
            Some(json!({"user": "mallory", "groups": ["admin"]})),
        ),
        (Method::GET, "/v1/tenants/shop/kubeconfigs", None),
        (Method::GET, "/v1/tenants/shop/usage", None),
        (
            Method::GET,
            "/v1/tenants/shop/usage?since=2026-01-01T00:00:00Z",
            None,
        ),
        // Another owner's tenant answers 404 before its query is looked at.
        (Method::GET, "/v1/tenants/shop/usage?since=garbage", None),
    ] {
        let (s, body) = b.raw(method, path, body.as_ref()).await?;
        assert_problem(s, &body, 404, None);
    }
    let (_, list) = b.raw(Method::GET, "/v1/tenants", None).await?;
    let names: Vec<&str> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["blog"]);
    let (_, list) = admin.raw(Method::GET, "/v1/tenants", None).await?;
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        2,
        "admins see the fleet"
    );
    // Kubeconfigs wait for Ready.
    let (s, body) = a
        .raw(
            Method::POST,
            "/v1/tenants/shop/kubeconfigs",
            Some(&json!({"user": "alice"})),
        )
        .await?;
    assert_problem(s, &body, 409, None);

    // Bad input: 4xx problem+json naming the field, never 5xx.
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"name": "Shop"}), 422, "name"),
        (json!({"name": "-shop"}), 422, "name"),
        (json!({"name": "a".repeat(41)}), 422, "name"),
        (json!({"name": ""}), 422, "name"),
        (json!({"name": "ok1", "version": "1.12"}), 422, "version"),
        (json!({"name": "ok2", "plan": "gold"}), 422, "plan"),
        (
            json!({"name": "ok3", "labels": {"a b": "c"}}),
            422,
            "labels",
        ),
        (json!({"name": "shop"}), 409, "name"),
        (json!({"name": "ok4", "colour": "blue"}), 422, "colour"),
        (json!({"version": "1.37"}), 422, "name"),
        (json!({"name": 7}), 422, "name"),
    ];
    for (body, want, field) in cases {
        let (s, got) = a.raw(Method::POST, "/v1/tenants", Some(&body)).await?;
        assert_problem(s, &got, want, Some(field));
    }
    let http = reqwest::Client::new();
    let send = |body: Vec<u8>, ctype: &'static str| {
        http.post(format!("{}/v1/tenants", orch.url))
            .bearer_auth(&admin_token)
            .header("content-type", ctype)
            .body(body)
            .send()
    };
    for (body, ctype, want) in [
        (b"{\"name\": ".to_vec(), "application/json", 400),
        (b"not json".to_vec(), "application/json", 400),
        (b"{\"name\": \"x\"}".to_vec(), "text/plain", 415),
        (
            format!("{{\"name\": \"{}\"}}", "x".repeat(100_000)).into_bytes(),
            "application/json",
            413,
        ),
    ] {
        let r = send(body, ctype).await?;
        let s = r.status().as_u16();
        assert_eq!(r.headers()["content-type"], "application/problem+json");
        let b: Value = r.json().await?;
        assert_problem(s, &b, want, None);
    }
    let (s, body) = admin.raw(Method::GET, "/v1/nothing-here", None).await?;
    assert_problem(s, &body, 404, None);

    // Revoked tokens stop working at once.
    let (s, _) = admin.raw(Method::DELETE, "/v1/tokens/team-b", None).await?;
    assert_eq!(s, 204);
    let (s, body) = b.raw(Method::GET, "/v1/tenants", None).await?;
    assert_problem(s, &body, 401, None);
    let (s, body) = admin.raw(Method::DELETE, "/v1/tokens/team-b", None).await?;
    assert_problem(s, &body, 404, None);

    // Usage: none before the first sample (no workers: never Ready, never sampled), the
    // plan's limits with it; bad ranges refused naming the parameter.
    let (s, t) = a.raw(Method::GET, "/v1/tenants/shop", None).await?;
    assert_eq!(s, 200, "{t}");
    assert!(t["usage"].is_null(), "{t}");
    let (s, u) = a.raw(Method::GET, "/v1/tenants/shop/usage", None).await?;
    assert_eq!(s, 200, "{u}");
    assert_eq!(u["items"], json!([]), "{u}");
    assert!(u["next_since"].is_null(), "{u}");
    assert_eq!(
        u["limits"]["pods"], 100,
        "the dev plan has the default quota: {u}"
    );
    assert_eq!(u["limits"]["requests_cpu"], 20_000, "{u}");
    let (s, u) = admin
        .raw(
            Method::GET,
            "/v1/tenants/shop/usage?since=2026-01-01T00:00:00%2B02:00&until=2026-01-02T00:00:00Z&limit=5",
            None,
        )
        .await?;
    assert_eq!(s, 200, "admins see every tenant's usage: {u}");
    assert_eq!(
        (u["since"].as_str(), u["until"].as_str()),
        (Some("2025-12-31T22:00:00Z"), Some("2026-01-02T00:00:00Z"))
    );
    for (query, want, field) in [
        (
            "since=2026-02-01T00:00:00Z&until=2026-01-01T00:00:00Z",
            422,
            Some("since"),
        ),
        ("since=yesterday", 422, Some("since")),
        ("since=2026-01-01", 422, Some("since")),
        ("until=2026-13-01T00:00:00Z", 422, Some("until")),
        ("until=1767225600", 422, Some("until")),
        ("limit=0", 422, Some("limit")),
        ("limit=10001", 422, Some("limit")),
        ("limit=many", 400, Some("limit")),
        ("limit=-1", 400, Some("limit")),
        (
            "since=2026-01-01T00:00:00Z&since=2026-01-02T00:00:00Z",
            400,
            Some("since"),
        ),
    ] {
        let (s, body) = a
            .raw(
                Method::GET,
                &format!("/v1/tenants/shop/usage?{query}"),
                None,
            )
            .await?;
        assert_problem(s, &body, want, field);
    }
    let (s, body) = anonymous
        .raw(Method::GET, "/v1/tenants/shop/usage", None)
        .await?;
    assert_problem(s, &body, 401, None);

    // Deletion is accepted and visible; versions list the catalog's three minors.
    let (s, t) = a.raw(Method::DELETE, "/v1/tenants/shop", None).await?;
    assert_eq!((s, t["phase"].as_str()), (202, Some("Deleting")));
    let (s, v) = a.raw(Method::GET, "/v1/versions", None).await?;
    assert_eq!(s, 200);
    assert_eq!(v["default"], "1.37");
    assert_eq!(v["versions"].as_array().unwrap().len(), 3);

    let metrics = reqwest::get(format!("{}/metrics", orch.url))
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("vcp_http_client_errors_total"),
        "{metrics}"
    );
    assert!(
        metrics.contains("vcp_usage_sample_errors_total 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("vcp_tenants{phase=\"Deleting\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("vcp_http_server_errors_total 0"),
        "{metrics}"
    );
    Ok(())
}

/// The web console (docs/console.md): its page and files need no token (they hold no data)
/// and carry a strict Content-Security-Policy, nosniff and a revalidating cache; the API the
/// page calls still refuses a request without a valid token.
#[tokio::test]
async fn the_console_needs_no_token_and_carries_its_security_headers_but_the_api_does()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-console", 0).await?;
    let (url, admin) = (&p.orchestrator.url, &p.admin);
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    for (path, kind, holds) in [
        (
            "/ui",
            "text/html; charset=utf-8",
            "<script src=\"/ui/app.js\"",
        ),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "window.vcpRequests",
        ),
        ("/ui/app.css", "text/css; charset=utf-8", "font-family"),
    ] {
        for token in [None, Some("vcp_nope"), Some(p.admin_token.as_str())] {
            let mut req = http.get(format!("{url}{path}"));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            let r = req.send().await?;
            assert_eq!(r.status(), 200, "{path} with token {token:?}");
            let h = r.headers().clone();
            assert_eq!(h["content-type"], kind, "{path}");
            let csp = h["content-security-policy"].to_str()?;
            assert!(
                csp.starts_with("default-src 'self'; script-src 'self';")
                    && csp.contains("frame-ancestors 'none'")
                    && !csp.contains("unsafe"),
                "{path}: {csp}"
            );
            assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
            assert_eq!(h["cache-control"], "no-cache", "{path}");
            let body = r.text().await?;
            assert!(body.contains(holds), "{path}: {body}");
            // A browser's copy is revalidated, not fetched again.
            let r = http
                .get(format!("{url}{path}"))
                .header("if-none-match", h["etag"].clone())
                .send()
                .await?;
            assert_eq!(r.status(), 304, "{path}");
        }
        let r = http.head(format!("{url}{path}")).send().await?;
        assert_eq!(r.status(), 200, "HEAD {path}");
        let r = http.post(format!("{url}{path}")).send().await?;
        assert_eq!(r.status(), 405, "POST {path}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
    let r = http.get(format!("{url}/ui/")).send().await?;
    assert_eq!(r.status(), 308);
    assert_eq!(r.headers()["location"], "/ui");
    let r = http.get(format!("{url}/ui/secrets.json")).send().await?;
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    // The API the page calls: the page's own requests carry the token the user gave.
    for token in [None, Some("vcp_nope")] {
        let mut req = http.get(format!("{url}/v1/tenants"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        let r = req.send().await?;
        assert_eq!(r.status(), 401, "/v1/tenants with token {token:?}");
    }
    let (s, b) = admin.raw(Method::GET, "/v1/tenants", None).await?;
    assert_eq!(s, 200, "{b}");
    // The files are counted by route, like the API's answers.
    let metrics = reqwest::get(format!("{url}/metrics")).await?.text().await?;
    assert!(
        metrics.contains(
            r#"vcp_http_request_duration_seconds_count{method="GET",route="/ui/app.js",status="200"} 3"#
        ),
        "{metrics}"
    );
    Ok(())
}

/// `/metrics` times requests by route template (never by path) and status, and has the pass
/// histograms from the start, on the prometheus-client registry.
#[tokio::test]
async fn metrics_time_requests_by_route_and_serve_the_pass_histograms() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-metrics", 0).await?;
    let (orch, admin) = (&p.orchestrator, &p.admin);
    for _ in 0..3 {
        let (s, _) = admin.raw(Method::GET, "/v1/versions", None).await?;
        assert_eq!(s, 200);
    }
    for name in ["nope", "other"] {
        let (s, _) = admin
            .raw(Method::GET, &format!("/v1/tenants/{name}"), None)
            .await?;
        assert_eq!(s, 404);
    }
    let (s, _) = admin.raw(Method::GET, "/v1/no/such/route", None).await?;
    assert_eq!(s, 404);
    let r = reqwest::get(format!("{}/metrics", orch.url)).await?;
    assert_eq!(
        r.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    let metrics = r.text().await?;
    for line in [
        r#"vcp_http_request_duration_seconds_count{method="GET",route="/v1/versions",status="200"} 3"#,
        r#"vcp_http_request_duration_seconds_count{method="GET",route="/v1/tenants/{name}",status="404"} 2"#,
        r#"vcp_http_request_duration_seconds_count{method="GET",route="unmatched",status="404"} 1"#,
        r#"vcp_http_request_duration_seconds_bucket{le="+Inf",method="GET",route="/v1/versions",status="200"} 3"#,
        r#"vcp_reconcile_pass_duration_seconds_count{pass="bring_up"} 0"#,
        r#"vcp_reconcile_pass_duration_seconds_count{pass="tear_down"} 0"#,
        "# TYPE vcp_http_request_duration_seconds histogram",
        "# TYPE vcp_reconcile_pass_duration_seconds histogram",
        r#"vcp_tenants{phase="Ready"} 0"#,
        "vcp_http_server_errors_total 0",
    ] {
        assert!(metrics.contains(line), "{line} missing in:\n{metrics}");
    }
    assert!(!metrics.contains("nope"), "a path became a label value");
    Ok(())
}

/// Times RFC 3339 can write whose UTC is outside the years 0000 to 9999 are clamped to those
/// years. They answered 500 (a panic converting to UTC, or an answer with the year -1 that
/// could not be written), and the schemathesis contract test generates such times: any date,
/// any offset up to ±23:59.
#[tokio::test]
async fn usage_ranges_at_the_ends_of_rfc3339_time_are_answered() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api-time-ends", 0).await?;
    let admin = &p.admin;
    admin.create_tenant("edge").await?;
    let last = "9999-12-31T23:59:59.999999999Z";
    for (query, since, until) in [
        // 10000-01-01T00:58:59Z in UTC.
        (
            "until=9999-12-31T23:59:59-00:59",
            "9999-12-30T23:59:59.999999999Z",
            last,
        ),
        // The default `since` a day before would be in the year -1.
        (
            "until=0000-01-01T00:00:00Z",
            "0000-01-01T00:00:00Z",
            "0000-01-01T00:00:00Z",
        ),
        // -0001-12-31T23:00:00Z in UTC.
        (
            "since=0000-01-01T00:00:00%2B01:00&until=0001-01-01T00:00:00Z",
            "0000-01-01T00:00:00Z",
            "0001-01-01T00:00:00Z",
        ),
    ] {
        let (s, u) = admin
            .raw(
                Method::GET,
                &format!("/v1/tenants/edge/usage?{query}"),
                None,
            )
            .await?;
        assert_eq!(s, 200, "{query}: {u}");
        assert_eq!(
            (u["since"].as_str(), u["until"].as_str()),
            (Some(since), Some(until)),
            "{query}"
        );
    }
    // After `until` (now) once clamped: refused, not a panic.
    let (s, body) = admin
        .raw(
            Method::GET,
            "/v1/tenants/edge/usage?since=9999-12-31T23:59:59-23:59",
            None,
        )
        .await?;
    assert_problem(s, &body, 422, Some("since"));
    Ok(())
}

/// A kubeconfig TTL is capped at the server's maximum however large it is: the document says
/// any positive number of units is valid, and one too large for a u64 of seconds was refused
/// (found by the schemathesis contract test).
#[tokio::test]
async fn a_kubeconfig_ttl_longer_than_any_clock_is_capped_not_refused() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api-huge-ttl", 0).await?;
    let admin = &p.admin;
    admin.create_tenant("edge").await?;
    for ttl in [
        "99999999999999999999d",
        "213503982334602d",
        "18446744073709551616",
    ] {
        let (s, body) = admin
            .raw(
                Method::POST,
                "/v1/tenants/edge/kubeconfigs",
                Some(&json!({"user": "alice", "ttl": ttl})),
            )
            .await?;
        // Past every check of the request; refused only because nothing provisions it here.
        assert_problem(s, &body, 409, None);
        assert_eq!(
            body["type"], "https://vcp.dev/problems/not-ready",
            "{ttl}: {body}"
        );
    }
    Ok(())
}

/// Waits until `api` answers its token with 200.
async fn answers(api: &ApiClient, what: &str) -> anyhow::Result<()> {
    let (status, _) =
        vcp_dev::testing::eventually(what, std::time::Duration::from_secs(30), || async {
            Ok(api
                .raw(Method::GET, "/v1/tenants", None)
                .await
                .ok()
                .filter(|(s, _)| *s == 200))
        })
        .await?;
    assert_eq!(status, 200);
    Ok(())
}

#[tokio::test]
async fn without_a_configured_token_the_first_start_prints_one_admin_token_once()
-> anyhow::Result<()> {
    use std::io::{BufRead, BufReader};
    let cluster = DevCluster::shared().await?;
    let pg = EphemeralPostgres::start().await?;
    let db = pg.create_database("firststart").await?;
    let start = || -> anyhow::Result<(std::process::Child, String)> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let child = std::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
            .arg("serve")
            .env_remove("VCP_ADMIN_TOKEN")
            .env("VCP_INVENTORY_KEY", vcp_dev::platform::DEV_INVENTORY_KEY)
            .env("VCP_DATABASE_URL", &db)
            .env("VCP_HOST_KUBECONFIG", cluster.kubeconfig_path())
            .env("VCP_LISTEN", format!("127.0.0.1:{port}"))
            .env("VCP_EXPOSE_ADDRESS", "127.0.0.1")
            .env("VCP_WORKERS", "0")
            .env("RUST_LOG", "info")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()?;
        Ok((child, format!("http://127.0.0.1:{port}")))
    };
    // First start: the token is printed on stdout, before the server listens.
    let (mut first, url) = start()?;
    let stdout = first.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .find(|l| l.contains("admin token"))
    })
    .await?
    .ok_or_else(|| anyhow::anyhow!("no admin token printed"))?;
    let token = line.rsplit(' ').next().unwrap().to_owned();
    assert!(token.starts_with("vcp_") && token.len() == 68, "{line}");
    let api = ApiClient::new(&url, &token);
    answers(&api, "the API answers the printed token").await?;
    first.kill()?;
    first.wait()?;

    // Second start on the same inventory: no new token, and the first still works.
    let (mut second, url) = start()?;
    let api = ApiClient::new(&url, &token);
    answers(&api, "the restarted API answers the first token").await?;
    second.kill()?;
    second.wait()?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut second.stdout.take().unwrap(), &mut out)?;
    assert!(!out.contains("admin token"), "printed again: {out}");
    Ok(())
}

/// Checks `value` against a schema of the document: objects carry their `required`
/// properties, arrays and `$ref`s are followed. Enough to catch a handler answering a shape
/// the document does not describe.
fn conforms(doc: &Value, schema: &Value, value: &Value, at: &str) {
    if let Some(r) = schema["$ref"].as_str() {
        let name = r.trim_start_matches("#/components/schemas/");
        return conforms(doc, &doc["components"]["schemas"][name], value, at);
    }
    if let Some(alts) = schema["oneOf"].as_array() {
        // Enums of strings come as oneOf; one branch must take the value.
        assert!(
            alts.iter()
                .any(|a| a["enum"].as_array().is_none_or(|e| e.contains(value))),
            "{at}: {value} is none of {schema}"
        );
        return;
    }
    match schema["type"].as_str() {
        Some("object") => {
            let obj = value
                .as_object()
                .unwrap_or_else(|| panic!("{at}: not an object: {value}"));
            for req in schema["required"].as_array().into_iter().flatten() {
                let k = req.as_str().unwrap();
                assert!(obj.contains_key(k), "{at}: missing {k} in {value}");
            }
            for (k, v) in obj {
                let props = &schema["properties"];
                assert!(
                    props.get(k).is_some() || schema["additionalProperties"].is_object(),
                    "{at}: {k} is not documented"
                );
                if let Some(p) = props.get(k) {
                    conforms(doc, p, v, &format!("{at}.{k}"));
                }
            }
        }
        Some("array") => {
            for (i, v) in value.as_array().into_iter().flatten().enumerate() {
                conforms(doc, &schema["items"], v, &format!("{at}[{i}]"));
            }
        }
        Some("string") => assert!(value.is_string(), "{at}: {value} is not a string"),
        _ => {}
    }
}

#[tokio::test]
async fn the_openapi_document_lists_every_route_and_malformed_input_is_never_a_5xx()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-openapi", 0).await?;
    let (orch, admin) = (&p.orchestrator, &p.admin);
    let admin_token = p.admin_token.clone();
    let (_, owner) = admin
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "team-a", "role": "owner"})),
        )
        .await?;
    let owner_token = owner["token"].as_str().unwrap().to_owned();
    let owner = admin.with_token(&owner_token);
    let (s, _) = owner
        .raw(Method::POST, "/v1/tenants", Some(&json!({"name": "shop"})))
        .await?;
    assert_eq!(s, 201);

    // What the server serves is what the library generates.
    let doc: Value = reqwest::get(format!("{}/openapi.json", orch.url))
        .await?
        .json()
        .await?;
    // But for the plans: the server names the ones it is configured with.
    let mut generated = serde_json::to_value(vcp_orchestrator::api::openapi())?;
    let plans: Vec<String> = vcp_orchestrator::render::parse_plans(vcp_dev::platform::DEV_PLANS)?
        .into_keys()
        .collect();
    assert_eq!(doc["components"]["schemas"]["Plan"]["enum"], json!(plans));
    generated["components"]["schemas"]["Plan"]["enum"] = json!(plans);
    assert_eq!(doc, generated);
    let mut operations = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            operations.push((method.to_uppercase(), path.clone(), op.clone()));
        }
    }
    let mut listed: Vec<String> = operations
        .iter()
        .map(|(m, p, _)| format!("{m} {p}"))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        [
            "DELETE /v1/tenants/{name}",
            "DELETE /v1/tenants/{name}/kubeconfigs/{serial}",
            "DELETE /v1/tenants/{name}/users/{user}",
            "DELETE /v1/tokens/{name}",
            "GET /healthz",
            "GET /metrics",
            "GET /openapi.json",
            "GET /readyz",
            "GET /v1/audit",
            "GET /v1/tenants",
            "GET /v1/tenants/{name}",
            "GET /v1/tenants/{name}/audit-events",
            "GET /v1/tenants/{name}/kubeconfigs",
            "GET /v1/tenants/{name}/rotations",
            "GET /v1/tenants/{name}/snapshots",
            "GET /v1/tenants/{name}/usage",
            "GET /v1/tokens",
            "GET /v1/upgrades",
            "GET /v1/upgrades/{id}",
            "GET /v1/usage",
            "GET /v1/versions",
            "PATCH /v1/tenants/{name}",
            "POST /v1/gateway/activity",
            "POST /v1/gateway/wake",
            "POST /v1/tenants",
            "POST /v1/tenants/{name}/break-glass",
            "POST /v1/tenants/{name}/kubeconfigs",
            "POST /v1/tenants/{name}/restore",
            "POST /v1/tenants/{name}/rotate",
            "POST /v1/tenants/{name}/sleep",
            "POST /v1/tenants/{name}/snapshots",
            "POST /v1/tenants/{name}/wake",
            "POST /v1/tokens",
            "POST /v1/upgrades",
            "POST /v1/upgrades/{id}/cancel",
            "POST /v1/upgrades/{id}/pause",
            "POST /v1/upgrades/{id}/resume",
        ]
    );

    let http = reqwest::Client::new();
    // The web console's routes are served beside these, on the same port, but are not in the
    // document (a page, not the JSON API: docs/console.md); its own list names them.
    assert_eq!(
        vcp_orchestrator::console::ROUTES,
        ["/ui", "/ui/", "/ui/app.css", "/ui/app.js"]
    );
    for route in vcp_orchestrator::console::ROUTES {
        assert!(doc["paths"][route].is_null(), "{route} is in the document");
        let r = http.get(format!("{}{route}", orch.url)).send().await?;
        assert_eq!(r.status(), 200, "{route} (/ui/ redirects to /ui)");
    }
    let bad_names = [
        "UPPER", "-x", "x-", "a.b", "a_b", "%00", "%2e%2e", "%ff", "%C3%BC", "%20", "system:x",
    ];
    let long_name = "x".repeat(300);
    let bad_tokens: [&[u8]; 4] = [b"", b"Bearer", b"Bearer vcp_nope", b"Basic YTpi\xff"];
    let mut tried = 0;
    let mut check = |what: String, status: u16, body: &str, must_be_4xx: bool| {
        tried += 1;
        assert!(status < 500, "{what} answered {status}: {body}");
        if must_be_4xx {
            assert!(
                (400..500).contains(&status),
                "{what} answered {status}: {body}"
            );
            assert!(
                body.contains("https://vcp.dev/problems/"),
                "{what}: not a problem: {body}"
            );
        }
    };
    for (method, path, op) in &operations {
        let m = Method::from_bytes(method.as_bytes())?;
        let takes_name = path.contains("{name}");
        let concrete = path.replace("{name}", "shop").replace("{id}", "1");
        // Every documented route is served (a real answer, not the fallback's 404).
        let r = http
            .request(m.clone(), format!("{}{concrete}", orch.url))
            .bearer_auth(&admin_token)
            .json(&json!({}))
            .send()
            .await?;
        let body = r.text().await?;
        assert!(
            !body.contains("no such route"),
            "{method} {path} is not served"
        );

        // Methods the route does not take.
        for other in [Method::PUT, Method::PATCH] {
            if doc["paths"][path.as_str()][other.as_str().to_lowercase()].is_object() {
                continue;
            }
            let r = http
                .request(other.clone(), format!("{}{concrete}", orch.url))
                .bearer_auth(&admin_token)
                .send()
                .await?;
            let (s, b) = (r.status().as_u16(), r.text().await?);
            check(format!("{other} {path}"), s, &b, true);
            assert_eq!(s, 405, "{other} {path}: {b}");
        }
        // Bad or missing credentials.
        if op["security"].is_array() {
            for t in bad_tokens {
                let mut req = http.request(m.clone(), format!("{}{concrete}", orch.url));
                if !t.is_empty() {
                    req = req.header(
                        "authorization",
                        reqwest::header::HeaderValue::from_bytes(t)?,
                    );
                }
                let r = req.send().await?;
                let (s, b) = (r.status().as_u16(), r.text().await?);
                check(format!("{method} {path} with token {t:?}"), s, &b, true);
                assert_eq!(s, 401, "{method} {path} with token {t:?}: {b}");
            }
        }
        // Names that no tenant or token can have, for both roles.
        if takes_name {
            for name in bad_names.iter().copied().chain([long_name.as_str()]) {
                for token in [&admin_token, &owner_token] {
                    let url = format!("{}{}", orch.url, path.replace("{name}", name));
                    let r = http
                        .request(m.clone(), url)
                        .bearer_auth(token)
                        .json(&json!({"user": "u", "groups": ["view"]}))
                        .send()
                        .await?;
                    // A URL normalises `%2e%2e` as `..` before it is sent: the request then
                    // names no tenant and may reach another route (`/v1/tenants/../usage` is
                    // `/v1/usage`), which must still never fail with a 5xx.
                    let names_a_tenant = r.url().path().contains("/v1/tenants/")
                        || !path.starts_with("/v1/tenants/{name}");
                    let (s, b) = (r.status().as_u16(), r.text().await?);
                    check(
                        format!("{method} {path} name {name:?}"),
                        s,
                        &b,
                        names_a_tenant,
                    );
                }
            }
        }
        // Malformed bodies: broken JSON, wrong shapes, every documented field mistyped,
        // unknown fields, the wrong content type and an oversize body.
        if let Some(schema) = op["requestBody"]["content"]["application/json"]["schema"]
            .as_object()
            .map(|s| Value::Object(s.clone()))
        {
            let name = schema["$ref"]
                .as_str()
                .unwrap()
                .trim_start_matches("#/components/schemas/");
            let fields: Vec<String> = doc["components"]["schemas"][name]["properties"]
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect();
            let mut bodies: Vec<(String, Vec<u8>, &str)> = vec![
                ("empty".into(), vec![], "application/json"),
                (
                    "truncated".into(),
                    b"{\"name\": ".to_vec(),
                    "application/json",
                ),
                ("array".into(), b"[]".to_vec(), "application/json"),
                ("null".into(), b"null".to_vec(), "application/json"),
                ("string".into(), b"\"x\"".to_vec(), "application/json"),
                ("binary".into(), vec![0xff, 0xfe, 0x00], "application/json"),
                ("text".into(), b"{\"name\": \"x\"}".to_vec(), "text/plain"),
                (
                    "unknown field".into(),
                    br#"{"name": "x", "user": "u", "surprise": 1}"#.to_vec(),
                    "application/json",
                ),
                (
                    "oversize".into(),
                    format!("{{\"name\": \"{}\"}}", "x".repeat(70_000)).into_bytes(),
                    "application/json",
                ),
            ];
            for f in &fields {
                let declared = doc["components"]["schemas"][name]["properties"][f]["type"].clone();
                for wrong in [
                    json!(7),
                    json!(true),
                    json!({"a": 1}),
                    json!([[]]),
                    json!(null),
                    json!("x".repeat(5000)),
                ] {
                    // A value of the field's own type is not wrong (`true` for a flag).
                    if declared == json!("boolean") && wrong.is_boolean() {
                        continue;
                    }
                    // Start from a body that is valid apart from the field under test.
                    let mut b = json!({"name": "valid-name", "user": "u", "role": "owner"});
                    b.as_object_mut().unwrap().retain(|k, _| fields.contains(k));
                    b[f] = wrong.clone();
                    bodies.push((
                        format!("{f}={wrong:.40}"),
                        serde_json::to_vec(&b)?,
                        "application/json",
                    ));
                }
            }
            for (what, body, ctype) in bodies {
                for token in [&admin_token, &owner_token] {
                    let r = http
                        .request(m.clone(), format!("{}{concrete}", orch.url))
                        .bearer_auth(token)
                        .header("content-type", ctype)
                        .body(body.clone())
                        .send()
                        .await?;
                    let (s, b) = (r.status().as_u16(), r.text().await?);
                    // A valid-but-for-one-field body may be accepted only when the field is
                    // optional and the value happens to be acceptable (`null`, a long string
                    // for a free-form field): no 5xx either way.
                    let strict = !what.contains("=null") && !what.contains("=\"xxx");
                    check(format!("{method} {path} body {what}"), s, &b, strict);
                }
            }
        }
        // Query strings: junk everywhere, a bad `retain_data` where it is documented.
        let r = http
            .request(m.clone(), format!("{}{concrete}?%ff=%zz&&=", orch.url))
            .bearer_auth(&owner_token)
            .send()
            .await?;
        let (s, b) = (r.status().as_u16(), r.text().await?);
        check(format!("{method} {path} junk query"), s, &b, false);
        if op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "retain_data")
        {
            for q in ["maybe", "%ff", "1"] {
                let r = http
                    .request(
                        m.clone(),
                        format!("{}/v1/tenants/nope?retain_data={q}", orch.url),
                    )
                    .bearer_auth(&owner_token)
                    .send()
                    .await?;
                let (s, b) = (r.status().as_u16(), r.text().await?);
                check(format!("{method} {path} retain_data={q}"), s, &b, true);
                assert_eq!(s, 400, "retain_data={q}: {b}");
            }
        }
        // `owner` where it is documented: a malformed one is the caller's mistake, for both
        // roles, before the tenant is looked up.
        if op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|p| p["name"] == "owner")
        {
            for (q, want) in [
                ("owner=UPPER", 422),
                ("owner=", 422),
                ("owner=%ff", 422),
                ("owner=a&owner=b", 400),
            ] {
                for token in [&admin_token, &owner_token] {
                    let r = http
                        .request(m.clone(), format!("{}{concrete}?{q}", orch.url))
                        .bearer_auth(token)
                        .json(&json!({"user": "u", "groups": ["view"]}))
                        .send()
                        .await?;
                    let (s, b) = (r.status().as_u16(), r.text().await?);
                    check(format!("{method} {path} {q}"), s, &b, true);
                    assert_eq!(s, want, "{method} {path} {q}: {b}");
                }
            }
        }
    }
    assert!(tried > 300, "only {tried} malformed requests");
    eprintln!(
        "{tried} malformed requests over {} operations, none answered 5xx",
        operations.len()
    );

    // Successful answers have the documented shapes.
    for (path, token) in [
        ("/v1/tenants", &owner_token),
        ("/v1/tenants/shop", &owner_token),
        ("/v1/tenants/shop/kubeconfigs", &owner_token),
        ("/v1/tenants/shop/usage", &owner_token),
        ("/v1/tokens", &admin_token),
        ("/v1/versions", &owner_token),
    ] {
        let (s, body) = admin.with_token(token).raw(Method::GET, path, None).await?;
        assert_eq!(s, 200, "{path}: {body}");
        let key = path.replace("/shop", "/{name}");
        let schema = &doc["paths"][key.as_str()]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"];
        assert!(schema.is_object(), "{path} has no documented answer");
        conforms(&doc, schema, &body, path);
    }
    let metrics = reqwest::get(format!("{}/metrics", orch.url))
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("vcp_http_server_errors_total 0"),
        "{metrics}"
    );
    Ok(())
}

/// New tenants and the catalog's classes: an `expired` version is refused (422, `version`),
/// a `preview` one only without `allow_preview` (docs/upgrades.md, "Versions and their
/// classes"); `GET /v1/versions` says which is which.
#[tokio::test]
async fn new_tenants_may_not_pick_an_expired_version_and_a_preview_one_only_when_asked()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let templates = tempfile::tempdir()?;
    // 1.35 (deprecated) expired, 1.36 (the second entry marked supported) a preview; 1.37
    // stays the supported default.
    vcp_dev::testing::templates_with(templates.path(), |v| {
        let (first, rest) = v.split_at(v.find("class: supported").unwrap() + 1);
        format!(
            "{first}{}",
            rest.replacen("class: supported", "class: preview", 1)
        )
        .replace("class: deprecated", "class: expired")
    })?;
    let p = vcp_dev::testing::platform_with(
        cluster,
        "vcp-api-classes",
        0,
        vec![(
            "VCP_TEMPLATES".into(),
            templates.path().display().to_string(),
        )],
    )
    .await?;
    let api = &p.admin;
    let (s, versions) = api.raw(Method::GET, "/v1/versions", None).await?;
    assert_eq!(s, 200, "{versions}");
    let classes: Vec<(&str, &str)> = versions["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["minor"].as_str().unwrap(), v["class"].as_str().unwrap()))
        .collect();
    assert_eq!(
        classes,
        [
            ("1.37", "supported"),
            ("1.36", "preview"),
            ("1.35", "expired")
        ]
    );

    for (body, why) in [
        (json!({"name": "old", "version": "1.35"}), "expired"),
        (
            json!({"name": "old", "version": "1.35", "allow_preview": true}),
            "expired",
        ),
        (json!({"name": "new", "version": "1.36"}), "allow_preview"),
        (
            json!({"name": "new", "version": "1.36", "allow_preview": false}),
            "allow_preview",
        ),
    ] {
        let (s, got) = api.raw(Method::POST, "/v1/tenants", Some(&body)).await?;
        assert_problem(s, &got, 422, Some("version"));
        assert!(
            got["detail"].as_str().is_some_and(|d| d.contains(why)),
            "{body}: {got}"
        );
    }
    let (s, listed) = api.raw(Method::GET, "/v1/tenants", None).await?;
    assert_eq!(s, 200);
    assert_eq!(listed["items"], json!([]), "nothing was created: {listed}");

    // Asked for explicitly, a preview is fine; the default needs no asking.
    let (s, t) = api
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": "new", "version": "1.36", "allow_preview": true})),
        )
        .await?;
    assert_eq!((s, t["version"].as_str()), (201, Some("1.36")), "{t}");
    let (s, t) = api
        .raw(Method::POST, "/v1/tenants", Some(&json!({"name": "plain"})))
        .await?;
    assert_eq!((s, t["version"].as_str()), (201, Some("1.37")), "{t}");
    Ok(())
}

/// (actor, action, tenant) of each entry of an audit page.
fn trail(page: &Value) -> Vec<(String, String, Option<String>)> {
    page["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or_default().to_owned(),
                e["action"].as_str().unwrap_or_default().to_owned(),
                e["tenant"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_audit_trail_reads_back_in_order_filtered_paged_and_scoped_to_owners()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api-audit", 0).await?;
    let admin = &p.admin;
    let (s, b) = admin.raw(Method::GET, "/v1/tokens", None).await?;
    assert_eq!(s, 200, "{b}");
    let admin_name = b["items"][0]["name"]
        .as_str()
        .expect("the admin token")
        .to_owned();

    // A scripted sequence: owners, their tenants, a deletion, a token revoked.
    let owners = owner_tokens(admin, &["team-a", "team-b", "ci"]).await?;
    let (a, b) = (&owners[0], &owners[1]);
    for (owner, tenant) in [(a, "shop"), (b, "blog"), (a, "cart")] {
        let (s, body) = owner
            .raw(Method::POST, "/v1/tenants", Some(&json!({"name": tenant})))
            .await?;
        assert_eq!(s, 201, "{body}");
    }
    let (s, body) = a.raw(Method::DELETE, "/v1/tenants/shop", None).await?;
    assert!(s == 202 || s == 200, "{s} {body}");
    let (s, body) = admin.raw(Method::DELETE, "/v1/tokens/ci", None).await?;
    assert!(s == 200 || s == 204, "{s} {body}");

    let t = |actor: &str, action: &str, tenant: Option<&str>| {
        (
            actor.to_owned(),
            action.to_owned(),
            tenant.map(str::to_owned),
        )
    };
    let (s, all) = admin.raw(Method::GET, "/v1/audit?limit=1000", None).await?;
    assert_eq!(s, 200, "{all}");
    assert_eq!(all["next_after"], Value::Null);
    assert_eq!(
        trail(&all),
        [
            t("vcp:vcp-api-audit", "token.admin-bootstrap", None),
            t(&admin_name, "token.create", None),
            t(&admin_name, "token.create", None),
            t(&admin_name, "token.create", None),
            t("team-a", "tenant.create", Some("shop")),
            t("team-b", "tenant.create", Some("blog")),
            t("team-a", "tenant.create", Some("cart")),
            t("team-a", "tenant.delete", Some("shop")),
            t(&admin_name, "token.revoke", None),
        ],
        "{all:#}"
    );
    let ids: Vec<i64> = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_i64().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert_eq!(all["items"][1]["detail"]["name"], "team-a");

    // Filters, each alone and together.
    let get = |who: &ApiClient, q: &str| {
        let (who, q) = (who.clone(), q.to_owned());
        async move {
            let (s, b) = who.raw(Method::GET, &format!("/v1/audit{q}"), None).await?;
            anyhow::ensure!(s == 200, "{q}: {s} {b}");
            Ok::<_, anyhow::Error>(b)
        }
    };
    assert_eq!(
        trail(&get(admin, "?tenant=shop").await?),
        [
            t("team-a", "tenant.create", Some("shop")),
            t("team-a", "tenant.delete", Some("shop"))
        ]
    );
    assert_eq!(trail(&get(admin, "?action=token.").await?).len(), 5);
    assert_eq!(
        trail(&get(admin, "?action=token.revoke").await?),
        [t(&admin_name, "token.revoke", None)]
    );
    assert_eq!(
        trail(&get(admin, "?actor=team-a&action=tenant.create").await?),
        [
            t("team-a", "tenant.create", Some("shop")),
            t("team-a", "tenant.create", Some("cart"))
        ]
    );
    let first_at = all["items"][0]["at"].as_str().unwrap().replace('+', "%2B");
    assert_eq!(trail(&get(admin, &format!("?until={first_at}")).await?), []);
    assert_eq!(
        trail(&get(admin, &format!("?since={first_at}")).await?).len(),
        9,
        "since is inclusive"
    );

    assert_eq!(
        trail(
            &get(
                admin,
                "?since=2030-01-01T00:00:00Z&until=2020-01-01T00:00:00Z"
            )
            .await?
        ),
        [],
        "a reversed range is empty"
    );

    // Pages of two follow each other without gaps or repeats.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = get(admin, &format!("?limit=2&after={after}")).await?;
        paged.extend(trail(&page));
        match page["next_after"].as_i64() {
            Some(n) => after = n,
            None => break,
        }
    }
    assert_eq!(paged, trail(&all));

    // An owner reads its own tenants' entries, a deleted one's too, and nothing else: not
    // another owner's tenant, not the token changes.
    assert_eq!(
        trail(&get(a, "").await?),
        [
            t("team-a", "tenant.create", Some("shop")),
            t("team-a", "tenant.create", Some("cart")),
            t("team-a", "tenant.delete", Some("shop")),
        ]
    );
    assert_eq!(trail(&get(a, "?tenant=blog").await?), []);
    assert_eq!(trail(&get(b, "?actor=team-a").await?), []);
    // The revoked token reads nothing.
    let (s, body) = owners[2].raw(Method::GET, "/v1/audit", None).await?;
    assert_problem(s, &body, 401, None);

    // Bad queries name the parameter.
    for (q, status, field) in [
        ("?tenant=Shop", 422, "tenant"),
        ("?action=Tenant.create", 422, "action"),
        ("?action=tenant.*", 422, "action"),
        ("?since=yesterday", 422, "since"),
        ("?after=-1", 422, "after"),
        ("?limit=0", 422, "limit"),
        ("?limit=1001", 422, "limit"),
        ("?limit=many", 400, "limit"),
    ] {
        let (s, body) = admin
            .raw(Method::GET, &format!("/v1/audit{q}"), None)
            .await?;
        assert_problem(s, &body, status, Some(field));
    }

    // The CLI reads the same trail.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
        .args(["audit", "--tenant", "shop", "-o", "json"])
        .env("VCP_API_URL", &p.orchestrator.url)
        .env("VCP_TOKEN", &p.admin_token)
        .output()
        .await?;
    assert!(out.status.success(), "{out:?}");
    let cli: Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(trail(&cli), trail(&get(admin, "?tenant=shop").await?));
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"))
        .args(["audit", "--limit", "3"])
        .env("VCP_API_URL", &p.orchestrator.url)
        .env("VCP_TOKEN", &p.admin_token)
        .env("COLUMNS", "100")
        .output()
        .await?;
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout)?;
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 4, "a header and three entries: {table}");
    assert!(
        lines[0].starts_with("ID") && lines[1].contains("token.admin-bootstrap"),
        "{table}"
    );
    assert!(String::from_utf8(out.stderr)?.contains("more entries follow"));
    Ok(())
}

/// Tenant names are unique per owner (issue 15): two owners may each have a tenant of the
/// same name and neither learns of the other's; an admin, who sees both, picks one with
/// `?owner=` and is told which owners to pick from without it.
#[tokio::test]
async fn tenant_names_are_unique_per_owner_and_admins_pick_one_by_owner() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api-names", 0).await?;
    let admin = &p.admin;
    let owners = owner_tokens(admin, &["team-x", "team-y"]).await?;
    let (x, y) = (&owners[0], &owners[1]);
    let twin = json!({"name": "twin"});

    // Both create the name: neither is told the other has it.
    let (s, tx) = x.raw(Method::POST, "/v1/tenants", Some(&twin)).await?;
    assert_eq!(s, 201, "{tx}");
    let (s, ty) = y.raw(Method::POST, "/v1/tenants", Some(&twin)).await?;
    assert_eq!(
        s, 201,
        "the other owner's tenant of this name must not conflict: {ty}"
    );
    assert_ne!(tx["key"], ty["key"]);
    // The same owner twice: its own tenant conflicts.
    let (s, b) = x.raw(Method::POST, "/v1/tenants", Some(&twin)).await?;
    assert_problem(s, &b, 409, Some("name"));
    assert!(
        b["detail"].as_str().unwrap().contains("already exists"),
        "{b}"
    );

    // Each owner sees its own only, by name and in its list; another owner's name is 404.
    for (client, me, other) in [(x, "team-x", "team-y"), (y, "team-y", "team-x")] {
        let (s, t) = client.raw(Method::GET, "/v1/tenants/twin", None).await?;
        assert_eq!((s, t["owner"].as_str()), (200, Some(me)), "{t}");
        let (s, t) = client
            .raw(Method::GET, &format!("/v1/tenants/twin?owner={me}"), None)
            .await?;
        assert_eq!((s, t["owner"].as_str()), (200, Some(me)), "{t}");
        let (s, b) = client
            .raw(
                Method::GET,
                &format!("/v1/tenants/twin?owner={other}"),
                None,
            )
            .await?;
        assert_problem(s, &b, 404, None);
        let (s, b) = client
            .raw(
                Method::GET,
                &format!("/v1/tenants/twin/kubeconfigs?owner={other}"),
                None,
            )
            .await?;
        assert_problem(s, &b, 404, None);
        let (_, list) = client.raw(Method::GET, "/v1/tenants", None).await?;
        let items = list["items"].as_array().unwrap();
        assert_eq!(items.len(), 1, "{list}");
        assert_eq!(items[0]["owner"], me);
    }

    // An admin sees both: without `owner` the name is ambiguous, on every route of a tenant.
    for path in [
        "/v1/tenants/twin",
        "/v1/tenants/twin/kubeconfigs",
        "/v1/tenants/twin/usage",
    ] {
        let (s, b) = admin.raw(Method::GET, path, None).await?;
        assert_problem(s, &b, 409, Some("owner"));
        assert_eq!(b["type"], "https://vcp.dev/problems/ambiguous-name", "{b}");
        let detail = b["detail"].as_str().unwrap();
        assert!(
            detail.contains("team-x") && detail.contains("team-y") && detail.contains("?owner="),
            "{b}"
        );
    }
    for (owner, key) in [("team-x", &tx["key"]), ("team-y", &ty["key"])] {
        let (s, t) = admin
            .raw(
                Method::GET,
                &format!("/v1/tenants/twin?owner={owner}"),
                None,
            )
            .await?;
        assert_eq!((s, &t["key"]), (200, key), "{t}");
    }
    // `owner` beside a route's own query parameters.
    let (s, u) = admin
        .raw(
            Method::GET,
            "/v1/tenants/twin/usage?owner=team-y&limit=5&since=2026-01-01T00:00:00Z",
            None,
        )
        .await?;
    assert_eq!(s, 200, "{u}");
    let (s, b) = admin
        .raw(Method::GET, "/v1/tenants/twin?owner=team-z", None)
        .await?;
    assert_problem(s, &b, 404, None);
    let (s, b) = admin
        .raw(Method::GET, "/v1/tenants/twin?owner=Team_X", None)
        .await?;
    assert_problem(s, &b, 422, Some("owner"));
    let (s, b) = admin
        .raw(
            Method::GET,
            "/v1/tenants/twin?owner=team-x&owner=team-y",
            None,
        )
        .await?;
    assert_problem(s, &b, 400, Some("owner"));

    // A snapshot asked by an admin is of the tenant it picked, not of every tenant named so.
    let (s, b) = admin
        .raw(Method::POST, "/v1/tenants/twin/snapshots", None)
        .await?;
    assert_problem(s, &b, 409, Some("owner"));
    let (s, b) = admin
        .raw(
            Method::POST,
            "/v1/tenants/twin/snapshots?owner=team-x",
            None,
        )
        .await?;
    assert_eq!(s, 202, "{b}");
    for (client, want) in [(x, 1), (y, 0)] {
        let (s, l) = client
            .raw(Method::GET, "/v1/tenants/twin/snapshots", None)
            .await?;
        assert_eq!(s, 200, "{l}");
        assert_eq!(l["snapshots"].as_array().unwrap().len(), want, "{l}");
    }

    // A fleet upgrade by name takes every owner's tenant of that name, each named with its
    // owner.
    for o in [x, y] {
        let (s, b) = o
            .raw(
                Method::POST,
                "/v1/tenants",
                Some(&json!({"name": "pair", "version": "1.36"})),
            )
            .await?;
        assert_eq!(s, 201, "{b}");
    }
    let (s, f) = admin
        .raw(
            Method::POST,
            "/v1/upgrades",
            Some(&json!({"target": "1.37", "selector": {"names": ["pair"]}})),
        )
        .await?;
    assert_eq!(s, 201, "{f}");
    let mut entries: Vec<(&str, &str)> = f["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["name"].as_str().unwrap(), t["owner"].as_str().unwrap()))
        .collect();
    entries.sort();
    assert_eq!(entries, [("pair", "team-x"), ("pair", "team-y")], "{f}");
    let (s, b) = admin
        .raw(
            Method::POST,
            &format!("/v1/upgrades/{}/cancel", f["id"]),
            Some(&json!({})),
        )
        .await?;
    assert_eq!(s, 200, "{b}");

    // The CLI: `--owner` (or VCP_OWNER) picks one; without it an admin is told to add it.
    let vcp = |args: &[&str], owner: Option<&str>| {
        let mut c = tokio::process::Command::new(env!("CARGO_BIN_EXE_vcp"));
        c.args(args)
            .env("VCP_API_URL", &p.orchestrator.url)
            .env("VCP_TOKEN", &p.admin_token)
            .env_remove("VCP_OWNER");
        if let Some(o) = owner {
            c.env("VCP_OWNER", o);
        }
        c.output()
    };
    let out = vcp(&["tenant", "get", "twin", "-o", "json"], None).await?;
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("?owner=") && err.contains("409"), "{err}");
    let out = vcp(
        &["tenant", "get", "twin", "--owner", "team-y", "-o", "json"],
        None,
    )
    .await?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout)?["key"],
        ty["key"]
    );
    let out = vcp(
        &["tenant", "kubeconfigs", "twin", "-o", "json"],
        Some("team-x"),
    )
    .await?;
    assert!(out.status.success(), "{out:?}");

    // Deleting one owner's tenant leaves the other's alone.
    let (s, d) = x
        .raw(Method::DELETE, "/v1/tenants/twin?retain_data=true", None)
        .await?;
    assert_eq!((s, &d["key"]), (202, &tx["key"]), "{d}");
    let (s, t) = y.raw(Method::GET, "/v1/tenants/twin", None).await?;
    assert_eq!((s, t["phase"].as_str()), (200, Some("Pending")), "{t}");
    let (s, b) = admin.raw(Method::DELETE, "/v1/tenants/twin", None).await?;
    assert_problem(s, &b, 409, Some("owner"));
    let (s, d) = admin
        .raw(Method::DELETE, "/v1/tenants/twin?owner=team-y", None)
        .await?;
    assert_eq!((s, &d["key"]), (202, &ty["key"]), "{d}");
    Ok(())
}

/// The smallest valid body of each request schema, and of each strict object inside one.
fn minimal(schema: &str) -> Option<Value> {
    Some(match schema {
        "CreateTenant" => json!({"name": "fresh"}),
        "UpgradeTenant" | "FleetUpgradeAction" | "FleetSelector" => json!({}),
        "RestoreTenant" => json!({"snapshot": 1}),
        "RotateTenant" => json!({"target": "ca"}),
        "IssueKubeconfig" => json!({"user": "u"}),
        "BreakGlassRequest" => json!({"reason": "drill"}),
        "CreateToken" => json!({"name": "fresh", "role": "owner"}),
        "CreateFleetUpgrade" => json!({"target": "1.37"}),
        "MaintenanceWindow" => json!({"days": ["sat"], "start": "02:00", "duration_minutes": 60}),
        "ActivityReport" => json!({"tenants": []}),
        "GatewayWake" => json!({"key": "nosuchkey1"}),
        "BackupPlan" => json!({}),
        _ => return None,
    })
}

/// The name of the schema a property refers to, directly or as the one non-null choice.
fn referenced(prop: &Value) -> Option<&str> {
    let r = prop["$ref"].as_str().or_else(|| {
        prop["oneOf"]
            .as_array()
            .or(prop["anyOf"].as_array())?
            .iter()
            .find_map(|c| c["$ref"].as_str())
    })?;
    r.strip_prefix("#/components/schemas/")
}

#[tokio::test]
async fn every_route_refuses_a_field_it_does_not_take() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-fields", 0).await?;
    let (orch, admin) = (&p.orchestrator, &p.admin);
    let (s, b) = admin
        .raw(Method::POST, "/v1/tenants", Some(&json!({"name": "shop"})))
        .await?;
    assert_eq!(s, 201, "{b}");
    let doc: Value = reqwest::get(format!("{}/openapi.json", orch.url))
        .await?
        .json()
        .await?;
    let schemas = &doc["components"]["schemas"];
    let http = reqwest::Client::new();
    let send = |method: &str, path: &str, body: &Value| {
        let url = format!(
            "{}{}",
            orch.url,
            path.replace("{name}", "shop")
                .replace("{id}", "1")
                .replace("{serial}", "00ff")
                .replace("{user}", "nobody")
        );
        let req = http
            .request(
                Method::from_bytes(method.to_uppercase().as_bytes()).unwrap(),
                url,
            )
            .bearer_auth(&p.admin_token)
            .json(body);
        async move {
            let r = req.send().await?;
            let status = r.status().as_u16();
            anyhow::Ok((status, r.json::<Value>().await.unwrap_or(Value::Null)))
        }
    };
    let mut checked = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            if method == "get" {
                continue;
            }
            let what = format!("{} {path}", method.to_uppercase());
            let Some(schema) =
                op["requestBody"]["content"]["application/json"]["schema"].as_object()
            else {
                // A route that takes no body refuses one with a field: a caller who sends
                // `{"location": ...}` believes it chose something.
                let (s, b) = send(method, path, &json!({"location": "s3://elsewhere"})).await?;
                assert_problem(s, &b, 422, Some("location"));
                checked.push(what);
                continue;
            };
            let name = schema["$ref"]
                .as_str()
                .unwrap()
                .trim_start_matches("#/components/schemas/");
            let valid = minimal(name).unwrap_or_else(|| panic!("{what}: no minimal {name}"));
            let mut body = valid.clone();
            body["location"] = json!("s3://elsewhere");
            let (s, b) = send(method, path, &body).await?;
            assert_problem(s, &b, 422, Some("location"));
            checked.push(what.clone());
            // And inside every strict object the body holds.
            for (field, prop) in schemas[name]["properties"].as_object().unwrap() {
                let Some(inner) = referenced(prop) else {
                    continue;
                };
                if schemas[inner]["additionalProperties"] != json!(false) {
                    continue;
                }
                let mut nested =
                    minimal(inner).unwrap_or_else(|| panic!("{what}: no minimal {inner}"));
                nested["location"] = json!("s3://elsewhere");
                let mut body = valid.clone();
                body[field] = nested;
                let (s, b) = send(method, path, &body).await?;
                assert_problem(s, &b, 422, Some(&format!("{field}.location")));
                checked.push(format!("{what} {field}"));
            }
        }
    }
    checked.sort();
    assert_eq!(
        checked,
        [
            "DELETE /v1/tenants/{name}",
            "DELETE /v1/tenants/{name}/kubeconfigs/{serial}",
            "DELETE /v1/tenants/{name}/users/{user}",
            "DELETE /v1/tokens/{name}",
            "PATCH /v1/tenants/{name}",
            "PATCH /v1/tenants/{name} backups",
            "PATCH /v1/tenants/{name} maintenance_window",
            "POST /v1/gateway/activity",
            "POST /v1/gateway/wake",
            "POST /v1/tenants",
            "POST /v1/tenants maintenance_window",
            "POST /v1/tenants/{name}/break-glass",
            "POST /v1/tenants/{name}/kubeconfigs",
            "POST /v1/tenants/{name}/restore",
            "POST /v1/tenants/{name}/rotate",
            "POST /v1/tenants/{name}/sleep",
            "POST /v1/tenants/{name}/snapshots",
            "POST /v1/tenants/{name}/wake",
            "POST /v1/tokens",
            "POST /v1/upgrades",
            "POST /v1/upgrades selector",
            "POST /v1/upgrades/{id}/cancel",
            "POST /v1/upgrades/{id}/pause",
            "POST /v1/upgrades/{id}/resume",
        ],
        "every route that writes"
    );
    // Refused means nothing happened: the tenant is there, with no snapshot asked for.
    let (s, b) = admin
        .raw(Method::GET, "/v1/tenants/shop/snapshots", None)
        .await?;
    assert_eq!((s, b["snapshots"].as_array().map(Vec::len)), (200, Some(0)));
    // None, or an empty object (what clients that always send a body send), is no body.
    let (s, b) = send("post", "/v1/tenants/{name}/snapshots", &json!({})).await?;
    assert_eq!(s, 202, "{b}");
    let r = http
        .post(format!("{}/v1/tenants/shop/snapshots", orch.url))
        .bearer_auth(&p.admin_token)
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 202);
    Ok(())
}

/// Snapshot ids are the tenant's own numbers: an owner learns nothing of the fleet's.
#[tokio::test]
async fn snapshot_ids_count_the_tenants_own_snapshots_only() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-snapids", 0).await?;
    let admin = &p.admin;
    let owners = owner_tokens(admin, &["team-a", "team-b"]).await?;
    let (a, b) = (&owners[0], &owners[1]);
    for (client, name) in [(a, "one"), (b, "two")] {
        let (s, body) = client
            .raw(Method::POST, "/v1/tenants", Some(&json!({"name": name})))
            .await?;
        assert_eq!(s, 201, "{body}");
    }
    let snap = |client: &ApiClient, name: &str| {
        let (client, path) = (client.clone(), format!("/v1/tenants/{name}/snapshots"));
        async move {
            let (s, body) = client.raw(Method::POST, &path, None).await?;
            assert_eq!(s, 202, "{body}");
            anyhow::Ok(body)
        }
    };
    for _ in 0..3 {
        snap(a, "one").await?;
    }
    let first = snap(b, "two").await?;
    assert_eq!(first["id"], 1, "{first}");
    assert!(
        first["location"]
            .as_str()
            .unwrap()
            .ends_with("/etcd-snapshots/snapshot-1.db"),
        "{first}"
    );
    let second = snap(b, "two").await?;
    assert_eq!(second["id"], 2, "{second}");
    let (_, list) = b
        .raw(Method::GET, "/v1/tenants/two/snapshots", None)
        .await?;
    let ids: Vec<&Value> = list["snapshots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["id"])
        .collect();
    assert_eq!(ids, [&json!(2), &json!(1)], "{list}");
    // The audit trail an owner reads says the same numbers.
    let (_, trail) = b
        .raw(
            Method::GET,
            "/v1/audit?tenant=two&action=tenant.snapshot.",
            None,
        )
        .await?;
    let told: Vec<&Value> = trail["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["detail"]["snapshot"])
        .collect();
    assert_eq!(told, [&json!(1), &json!(2)], "{trail}");
    // A restore names the tenant's own snapshot: "3" is one of tenant one's numbers, not two's.
    let (s, body) = admin
        .raw(
            Method::POST,
            "/v1/tenants/two/restore",
            Some(&json!({"snapshot": 3})),
        )
        .await?;
    assert_problem(s, &body, 422, Some("snapshot"));
    Ok(())
}

/// `GET /v1/usage`: the CSV export of a known range holds exactly the samples taken in it (not
/// those at its ends' other side), by time and then tenant, for an admin every tenant and for
/// an owner its own; pages meet without a gap or a repeat where many tenants share an instant.
#[tokio::test]
async fn the_fleet_usage_export_holds_exactly_the_samples_of_its_range() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let p = vcp_dev::testing::platform(cluster, "vcp-api-usage-export", 0).await?;
    let admin = &p.admin;
    let owners = owner_tokens(admin, &["team-a", "team-b"]).await?;
    owners[0].create_tenant("alpha").await?;
    owners[1].create_tenant("beta").await?;
    let db = sqlx::PgPool::connect(&p.database_url).await?;
    let ids: Vec<(i64, String)> = sqlx::query_as("SELECT id, name FROM tenants ORDER BY id")
        .fetch_all(&db)
        .await?;
    // Five instants an hour apart; both tenants sampled at each, with pods = hour * 10 + n.
    for hour in 0..5i64 {
        for (n, (id, _)) in ids.iter().enumerate() {
            sqlx::query(
                "INSERT INTO usage_samples (tenant_id, sampled_at, pods, requests_cpu,
                   requests_memory, limits_cpu, limits_memory, services,
                   persistent_volume_claims, requests_storage, namespaces)
                 VALUES ($1, '2026-01-01T00:00:00Z'::timestamptz + make_interval(hours => $2::int),
                   $3, 250, 1048576, 0, 0, 1, 0, 0, 2)",
            )
            .bind(id)
            .bind(i32::try_from(hour)?)
            .bind(hour * 10 + i64::try_from(n)?)
            .execute(&db)
            .await?;
        }
    }
    let range = "since=2026-01-01T01:00:00Z&until=2026-01-01T04:00:00Z";
    let csv = |who: &ApiClient, query: String| {
        let url = format!("{}/v1/usage?{query}", who.base);
        let token = who.token().to_owned();
        async move {
            let r = reqwest::Client::new()
                .get(url)
                .bearer_auth(token)
                .send()
                .await?;
            let status = r.status().as_u16();
            let kind = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let next = r
                .headers()
                .get("vcp-next-cursor")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            anyhow::Ok((status, kind, next, r.text().await?))
        }
    };
    let (s, kind, next, text) = csv(admin, format!("{range}&format=csv")).await?;
    assert_eq!(
        (s, kind.as_str(), next),
        (200, "text/csv; charset=utf-8", None),
        "{text}"
    );
    let want = "sampled_at,owner,tenant,pods,requests_cpu,requests_memory,limits_cpu,limits_memory,services,persistent_volume_claims,requests_storage,namespaces\n\
        2026-01-01T01:00:00Z,team-a,alpha,10,250,1048576,0,0,1,0,0,2\n\
        2026-01-01T01:00:00Z,team-b,beta,11,250,1048576,0,0,1,0,0,2\n\
        2026-01-01T02:00:00Z,team-a,alpha,20,250,1048576,0,0,1,0,0,2\n\
        2026-01-01T02:00:00Z,team-b,beta,21,250,1048576,0,0,1,0,0,2\n\
        2026-01-01T03:00:00Z,team-a,alpha,30,250,1048576,0,0,1,0,0,2\n\
        2026-01-01T03:00:00Z,team-b,beta,31,250,1048576,0,0,1,0,0,2\n";
    assert_eq!(text, want);

    // An owner: its own tenant's only.
    let (s, _, _, text) = csv(&owners[1], format!("{range}&format=csv")).await?;
    assert_eq!(s, 200);
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines.iter().all(|l| l.contains(",team-b,beta,")), "{text}");

    // Pages of three: they meet inside an instant, and together are the whole range.
    let (s, first) = admin
        .raw(Method::GET, &format!("/v1/usage?{range}&limit=3"), None)
        .await?;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["items"].as_array().unwrap().len(), 3);
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let (_, _, next, text) = csv(admin, format!("{range}&limit=3&format=csv")).await?;
    assert_eq!(next.as_deref(), Some(cursor.as_str()));
    assert_eq!(text.lines().count(), 4);
    let (s, second) = admin
        .raw(
            Method::GET,
            &format!("/v1/usage?{range}&limit=3&cursor={cursor}"),
            None,
        )
        .await?;
    assert_eq!(s, 200, "{second}");
    assert!(second["next_cursor"].is_null(), "{second}");
    let pods: Vec<i64> = first["items"]
        .as_array()
        .unwrap()
        .iter()
        .chain(second["items"].as_array().unwrap())
        .map(|i| i["used"]["pods"].as_i64().unwrap())
        .collect();
    assert_eq!(pods, [10, 11, 20, 21, 30, 31]);

    // `/metrics`: each live tenant's latest sample (hour 4), per resource.
    let metrics = reqwest::get(format!("{}/metrics", admin.base))
        .await?
        .text()
        .await?;
    for line in [
        r#"vcp_tenant_usage{owner="team-a",tenant="alpha",resource="pods"} 40"#,
        r#"vcp_tenant_usage{owner="team-b",tenant="beta",resource="pods"} 41"#,
        r#"vcp_tenant_usage{owner="team-b",tenant="beta",resource="requests_memory"} 1048576"#,
    ] {
        assert!(metrics.contains(line), "{line} not in /metrics");
    }

    // Bad input.
    for (query, field) in [
        ("cursor=nope", "cursor"),
        ("since=yesterday", "since"),
        ("limit=0", "limit"),
    ] {
        let (s, b) = admin
            .raw(Method::GET, &format!("/v1/usage?{query}"), None)
            .await?;
        assert_problem(s, &b, 422, Some(field));
    }
    let (s, b) = admin.raw(Method::GET, "/v1/usage?format=xml", None).await?;
    assert_problem(s, &b, 400, None);
    Ok(())
}
