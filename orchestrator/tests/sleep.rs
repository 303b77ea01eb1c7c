//! Sleeping tenants end to end on the dev cluster, with a real `vcp serve` and real control
//! planes on the devnode: asked to sleep, the control plane scales to zero (CoreDNS kept while
//! a workload runs) and the apiserver Service says so; the gateway's wake brings it back with
//! its objects; a plan's idle time puts an untouched tenant to sleep by itself; a wake racing a
//! delete leaves nothing behind. Also the gateway token's reach: its two routes and nothing
//! else, and nobody else's token on them.

use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{Api, ListParams, PostParams};
use reqwest::Method;
use serde_json::{Value, json};
use std::time::Duration;
use vcp_dev::cluster::DevCluster;
use vcp_dev::platform::ApiClient;
use vcp_dev::testing::eventually;

const READY_TIMEOUT: Duration = Duration::from_secs(240);
const GATEWAY_TOKEN: &str = "vcp_gw_test_token_0123456789abcdef";

async fn tenant_client(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// The names of the pods in the tenant's control-plane namespace that are not going away.
async fn control_plane_pods(host: &kube::Client, key: &str) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Pod>::namespaced(host.clone(), &format!("vcp-{key}"))
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| p.metadata.name)
        .collect())
}

async fn asleep_annotation(host: &kube::Client, key: &str) -> anyhow::Result<Option<String>> {
    let svc = Api::<Service>::namespaced(host.clone(), &format!("vcp-{key}"))
        .get("kube-apiserver")
        .await?;
    Ok(svc
        .metadata
        .annotations
        .and_then(|a| a.get("vcp.dev/asleep").cloned()))
}

/// Waits until the tenant is `Sleeping` with its control plane gone.
async fn asleep(api: &ApiClient, name: &str, timeout: Duration) -> anyhow::Result<Value> {
    eventually(&format!("{name} asleep"), timeout, || async {
        let t = api.get_tenant(name).await?.unwrap_or_default();
        let down = t["conditions"].as_array().into_iter().flatten().any(|c| {
            c["type"] == "Ready"
                && c["message"]
                    .as_str()
                    .is_some_and(|m| m.starts_with("asleep"))
        });
        Ok((t["phase"] == "Sleeping" && down).then_some(t))
    })
    .await
}

#[tokio::test]
async fn tenants_sleep_when_asked_or_idle_and_wake_with_their_objects() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let platform = vcp_dev::testing::platform_with(
        cluster,
        "vcp-sleep",
        3,
        vec![
            ("VCP_GATEWAY_TOKEN".into(), GATEWAY_TOKEN.into()),
            ("VCP_SLEEP_SWEEP_SECONDS".into(), "5".into()),
        ],
    )
    .await?;
    let api = platform.admin.clone();
    let gateway = api.with_token(GATEWAY_TOKEN);

    // The gateway's token reaches its two routes and nothing else; an owner's reaches neither.
    let (s, b) = gateway.raw(Method::GET, "/v1/tenants", None).await?;
    assert_eq!(s, 403, "{b}");
    let owner = api.new_owner("sleeper").await?;
    let report = json!({"tenants": []});
    let (s, b) = owner
        .raw(Method::POST, "/v1/gateway/activity", Some(&report))
        .await?;
    assert_eq!(s, 403, "{b}");
    let (s, b) = gateway
        .raw(Method::POST, "/v1/gateway/activity", Some(&report))
        .await?;
    assert_eq!((s, b["moved"].as_u64()), (200, Some(0)), "{b}");

    owner.create_tenant("nap").await?;
    let (s, b) = api
        .raw(
            Method::POST,
            "/v1/tenants",
            Some(&json!({"name": "idle", "plan": "sleepy"})),
        )
        .await?;
    assert_eq!(s, 201, "{b}");
    // Not Ready yet: no sleep.
    let (s, b) = api
        .raw(Method::POST, "/v1/tenants/idle/sleep", None)
        .await?;
    assert_eq!(s, 409, "{b}");
    assert_eq!(b["field"], "phase", "{b}");

    let nap = owner.wait_ready("nap", READY_TIMEOUT).await?;
    let nap_key = nap["key"].as_str().unwrap().to_owned();
    let tenant = tenant_client(&owner.kubeconfig("nap", "alice", &["admin"], "1h").await?).await?;
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "default");
    cms.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"k": "v"}}))?,
    )
    .await?;
    // A workload that runs on (simulated) nodes while the control plane sleeps.
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "metadata": {"name": "worker"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }))?,
    )
    .await?;
    eventually("the worker Running", Duration::from_secs(60), || async {
        let p = pods.get("worker").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;

    // Asked to sleep: every control-plane pod goes but CoreDNS, which serves the running pod.
    let (s, b) = owner
        .raw(Method::POST, "/v1/tenants/nap/sleep", None)
        .await?;
    assert_eq!((s, b["sleep"].as_str()), (202, Some("asleep")), "{b}");
    asleep(&owner, "nap", Duration::from_secs(120)).await?;
    let left = control_plane_pods(&host, &nap_key).await?;
    assert!(
        !left.is_empty() && left.iter().all(|p| p.starts_with("coredns-")),
        "only CoreDNS is left while a workload runs: {left:?}"
    );
    assert_eq!(
        asleep_annotation(&host, &nap_key).await?.as_deref(),
        Some("true")
    );
    let (s, _) = owner
        .raw(Method::POST, "/v1/tenants/nap/sleep", None)
        .await?;
    assert_eq!(s, 202, "asking again changes nothing");

    // The gateway's activity report moves the tenant's idle clock; bad reports are refused.
    let now =
        time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339)?;
    let (s, b) = gateway
        .raw(
            Method::POST,
            "/v1/gateway/activity",
            Some(&json!({"tenants": [{"key": nap_key, "at": now}, {"key": "nosuchkey1", "at": now}]})),
        )
        .await?;
    assert_eq!((s, b["moved"].as_u64()), (200, Some(1)), "{b}");
    let seen = owner.get_tenant("nap").await?.unwrap();
    assert!(seen["active_at"].is_string(), "{seen}");
    let too_many: Vec<Value> = (0..501)
        .map(|i| json!({"key": format!("k{i}"), "at": now}))
        .collect();
    for bad in [
        json!({"tenants": [{"key": "Not-A-Key", "at": now}]}),
        json!({"tenants": too_many}),
        json!({"tenants": [{"key": nap_key}]}),
    ] {
        let (s, b) = gateway
            .raw(Method::POST, "/v1/gateway/activity", Some(&bad))
            .await?;
        assert!(s == 422 || s == 400, "{bad}: {s} {b}");
    }

    // The gateway's wake: the control plane comes back on its data.
    let (s, b) = gateway
        .raw(
            Method::POST,
            "/v1/gateway/wake",
            Some(&json!({"key": "nosuchkey1"})),
        )
        .await?;
    assert_eq!(s, 404, "{b}");
    let (s, b) = gateway
        .raw(
            Method::POST,
            "/v1/gateway/wake",
            Some(&json!({"key": nap_key})),
        )
        .await?;
    assert_eq!((s, b["woken"].as_bool()), (202, Some(true)), "{b}");
    let woke = std::time::Instant::now();
    owner.wait_ready("nap", READY_TIMEOUT).await?;
    println!(
        "nap Ready again {:?} after the gateway's wake",
        woke.elapsed()
    );
    let tenant = tenant_client(&owner.kubeconfig("nap", "alice", &["admin"], "1h").await?).await?;
    let kept = Api::<ConfigMap>::namespaced(tenant, "default")
        .get("kept")
        .await?;
    assert_eq!(kept.data.unwrap()["k"], "v");
    assert_eq!(asleep_annotation(&host, &nap_key).await?, None);
    let (s, b) = gateway
        .raw(
            Method::POST,
            "/v1/gateway/wake",
            Some(&json!({"key": nap_key})),
        )
        .await?;
    assert_eq!((s, b["woken"].as_bool()), (202, Some(false)), "{b}");

    // Idle for its plan's minute, with nothing running: asleep by itself, with no pod at all.
    // Its minute starts at Ready, and `nap`'s checks above can take that long on a loaded
    // machine: it may be asleep already when this looks (only a Ready tenant ever sleeps).
    let idle = eventually("idle Ready or asleep", READY_TIMEOUT, || async {
        let t = api.get_tenant("idle").await?.unwrap_or_default();
        Ok(matches!(t["phase"].as_str(), Some("Ready" | "Sleeping")).then_some(t))
    })
    .await?;
    let idle_key = idle["key"].as_str().unwrap().to_owned();
    let slept = asleep(&api, "idle", Duration::from_secs(180)).await?;
    assert_eq!(slept["sleep"], "asleep");
    eventually("no pod left of idle", Duration::from_secs(60), || async {
        Ok(control_plane_pods(&host, &idle_key)
            .await?
            .is_empty()
            .then_some(()))
    })
    .await?;
    let (s, audit) = api
        .raw(Method::GET, "/v1/audit?action=tenant.sleep", None)
        .await?;
    assert_eq!(s, 200, "{audit}");
    let actors: Vec<&str> = audit["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["actor"].as_str())
        .collect();
    assert!(actors.contains(&"vcp:idle-sweep"), "{audit}");
    assert!(actors.contains(&"sleeper"), "{audit}");

    // A wake racing a delete: the delete wins, and nothing of the tenant is left.
    let (wake, delete) = tokio::join!(
        api.raw(Method::POST, "/v1/tenants/idle/wake", None),
        api.raw(Method::DELETE, "/v1/tenants/idle", None),
    );
    let (ws, wb) = wake?;
    assert!(ws == 202 || ws == 404, "{ws} {wb}");
    assert_eq!(delete?.0, 202);
    eventually("idle gone", Duration::from_secs(180), || async {
        Ok(api.get_tenant("idle").await?.is_none().then_some(()))
    })
    .await?;
    eventually(
        "idle's namespace gone",
        Duration::from_secs(120),
        || async {
            let ns = Api::<k8s_openapi::api::core::v1::Namespace>::all(host.clone())
                .get_opt(&format!("vcp-{idle_key}"))
                .await?;
            Ok(ns.is_none().then_some(()))
        },
    )
    .await?;
    owner.delete_tenant("nap").await?;
    Ok(())
}
