//! The tenant's audit log, against a real `vcp serve`, real tenant apiservers (their audit
//! webhook, the authorizer's egress relay) and a real Postgres on the dev cluster: requests
//! made with kubectl and a user's kubeconfig show up in the owner's
//! `GET /v1/tenants/{name}/audit-events` (and `vcp tenant audit`) with their user, verb and
//! resource, sudo with both the real user and the identity it acted as, a break-glass request
//! with the admin it was issued to, filtered and paged;
//! a Secret's data never reaches the inventory; another owner sees none of it; the ingest
//! refuses what its token does not vouch for; retention deletes exactly the events past it.
//!
//! `vcp serve` runs as a process on the machine; the control planes run on the process node,
//! whose pods reach the machine at their bridge's gateway. The ingest listens there (and only
//! there), so the apiservers' webhooks reach it as they would reach vcp's Service in a cluster.

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing;

/// The process node's pod gateway: where its pods reach this machine.
async fn process_node_gateway(host: &kube::Client) -> anyhow::Result<String> {
    let nodes = Api::<Node>::all(host.clone())
        .list(&ListParams::default().labels("vcp.dev/runtime=process"))
        .await?;
    let cidr = nodes
        .items
        .iter()
        .find_map(|n| n.metadata.annotations.as_ref()?.get("vcp.dev/pod-cidr"))
        .ok_or_else(|| anyhow::anyhow!("no process node with a pod CIDR"))?;
    let net: ipnet::Ipv4Net = cidr.parse()?;
    let base = u32::from(net.network());
    Ok(std::net::Ipv4Addr::from(base + 1).to_string())
}

/// One page of `tenant`'s events with `query`, as `api`'s caller: (status, body).
async fn events(api: &ApiClient, tenant: &str, query: &str) -> anyhow::Result<(u16, Value)> {
    api.raw(
        Method::GET,
        &format!("/v1/tenants/{tenant}/audit-events?{query}"),
        None,
    )
    .await
}

/// The items of a 200 answer.
fn items(body: &Value) -> Vec<Value> {
    body["items"].as_array().cloned().unwrap_or_default()
}

/// Every event of `tenant` matching `query`, page by page (`limit` each).
async fn all_pages(
    api: &ApiClient,
    tenant: &str,
    query: &str,
    limit: u32,
) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let q = match &cursor {
            Some(c) => format!("{query}&limit={limit}&cursor={c}"),
            None => format!("{query}&limit={limit}"),
        };
        let (status, body) = events(api, tenant, &q).await?;
        anyhow::ensure!(status == 200, "{q}: {status} {body}");
        let page = items(&body);
        anyhow::ensure!(page.len() <= limit as usize, "{q}: a page over its limit");
        out.extend(page);
        match body["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_owned()),
            None => return Ok(out),
        }
    }
}

/// Waits until `tenant` has an event matching `query`; its events.
async fn wait_for(api: &ApiClient, tenant: &str, query: &str) -> anyhow::Result<Vec<Value>> {
    testing::eventually(
        &format!("an audit event of {tenant} with {query}"),
        Duration::from_secs(60),
        || async {
            let (status, body) = events(api, tenant, query).await?;
            anyhow::ensure!(status == 200, "{query}: {status} {body}");
            let found = items(&body);
            Ok((!found.is_empty()).then_some(found))
        },
    )
    .await
}

fn kubectl(cluster: &DevCluster, kc: &Path, line: &str) {
    let args: Vec<&str> = line.split_whitespace().collect();
    let (ok, _, err) = testing::kubectl_with(cluster, kc, &args);
    assert!(ok, "kubectl {line}: {err}");
}

#[tokio::test]
async fn a_tenants_requests_reach_its_owners_audit_log_and_nobody_elses() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let gateway = process_node_gateway(&host).await?;
    let [port] = vcp_dev::process::free_ports()?;
    let ingest = format!("http://{gateway}:{port}/audit/v1/events");
    let p = testing::platform_with(
        cluster,
        "vcp-tenant-audit",
        2,
        vec![
            ("VCP_AUDIT_LISTEN".into(), format!("{gateway}:{port}")),
            ("VCP_AUDIT_URL".into(), ingest.clone()),
            ("VCP_TENANT_AUDIT_SWEEP_SECONDS".into(), "1".into()),
        ],
    )
    .await?;
    let admin = &p.admin;
    let (shop_owner, other_owner) = (
        admin.new_owner("team-shop").await?,
        admin.new_owner("team-other").await?,
    );
    shop_owner.create_tenant("shop").await?;
    other_owner.create_tenant("other").await?;
    let (shop, other) = tokio::try_join!(
        shop_owner.wait_ready("shop", Duration::from_secs(240)),
        other_owner.wait_ready("other", Duration::from_secs(240)),
    )?;
    let shop_ns = format!("vcp-{}", shop["key"].as_str().unwrap_or_default());
    let _ = other;

    let dir = p.dir.path();
    let issue = |user: &'static str, groups: &'static [&'static str]| {
        let api = shop_owner.clone();
        async move {
            let path = dir.join(format!("{user}-{}", groups.join("-")));
            std::fs::write(&path, api.kubeconfig("shop", user, groups, "1h").await?)?;
            anyhow::Ok(path)
        }
    };
    let root = issue("root", &["admin"]).await?;
    let alice = issue("alice", &["edit"]).await?;
    let dave = issue("dave", &["view", "sudo"]).await?;
    kubectl(cluster, &root, "create namespace apps");
    kubectl(
        cluster,
        &alice,
        "-n apps create configmap audit-probe --from-literal=k=v",
    );
    kubectl(cluster, &alice, "-n apps get configmaps");
    kubectl(cluster, &alice, "-n apps get configmap audit-probe");
    kubectl(
        cluster,
        &root,
        "-n apps create secret generic vault --from-literal=password=hunter2-marker",
    );
    kubectl(
        cluster,
        &root,
        "-n apps create rolebinding alice-view --clusterrole=view --user=alice",
    );
    kubectl(
        cluster,
        &dave,
        "--as=dave --as-group=vcp:sudo create namespace by-sudo",
    );
    // Break-glass: an admin's plain system:masters certificate, which the tenant's own RBAC
    // and revocations cannot stop, so its requests must name the admin.
    let (status, glass) = admin
        .raw(
            Method::POST,
            "/v1/tenants/shop/break-glass",
            Some(&json!({"reason": "audit drill", "ttl": "15m"})),
        )
        .await?;
    assert_eq!(status, 201, "{glass}");
    let glass_user = glass["user"].as_str().unwrap_or_default().to_owned();
    let glass_path = dir.join("break-glass");
    std::fs::write(
        &glass_path,
        glass["kubeconfig"].as_str().unwrap_or_default(),
    )?;
    kubectl(cluster, &glass_path, "create namespace by-break-glass");

    // The request with its user, verb and resource.
    let created = wait_for(
        &shop_owner,
        "shop",
        "user=alice&verb=create&resource=configmaps",
    )
    .await?;
    assert_eq!(created.len(), 1, "{created:?}");
    let e = &created[0];
    assert_eq!(e["user"], "alice");
    assert!(e["groups"].to_string().contains("edit"), "{e}");
    assert_eq!(e["verb"], "create");
    assert_eq!(e["resource"], "configmaps");
    assert_eq!(
        (&e["namespace"], &e["name"]),
        (&json!("apps"), &json!("audit-probe"))
    );
    assert_eq!(e["response_code"], 201);
    assert_eq!(e["impersonated_user"], Value::Null);
    assert_eq!(e["event"]["auditID"], e["audit_id"]);

    // sudo: the real user, and whom it acted as.
    let sudo = wait_for(
        &shop_owner,
        "shop",
        "user=dave&verb=create&resource=namespaces",
    )
    .await?;
    assert_eq!(sudo[0]["user"], "dave");
    assert_eq!(sudo[0]["impersonated_user"], "dave");
    assert!(
        sudo[0]["impersonated_groups"]
            .as_array()
            .is_some_and(|g| g.contains(&json!("vcp:sudo"))),
        "{}",
        sudo[0]
    );
    assert_eq!(sudo[0]["name"], "by-sudo");

    // Break-glass: the certificate's user, and the admin it was issued to.
    let admin_token: String = admin.raw(Method::GET, "/v1/tokens", None).await?.1["items"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|t| t["role"] == "admin")
        .and_then(|t| t["name"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert_eq!(glass_user, format!("vcp:break-glass:{admin_token}"));
    let by_glass = wait_for(
        &shop_owner,
        "shop",
        &format!("user={glass_user}&verb=create&resource=namespaces"),
    )
    .await?;
    assert_eq!(by_glass[0]["name"], "by-break-glass", "{}", by_glass[0]);
    assert_eq!(by_glass[0]["break_glass_by"], json!(admin_token));

    // An RBAC write in full; a Secret's data never.
    let rb = wait_for(
        &shop_owner,
        "shop",
        "verb=create&resource=rolebindings.rbac.authorization.k8s.io",
    )
    .await?;
    assert_eq!(rb[0]["event"]["requestObject"]["roleRef"]["name"], "view");
    let secret = wait_for(&shop_owner, "shop", "verb=create&resource=secrets").await?;
    assert_eq!(secret[0]["name"], "vault");
    let pool = sqlx::PgPool::connect(&p.database_url).await?;
    let leaked: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tenant_audit_events
         WHERE event::text LIKE '%hunter2-marker%' OR event::text LIKE '%aHVudGVyMi1tYXJrZXI%'",
    )
    .fetch_one(&pool)
    .await?;
    assert_eq!(leaked, 0, "a Secret's data reached the inventory");

    // Filters: every event of alice is hers (or made as her), and only configmaps with that
    // filter; paging one at a time gives what one page gives.
    let (_, body) = events(&shop_owner, "shop", "user=alice&limit=1000").await?;
    let mine = items(&body);
    assert!(mine.len() >= 3, "{body}");
    assert!(
        mine.iter()
            .all(|e| e["user"] == "alice" || e["impersonated_user"] == "alice")
    );
    let (_, body) = events(
        &shop_owner,
        "shop",
        "user=alice&resource=configmaps&verb=get",
    )
    .await?;
    let gets = items(&body);
    assert_eq!(gets.len(), 1, "{body}");
    assert_eq!(gets[0]["name"], "audit-probe");
    let (_, body) = events(
        &shop_owner,
        "shop",
        "user=alice&resource=configmaps&verb=list",
    )
    .await?;
    assert_eq!(items(&body).len(), 1, "{body}");
    assert!(
        gets.iter()
            .all(|e| e["verb"] == "get" && e["resource"] == "configmaps")
    );
    let paged = all_pages(&shop_owner, "shop", "user=alice", 1).await?;
    let ids = |v: &[Value]| v.iter().map(|e| e["audit_id"].clone()).collect::<Vec<_>>();
    assert_eq!(ids(&paged[..mine.len()]), ids(&mine));
    for (status, query) in [
        (422, "verb=Create"),
        (422, "resource=*.apps"),
        (422, "cursor=next"),
        (422, "limit=0"),
        (400, "limit=x"),
    ] {
        assert_eq!(
            events(&shop_owner, "shop", query).await?.0,
            status,
            "{query}"
        );
    }

    // The CLI reads the same log.
    let (code, out, err) = testing::vcp_client(
        env!("CARGO_BIN_EXE_vcp"),
        &shop_owner.base,
        shop_owner_token(&shop_owner),
        200,
        &[
            "tenant", "audit", "shop", "--user", "alice", "--verb", "create", "-o", "json",
        ],
    )
    .await?;
    assert_eq!(code, 0, "{err}");
    let cli: Value = serde_json::from_str(&out)?;
    assert_eq!(ids(&items(&cli)), ids(&created));

    // Another owner: no such tenant, and nothing of shop's in its own tenant's log.
    assert_eq!(events(&other_owner, "shop", "").await?.0, 404);
    wait_for(&other_owner, "other", "verb=get").await?;
    let theirs = all_pages(&other_owner, "other", "verb=get", 1000).await?;
    let shop_ids = ids(&all_pages(&shop_owner, "shop", "verb=get", 1000).await?);
    assert!(theirs.iter().all(|e| e["user"] != "alice"
        && e["user"] != "dave"
        && !shop_ids.contains(&e["audit_id"])),);
    // An admin reads it too.
    assert_eq!(events(admin, "shop", "user=alice").await?.0, 200);

    // The ingest: no token or an unknown one is refused; the tenant's own token with a body
    // that is no EventList is refused and stores nothing.
    let http = reqwest::Client::new();
    let post = |token: Option<&str>, body: &'static str| {
        let mut r = http.post(&ingest).body(body);
        if let Some(t) = token {
            r = r.bearer_auth(t);
        }
        r.send()
    };
    let list = r#"{"kind":"EventList","apiVersion":"audit.k8s.io/v1","items":[]}"#;
    assert_eq!(post(None, list).await?.status(), 401);
    assert_eq!(post(Some("vcp_not-a-token"), list).await?.status(), 401);
    let by_path = http
        .post(format!("{ingest}/vcp_not-a-token"))
        .body(list)
        .send()
        .await?;
    assert_eq!(by_path.status(), 401);
    let token = {
        let s = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(host.clone(), &shop_ns)
            .get("audit-config")
            .await?;
        String::from_utf8(s.data.unwrap_or_default()["token"].0.clone())?
    };
    assert_eq!(post(Some(&token), "not json").await?.status(), 400);
    assert_eq!(post(Some(&token), list).await?.status(), 200);

    // Retention (the default plan keeps 30 days): events aged 31 days go at the next sweep,
    // events aged 29 days stay.
    let shop_id: i64 = sqlx::query_scalar("SELECT id FROM tenants WHERE name = 'shop'")
        .fetch_one(&pool)
        .await?;
    let aged = |days: i64, verb: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query(
                "UPDATE tenant_audit_events SET at = now() - make_interval(days => $1::int)
                 WHERE tenant_id = $2 AND username = 'alice' AND verb = $3",
            )
            .bind(days as i32)
            .bind(shop_id)
            .bind(verb)
            .execute(&pool)
            .await
            .map(|r| r.rows_affected())
        }
    };
    let old = aged(31, "create").await?;
    let kept = aged(29, "get").await?;
    assert!(old >= 1 && kept >= 1, "{old} {kept}");
    testing::eventually("the sweep", Duration::from_secs(30), || async {
        let left: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM tenant_audit_events WHERE at < now() - interval '30 days'",
        )
        .fetch_one(&pool)
        .await?;
        Ok((left == 0).then_some(()))
    })
    .await?;
    let still: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM tenant_audit_events
         WHERE tenant_id = $1 AND username = 'alice' AND verb = 'get'",
    )
    .bind(shop_id)
    .fetch_one(&pool)
    .await?;
    assert_eq!(still as u64, kept, "events within the retention stay");
    let (_, body) = events(
        &shop_owner,
        "shop",
        "user=alice&verb=create&resource=configmaps",
    )
    .await?;
    assert!(items(&body).is_empty(), "{body}");
    Ok(())
}

/// The bearer token an [`ApiClient`] speaks with.
fn shop_owner_token(api: &ApiClient) -> &str {
    api.token()
}
