//! The HTTP API of a real `vcp serve` (no reconcile workers, so nothing is provisioned):
//! authentication, owner isolation, and bad input answered with 4xx problem+json.

use reqwest::Method;
use serde_json::{Value, json};
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::{self, ApiClient, ServeOptions};
use vcp_dev::postgres::EphemeralPostgres;
use vcp_dev::process::Supervision;

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
    let pg = EphemeralPostgres::start().await?;
    let dir = tempfile::tempdir()?;
    let admin_token = platform::new_token();
    let orch = platform::start_orchestrator(
        cluster,
        dir.path(),
        &ServeOptions {
            database_url: pg.create_database("api").await?,
            admin_token: admin_token.clone(),
            replica_id: "vcp-api".into(),
            workers: 0,
            port: None,
            simulate: false,
        },
        Supervision::Attached,
    )
    .await?;
    let admin = ApiClient::new(&orch.url, &admin_token);

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
    let mut owners = Vec::new();
    for name in ["team-a", "team-b"] {
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
    let (a, b) = (&owners[0], &owners[1]);
    let (s, body) = a
        .raw(
            Method::POST,
            "/v1/tokens",
            Some(&json!({"name": "x", "role": "admin"})),
        )
        .await?;
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

    // Deletion is accepted and visible; versions list both minors.
    let (s, t) = a.raw(Method::DELETE, "/v1/tenants/shop", None).await?;
    assert_eq!((s, t["phase"].as_str()), (202, Some("Deleting")));
    let (s, v) = a.raw(Method::GET, "/v1/versions", None).await?;
    assert_eq!(s, 200);
    assert_eq!(v["default"], "1.37");
    assert_eq!(v["versions"].as_array().unwrap().len(), 2);

    let metrics = reqwest::get(format!("{}/metrics", orch.url))
        .await?
        .text()
        .await?;
    assert!(
        metrics.contains("vcp_http_client_errors_total"),
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
    let ok = vcp_dev::testing::eventually(
        "the API answers the printed token",
        std::time::Duration::from_secs(30),
        || async {
            Ok(api
                .raw(Method::GET, "/v1/tenants", None)
                .await
                .ok()
                .filter(|(s, _)| *s == 200))
        },
    )
    .await?;
    assert_eq!(ok.0, 200);
    first.kill()?;
    first.wait()?;

    // Second start on the same inventory: no new token, and the first still works.
    let (mut second, url) = start()?;
    let api = ApiClient::new(&url, &token);
    vcp_dev::testing::eventually(
        "the restarted API answers the first token",
        std::time::Duration::from_secs(30),
        || async {
            Ok(api
                .raw(Method::GET, "/v1/tenants", None)
                .await
                .ok()
                .filter(|(s, _)| *s == 200))
        },
    )
    .await?;
    second.kill()?;
    second.wait()?;
    let mut out = String::new();
    std::io::Read::read_to_string(&mut second.stdout.take().unwrap(), &mut out)?;
    assert!(!out.contains("admin token"), "printed again: {out}");
    Ok(())
}
