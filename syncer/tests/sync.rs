//! The syncer between a real tenant control plane and the real dev host cluster.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Event, Namespace, Node, Pod, Service};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use std::collections::BTreeSet;
use std::time::Duration;
use vcp_core::naming::LABEL_TENANT;
use vcp_dev::DevCluster;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace, running};

type Res<T = ()> = anyhow::Result<T>;

async fn create<K>(client: &Client, ns: &str, v: serde_json::Value) -> Res<K>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let obj: K = serde_json::from_value(v)?;
    Ok(Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &obj)
        .await?)
}

/// An EndpointSlice of Service `db` written by hand (not by Kubernetes' controllers).
fn manual_slice() -> serde_json::Value {
    serde_json::json!({
        "metadata": {"name": "db-manual", "labels": {
            "kubernetes.io/service-name": "db",
            "endpointslice.kubernetes.io/managed-by": "ops.example.com"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["192.0.2.11"]}],
        "ports": [{"port": 5432}],
    })
}

/// A tenant policy that lets hand-written endpoints name the documentation range (outside the
/// cluster; by default only the tenant's own pods may be named).
const DOC_ENDPOINTS: &str = "endpoints: {external_cidrs: [192.0.2.0/24]}";

/// A tenant policy that lets tenant-created NFS volumes reach the host.
const NFS_VOLUMES: &str = "volumes: {persistent_volume_sources: [nfs]}";

/// A tenant control plane with a syncer between it and the shared dev cluster. Destructure
/// it whole: the control plane and the syncer stop when their parts drop.
struct Synced {
    cluster: &'static DevCluster,
    host: Client,
    cp: TenantControlPlane,
    _syncer: vcp_dev::process::Spawned,
    tenant: Client,
}

async fn synced(key: &str) -> Res<Synced> {
    synced_with_policy(key, "{}").await
}

/// [`synced`] with a tenant policy of its own (YAML).
async fn synced_with_policy(key: &str, policy: &str) -> Res<Synced> {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start(key).await?;
    let _syncer = cp.start_syncer(cluster, &[&cp.policy_flag(policy)?])?;
    let tenant = cp.connect().await?;
    Ok(Synced {
        cluster,
        host,
        cp,
        _syncer,
        tenant,
    })
}

#[tokio::test]
async fn a_deployment_with_config_secret_and_service_runs_on_the_host_and_reports_back() -> Res {
    let Synced {
        cluster,
        host,
        cp: tenant_cp,
        _syncer,
        tenant,
    } = synced("e2ea").await?;

    namespace(&tenant, "apps").await?;
    create::<ConfigMap>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}}),
    )
    .await?;
    create::<k8s_openapi::api::core::v1::Secret>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "creds"}, "stringData": {"password": "pw"}}),
    )
    .await?;
    // Referenced by nothing: it must stay in the tenant.
    create::<ConfigMap>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "unused"}, "data": {"mode": "never"}}),
    )
    .await?;
    create::<Deployment>(&tenant, "apps", serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [{
                        "name": "web", "image": "nginx:1.29",
                        "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}],
                        "volumeMounts": [{"name": "settings", "mountPath": "/etc/settings"}],
                    }],
                    "volumes": [{"name": "settings", "configMap": {"name": "settings"}}],
                },
            },
        },
    })).await?;
    create::<Service>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        }),
    )
    .await?;

    // Down: the host has the translated namespace and objects, with markers.
    let host_ns = Api::<Namespace>::all(host.clone());
    let ns = eventually(
        "host namespace e2ea-apps",
        Duration::from_secs(30),
        || async { Ok(host_ns.get_opt("e2ea-apps").await?) },
    )
    .await?;
    assert_eq!(ns.labels()[LABEL_TENANT], "e2ea");
    let host_cm = eventually("host configmap", Duration::from_secs(30), || async {
        Ok(Api::<ConfigMap>::namespaced(host.clone(), "e2ea-apps")
            .get_opt("settings")
            .await?)
    })
    .await?;
    assert_eq!(host_cm.data.as_ref().unwrap()["mode"], "fast");
    assert_eq!(host_cm.labels()[LABEL_TENANT], "e2ea");
    // The Secret the pods use follows the ConfigMap (copied one after the other).
    eventually(
        "the secret the pods use on the host",
        Duration::from_secs(30),
        || async {
            Ok(
                Api::<k8s_openapi::api::core::v1::Secret>::namespaced(host.clone(), "e2ea-apps")
                    .get_opt("creds")
                    .await?,
            )
        },
    )
    .await?;
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "e2ea-apps");
    let hp = eventually("3 running host pods", Duration::from_secs(120), || async {
        let l = host_pods
            .list(&ListParams::default().labels("app=web"))
            .await?;
        Ok((l.items.iter().filter(|p| running(p)).count() == 3).then_some(l.items))
    })
    .await?;
    assert!(
        hp.iter()
            .all(|p| p.spec.as_ref().unwrap().automount_service_account_token == Some(false))
    );

    // Only what pods reference goes down (no --sync-all-configmaps-secrets here): `unused`
    // was created before `settings` went down and the pods ran, so it would be there by now.
    assert!(
        Api::<ConfigMap>::namespaced(host.clone(), "e2ea-apps")
            .get_opt("unused")
            .await?
            .is_none(),
        "an unreferenced configmap reached the host"
    );
    // An edit of a referenced ConfigMap reaches the host copy (as a kubelet would see it).
    Api::<ConfigMap>::namespaced(tenant.clone(), "apps")
        .patch(
            "settings",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"data": {"mode": "safe"}})),
        )
        .await?;
    eventually(
        "the edited configmap on the host",
        Duration::from_secs(60),
        || async {
            let cm = Api::<ConfigMap>::namespaced(host.clone(), "e2ea-apps")
                .get_opt("settings")
                .await?;
            let mode = cm.and_then(|c| c.data?.get("mode").cloned());
            Ok((mode.as_deref() == Some("safe")).then_some(()))
        },
    )
    .await?;

    // Up: tenant pods Running with the host pod IPs, bound to virtual nodes of the host nodes.
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let host_ips: BTreeSet<String> = hp
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    let tp = eventually(
        "3 running bound tenant pods with host IPs",
        Duration::from_secs(120),
        || async {
            let l = tenant_pods
                .list(&ListParams::default().labels("app=web"))
                .await?;
            let ips: BTreeSet<String> = l
                .items
                .iter()
                .filter(|p| running(p))
                .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
                .collect();
            let bound = l
                .items
                .iter()
                .all(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some());
            Ok((ips == host_ips && bound).then_some(l.items))
        },
    )
    .await?;
    let nodes: BTreeSet<String> = tp
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    let tenant_nodes = Api::<Node>::all(tenant.clone())
        .list(&ListParams::default())
        .await?;
    let names: BTreeSet<String> = tenant_nodes.items.iter().map(|n| n.name_any()).collect();
    assert!(
        nodes.is_subset(&names),
        "virtual nodes {names:?} missing some of {nodes:?}"
    );
    assert!(nodes.iter().all(|n| n.starts_with("kwok-node-")));
    // The apiserver taints every node it creates not-ready; the syncer, the tenant's node
    // lifecycle, takes the taint off a node whose host node is Ready.
    eventually(
        "virtual nodes of Ready host nodes without the not-ready taint",
        Duration::from_secs(30),
        || async {
            let l = Api::<Node>::all(tenant.clone())
                .list(&ListParams::default())
                .await?;
            Ok(l.items
                .iter()
                .filter(|n| nodes.contains(&n.name_any()))
                .all(|n| {
                    n.spec
                        .as_ref()
                        .and_then(|s| s.taints.as_ref())
                        .is_none_or(|ts| ts.iter().all(|t| t.key != "node.kubernetes.io/not-ready"))
                })
                .then_some(()))
        },
    )
    .await?;

    // Each host pod's token (issued by the tenant, kept in a host Secret it owns) authenticates
    // to the tenant apiserver as the pod's service account.
    let tenant_pod = &tp[0];
    let secret_name = vcp_syncer::naming::token_secret_name(&tenant_pod.uid().unwrap());
    let host_secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(host.clone(), "e2ea-apps");
    let secret = eventually(
        "the token secret owned by its host pod",
        Duration::from_secs(30),
        || async {
            let s = host_secrets.get_opt(&secret_name).await?;
            Ok(s.filter(|s| {
                s.owner_references()
                    .iter()
                    .any(|o| o.kind == "Pod" && o.name == tenant_pod.name_any())
            }))
        },
    )
    .await?;
    let data = secret.data.unwrap();
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("ca.crt"), &data["ca.crt"].0)?;
    assert_eq!(data["namespace"].0, b"apps");
    let kc = kube::config::Kubeconfig::read_from(&tenant_cp.kubeconfig)?;
    let server = kc.clusters[0]
        .cluster
        .as_ref()
        .unwrap()
        .server
        .clone()
        .unwrap();
    let out = std::process::Command::new(cluster.kubectl())
        .args([
            "--kubeconfig=/dev/null",
            "--server",
            &server,
            "--certificate-authority",
        ])
        .arg(dir.path().join("ca.crt"))
        .args([
            "--token",
            std::str::from_utf8(&data["token"].0)?,
            "auth",
            "whoami",
            "-o",
            "json",
        ])
        .output()?;
    assert!(
        out.status.success(),
        "whoami with the pod token: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let who: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let user = &who["status"]["userInfo"];
    assert_eq!(user["username"], "system:serviceaccount:apps:default");
    // Issued once the pod was bound, as a kubelet asks: the token names the pod's node, as a
    // real cluster's does (the conformance suite's token tests read these claims).
    let node = tenant_pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/node-name"],
        serde_json::json!([node]),
        "{who}"
    );
    assert_eq!(
        user["extra"]["authentication.kubernetes.io/pod-name"],
        serde_json::json!([tenant_pod.name_any()]),
        "{who}"
    );

    // Services keep one ClusterIP on both sides.
    let host_svc = eventually("host service", Duration::from_secs(30), || async {
        Ok(Api::<Service>::namespaced(host.clone(), "e2ea-apps")
            .get_opt("web")
            .await?)
    })
    .await?;
    let host_ip = host_svc.spec.unwrap().cluster_ip.unwrap();
    eventually(
        "tenant service with the host's cluster IP",
        Duration::from_secs(30),
        || async {
            let s = Api::<Service>::namespaced(tenant.clone(), "apps")
                .get("web")
                .await?;
            Ok((s.spec.and_then(|s| s.cluster_ip) == Some(host_ip.clone())).then_some(()))
        },
    )
    .await?;

    // Deleting the Deployment in the tenant removes the host pods and then the tenant pods.
    Api::<Deployment>::namespaced(tenant.clone(), "apps")
        .delete("web", &DeleteParams::foreground())
        .await?;
    eventually("host pods gone", Duration::from_secs(120), || async {
        Ok(host_pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    eventually("tenant pods gone", Duration::from_secs(120), || async {
        Ok(tenant_pods
            .list(&ListParams::default().labels("app=web"))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    Ok(())
}

/// Nodes before any pod, and trust bundles: a tenant lists its pool's nodes from the start,
/// as a real cluster lists its nodes (the conformance suite counts them before its first
/// test), and a pod's `clusterTrustBundle` sources read the tenant's bundles on the host.
#[tokio::test]
async fn a_tenant_lists_its_pool_before_any_pod_and_pods_read_its_trust_bundles() -> Res {
    use k8s_openapi::api::certificates::v1::ClusterTrustBundle;
    let Synced {
        host,
        cp: _cp,
        _syncer,
        tenant,
        ..
    } = synced("e2ectb").await?;
    // The pool of a plan without a selector or tolerations: every host node whose taints
    // keep no pod off it (the node controllers' own taints aside).
    let pool: BTreeSet<String> = Api::<Node>::all(host.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|n| {
            n.spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_none_or(|ts| {
                    ts.iter().all(|t| {
                        t.effect == "PreferNoSchedule" || t.key.starts_with("node.kubernetes.io/")
                    })
                })
        })
        .map(|n| n.name_any())
        .collect();
    assert!(
        !pool.is_empty(),
        "the dev cluster has untainted kwok workers"
    );
    eventually(
        "the pool's nodes in the tenant, before any pod",
        Duration::from_secs(60),
        || async {
            let names: BTreeSet<String> = Api::<Node>::all(tenant.clone())
                .list(&ListParams::default())
                .await?
                .items
                .iter()
                .map(|n| n.name_any())
                .collect();
            Ok((names == pool).then_some(()))
        },
    )
    .await?;
    assert!(
        Api::<Pod>::all(tenant.clone())
            .list(&ListParams::default())
            .await?
            .items
            .is_empty()
    );

    namespace(&tenant, "apps").await?;
    // The apiserver admits only bundles of parseable certificates.
    let ca = vcp_pki::Ca::generate(
        "trust-anchor.example",
        time::OffsetDateTime::now_utc(),
        time::Duration::days(1),
    )?;
    let pem = ca.cert_key().cert_pem.clone();
    let pem = pem.as_str();
    let bundles: Api<ClusterTrustBundle> = Api::all(tenant.clone());
    bundles
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": "anchors"},
                "spec": {"trustBundle": pem},
            }))?,
        )
        .await?;
    let pod: Pod = create(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "anchored"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox",
                    "volumeMounts": [{"name": "ctb", "mountPath": "/ctb"}]}],
                "volumes": [{"name": "ctb", "projected": {"sources": [
                    {"clusterTrustBundle": {"name": "anchors", "path": "anchors.pem"}},
                    {"clusterTrustBundle": {"signerName": "example.com/none",
                        "labelSelector": {}, "path": "none.pem", "optional": true}},
                    {"clusterTrustBundle": {"name": "missing", "path": "missing.pem"}},
                ]}}],
            },
        }),
    )
    .await?;
    let name = vcp_syncer::naming::trust_bundles_name(&pod.uid().unwrap());
    let host_cms: Api<ConfigMap> = Api::namespaced(host.clone(), "e2ectb-apps");
    let cm = eventually(
        "the pod's trust bundles on the host, owned by its host pod",
        Duration::from_secs(60),
        || async {
            Ok(host_cms.get_opt(&name).await?.filter(|c| {
                c.owner_references()
                    .iter()
                    .any(|o| o.kind == "Pod" && o.name == "anchored")
            }))
        },
    )
    .await?;
    // The tenant's bundle by name; an optional source that matched nothing is an empty file;
    // a required one that matched nothing is left out, so the kubelet holds the pod back.
    let data = cm.data.unwrap_or_default();
    assert_eq!(data.get("ctb-0-0").map(String::as_str), Some(pem));
    assert_eq!(data.get("ctb-0-1").map(String::as_str), Some(""));
    assert!(!data.contains_key("ctb-0-2"), "{data:?}");
    let host_pod = Api::<Pod>::namespaced(host.clone(), "e2ectb-apps")
        .get("anchored")
        .await?;
    let volume = host_pod
        .spec
        .unwrap()
        .volumes
        .unwrap()
        .into_iter()
        .find(|v| v.name == "ctb")
        .unwrap();
    let sources = volume.projected.unwrap().sources.unwrap();
    assert!(sources.iter().all(|s| s.cluster_trust_bundle.is_none()
        && s.config_map.as_ref().is_some_and(|c| c.name == name)));
    Ok(())
}

#[tokio::test]
async fn identical_names_in_two_tenants_coexist_and_a_foreign_host_object_is_left_alone() -> Res {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let (b, c) = (
        TenantControlPlane::start("e2eb").await?,
        TenantControlPlane::start("e2ec").await?,
    );
    let all = ["--sync-all-configmaps-secrets"];
    let (_sb, _sc) = (
        b.start_syncer(cluster, &all)?,
        c.start_syncer(cluster, &all)?,
    );
    let (tb, tc) = (b.connect().await?, c.connect().await?);
    for (t, v) in [(&tb, "from-b"), (&tc, "from-c")] {
        namespace(t, "apps").await?;
        create::<ConfigMap>(
            t,
            "apps",
            serde_json::json!({"metadata": {"name": "settings"}, "data": {"who": v}}),
        )
        .await?;
    }
    for (ns, want) in [("e2eb-apps", "from-b"), ("e2ec-apps", "from-c")] {
        let cm = eventually(ns, Duration::from_secs(30), || async {
            Ok(Api::<ConfigMap>::namespaced(host.clone(), ns)
                .get_opt("settings")
                .await?)
        })
        .await?;
        assert_eq!(cm.data.unwrap()["who"], want);
    }

    // Someone else's object in tenant b's host namespace, without markers.
    create::<ConfigMap>(
        &host,
        "e2eb-apps",
        serde_json::json!({"metadata": {"name": "taken"}, "data": {"owner": "ops"}}),
    )
    .await?;
    create::<ConfigMap>(
        &tb,
        "apps",
        serde_json::json!({"metadata": {"name": "taken"}, "data": {"owner": "tenant"}}),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(tb.clone(), "apps");
    eventually(
        "a HostConflict event in the tenant",
        Duration::from_secs(30),
        || async {
            let l = events.list(&ListParams::default()).await?;
            Ok(l.items
                .iter()
                .any(|e| e.reason.as_deref() == Some("HostConflict"))
                .then_some(()))
        },
    )
    .await?;
    let foreign = Api::<ConfigMap>::namespaced(host.clone(), "e2eb-apps")
        .get("taken")
        .await?;
    assert_eq!(
        foreign.data.as_ref().unwrap()["owner"],
        "ops",
        "the syncer changed a host object it does not own"
    );
    assert!(!foreign.labels().contains_key(LABEL_TENANT));

    // Deleting the tenant namespace removes the host namespace of that tenant only.
    Api::<Namespace>::all(tb.clone())
        .delete("apps", &DeleteParams::default())
        .await?;
    eventually("e2eb-apps deleted", Duration::from_secs(90), || async {
        let ns = Api::<Namespace>::all(host.clone())
            .get_opt("e2eb-apps")
            .await?;
        Ok(ns
            .is_none_or(|n| n.metadata.deletion_timestamp.is_some())
            .then_some(()))
    })
    .await?;
    assert!(
        Api::<Namespace>::all(host.clone())
            .get_opt("e2ec-apps")
            .await?
            .is_some()
    );
    Ok(())
}

#[tokio::test]
async fn drift_is_repaired_out_of_band_deletions_are_replaced_and_a_restart_converges() -> Res {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start("e2ed").await?;
    let syncer = cp.start_syncer(cluster, &["--sync-all-configmaps-secrets"])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;
    create::<ConfigMap>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "settings"}, "data": {"mode": "fast"}}),
    )
    .await?;
    create::<Deployment>(&tenant, "apps", serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "web", "image": "nginx:1.29"}]}}},
    })).await?;
    let host_cms: Api<ConfigMap> = Api::namespaced(host.clone(), "e2ed-apps");
    eventually("host configmap", Duration::from_secs(30), || async {
        Ok(host_cms.get_opt("settings").await?)
    })
    .await?;

    // Someone edits the host copy by hand: the tenant's data comes back.
    let patch = serde_json::json!({"data": {"mode": "slow"}});
    host_cms
        .patch(
            "settings",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await?;
    eventually(
        "host configmap restored",
        Duration::from_secs(30),
        || async {
            let cm = host_cms.get("settings").await?;
            Ok((cm
                .data
                .as_ref()
                .and_then(|d| d.get("mode"))
                .map(String::as_str)
                == Some("fast"))
            .then_some(()))
        },
    )
    .await?;

    // A host pod deleted out of band: the tenant loses that pod and its ReplicaSet replaces it.
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "e2ed-apps");
    let before = eventually(
        "2 running tenant pods",
        Duration::from_secs(120),
        || async {
            let l = tenant_pods
                .list(&ListParams::default().labels("app=web"))
                .await?;
            Ok((l.items.iter().filter(|p| running(p)).count() == 2).then_some(l.items))
        },
    )
    .await?;
    let victim = before[0].name_any();
    host_pods.delete(&victim, &DeleteParams::default()).await?;
    eventually(
        "the victim replaced in the tenant",
        Duration::from_secs(120),
        || async {
            let l = tenant_pods
                .list(&ListParams::default().labels("app=web"))
                .await?;
            let names: BTreeSet<String> = l
                .items
                .iter()
                .filter(|p| running(p))
                .map(|p| p.name_any())
                .collect();
            Ok((names.len() == 2 && !names.contains(&victim)).then_some(()))
        },
    )
    .await?;

    // Changes made while the syncer is down are picked up after it restarts.
    drop(syncer);
    create::<ConfigMap>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "late"}, "data": {"x": "1"}}),
    )
    .await?;
    Api::<ConfigMap>::namespaced(tenant.clone(), "apps")
        .delete("settings", &DeleteParams::default())
        .await?;
    let _syncer = cp.start_syncer(cluster, &["--sync-all-configmaps-secrets"])?;
    let converged = eventually(
        "late created and settings removed on the host",
        Duration::from_secs(120),
        || async {
            let late = host_cms.get_opt("late").await?.is_some();
            let settings = host_cms.get_opt("settings").await?.is_some();
            Ok((late && !settings).then_some(()))
        },
    )
    .await;
    if let Err(e) = converged {
        // Seen twice on a loaded CI machine and never locally: keep what the syncer said.
        let late = host_cms.get_opt("late").await?.is_some();
        let settings = host_cms.get_opt("settings").await?.is_some();
        let log = std::fs::read_to_string(cp.syncer_log()).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(80).collect();
        anyhow::bail!(
            "{e} (late on host: {late}, settings on host: {settings}); syncer log tail:\n{}",
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    // Converged: the same two pods on both sides, nothing missing and nothing left over.
    eventually(
        "two pods on each side, the same ones",
        Duration::from_secs(120),
        || async {
            let names = |l: Vec<Pod>| l.into_iter().map(|p| p.name_any()).collect::<BTreeSet<_>>();
            let host_names = names(
                host_pods
                    .list(&ListParams::default().labels("app=web"))
                    .await?
                    .items,
            );
            let tenant_names = names(
                tenant_pods
                    .list(&ListParams::default().labels("app=web"))
                    .await?
                    .items,
            );
            Ok((host_names.len() == 2 && host_names == tenant_names).then_some(()))
        },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn claims_and_statefulset_templates_bind_through_the_host_storage_class() -> Res {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    let setup = synced("e2ef").await?;
    let (host, tenant) = (setup.host.clone(), setup.tenant.clone());
    namespace(&tenant, "data").await?;
    create::<PersistentVolumeClaim>(&tenant, "data", serde_json::json!({
        "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    })).await?;
    create::<StatefulSet>(&tenant, "data", serde_json::json!({
        "metadata": {"name": "db"},
        "spec": {
            "serviceName": "db", "replicas": 2,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [{
                "name": "db", "image": "postgres:17",
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "2Gi"}}}}],
        },
    })).await?;

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(tenant.clone(), "data");
    let bound = eventually("3 bound tenant claims", Duration::from_secs(90), || async {
        let l = claims.list(&ListParams::default()).await?;
        let bound: Vec<_> = l
            .items
            .into_iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .collect();
        Ok((bound.len() == 3).then_some(bound))
    })
    .await?;
    let tenant_pvs = Api::<PersistentVolume>::all(tenant.clone());
    for c in &bound {
        let pv = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .expect("bound claims name their volume");
        let v = tenant_pvs.get(&pv).await?;
        assert_eq!(
            v.spec.unwrap().claim_ref.unwrap().name.as_deref(),
            Some(c.name_any().as_str())
        );
        // The tenant's volume is the host's, by name.
        let host_claim = Api::<PersistentVolumeClaim>::namespaced(host.clone(), "e2ef-data")
            .get(&c.name_any())
            .await?;
        assert_eq!(host_claim.spec.unwrap().volume_name, Some(pv));
    }
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "data");
    eventually(
        "both StatefulSet pods running",
        Duration::from_secs(120),
        || async {
            let l = pods.list(&ListParams::default().labels("app=db")).await?;
            Ok((l.items.iter().filter(|p| running(p)).count() == 2).then_some(()))
        },
    )
    .await?;
    // A member's own name in its /etc/hosts is the tenant's: the host pod has the syncer's
    // init container and its copy of the file; the tenant pod shows neither.
    let member = Api::<Pod>::namespaced(host.clone(), "e2ef-data")
        .get("db-0")
        .await?;
    let spec = member.spec.unwrap();
    let fix = &spec.init_containers.as_ref().expect("an init container")[0];
    assert_eq!(fix.name, "vcp-etc-hosts");
    assert!(
        fix.args
            .iter()
            .flatten()
            .any(|a| a == "--to-domain=db.data.svc.cluster.local"),
        "{:?}",
        fix.args
    );
    assert!(
        spec.containers[0]
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == "/etc/hosts" && m.name == "vcp-etc-hosts")
    );
    let shown = pods.get("db-0").await?;
    assert!(shown.spec.unwrap().init_containers.is_none());
    let status = serde_json::to_string(&shown.status).unwrap();
    assert!(!status.contains("vcp-etc-hosts"), "{status}");

    // A deleted claim takes its mirrored volume and its host claim along.
    let scratch_pv = bound
        .iter()
        .find(|c| c.name_any() == "scratch")
        .unwrap()
        .spec
        .as_ref()
        .unwrap()
        .volume_name
        .clone()
        .unwrap();
    claims.delete("scratch", &DeleteParams::default()).await?;
    eventually(
        "mirror and host claim gone",
        Duration::from_secs(120),
        || async {
            let mirror = tenant_pvs.get_opt(&scratch_pv).await?.is_some();
            let host_claim = Api::<PersistentVolumeClaim>::namespaced(host.clone(), "e2ef-data")
                .get_opt("scratch")
                .await?
                .is_some();
            Ok((!mirror && !host_claim).then_some(()))
        },
    )
    .await?;
    Ok(())
}

fn env_of(p: &Pod) -> std::collections::BTreeMap<String, String> {
    p.spec.as_ref().unwrap().containers[0]
        .env
        .iter()
        .flatten()
        .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test]
async fn host_pods_carry_service_links_of_the_tenant_services() -> Res {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start("e2eh").await?;
    // The tenant's control-plane namespace on the host, with the apiserver Service the syncer
    // points pods at (no selector: its ClusterIP is data here, nothing connects to it).
    namespace(&host, "vcp-e2eh").await?;
    let apiserver = create::<Service>(
        &host,
        "vcp-e2eh",
        serde_json::json!({
            "metadata": {"name": "kube-apiserver"},
            "spec": {"ports": [{"name": "https", "port": 6443}]},
        }),
    )
    .await?;
    let api_ip = apiserver.spec.unwrap().cluster_ip.unwrap();
    let _syncer = cp.start_syncer(cluster, &["--host-namespace=vcp-e2eh"])?;
    let tenant = cp.connect().await?;
    // The tenant's own `kubernetes` endpoints are that Service, not the control plane's pods.
    let eps = Api::<k8s_openapi::api::core::v1::Endpoints>::namespaced(tenant.clone(), "default");
    let want = format!("{api_ip}:6443");
    eventually(
        "the tenant's kubernetes endpoints",
        Duration::from_secs(30),
        || async {
            let shown: Vec<String> = eps
                .get_opt("kubernetes")
                .await?
                .into_iter()
                .flat_map(|e| e.subsets.unwrap_or_default())
                .flat_map(|s| {
                    let port = s.ports.unwrap_or_default().first().map_or(0, |p| p.port);
                    s.addresses
                        .unwrap_or_default()
                        .into_iter()
                        .map(move |a| format!("{}:{port}", a.ip))
                })
                .collect();
            Ok((shown == [want.clone()]).then_some(()))
        },
    )
    .await?;
    namespace(&tenant, "apps").await?;
    let svc = create::<Service>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"ports": [{"name": "http", "port": 80}]},
        }),
    )
    .await?;
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    let host_svcs: Api<Service> = Api::namespaced(host.clone(), "e2eh-apps");
    eventually("host service", Duration::from_secs(30), || async {
        Ok(host_svcs.get_opt("web").await?)
    })
    .await?;
    for (name, links) in [("linked", true), ("unlinked", false)] {
        create::<Pod>(
            &tenant,
            "apps",
            serde_json::json!({
                "metadata": {"name": name, "labels": {"v": "1"}},
                "spec": {"enableServiceLinks": links, "containers": [{
                    "name": "c", "image": "registry.k8s.io/pause:3.10",
                    "env": [{"name": "WEB_SERVICE_PORT", "value": "8080"},
                        {"name": "KUBERNETES_PORT_443_TCP_ADDR", "value": "192.0.2.66"}]}]},
            }),
        )
        .await?;
    }
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "e2eh-apps");
    let linked = eventually("host pod linked", Duration::from_secs(60), || async {
        Ok(host_pods.get_opt("linked").await?)
    })
    .await?;
    let env = env_of(&linked);
    assert_eq!(env.get("WEB_SERVICE_HOST"), Some(&ip));
    assert_eq!(env["WEB_SERVICE_PORT_HTTP"], "80");
    assert_eq!(env["WEB_PORT_80_TCP"], format!("tcp://{ip}:80"));
    assert_eq!(
        env["WEB_SERVICE_PORT"], "8080",
        "the container's own value wins"
    );
    assert_eq!(
        linked.spec.as_ref().unwrap().enable_service_links,
        Some(false),
        "never the host's links"
    );
    let unlinked = eventually("host pod unlinked", Duration::from_secs(60), || async {
        Ok(host_pods.get_opt("unlinked").await?)
    })
    .await?;
    assert!(!env_of(&unlinked).contains_key("WEB_SERVICE_HOST"));
    // Every KUBERNETES_* name the host kubelet would inject (links or not) is set to the tenant
    // apiserver's host Service, and the tenant's forged value is gone.
    let kubernetes = [
        ("KUBERNETES_SERVICE_HOST", api_ip.clone()),
        ("KUBERNETES_SERVICE_PORT", "6443".into()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", "6443".into()),
        ("KUBERNETES_PORT", format!("tcp://{api_ip}:6443")),
        ("KUBERNETES_PORT_443_TCP", format!("tcp://{api_ip}:6443")),
        ("KUBERNETES_PORT_443_TCP_PROTO", "tcp".into()),
        ("KUBERNETES_PORT_443_TCP_PORT", "6443".into()),
        ("KUBERNETES_PORT_443_TCP_ADDR", api_ip.clone()),
    ];
    for pod in [&linked, &unlinked] {
        let env = env_of(pod);
        for (name, want) in &kubernetes {
            assert_eq!(
                env.get(*name),
                Some(want),
                "{name} of host pod {}",
                pod.name_any()
            );
        }
        let vars = pod.spec.as_ref().unwrap().containers[0]
            .env
            .iter()
            .flatten()
            .filter(|e| e.name == "KUBERNETES_PORT_443_TCP_ADDR")
            .count();
        assert_eq!(vars, 1, "the tenant's forged variable is gone");
    }

    // A Service created later does not change the running pod (env is immutable), and the
    // pod's mutable fields still sync.
    create::<Service>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "late"}, "spec": {"ports": [{"port": 81}]}}),
    )
    .await?;
    eventually("host service late", Duration::from_secs(30), || async {
        Ok(host_svcs.get_opt("late").await?)
    })
    .await?;
    Api::<Pod>::namespaced(tenant.clone(), "apps")
        .patch(
            "linked",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"metadata": {"labels": {"v": "2"}}})),
        )
        .await?;
    let relabelled = eventually(
        "the new label on the host pod",
        Duration::from_secs(60),
        || async {
            let p = host_pods.get("linked").await?;
            Ok((p.labels().get("v").map(String::as_str) == Some("2")).then_some(p))
        },
    )
    .await?;
    assert!(!env_of(&relabelled).contains_key("LATE_SERVICE_HOST"));
    assert_eq!(env_of(&relabelled), env);
    Ok(())
}

#[tokio::test]
async fn hand_written_endpoints_of_selector_less_services_go_down_and_away() -> Res {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let setup = synced_with_policy("e2ei", DOC_ENDPOINTS).await?;
    let (host, tenant) = (setup.host.clone(), setup.tenant.clone());
    namespace(&tenant, "apps").await?;
    for (name, selector) in [
        ("db", None),
        ("web", Some(serde_json::json!({"app": "web"}))),
    ] {
        create::<Service>(
            &tenant,
            "apps",
            serde_json::json!({"metadata": {"name": name},
                "spec": {"selector": selector, "ports": [{"port": 5432}]}}),
        )
        .await?;
    }
    // Addresses from the documentation range: data only, nothing connects to them.
    create::<Endpoints>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "db"},
            "subsets": [{"addresses": [{"ip": "192.0.2.10"}], "ports": [{"port": 5432}]}],
        }),
    )
    .await?;
    create::<EndpointSlice>(&tenant, "apps", manual_slice()).await?;

    let host_eps: Api<Endpoints> = Api::namespaced(host.clone(), "e2ei-apps");
    let host_slices: Api<EndpointSlice> = Api::namespaced(host.clone(), "e2ei-apps");
    let ep = eventually("host endpoints db", Duration::from_secs(60), || async {
        Ok(host_eps.get_opt("db").await?)
    })
    .await?;
    assert_eq!(ep.labels()[LABEL_TENANT], "e2ei");
    assert_eq!(
        ep.subsets.unwrap()[0].addresses.as_ref().unwrap()[0].ip,
        "192.0.2.10"
    );
    let slice = eventually("host slice db-manual", Duration::from_secs(60), || async {
        Ok(host_slices.get_opt("db-manual").await?)
    })
    .await?;
    assert_eq!(slice.labels()["kubernetes.io/service-name"], "db");
    assert_eq!(slice.endpoints.unwrap()[0].addresses, ["192.0.2.11"]);

    // Slices Kubernetes manages (the tenant's mirror of db's Endpoints, web's computed ones)
    // and Endpoints of a Service with a selector are not copied.
    let tenant_slices = Api::<EndpointSlice>::namespaced(tenant.clone(), "apps")
        .list(&ListParams::default())
        .await?;
    for s in tenant_slices
        .items
        .iter()
        .filter(|s| s.name_any() != "db-manual")
    {
        let copy = host_slices.get_opt(&s.name_any()).await?;
        assert!(
            copy.is_none_or(|c| !c.annotations().contains_key(vcp_core::naming::ANN_UID)),
            "controller-managed tenant slice {} was copied",
            s.name_any()
        );
    }
    if let Some(web) = host_eps.get_opt("web").await? {
        assert!(
            !web.annotations().contains_key(vcp_core::naming::ANN_UID),
            "endpoints of a service with a selector were copied"
        );
    }

    Api::<Endpoints>::namespaced(tenant.clone(), "apps")
        .delete("db", &DeleteParams::default())
        .await?;
    Api::<EndpointSlice>::namespaced(tenant.clone(), "apps")
        .delete("db-manual", &DeleteParams::default())
        .await?;
    eventually("host copies gone", Duration::from_secs(60), || async {
        let ep = host_eps.get_opt("db").await?.is_some();
        let slice = host_slices.get_opt("db-manual").await?.is_some();
        Ok((!ep && !slice).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_selector_hands_endpoints_to_the_host_and_removing_it_hands_them_back() -> Res {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Patch, PatchParams};
    use vcp_core::naming::{ANN_NAME, ANN_UID};
    let setup = synced_with_policy("e2eo", DOC_ENDPOINTS).await?;
    let (host, tenant) = (setup.host.clone(), setup.tenant.clone());
    namespace(&tenant, "apps").await?;
    create::<Service>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "db"}, "spec": {"ports": [{"port": 5432}]}}),
    )
    .await?;
    // Addresses from the documentation range: data only, nothing connects to them.
    let endpoints = |ip: &str| {
        serde_json::json!({
            "metadata": {"name": "db"},
            "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 5432}]}],
        })
    };
    create::<Endpoints>(&tenant, "apps", endpoints("192.0.2.10")).await?;
    create::<EndpointSlice>(&tenant, "apps", manual_slice()).await?;
    let host_eps: Api<Endpoints> = Api::namespaced(host.clone(), "e2eo-apps");
    let host_slices: Api<EndpointSlice> = Api::namespaced(host.clone(), "e2eo-apps");
    let copied = |ip: &'static str| {
        let (host_eps, host_slices) = (host_eps.clone(), host_slices.clone());
        async move {
            let ep = host_eps.get_opt("db").await?.filter(|ep| {
                ep.annotations().contains_key(ANN_UID)
                    && ep
                        .subsets
                        .iter()
                        .flatten()
                        .any(|s| s.addresses.iter().flatten().any(|a| a.ip == ip))
            });
            let slice = host_slices.get_opt("db-manual").await?;
            anyhow::Ok(ep.zip(slice))
        }
    };
    eventually(
        "copies of endpoints and slice",
        Duration::from_secs(60),
        || copied("192.0.2.10"),
    )
    .await?;

    // A selector: the host computes db's endpoints, and the copies go.
    let services: Api<Service> = Api::namespaced(tenant.clone(), "apps");
    let pp = PatchParams::default();
    services
        .patch(
            "db",
            &pp,
            &Patch::Merge(serde_json::json!({"spec": {"selector": {"app": "db"}}})),
        )
        .await?;
    let handed_over = || async {
        let ep = host_eps.get_opt("db").await?;
        let ours = ep.is_some_and(|ep| ep.annotations().contains_key(ANN_NAME));
        let slice = host_slices.get_opt("db-manual").await?.is_some();
        anyhow::Ok((!ours && !slice).then_some(()))
    };
    eventually(
        "host copies deleted once the service has a selector",
        Duration::from_secs(60),
        handed_over,
    )
    .await?;
    eventually(
        "the host's own endpoints for db",
        Duration::from_secs(60),
        || async { Ok(host_eps.get_opt("db").await?) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        handed_over().await?.is_some(),
        "the syncer copied endpoints of a selector service again"
    );

    // No selector again: what the tenant writes by hand goes down again, slice included.
    services
        .patch(
            "db",
            &pp,
            &Patch::Merge(serde_json::json!({"spec": {"selector": null}})),
        )
        .await?;
    let host_svc = Api::<Service>::namespaced(host.clone(), "e2eo-apps");
    eventually(
        "host service without selector",
        Duration::from_secs(60),
        || async {
            let s = host_svc.get("db").await?;
            Ok(s.spec.and_then(|s| s.selector).is_none().then_some(()))
        },
    )
    .await?;
    Api::<Endpoints>::namespaced(tenant.clone(), "apps")
        .patch(
            "db",
            &pp,
            &Patch::Merge(serde_json::json!({"subsets": endpoints("192.0.2.20")["subsets"]})),
        )
        .await?;
    let (ep, slice) = eventually(
        "copies of the hand-written endpoints again",
        Duration::from_secs(60),
        || copied("192.0.2.20"),
    )
    .await?;
    let tenant_ep = Api::<Endpoints>::namespaced(tenant.clone(), "apps")
        .get("db")
        .await?;
    assert_eq!(
        ep.annotations().get(ANN_UID),
        tenant_ep.metadata.uid.as_ref()
    );
    assert_eq!(slice.endpoints.unwrap()[0].addresses, ["192.0.2.11"]);
    Ok(())
}

#[tokio::test]
async fn a_tenant_volume_and_the_claim_naming_it_bind_on_the_host() -> Res {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    // NFS volumes (data for the API: nothing mounts them here) are the plan's to allow.
    let setup = synced_with_policy("e2ej", NFS_VOLUMES).await?;
    let (host, tenant) = (setup.host.clone(), setup.tenant.clone());
    namespace(&tenant, "apps").await?;
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-a"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
            "storageClassName": "manual", "persistentVolumeReclaimPolicy": "Retain",
            "nfs": {"server": "192.0.2.50", "path": "/exports/local-a"}},
    }))?;
    let tenant_pvs = Api::<PersistentVolume>::all(tenant.clone());
    tenant_pvs.create(&PostParams::default(), &pv).await?;
    create::<PersistentVolumeClaim>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
                "volumeName": "local-a", "resources": {"requests": {"storage": "1Gi"}}},
        }),
    )
    .await?;

    let host_pvs = Api::<PersistentVolume>::all(host.clone());
    let host_claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), "e2ej-apps");
    let bound = eventually(
        "the host volume bound to the host claim",
        Duration::from_secs(120),
        || async {
            let v = host_pvs.get_opt("e2ej-local-a").await?;
            Ok(v.filter(|v| v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")))
        },
    )
    .await;
    let hpv = match bound {
        Ok(v) => v,
        Err(e) => {
            let v = host_pvs.get_opt("e2ej-local-a").await?;
            let c = host_claims.get_opt("data").await?;
            let tv = tenant_pvs.get_opt("local-a").await?;
            anyhow::bail!(
                "{e}\nhost volume: {:?}\nhost claim: {:?}\ntenant volume: {:?}",
                v.map(|v| (
                    v.metadata.annotations,
                    v.spec.and_then(|s| s.claim_ref),
                    v.status
                )),
                c.map(|c| (c.spec, c.status)),
                tv.map(|v| (v.spec.and_then(|s| s.claim_ref), v.status))
            );
        }
    };
    assert_eq!(hpv.labels()[LABEL_TENANT], "e2ej");
    let spec = hpv.spec.unwrap();
    assert_eq!(spec.storage_class_name.as_deref(), Some("manual"));
    let claim_ref = spec.claim_ref.unwrap();
    assert_eq!(
        (claim_ref.namespace.as_deref(), claim_ref.name.as_deref()),
        (Some("e2ej-apps"), Some("data"))
    );
    let hclaim = host_claims.get("data").await?;
    assert_eq!(
        hclaim.spec.unwrap().volume_name.as_deref(),
        Some("e2ej-local-a")
    );
    assert_eq!(
        claim_ref.uid, hclaim.metadata.uid,
        "bound to the host claim"
    );
    eventually(
        "tenant volume and claim bound",
        Duration::from_secs(60),
        || async {
            let v = tenant_pvs.get("local-a").await?;
            let c = Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "apps")
                .get("data")
                .await?;
            let phase = v.status.and_then(|s| s.phase);
            let bound_to = c.spec.and_then(|s| s.volume_name);
            Ok(
                (phase.as_deref() == Some("Bound") && bound_to.as_deref() == Some("local-a"))
                    .then_some(()),
            )
        },
    )
    .await?;
    assert!(
        tenant_pvs
            .list(&ListParams::default().labels(vcp_syncer::kinds::pvcs::translate::MIRROR_LABEL))
            .await?
            .items
            .is_empty(),
        "no mirror for a claim bound to a tenant volume"
    );

    // Gone in the tenant, gone on the host.
    Api::<PersistentVolumeClaim>::namespaced(tenant.clone(), "apps")
        .delete("data", &DeleteParams::default())
        .await?;
    tenant_pvs
        .delete("local-a", &DeleteParams::default())
        .await?;
    eventually("host volume gone", Duration::from_secs(120), || async {
        Ok(host_pvs
            .get_opt("e2ej-local-a")
            .await?
            .is_none()
            .then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn claims_the_tenant_binds_later_bind_on_the_host_and_unclaimed_volumes_are_no_ones() -> Res {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::api::{Patch, PatchParams};
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let (p, q) = (
        TenantControlPlane::start("e2ep").await?,
        TenantControlPlane::start("e2eq").await?,
    );
    let _syncers = (
        p.start_syncer(cluster, &[&p.policy_flag(NFS_VOLUMES)?])?,
        q.start_syncer(cluster, &[&q.policy_flag(NFS_VOLUMES)?])?,
    );
    let (tp, tq) = (p.connect().await?, q.connect().await?);
    for t in [&tp, &tq] {
        namespace(t, "apps").await?;
    }
    let volume = |name: &str, class: &str| -> Res<PersistentVolume> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "storageClassName": class, "persistentVolumeReclaimPolicy": "Retain",
                "nfs": {"server": "192.0.2.50", "path": format!("/exports/{name}")}},
        }))?)
    };
    let claim = |name: &str, class: &str| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                "resources": {"requests": {"storage": "1Gi"}}},
        })
    };
    let host_pvs = Api::<PersistentVolume>::all(host.clone());
    let p_pvs = Api::<PersistentVolume>::all(tp.clone());
    let pp = PostParams::default();

    // e2ep's unclaimed volume is not on the host, where e2eq's claim of the same class
    // would take it.
    p_pvs.create(&pp, &volume("local-a", "shared")?).await?;
    eventually(
        "the tenant volume available",
        Duration::from_secs(60),
        || async {
            let v = p_pvs.get("local-a").await?;
            Ok((v.status.and_then(|s| s.phase).as_deref() == Some("Available")).then_some(()))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    create::<PersistentVolumeClaim>(&tq, "apps", claim("grab", "shared")).await?;
    let q_host_claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), "e2eq-apps");
    eventually("e2eq's host claim", Duration::from_secs(60), || async {
        Ok(q_host_claims.get_opt("grab").await?)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let grab = q_host_claims.get("grab").await?;
    assert_eq!(
        grab.spec.and_then(|s| s.volume_name),
        None,
        "e2eq's claim bound e2ep's volume on the host"
    );
    assert!(host_pvs.get_opt("e2ep-local-a").await?.is_none());

    // A claim made without volumeName: the tenant's binder picks the volume, and only then
    // does the volume go down, pre-bound to that claim's host copy.
    create::<PersistentVolumeClaim>(&tp, "apps", claim("data", "shared")).await?;
    // A claim waiting on the host first, then pointed by the tenant at a volume of its own.
    create::<PersistentVolumeClaim>(&tp, "apps", claim("logs", "shared-b")).await?;
    let p_host_claims = Api::<PersistentVolumeClaim>::namespaced(host.clone(), "e2ep-apps");
    eventually(
        "e2ep's host claim logs",
        Duration::from_secs(60),
        || async { Ok(p_host_claims.get_opt("logs").await?) },
    )
    .await?;
    p_pvs.create(&pp, &volume("local-b", "shared-b")?).await?;
    Api::<PersistentVolumeClaim>::namespaced(tp.clone(), "apps")
        .patch(
            "logs",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"volumeName": "local-b"}})),
        )
        .await?;

    for (claim, volume) in [("data", "local-a"), ("logs", "local-b")] {
        let host_volume = format!("e2ep-{volume}");
        let consistent = eventually(
            "host volume and host claim bound to each other",
            Duration::from_secs(120),
            || async {
                let v = host_pvs.get_opt(&host_volume).await?;
                let c = p_host_claims.get(claim).await?;
                let bound = |phase: Option<&str>| phase == Some("Bound");
                Ok(v.filter(|v| {
                    let r = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
                    bound(v.status.as_ref().and_then(|s| s.phase.as_deref()))
                        && bound(c.status.as_ref().and_then(|s| s.phase.as_deref()))
                        && r.is_some_and(|r| {
                            r.namespace.as_deref() == Some("e2ep-apps")
                                && r.name.as_deref() == Some(claim)
                                && r.uid == c.metadata.uid
                        })
                        && c.spec.as_ref().and_then(|s| s.volume_name.as_deref())
                            == Some(host_volume.as_str())
                }))
            },
        )
        .await;
        if let Err(e) = consistent {
            let v = host_pvs.get_opt(&host_volume).await?;
            let c = p_host_claims.get_opt(claim).await?;
            anyhow::bail!(
                "{e}\nhost volume: {:?}\nhost claim: {:?}",
                v.map(|v| (v.spec.and_then(|s| s.claim_ref), v.status)),
                c.map(|c| (c.spec.and_then(|s| s.volume_name), c.status))
            );
        }
        eventually(
            "tenant volume and claim bound",
            Duration::from_secs(60),
            || async {
                let v = p_pvs.get(volume).await?;
                let c = Api::<PersistentVolumeClaim>::namespaced(tp.clone(), "apps")
                    .get(claim)
                    .await?;
                let phase = c.status.and_then(|s| s.phase);
                let v_phase = v.status.and_then(|s| s.phase);
                let bound_to = c.spec.and_then(|s| s.volume_name);
                Ok((phase.as_deref() == Some("Bound")
                    && v_phase.as_deref() == Some("Bound")
                    && bound_to.as_deref() == Some(volume))
                .then_some(()))
            },
        )
        .await?;
    }
    let grab = q_host_claims.get("grab").await?;
    assert_eq!(grab.spec.and_then(|s| s.volume_name), None);
    Ok(())
}

#[tokio::test]
async fn host_events_about_synced_pods_show_on_the_tenant_pods_once() -> Res {
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start("e2ek").await?;
    let syncer = cp.start_syncer(cluster, &[])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;
    let deploy = |name: &str| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}},
        })
    };
    let events: Api<Event> = Api::namespaced(tenant.clone(), "apps");
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "e2ek-apps");
    let host_events: Api<Event> = Api::namespaced(host.clone(), "e2ek-apps");
    // A Deployment's pod on the host (bound in the tenant), and a kubelet-style Event about its
    // host pod whose message names the host namespace (kwok's nodes send none of their own).
    let bound = |app: &'static str| {
        let (pods, host_pods, host_events) = (pods.clone(), host_pods.clone(), host_events.clone());
        async move {
            let pod = eventually(
                &format!("tenant pod {app} bound"),
                Duration::from_secs(120),
                || async {
                    Ok(pods
                        .list(&ListParams::default().labels(&format!("app={app}")))
                        .await?
                        .items
                        .into_iter()
                        .find(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()))
                },
            )
            .await?;
            let name = pod.name_any();
            let h = host_pods.get(&name).await?;
            let mut ev = host_event(
                &format!("{name}.pulled"),
                "e2ek-apps",
                ["Pod", "e2ek-apps", &name, &h.uid().unwrap_or_default()],
                "Pulled",
            )?;
            ev.message = Some(format!("pulled for e2ek-apps/{name}"));
            host_events.create(&PostParams::default(), &ev).await?;
            anyhow::Ok(pod)
        }
    };
    let copies = |pod: Pod, reason: &'static str| {
        let events = events.clone();
        async move {
            let found: Vec<Event> = events
                .list(&ListParams::default())
                .await?
                .items
                .into_iter()
                .filter(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.involved_object.kind.as_deref() == Some("Pod")
                        && e.involved_object.name == pod.metadata.name
                        && e.involved_object.uid == pod.metadata.uid
                })
                .collect();
            anyhow::Ok(found)
        }
    };
    create::<Deployment>(&tenant, "apps", deploy("web")).await?;
    let web = bound("web").await?;
    let first = eventually(
        "the host pod's Event on the tenant pod",
        Duration::from_secs(120),
        || async {
            let found = copies(web.clone(), "Pulled").await?;
            Ok((!found.is_empty()).then_some(found))
        },
    )
    .await?;
    assert_eq!(first.len(), 1);
    assert_eq!(
        first[0].message.as_deref(),
        Some(format!("pulled for apps/{}", web.name_any()).as_str()),
        "host namespace leaked"
    );
    // The host scheduler's binding record stays on the host: the tenant pod's binding is it.
    let host_scheduled = host_events
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .any(|e| e.reason.as_deref() == Some("Scheduled"));
    assert!(host_scheduled, "the host scheduler recorded no binding");
    assert_eq!(copies(web.clone(), "Scheduled").await?.len(), 0);

    // A restarted syncer sees every host event again and copies none twice.
    drop(syncer);
    let _syncer = cp.start_syncer(cluster, &[])?;
    create::<Deployment>(&tenant, "apps", deploy("api")).await?;
    let api = bound("api").await?;
    eventually(
        "the new syncer copies events",
        Duration::from_secs(120),
        || async {
            let found = copies(api.clone(), "Pulled").await?;
            Ok((!found.is_empty()).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        copies(web, "Pulled").await?.len(),
        1,
        "the Event was copied twice"
    );
    Ok(())
}

/// A host Event about `object` (kind, namespace, name, uid) with `reason`, in `ns`.
fn host_event(name: &str, ns: &str, object: [&str; 4], reason: &str) -> Res<Event> {
    let [kind, object_ns, object_name, uid] = object;
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "namespace": object_ns,
            "name": object_name, "uid": uid},
        "reason": reason, "type": "Normal", "message": format!("probe {reason}"),
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingComponent": "vcp-test", "reportingInstance": "vcp-test-1", "action": "Probe",
    }))?)
}

#[tokio::test]
async fn host_events_reach_only_the_tenant_whose_host_namespace_they_are_in() -> Res {
    use vcp_core::naming::{ANN_NAME, ANN_NAMESPACE};
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    // A host namespace spelled like tenant e2em's namespace `stray`, but not the syncer's: what
    // happens in it is someone else's, even about an object carrying e2em's markers.
    namespace(&host, "e2em-stray").await?;
    let (m, n) = (
        TenantControlPlane::start("e2em").await?,
        TenantControlPlane::start("e2en").await?,
    );
    let _syncers = (m.start_syncer(cluster, &[])?, n.start_syncer(cluster, &[])?);
    let (tm, tn) = (m.connect().await?, n.connect().await?);
    namespace(&tm, "stray").await?;
    // The tenant's own ConfigMap `web` there keeps the look-alike from being collected.
    create::<ConfigMap>(
        &tm,
        "stray",
        serde_json::json!({"metadata": {"name": "web"}}),
    )
    .await?;
    let forged = create::<ConfigMap>(
        &host,
        "e2em-stray",
        serde_json::json!({"metadata": {"name": "web",
            "labels": {LABEL_TENANT: "e2em"},
            "annotations": {ANN_NAME: "web", ANN_NAMESPACE: "stray"}}}),
    )
    .await?;
    let pod = serde_json::json!({"metadata": {"name": "web"},
        "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}});
    let mut uids = Vec::new();
    for (tenant, key) in [(&tm, "e2em"), (&tn, "e2en")] {
        namespace(tenant, "apps").await?;
        let t = create::<Pod>(tenant, "apps", pod.clone()).await?;
        let host_pods: Api<Pod> = Api::namespaced(host.clone(), &format!("{key}-apps"));
        let h = eventually("host pod web", Duration::from_secs(60), || async {
            Ok(host_pods.get_opt("web").await?)
        })
        .await?;
        uids.push((t.uid().unwrap(), h.uid().unwrap()));
    }
    let (m_host_uid, n_host_uid) = (uids[0].1.clone(), uids[1].1.clone());

    // What e2em's syncer must not copy: an Event in its namespace about e2en's pod (same
    // names), and one in the stray namespace about the forged object.
    let events = |ns: &str| Api::<Event>::namespaced(host.clone(), ns);
    let pp = PostParams::default();
    events("e2em-apps")
        .create(
            &pp,
            &host_event(
                "cross",
                "e2em-apps",
                ["Pod", "e2en-apps", "web", &n_host_uid],
                "CrossProbe",
            )?,
        )
        .await?;
    let forged_uid = forged.uid().unwrap();
    events("e2em-stray")
        .create(
            &pp,
            &host_event(
                "stray",
                "e2em-stray",
                ["ConfigMap", "e2em-stray", "web", &forged_uid],
                "StrayProbe",
            )?,
        )
        .await?;
    // What each must copy, created last: once they arrived, the others had their chance.
    for (key, uid) in [("e2em", &m_host_uid), ("e2en", &n_host_uid)] {
        let ns = format!("{key}-apps");
        events(&ns)
            .create(
                &pp,
                &host_event("own", &ns, ["Pod", &ns, "web", uid], "OwnProbe")?,
            )
            .await?;
    }
    let probes = |tenant: &Client| {
        let api = Api::<Event>::all(tenant.clone());
        async move {
            let all = api.list(&ListParams::default()).await?.items;
            anyhow::Ok(
                all.into_iter()
                    .filter(|e| e.reason.as_deref().is_some_and(|r| r.ends_with("Probe")))
                    .collect::<Vec<_>>(),
            )
        }
    };
    for tenant in [&tm, &tn] {
        eventually(
            "the OwnProbe event in the tenant",
            Duration::from_secs(60),
            || async {
                let found = probes(tenant).await?;
                Ok(found
                    .iter()
                    .any(|e| e.reason.as_deref() == Some("OwnProbe"))
                    .then_some(()))
            },
        )
        .await?;
    }
    // The watches are per namespace; give a late copy a moment to show before checking.
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (tenant, (tenant_uid, _), key) in [(&tm, &uids[0], "e2em"), (&tn, &uids[1], "e2en")] {
        let found = probes(tenant).await?;
        let seen: Vec<(Option<String>, Option<String>, Option<String>)> = found
            .iter()
            .map(|e| {
                (
                    e.reason.clone(),
                    e.involved_object.namespace.clone(),
                    e.involved_object.uid.clone(),
                )
            })
            .collect();
        assert_eq!(
            seen,
            [(
                Some("OwnProbe".to_owned()),
                Some("apps".to_owned()),
                Some(tenant_uid.clone())
            )],
            "tenant {key} got exactly its own probe, on its own pod"
        );
    }
    Ok(())
}

/// GET of a path on a local HTTP server (the syncer's own listener on 127.0.0.1).
async fn http_get(port: u16, path: &str) -> Res<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// The value of the first sample `series` (name and labels, exactly as exported) in `text`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Creates a tenant namespace and waits for its default service account: until the tenant's
/// controller-manager made it, the tenant apiserver refuses pods there (403), which a loaded
/// machine shows.
async fn namespace_for_pods(tenant: &Client, ns: &str) -> Res {
    namespace(tenant, ns).await?;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(tenant.clone(), ns);
    eventually(
        "the default service account",
        Duration::from_secs(60),
        || async { Ok(sas.get_opt("default").await?) },
    )
    .await?;
    Ok(())
}

/// A tenant `key` whose syncer serves `/metrics` on the returned port, with pod `p` of `spec`
/// Running in its namespace `apps`.
struct PodWithMetrics {
    cluster: &'static DevCluster,
    tenant: Client,
    pods: Api<Pod>,
    port: u16,
    _syncer: vcp_dev::process::Spawned,
    _cp: TenantControlPlane,
}

async fn pod_with_metrics(key: &str, spec: serde_json::Value) -> Res<PodWithMetrics> {
    let cluster = DevCluster::shared().await?;
    let cp = TenantControlPlane::start(key).await?;
    let [port] = vcp_dev::process::free_ports()?;
    let listen = format!("--listen=127.0.0.1:{port}");
    let syncer = cp.start_syncer(cluster, &[&listen])?;
    let tenant = cp.connect().await?;
    namespace_for_pods(&tenant, "apps").await?;
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "p"}, "spec": spec}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    eventually(
        "the tenant pod running",
        Duration::from_secs(120),
        || async { Ok(running(&pods.get("p").await?).then_some(())) },
    )
    .await?;
    Ok(PodWithMetrics {
        cluster,
        tenant,
        pods,
        port,
        _syncer: syncer,
        _cp: cp,
    })
}

#[tokio::test]
async fn metrics_report_sync_latency_in_flight_reconciles_and_errors() -> Res {
    // With a trust-bundle source: its host ConfigMap is looked at on every pass (below).
    let PodWithMetrics {
        cluster,
        tenant,
        pods,
        port,
        _cp,
        _syncer,
    } = pod_with_metrics(
        "e2el",
        serde_json::json!({
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "volumeMounts": [{"name": "ctb", "mountPath": "/ctb"}]}],
            "volumes": [{"name": "ctb", "projected": {"sources": [
                {"clusterTrustBundle": {"signerName": "example.com/none",
                    "labelSelector": {}, "path": "none.pem", "optional": true}},
            ]}}],
        }),
    )
    .await?;
    let text = eventually("metrics of pods", Duration::from_secs(30), || async {
        let Ok(resp) = http_get(port, "/metrics").await else {
            return Ok(None);
        };
        let down = sample(
            &resp,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"}"#,
        );
        let up = sample(
            &resp,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="up"}"#,
        );
        Ok((down > Some(0.0) && up > Some(0.0)).then_some(resp))
    })
    .await?;
    assert!(text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"));
    assert!(
        sample(
            &text,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Namespace",direction="down"}"#
        ) > Some(0.0)
    );
    assert!(sample(&text, r#"vcp_syncer_reconciles_in_flight{kind="Pod"}"#).is_some());
    // Requests to both apiservers are counted: the host pod's creation and the tenant pod's
    // binding at least.
    assert!(
        sample(
            &text,
            r#"vcp_syncer_api_requests_total{side="host",verb="create",resource="pods"}"#
        ) >= Some(1.0)
    );
    assert!(
        sample(
            &text,
            r#"vcp_syncer_api_requests_total{side="tenant",verb="create",resource="pods/binding"}"#
        ) >= Some(1.0)
    );

    // A pass over a pod with a token reads its token Secret from the cache once it exists, and
    // its trust-bundle ConfigMap too: passes that change neither ask the host nothing (they
    // used to GET both).
    let gets = |text: &str| {
        let of = |resource: &str| {
            sample(
                text,
                &format!(
                    r#"vcp_syncer_api_requests_total{{side="host",verb="get",resource="{resource}"}}"#
                ),
            )
            .unwrap_or(0.0)
        };
        (of("secrets"), of("configmaps"))
    };
    let passes = |text: &str| {
        sample(
            text,
            r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"}"#,
        )
        .unwrap_or(0.0)
    };
    // Settled first: the token Secret is in the host cache once a pass found nothing to do.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = http_get(port, "/metrics").await?;
    for i in 0..3 {
        pods.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {"pass": i.to_string()}}})),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = eventually("three more pod passes", Duration::from_secs(30), || async {
        let t = http_get(port, "/metrics").await?;
        Ok((passes(&t) >= passes(&before) + 3.0).then_some(t))
    })
    .await?;
    assert_eq!(
        gets(&after),
        gets(&before),
        "passes over a pod whose token Secret and trust-bundle ConfigMap exist read them from the caches"
    );

    // The host refuses pods in a namespace whose quota allows none: failed syncs are counted.
    namespace_for_pods(&tenant, "full").await?;
    let host = cluster.connect().await?;
    eventually(
        "host namespace e2el-full",
        Duration::from_secs(30),
        || async {
            Ok(Api::<Namespace>::all(host.clone())
                .get_opt("e2el-full")
                .await?)
        },
    )
    .await?;
    create::<k8s_openapi::api::core::v1::ResourceQuota>(
        &host,
        "e2el-full",
        serde_json::json!({"metadata": {"name": "none"}, "spec": {"hard": {"pods": "0"}}}),
    )
    .await?;
    // Counted by the host's quota controller first: before that, an apiserver whose quota
    // informer lags (a loaded machine) still admits the pod, and no error ever comes (the
    // test failed so twice under the full suite).
    let quotas =
        Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(host.clone(), "e2el-full");
    eventually(
        "the host quota counted",
        Duration::from_secs(60),
        || async {
            let q = quotas.get("none").await?;
            Ok(q.status
                .and_then(|s| s.hard)
                .is_some_and(|h| h.contains_key("pods"))
                .then_some(()))
        },
    )
    .await?;
    create::<Pod>(
        &tenant,
        "full",
        serde_json::json!({
            "metadata": {"name": "refused"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
        }),
    )
    .await?;
    eventually("a counted pod error", Duration::from_secs(60), || async {
        let Ok(resp) = http_get(port, "/metrics").await else {
            return Ok(None);
        };
        let errors = sample(
            &resp,
            r#"vcp_syncer_sync_errors_total{kind="Pod",error="kube"}"#,
        );
        Ok((errors > Some(0.0)).then_some(()))
    })
    .await?;
    Ok(())
}

/// A host status change costs one pass: the status it copies up comes back as a tenant event
/// the syncer recognises as its own write's, and that echo triggers no second pass.
#[tokio::test]
async fn a_status_copied_up_costs_one_pass_not_two() -> Res {
    let PodWithMetrics {
        cluster,
        pods,
        port,
        _cp,
        _syncer,
        ..
    } = pod_with_metrics(
        "e2ew",
        serde_json::json!({"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}),
    )
    .await?;
    let passes = || async {
        let text = http_get(port, "/metrics").await?;
        Ok::<_, anyhow::Error>(
            sample(
                &text,
                r#"vcp_syncer_sync_duration_seconds_count{kind="Pod",direction="down"}"#,
            )
            .unwrap_or(0.0),
        )
    };
    // Settled: the passes of the pod's start are over.
    let mut before = passes().await?;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = passes().await?;
        if now == before {
            break;
        }
        before = now;
    }
    let host = cluster.connect().await?;
    let host_pods: Api<Pod> = Api::namespaced(host, "e2ew-apps");
    host_pods
        .patch_status(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"status": {"conditions": [
                {"type": "example.com/Probe", "status": "True"},
            ]}})),
        )
        .await?;
    eventually("the condition up", Duration::from_secs(30), || async {
        let p = pods.get("p").await?;
        let shown = p
            .status
            .and_then(|s| s.conditions)
            .is_some_and(|c| c.iter().any(|c| c.type_ == "example.com/Probe"));
        Ok(shown.then_some(()))
    })
    .await?;
    // Time for an echo's pass, had there been one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = passes().await?;
    assert_eq!(
        after - before,
        1.0,
        "one pass for the host's change, none for the echo of the status it wrote up"
    );
    Ok(())
}

#[tokio::test]
async fn gc_never_deletes_look_alikes_outside_the_host_namespaces_it_owns() -> Res {
    use vcp_core::naming::{ANN_NAME, ANN_NAMESPACE};
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    // `e2eg-stray` is spelled like the host namespace of tenant namespace `stray` but was
    // made by someone else (no tenant label); `e2eg-apps` is the syncer's own.
    namespace(&host, "e2eg-stray").await?;
    let cp = TenantControlPlane::start("e2eg").await?;
    let _syncer = cp.start_syncer(cluster, &[])?;
    let tenant = cp.connect().await?;
    namespace(&tenant, "apps").await?;
    let host_cms = |ns: &str| Api::<ConfigMap>::namespaced(host.clone(), ns);
    eventually(
        "host namespace e2eg-apps",
        Duration::from_secs(60),
        || async {
            Ok(Api::<Namespace>::all(host.clone())
                .get_opt("e2eg-apps")
                .await?)
        },
    )
    .await?;
    let forged = |name: &str, tenant_ns: &str| {
        serde_json::json!({"metadata": {"name": name,
            "labels": {LABEL_TENANT: "e2eg"},
            "annotations": {ANN_NAME: name, ANN_NAMESPACE: tenant_ns}}})
    };
    // Markers of objects the tenant does not have, in three places: in the syncer's own
    // namespace (collected: the control that shows gc ran), in the look-alike namespace
    // naming it, and in the look-alike naming another namespace.
    create::<ConfigMap>(&host, "e2eg-apps", forged("control", "apps")).await?;
    create::<ConfigMap>(&host, "e2eg-stray", forged("same", "stray")).await?;
    create::<ConfigMap>(&host, "e2eg-stray", forged("other", "apps")).await?;
    eventually(
        "the control is collected",
        Duration::from_secs(60),
        || async {
            Ok(host_cms("e2eg-apps")
                .get_opt("control")
                .await?
                .is_none()
                .then_some(()))
        },
    )
    .await?;
    // A change to the look-alikes wakes the gc for them again; they must still be there.
    for name in ["same", "other"] {
        let mut cm = host_cms("e2eg-stray").get(name).await?;
        cm.data = Some([("touched".to_owned(), "yes".to_owned())].into());
        host_cms("e2eg-stray")
            .replace(name, &PostParams::default(), &cm)
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["same", "other"] {
        assert!(
            host_cms("e2eg-stray").get_opt(name).await?.is_some(),
            "{name} in a namespace the syncer does not own was deleted"
        );
    }
    Ok(())
}

/// The host side of a restarted syncer whose credentials cannot list pods in a host namespace
/// yet (a RoleBinding not in force, say): its fan-in counts that namespace as listed empty, so
/// the cache is complete without the host pod. A running tenant pod must not be taken for one
/// whose host pod vanished (that deleted it, as after a node loss), only kept until the host
/// answers. The syncer here acts as a user of its own (impersonated), granted everything it
/// uses except pods until the test grants those.
#[tokio::test]
async fn a_restarted_syncer_that_cannot_list_host_pods_yet_keeps_running_tenant_pods() -> Res {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    const USER: &str = "e2et-lagging-syncer";
    let cluster = DevCluster::shared().await?;
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start("e2et").await?;
    let syncer = cp.start_syncer(cluster, &[])?;
    let tenant = cp.connect().await?;
    namespace_for_pods(&tenant, "apps").await?;
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let before = eventually(
        "the tenant pod running",
        Duration::from_secs(120),
        || async {
            let p = pods.get("p").await?;
            Ok(running(&p).then_some(p))
        },
    )
    .await?;
    drop(syncer);

    // Everything the syncer touches on the host, pods aside; RBAC cannot subtract, so the
    // core kinds are named and the other groups are whole.
    let core = [
        "namespaces",
        "configmaps",
        "secrets",
        "services",
        "endpoints",
        "events",
        "serviceaccounts",
        "serviceaccounts/token",
        "persistentvolumeclaims",
        "persistentvolumes",
        "nodes",
        "resourcequotas",
        "limitranges",
    ];
    let role = |name: &str, rules: serde_json::Value| -> Res<ClusterRole> {
        Ok(serde_json::from_value(
            serde_json::json!({"metadata": {"name": name}, "rules": rules}),
        )?)
    };
    let binding = |name: &str| -> Res<ClusterRoleBinding> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": USER}],
        }))?)
    };
    let roles: Api<ClusterRole> = Api::all(host.clone());
    let bindings: Api<ClusterRoleBinding> = Api::all(host.clone());
    let pp = PostParams::default();
    roles
        .create(
            &pp,
            &role(
                "e2et-no-pods",
                serde_json::json!([
                    {"apiGroups": [""], "resources": core, "verbs": ["*"]},
                    {"apiGroups": ["discovery.k8s.io", "networking.k8s.io", "storage.k8s.io",
                        "rbac.authorization.k8s.io", "events.k8s.io", "coordination.k8s.io",
                        "admissionregistration.k8s.io"], "resources": ["*"], "verbs": ["*"]},
                ]),
            )?,
        )
        .await?;
    bindings.create(&pp, &binding("e2et-no-pods")?).await?;
    let mut kubeconfig = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
    for user in &mut kubeconfig.auth_infos {
        if let Some(info) = user.auth_info.as_mut() {
            info.impersonate = Some(USER.into());
        }
    }
    let dir = tempfile::tempdir()?;
    let lagging = dir.path().join("lagging.kubeconfig");
    std::fs::write(&lagging, serde_yaml::to_string(&kubeconfig)?)?;

    let _syncer = cp.start_syncer_as(&lagging, &vcp_dev::tenant::syncer_binary()?, &[])?;
    // Long enough for the restarted syncer to list, find the pod missing from its cache and
    // retry a few times.
    tokio::time::sleep(Duration::from_secs(15)).await;
    let kept = pods.get_opt("p").await?;
    anyhow::ensure!(
        kept.as_ref()
            .is_some_and(|p| p.uid() == before.uid() && p.metadata.deletion_timestamp.is_none()),
        "the running tenant pod was deleted while its host pod could not be listed: {:?}",
        kept.map(|p| (p.uid(), p.metadata.deletion_timestamp))
    );

    // Pods granted: the same pod, still running, still mirrored.
    roles
        .create(&pp, &role("e2et-pods", serde_json::json!([
            {"apiGroups": [""], "resources": ["pods", "pods/status", "pods/binding"], "verbs": ["*"]},
        ]))?)
        .await?;
    bindings.create(&pp, &binding("e2et-pods")?).await?;
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "e2et-apps");
    eventually(
        "the pod mirrored after the grant",
        Duration::from_secs(120),
        || async {
            let (t, h) = (pods.get_opt("p").await?, host_pods.get_opt("p").await?);
            Ok(t.zip(h).and_then(|(t, h)| {
                let same = t.uid() == before.uid()
                    && h.annotations().get(vcp_core::naming::ANN_UID) == before.uid().as_ref();
                (same && running(&t)).then_some(())
            }))
        },
    )
    .await?;
    for name in ["e2et-no-pods", "e2et-pods"] {
        bindings.delete(name, &DeleteParams::default()).await?;
        roles.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// Tenant Services asking for addresses the plan reserves get the host's instead: the syncer
/// recreates each tenant Service with its host Service's ClusterIP. Many at once, so that
/// garbage collection sees tenant Services gone or replaced in the middle of it: none may be
/// lost, each must end with its host Service's address, and it must stay that way.
#[tokio::test]
async fn services_recreated_with_the_hosts_addresses_all_settle_on_them() -> Res {
    let Synced {
        host,
        tenant,
        _syncer,
        cp: _cp,
        ..
    } = synced_with_policy("e2es", "services: {reserved_cluster_ips: [10.96.0.0/24]}").await?;
    namespace(&tenant, "apps").await?;
    let names: Vec<String> = (0..8).map(|i| format!("svc-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        create::<Service>(
            &tenant,
            "apps",
            serde_json::json!({
                "metadata": {"name": name},
                "spec": {"clusterIP": format!("10.96.0.{}", 20 + i), "ports": [{"port": 80}]},
            }),
        )
        .await?;
    }
    let tenant_svcs: Api<Service> = Api::namespaced(tenant.clone(), "apps");
    let host_svcs: Api<Service> = Api::namespaced(host.clone(), "e2es-apps");
    // The host Services as first created: the tenant ones must come to them, not the other way
    // round (a host Service deleted and made again gets another address).
    let created = eventually("every host Service", Duration::from_secs(60), || async {
        let mut uids = Vec::new();
        for name in &names {
            let Some(h) = host_svcs.get_opt(name).await? else {
                return Ok(None);
            };
            uids.push(h.uid());
        }
        Ok(Some(uids))
    })
    .await?;
    let settled = || async {
        let ip = |s: &Service| s.spec.as_ref().and_then(|s| s.cluster_ip.clone());
        let mut out = Vec::new();
        for name in &names {
            let (t, h) = (
                tenant_svcs.get_opt(name).await?,
                host_svcs.get_opt(name).await?,
            );
            let pair = (t.as_ref().and_then(ip), h.as_ref().and_then(ip));
            if pair.0.is_none() || pair.0 != pair.1 {
                return anyhow::Ok(None);
            }
            out.push((name.clone(), pair.0, t.and_then(|t| t.uid())));
        }
        Ok(Some(out))
    };
    let first = eventually(
        "every tenant Service on its host Service's address",
        Duration::from_secs(120),
        settled,
    )
    .await?;
    // Settled for good: the same objects and addresses a while later.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let again = settled().await?;
    assert_eq!(again.as_ref(), Some(&first), "the Services moved again");
    let mut now = Vec::new();
    for name in &names {
        now.push(host_svcs.get(name).await?.uid());
    }
    assert_eq!(now, created, "a host Service was deleted and made again");
    Ok(())
}

/// The first Event on tenant pod `pod` with `reason` whose message contains `text`, within a
/// minute (`what` names the wait).
async fn event_on(
    events: &Api<Event>,
    what: &str,
    reason: &str,
    pod: &str,
    text: &str,
) -> Res<Event> {
    eventually(what, Duration::from_secs(60), || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(pod)
                    && e.message.as_deref().unwrap_or_default().contains(text)
            }))
    })
    .await
}

/// The CPU request host pod `name` runs with.
async fn host_cpu_request(host_pods: &Api<Pod>, name: &str) -> Res<Option<String>> {
    let p = host_pods.get(name).await?;
    Ok(p.spec.and_then(|s| {
        s.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("cpu"))
            .map(|q| q.0.clone())
    }))
}

#[tokio::test]
async fn resizes_deadlines_and_ephemeral_containers_go_down_within_the_plan() -> Res {
    // One CPU of requests for the whole tenant, and no default limits: the pods below set
    // requests only, and run with exactly those on the host.
    let Synced {
        host,
        tenant,
        _syncer,
        cp: _cp,
        ..
    } = synced_with_policy(
        "rsz",
        r#"quota: {pods: 10, requests_cpu: "1", limits: {default_limit: null}}"#,
    )
    .await?;
    namespace(&tenant, "apps").await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "rsz-apps");
    for name in ["a", "b"] {
        create::<Pod>(
            &tenant,
            "apps",
            serde_json::json!({"metadata": {"name": name,
                // kwok reports the resources, as a kubelet that resizes in place does.
                "annotations": {"kwok.test/report-resources": "yes"}},
                "spec": {"containers": [{
                "name": "c", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}}}]}}),
        )
        .await?;
    }
    for name in ["a", "b"] {
        eventually("host pods", Duration::from_secs(120), || async {
            Ok(host_pods.get_opt(name).await?.map(|_| ()))
        })
        .await?;
    }
    let a = host_pods.get("a").await?;
    assert_eq!(
        a.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits,
        None,
        "a plan without default limits adds none"
    );
    let resize = |cpu: &'static str| {
        let pods = pods.clone();
        async move {
            let patch = serde_json::json!({"spec": {"containers": [{"name": "c",
                "resources": {"requests": {"cpu": cpu, "memory": "64Mi"}}}]}});
            pods.patch_subresource(
                "resize",
                "a",
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await?;
            anyhow::Ok(())
        }
    };
    let host_has = |cpu: &'static str| {
        let host_pods = host_pods.clone();
        async move {
            eventually(
                &format!("host pod a requesting {cpu} CPU"),
                Duration::from_secs(60),
                || async {
                    let now = host_cpu_request(&host_pods, "a").await?;
                    Ok((now.as_deref() == Some(cpu)).then_some(()))
                },
            )
            .await
        }
    };
    // 500m + 200m fit in one CPU: through the host's resize subresource.
    resize("500m").await?;
    host_has("500m").await?;
    // 900m + 200m do not: the host pod keeps 500m, and the tenant is told.
    resize("900m").await?;
    let events: Api<Event> = Api::namespaced(tenant.clone(), "apps");
    let told = event_on(
        &events,
        "the refused resize told",
        "TenantQuotaExceeded",
        "a",
        "",
    )
    .await?;
    assert!(
        told.message.unwrap_or_default().contains("resize"),
        "the event says it is the resize that waits"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        host_cpu_request(&host_pods, "a").await?.as_deref(),
        Some("500m")
    );
    // Back down: a smaller resize needs no leave.
    resize("300m").await?;
    host_has("300m").await?;
    // And a deadline set on the running pod reaches the host pod.
    pods.patch(
        "b",
        &PatchParams::default(),
        &Patch::Strategic(serde_json::json!({"spec": {"activeDeadlineSeconds": 3600}})),
    )
    .await?;
    eventually(
        "the deadline on the host pod",
        Duration::from_secs(60),
        || async {
            let p = host_pods.get("b").await?;
            Ok((p.spec.and_then(|s| s.active_deadline_seconds) == Some(3600)).then_some(()))
        },
    )
    .await?;
    // `kubectl debug`: an ephemeral container reaches the host pod; one with SYS_ADMIN, which
    // the plan's baseline level refuses, does not, and the tenant is told.
    let debug = |name: &'static str, privileged: bool| {
        let pods = pods.clone();
        async move {
            let mut c =
                serde_json::json!({"name": name, "image": "busybox", "targetContainerName": "c"});
            if privileged {
                c["securityContext"] = serde_json::json!({"capabilities": {"add": ["SYS_ADMIN"]}});
            }
            let patch = serde_json::json!({"spec": {"ephemeralContainers": [c]}});
            pods.patch_subresource(
                "ephemeralcontainers",
                "b",
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await?;
            anyhow::Ok(())
        }
    };
    let ephemeral = |p: &Pod| -> Vec<String> {
        p.spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.as_ref())
            .map(|cs| cs.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default()
    };
    debug("debugger", false).await?;
    eventually(
        "the ephemeral container on the host pod",
        Duration::from_secs(60),
        || async { Ok((ephemeral(&host_pods.get("b").await?) == ["debugger"]).then_some(())) },
    )
    .await?;
    debug("admin", true).await?;
    event_on(
        &events,
        "the refusal told",
        "PolicyRefused",
        "b",
        "ephemeralContainers",
    )
    .await?;
    assert_eq!(ephemeral(&host_pods.get("b").await?), ["debugger"]);
    Ok(())
}

#[tokio::test]
async fn what_the_tenant_removes_goes_from_the_host_too() -> Res {
    let Synced {
        host,
        tenant,
        _syncer,
        cp: _cp,
        ..
    } = synced("rmv").await?;
    namespace(&tenant, "apps").await?;
    let svc: Api<Service> = Api::namespaced(tenant.clone(), "apps");
    let host_svc: Api<Service> = Api::namespaced(host.clone(), "rmv-apps");
    create::<Service>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "multi", "labels": {"tier": "web", "team": "a"}},
            "spec": {"selector": {"app": "multi"}, "ports": [
                {"name": "tcp", "port": 80, "protocol": "TCP"},
                {"name": "udp", "port": 80, "protocol": "UDP"}]}}),
    )
    .await?;
    let ports = |s: &Service| {
        s.spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|ps| {
                ps.iter()
                    .map(|p| p.protocol.clone().unwrap_or_default())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    eventually(
        "the host Service with both ports",
        Duration::from_secs(60),
        || async {
            Ok(host_svc
                .get_opt("multi")
                .await?
                .filter(|s| ports(s).len() == 2)
                .map(|_| ()))
        },
    )
    .await?;
    // The tenant drops the UDP port and a label: both go on the host, as a real cluster's
    // kube-proxy would stop forwarding the port.
    svc.patch(
        "multi",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(serde_json::json!([
            {"op": "remove", "path": "/spec/ports/1"},
            {"op": "remove", "path": "/metadata/labels/team"},
        ]))?),
    )
    .await?;
    let h = eventually(
        "the UDP port gone from the host",
        Duration::from_secs(60),
        || async {
            Ok(host_svc
                .get_opt("multi")
                .await?
                .filter(|s| ports(s) == ["TCP"]))
        },
    )
    .await?;
    assert!(!h.labels().contains_key("team"), "{:?}", h.labels());
    assert_eq!(h.labels().get("tier").map(String::as_str), Some("web"));
    // A data key the tenant removes from a ConfigMap a pod mounts goes too.
    let cms: Api<ConfigMap> = Api::namespaced(tenant.clone(), "apps");
    let host_cms: Api<ConfigMap> = Api::namespaced(host.clone(), "rmv-apps");
    create::<ConfigMap>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "conf"}, "data": {"a": "1", "b": "2"}}),
    )
    .await?;
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({"metadata": {"name": "reader"}, "spec": {
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                "envFrom": [{"configMapRef": {"name": "conf"}}]}]}}),
    )
    .await?;
    eventually("the host ConfigMap", Duration::from_secs(60), || async {
        Ok(host_cms.get_opt("conf").await?.map(|_| ()))
    })
    .await?;
    cms.patch(
        "conf",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(serde_json::json!([
            {"op": "remove", "path": "/data/b"},
        ]))?),
    )
    .await?;
    eventually(
        "the data key gone from the host",
        Duration::from_secs(60),
        || async {
            let cm = host_cms.get("conf").await?;
            let keys: Vec<String> = cm.data.unwrap_or_default().into_keys().collect();
            Ok((keys == ["a"]).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// The host kubelet's request for a pod certificate reaches the tenant's signer through the
/// syncer, and its answer reaches the host request: the test plays the kubelet (a request
/// on the host, for the host pod, with a stub PKCS#10 request of a key of its own) and the
/// tenant's signer (an Issued answer in the tenant).
#[tokio::test]
async fn pod_certificate_requests_go_to_the_tenants_signer_and_its_answer_to_the_host() -> Res {
    use k8s_openapi::api::certificates::v1::PodCertificateRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let Synced {
        host,
        tenant,
        cp: _cp,
        _syncer,
        ..
    } = synced("pcrt").await?;
    namespace(&tenant, "apps").await?;
    let signer = "e2e.example.com/pcrt-signer";
    create::<Pod>(&tenant, "apps", serde_json::json!({
        "metadata": {"name": "svc"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
                 "volumes": [{"name": "certs", "projected": {"sources": [
                     {"podCertificate": {"signerName": signer, "keyType": "ECDSAP256", "credentialBundlePath": "bundle.pem"}}]}}]},
    })).await?;
    let tenant_pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    let tp = eventually("tenant pod running", Duration::from_secs(60), || async {
        Ok(Some(tenant_pods.get("svc").await?).filter(running))
    })
    .await?;
    let hp = Api::<Pod>::namespaced(host.clone(), "pcrt-apps")
        .get("svc")
        .await?;
    let host_signer = {
        let v = &hp.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0];
        let src = &v.projected.as_ref().unwrap().sources.as_ref().unwrap()[0];
        src.pod_certificate.as_ref().unwrap().signer_name.clone()
    };
    assert!(
        host_signer.starts_with("pods.vcp.dev/pcrt."),
        "{host_signer}: the tenant's signer name never reaches the host"
    );

    // The kubelet's request, on the host.
    let key = rcgen::KeyPair::generate()?;
    let stub = rcgen::CertificateParams::new(Vec::<String>::new())?.serialize_request(&key)?;
    let stub_der = stub.der().to_vec();
    let node = hp.spec.as_ref().unwrap().node_name.clone().unwrap();
    let node_uid = Api::<Node>::all(host.clone())
        .get(&node)
        .await?
        .uid()
        .unwrap();
    let sa_uid = Api::<ServiceAccount>::namespaced(host.clone(), "pcrt-apps")
        .get_opt("default")
        .await?
        .and_then(|s| s.uid())
        .unwrap_or_else(|| "no-service-account".into());
    let host_requests: Api<PodCertificateRequest> = Api::namespaced(host.clone(), "pcrt-apps");
    let asked: PodCertificateRequest = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "svc-req1"},
        "spec": {
            "signerName": host_signer, "podName": "svc", "podUID": hp.uid().unwrap(),
            "serviceAccountName": "default", "serviceAccountUID": sa_uid,
            "nodeName": node, "nodeUID": node_uid, "maxExpirationSeconds": 86400,
            "stubPKCS10Request": k8s_openapi::ByteString(stub_der.clone()),
        },
    }))?;
    host_requests.create(&PostParams::default(), &asked).await?;

    // The same request in the tenant, for the tenant's pod, naming the tenant's signer.
    let tenant_requests: Api<PodCertificateRequest> = Api::namespaced(tenant.clone(), "apps");
    let relayed = eventually(
        "the request in the tenant",
        Duration::from_secs(30),
        || async { Ok(tenant_requests.get_opt("svc-req1").await?) },
    )
    .await?;
    let s = &relayed.spec;
    assert_eq!(s.signer_name, signer);
    assert_eq!(
        (s.pod_name.as_str(), Some(s.pod_uid.clone())),
        ("svc", tp.uid())
    );
    assert_eq!(s.service_account_name, "default");
    assert_eq!(
        s.node_name,
        tp.spec.as_ref().unwrap().node_name.clone().unwrap()
    );
    assert_eq!(s.stub_pkc_s10_request.0, stub_der);

    // The tenant's signer answers it.
    let ca_key = rcgen::KeyPair::generate()?;
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;
    let mut leaf = rcgen::CertificateSigningRequestParams::from_der(&stub_der.clone().into())?;
    let now = time::OffsetDateTime::now_utc().replace_nanosecond(0)?;
    let (not_before, not_after) = (
        now - time::Duration::minutes(1),
        now + time::Duration::hours(2),
    );
    leaf.params.not_before = not_before;
    leaf.params.not_after = not_after;
    let chain = leaf.signed_by(&ca)?.pem();
    let rfc = |t: time::OffsetDateTime| {
        t.format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let mut answered = relayed.clone();
    answered.status = Some(serde_json::from_value(serde_json::json!({
        "certificateChain": chain,
        "notBefore": rfc(not_before), "notAfter": rfc(not_after),
        "beginRefreshAt": rfc(now + time::Duration::hours(1)),
        "conditions": [{"type": "Issued", "status": "True", "reason": "Issued", "message": "test signer",
                        "lastTransitionTime": rfc(now), "observedGeneration": relayed.metadata.generation}],
    }))?);
    tenant_requests
        .replace_status("svc-req1", &PostParams::default(), &answered)
        .await?;

    // The kubelet finds the answer on the host.
    let done = eventually(
        "the answer on the host",
        Duration::from_secs(30),
        || async {
            Ok(host_requests
                .get("svc-req1")
                .await?
                .status
                .filter(|s| s.certificate_chain.is_some()))
        },
    )
    .await?;
    assert_eq!(done.certificate_chain.as_deref(), Some(chain.as_str()));
    Ok(())
}

/// A tenant pod held by a finalizer (a Job's, say) and deleted: once its host pod is gone it
/// gets a terminal phase, as a kubelet gives a pod it stopped, so the finalizer's owner can
/// let it go; without one it would wait forever.
#[tokio::test]
async fn a_deleted_pod_held_by_a_finalizer_ends_failed_once_its_host_pod_is_gone() -> Res {
    let Synced {
        host,
        tenant,
        cp: _cp,
        _syncer,
        ..
    } = synced("fnlz").await?;
    namespace(&tenant, "apps").await?;
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "held", "finalizers": ["example.com/hold"]},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    eventually("held running", Duration::from_secs(60), || async {
        Ok(Some(pods.get("held").await?).filter(running))
    })
    .await?;
    pods.delete("held", &DeleteParams::default()).await?;
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "fnlz-apps");
    eventually("the host pod gone", Duration::from_secs(60), || async {
        Ok(host_pods.get_opt("held").await?.is_none().then_some(()))
    })
    .await?;
    let ended = eventually("held Failed", Duration::from_secs(30), || async {
        Ok(Some(pods.get("held").await?)
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")))
    })
    .await?;
    assert!(ended.metadata.deletion_timestamp.is_some());
    // Its owner lets it go.
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    eventually("held gone", Duration::from_secs(30), || async {
        Ok(pods.get_opt("held").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_readiness_gate_the_tenant_sets_reaches_the_host_pod_and_stays_on_the_tenant() -> Res {
    let Synced {
        host,
        tenant,
        cp: _cp,
        _syncer,
        ..
    } = synced("gate").await?;
    namespace_for_pods(&tenant, "apps").await?;
    let gate = "example.com/lb-ready";
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "g"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "readinessGates": [{"conditionType": gate}],
            },
        }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "apps");
    eventually("g running", Duration::from_secs(60), || async {
        Ok(Some(pods.get("g").await?).filter(running))
    })
    .await?;
    let condition = |p: &Pod, t: &str| vcp_dev::testing::condition(p, t).map(|c| c.status.clone());
    // The tenant's controller sets its gate, as a load balancer controller would.
    pods.patch_status(
        "g",
        &PatchParams::default(),
        &Patch::Strategic(serde_json::json!({"status": {"conditions": [
            {"type": gate, "status": "True", "reason": "Registered"},
        ]}})),
    )
    .await?;
    let host_pods: Api<Pod> = Api::namespaced(host.clone(), "gate-apps");
    eventually(
        "the gate on the host pod",
        Duration::from_secs(30),
        || async {
            let h = host_pods.get("g").await?;
            Ok((condition(&h, gate).as_deref() == Some("True")).then_some(()))
        },
    )
    .await?;
    // A later host status change is copied up without erasing the tenant's gate.
    host_pods
        .patch_status(
            "g",
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({"status": {"conditions": [
                {"type": "example.com/host-probe", "status": "True"},
            ]}})),
        )
        .await?;
    let p = eventually("the host's change up", Duration::from_secs(30), || async {
        let p = pods.get("g").await?;
        Ok(condition(&p, "example.com/host-probe")
            .is_some()
            .then_some(p))
    })
    .await?;
    assert_eq!(
        condition(&p, gate).as_deref(),
        Some("True"),
        "the tenant's gate kept"
    );
    // The tenant changes its mind: the host follows.
    pods.patch_status(
        "g",
        &PatchParams::default(),
        &Patch::Strategic(serde_json::json!({"status": {"conditions": [
            {"type": gate, "status": "False", "reason": "Deregistered"},
        ]}})),
    )
    .await?;
    eventually(
        "the gate False on the host",
        Duration::from_secs(30),
        || async {
            let h = host_pods.get("g").await?;
            Ok((condition(&h, gate).as_deref() == Some("False")).then_some(()))
        },
    )
    .await?;
    // A gate on a condition the host decides is the host's to meet: the tenant is told once,
    // however many passes the pod gets, and its own value never reaches the host.
    create::<Pod>(
        &tenant,
        "apps",
        serde_json::json!({
            "metadata": {"name": "s"},
            "spec": {
                "containers": [{"name": "c", "image": "busybox"}],
                "readinessGates": [{"conditionType": "PodScheduled"}],
            },
        }),
    )
    .await?;
    eventually("s running", Duration::from_secs(60), || async {
        Ok(Some(pods.get("s").await?).filter(running))
    })
    .await?;
    let events: Api<Event> = Api::namespaced(tenant.clone(), "apps");
    event_on(
        &events,
        "the warning about the gate",
        "ReadinessGateNotMirrored",
        "s",
        "PodScheduled",
    )
    .await?;
    // More passes: a label change and a status change of the pod's own.
    pods.patch(
        "s",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"labels": {"touched": "1"}}})),
    )
    .await?;
    eventually("the label on the host", Duration::from_secs(30), || async {
        let h = host_pods.get("s").await?;
        Ok(h.labels().contains_key("touched").then_some(()))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let told: Vec<Event> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ReadinessGateNotMirrored")
                && e.involved_object.name.as_deref() == Some("s")
        })
        .collect();
    assert_eq!(told.len(), 1, "one event: {told:?}");
    assert_eq!(told[0].count.unwrap_or(1), 1, "told once: {told:?}");
    assert_eq!(told[0].type_.as_deref(), Some("Warning"));
    Ok(())
}
