//! A tenant's cluster-admin tries to reach the host through the syncer, against a real tenant
//! control plane and the real dev host cluster; every attempt fails, the host holds nothing of
//! it, and the tenant is told why (Warning events, pod conditions). Well-behaved workloads keep
//! running under `restricted`.

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, Namespace, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use std::time::Duration;
use vcp_core::naming::LABEL_TENANT;
use vcp_dev::DevCluster;
use vcp_dev::tenant::TenantControlPlane;
use vcp_dev::testing::{eventually, namespace, running};

type Res<T = ()> = anyhow::Result<T>;

const WAIT: Duration = Duration::from_secs(60);

struct Tenant {
    host: Client,
    tenant: Client,
    cp: TenantControlPlane,
    _syncer: vcp_dev::process::Spawned,
}

impl Drop for Tenant {
    /// The syncer's warnings, shown with a failed test's output (captured otherwise).
    fn drop(&mut self) {
        let log = std::fs::read_to_string(self.cp.syncer_log()).unwrap_or_default();
        let warnings: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .collect();
        for l in &warnings[warnings.len().saturating_sub(30)..] {
            eprintln!("syncer: {l}");
        }
    }
}

async fn tenant(key: &str, policy: &str) -> Res<Tenant> {
    tenant_on(DevCluster::shared().await?, key, policy).await
}

async fn tenant_on(cluster: &DevCluster, key: &str, policy: &str) -> Res<Tenant> {
    let host = cluster.connect().await?;
    let cp = TenantControlPlane::start(key).await?;
    let _syncer = cp.start_syncer(cluster, &[&cp.policy_flag(policy)?])?;
    let tenant = cp.connect().await?;
    Ok(Tenant {
        host,
        tenant,
        cp,
        _syncer,
    })
}

async fn create<K>(client: &Client, ns: Option<&str>, v: serde_json::Value) -> Res<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    let mut obj: K = serde_json::from_value(v)?;
    obj.meta_mut().namespace = ns.map(str::to_owned);
    // One helper for namespaced and cluster-scoped kinds: `Api` splits them by type.
    let url = K::url_path(&(), ns);
    let req = http::Request::post(url)
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&obj)?)?;
    Ok(client.request::<K>(req).await?)
}

/// Waits for a Warning event with `reason` about `name` in tenant namespace `ns` whose message
/// contains every one of `needles`; returns the message.
async fn warned(
    tenant: &Client,
    ns: &str,
    name: &str,
    reason: &str,
    needles: &[&str],
) -> Res<String> {
    let events: Api<Event> = Api::namespaced(tenant.clone(), ns);
    eventually(
        &format!("a {reason} event on {ns}/{name} naming {needles:?}"),
        WAIT,
        || async {
            let l = events.list(&ListParams::default()).await?;
            Ok(l.items.into_iter().find_map(|e| {
                let msg = e.message.clone().unwrap_or_default();
                (e.type_.as_deref() == Some("Warning")
                    && e.reason.as_deref() == Some(reason)
                    && e.involved_object.name.as_deref() == Some(name)
                    && needles.iter().all(|n| msg.contains(n)))
                .then_some(msg)
            }))
        },
    )
    .await
}

/// Waits until tenant pod `name` shows `PodScheduled: False` with `reason` naming `field`, and
/// a Warning event says the same; then checks the host never got the pod.
async fn kept_off_the_host(t: &Tenant, key: &str, name: &str, reason: &str, field: &str) -> Res {
    let pods: Api<Pod> = Api::namespaced(t.tenant.clone(), "apps");
    let condition = eventually(
        &format!("{name}: PodScheduled False ({reason})"),
        WAIT,
        || async {
            let p = pods.get(name).await?;
            Ok(p.status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some(reason)
                }))
        },
    )
    .await?;
    let message = condition.message.unwrap_or_default();
    assert!(
        message.contains(field),
        "{name}: the condition names {field}: {message}"
    );
    warned(&t.tenant, "apps", name, reason, &[field]).await?;
    let p = pods.get(name).await?;
    assert_eq!(p.status.and_then(|s| s.phase).as_deref(), Some("Pending"));
    let host = Api::<Pod>::namespaced(t.host.clone(), &format!("{key}-apps"));
    assert!(
        host.get_opt(name).await?.is_none(),
        "{name} reached the host"
    );
    Ok(())
}

#[tokio::test]
async fn pods_that_would_escape_stay_pending_in_the_tenant_and_never_reach_the_host() -> Res {
    let t = tenant("isoa", "{}").await?;
    namespace(&t.tenant, "apps").await?;
    // Root with SYS_ADMIN, the host's network and PID namespaces and its whole filesystem.
    create::<Pod>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "escape"},
            "spec": {
                "hostNetwork": true, "hostPID": true,
                "containers": [{"name": "c", "image": "busybox",
                    "securityContext": {"runAsUser": 0, "capabilities": {"add": ["SYS_ADMIN"]}},
                    "volumeMounts": [{"name": "root", "mountPath": "/host"}]}],
                "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            },
        }),
    )
    .await?;
    kept_off_the_host(&t, "isoa", "escape", "PolicyRefused", "spec.hostNetwork").await?;
    let msg = warned(&t.tenant, "apps", "escape", "PolicyRefused", &["baseline"]).await?;
    eprintln!("refusal seen by the tenant: {msg}");
    // A runtime class the plan does not list (the tenant's admission wants it to exist).
    create::<k8s_openapi::api::node::v1::RuntimeClass>(
        &t.tenant,
        None,
        serde_json::json!({
            "metadata": {"name": "unconfined"}, "handler": "runc",
        }),
    )
    .await?;
    create::<Pod>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "runtime"},
        "spec": {"runtimeClassName": "unconfined", "containers": [{"name": "c", "image": "busybox"}]},
    }))
    .await?;
    kept_off_the_host(
        &t,
        "isoa",
        "runtime",
        "PolicyRefused",
        "spec.runtimeClassName",
    )
    .await?;
    // A projected certificate of a host signer's name: the host pod asks vcp's signer for
    // the tenant instead, which only the tenant's own signers answer (through the syncer), so
    // the host never issues a certificate for a tenant workload.
    let cert = create::<Pod>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "cert"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}],
            "volumes": [{"name": "id", "projected": {"sources": [{"podCertificate": {
                "signerName": "kubernetes.io/kube-apiserver-client-pod", "keyType": "ED25519", "credentialBundlePath": "bundle.pem"}}]}}]},
    }))
    .await;
    match cert {
        Ok(p)
            if p.spec
                .as_ref()
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|v| {
                    v[0].projected.as_ref().is_some_and(|p| {
                        p.sources
                            .as_ref()
                            .is_some_and(|s| s[0].pod_certificate.is_some())
                    })
                }) =>
        {
            let host = Api::<Pod>::namespaced(t.host.clone(), "isoa-apps");
            let hp = eventually("cert on the host", WAIT, || async {
                Ok(host.get_opt("cert").await?)
            })
            .await?;
            let v = &hp.spec.unwrap().volumes.unwrap()[0];
            let src = &v.projected.as_ref().unwrap().sources.as_ref().unwrap()[0];
            let signer = &src.pod_certificate.as_ref().unwrap().signer_name;
            assert!(
                signer.starts_with("pods.vcp.dev/isoa."),
                "the host pod asks {signer}"
            );
        }
        other => eprintln!(
            "skipped the podCertificate attempt: the tenant apiserver does not serve the field (its feature gate is off): {:?}",
            other.err()
        ),
    }
    Ok(())
}

#[tokio::test]
async fn placement_priority_affinity_and_downward_api_stay_inside_the_tenant() -> Res {
    let t = tenant(
        "isop",
        "placement: {node_selector: {type: kwok}, avoid_node_labels: {vcp.dev/runtime: process}}",
    )
    .await?;
    namespace(&t.tenant, "apps").await?;
    create::<PriorityClass>(
        &t.tenant,
        None,
        serde_json::json!({
            "metadata": {"name": "urgent"}, "value": 1000000,
        }),
    )
    .await?;
    // Everything that would steer the host scheduler: a node by name (honoured only inside
    // the pool), a control-plane node's label, a toleration of every taint, a fleet-wide
    // anti-affinity, a priority class.
    create::<Pod>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "placed", "labels": {"app": "placed"}},
        "spec": {
            "nodeName": "kwok-node-1",
            "nodeSelector": {"type": "control-plane"},
            "tolerations": [{"operator": "Exists"}],
            "priorityClassName": "urgent",
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "Exists"}]},
                "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}},
            "containers": [{"name": "c", "image": "busybox", "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}]}],
        },
    })).await?;
    let host_pods = Api::<Pod>::namespaced(t.host.clone(), "isop-apps");
    let host = eventually("host pod placed, bound by the host", WAIT, || async {
        Ok(host_pods
            .get_opt("placed")
            .await?
            .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()))
    })
    .await?;
    let spec = host.spec.clone().unwrap();
    let node = spec.node_name.clone().unwrap();
    assert_eq!(node, "kwok-node-1", "the pool's node the tenant chose");
    // Bound at creation, as a real cluster's kubelet runs a pod named to it, not by the host
    // scheduler (whose binding records no field owner).
    let bound_by_syncer = host.managed_fields().iter().any(|m| {
        m.manager.as_deref() == Some("vcp-syncer")
            && m.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.pointer("/f:spec/f:nodeName").is_some())
    });
    assert!(
        bound_by_syncer,
        "the host pod was not created bound: {:?}",
        host.managed_fields()
    );
    assert_eq!(spec.node_selector.clone().unwrap()["type"], "kwok");
    assert!(
        spec.tolerations
            .iter()
            .flatten()
            .all(|t| t.operator.as_deref() != Some("Exists") || t.key.is_some()),
        "the tolerate-everything toleration reached the host: {:?}",
        spec.tolerations
    );
    assert_eq!(spec.priority_class_name, None);
    assert_eq!(
        vcp_fixtures::anti_affinity_tenant(spec.affinity.as_ref().unwrap(), LABEL_TENANT)
            .as_deref(),
        Some("isop"),
        "the anti-affinity sees only the tenant's own namespaces"
    );
    let env = &spec.containers[0].env.as_ref().unwrap();
    let ns_var = env.iter().find(|e| e.name == "NS").unwrap();
    assert_eq!(
        ns_var
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap()
            .field_path,
        "metadata.annotations['vcp.dev/tenant-namespace']"
    );
    assert_eq!(host.annotations()["vcp.dev/tenant-namespace"], "apps");
    warned(
        &t.tenant,
        "apps",
        "placed",
        "PlacementAdjusted",
        &["type=control-plane", "tolerations", "urgent"],
    )
    .await?;
    // The tenant sees the node it chose, which is where the pod runs.
    let pods: Api<Pod> = Api::namespaced(t.tenant.clone(), "apps");
    let p = eventually("tenant pod placed running", WAIT, || async {
        Ok(Some(pods.get("placed").await?).filter(running))
    })
    .await?;
    assert_eq!(p.spec.unwrap().node_name.as_deref(), Some("kwok-node-1"));

    // A node outside the pool by name: the host pod is required to be on it and in the pool
    // at once, so the host scheduler places it nowhere (a real cluster would leave a pod bound
    // to a node that does not run it just as Pending).
    create::<Pod>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "outside"},
            "spec": {"nodeName": "devnode-0", "containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await?;
    let unschedulable = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| {
                c.type_ == "PodScheduled"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("Unschedulable")
            })
    };
    let outside = eventually("host pod outside found unschedulable", WAIT, || async {
        Ok(host_pods.get_opt("outside").await?.filter(unschedulable))
    })
    .await?;
    let spec = outside.spec.unwrap();
    assert_eq!(spec.node_name, None, "never bound: {:?}", outside.status);
    assert_eq!(spec.node_selector.unwrap()["type"], "kwok");
    let terms = spec
        .affinity
        .and_then(|a| {
            a.node_affinity?
                .required_during_scheduling_ignored_during_execution
        })
        .map(|r| r.node_selector_terms)
        .unwrap_or_default();
    assert!(
        !terms.is_empty()
            && terms
                .iter()
                .all(|t| t.match_fields.iter().flatten().any(|f| {
                    f.key == "metadata.name"
                        && f.values.as_deref() == Some(&["devnode-0".to_owned()][..])
                })),
        "{terms:?}"
    );
    Ok(())
}

#[tokio::test]
async fn namespaces_volumes_and_services_reach_the_host_only_as_the_plan_allows() -> Res {
    let t = tenant("isob", "services: {reserved_cluster_ips: [10.96.0.0/24]}").await?;
    create::<Namespace>(&t.tenant, None, serde_json::json!({
        "metadata": {"name": "apps", "labels": {"pod-security.kubernetes.io/enforce": "privileged"}},
    }))
    .await?;
    let host_ns = eventually("host namespace isob-apps", WAIT, || async {
        Ok(Api::<Namespace>::all(t.host.clone())
            .get_opt("isob-apps")
            .await?)
    })
    .await?;
    let labels = host_ns.labels();
    assert_eq!(
        labels["pod-security.kubernetes.io/enforce"], "baseline",
        "the plan's level, not the tenant's"
    );
    assert_eq!(labels["t.pod-security.kubernetes.io/enforce"], "privileged");
    // The host's own admission enforces it too: a pod that slipped past the syncer is refused.
    let direct = create::<Pod>(
        &t.host,
        Some("isob-apps"),
        serde_json::json!({
            "metadata": {"name": "direct"},
            "spec": {"hostPID": true, "containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await;
    let err = direct
        .expect_err("the host admitted a hostPID pod in a tenant namespace")
        .to_string();
    assert!(err.contains("violates PodSecurity"), "{err}");

    // A tenant volume of a host node's files, claimed.
    create::<PersistentVolume>(&t.tenant, None, serde_json::json!({
        "metadata": {"name": "root"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "manual",
            "hostPath": {"path": "/"},
            "claimRef": {"namespace": "apps", "name": "root"}},
    }))
    .await?;
    create::<PersistentVolumeClaim>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "root"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "manual", "volumeName": "root",
            "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .await?;
    warned(
        &t.tenant,
        "default",
        "root",
        "PolicyRefused",
        &["spec.hostPath", "host node"],
    )
    .await?;

    // externalIPs (CVE-2020-8554), 50 NodePorts, and the cluster DNS address.
    let ports: Vec<_> = (0..50)
        .map(|i| serde_json::json!({"name": format!("p{i}"), "port": 1000 + i}))
        .collect();
    create::<Service>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "hijack"},
        "spec": {"selector": {"app": "x"}, "ports": [{"port": 80}], "externalIPs": ["192.0.2.77"]},
    }))
    .await?;
    create::<Service>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "many"},
            "spec": {"type": "NodePort", "selector": {"app": "x"}, "ports": ports},
        }),
    )
    .await?;
    create::<Service>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "dns"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "x"}, "ports": [{"port": 53, "protocol": "UDP"}]},
    }))
    .await?;
    let host_svcs = Api::<Service>::namespaced(t.host.clone(), "isob-apps");
    let get = |name: &'static str| {
        let api = host_svcs.clone();
        async move { Ok(api.get_opt(name).await?) }
    };
    let hijack = eventually("host service hijack", WAIT, || get("hijack")).await?;
    assert_eq!(hijack.spec.unwrap().external_ips, None);
    warned(
        &t.tenant,
        "apps",
        "hijack",
        "PolicyRefused",
        &["externalIPs"],
    )
    .await?;
    let many = eventually("host service many", WAIT, || get("many")).await?;
    let spec = many.spec.unwrap();
    assert_eq!(
        spec.type_.as_deref(),
        Some("ClusterIP"),
        "no host NodePorts"
    );
    assert!(spec.ports.unwrap().iter().all(|p| p.node_port.is_none()));
    warned(&t.tenant, "apps", "many", "PolicyRefused", &["NodePort"]).await?;
    let dns = eventually("host service dns", WAIT, || get("dns")).await?;
    let ip = dns.spec.unwrap().cluster_ip.unwrap();
    assert_ne!(
        ip, "10.96.0.10",
        "the host's reserved address went to a tenant"
    );
    let tenant_svcs: Api<Service> = Api::namespaced(t.tenant.clone(), "apps");
    eventually(
        "tenant service dns recreated with the host address",
        WAIT,
        || async {
            let s = tenant_svcs.get_opt("dns").await?;
            Ok(s.filter(|s| {
                s.spec.as_ref().and_then(|s| s.cluster_ip.as_deref()) == Some(ip.as_str())
            }))
        },
    )
    .await?;
    // Nothing of the volume reached the host.
    let host_pvs = Api::<PersistentVolume>::all(t.host.clone());
    assert!(
        host_pvs.get_opt("isob-root").await?.is_none(),
        "the hostPath volume reached the host"
    );
    Ok(())
}

#[tokio::test]
async fn external_name_services_reach_the_host_only_with_names_the_plan_allows() -> Res {
    let t = tenant("isox", "endpoints: {external_names: [db.example.com]}").await?;
    namespace(&t.tenant, "apps").await?;
    let external = |name: &str, target: &str| {
        serde_json::json!({
            "metadata": {"name": name},
            "spec": {"type": "ExternalName", "externalName": target},
        })
    };
    // The plan's name goes down as it is.
    create::<Service>(&t.tenant, Some("apps"), external("db", "db.example.com")).await?;
    let host_svcs = Api::<Service>::namespaced(t.host.clone(), "isox-apps");
    let db = eventually("host service db", WAIT, || async {
        Ok(host_svcs.get_opt("db").await?)
    })
    .await?;
    assert_eq!(
        db.spec.and_then(|s| s.external_name).as_deref(),
        Some("db.example.com")
    );
    // Names that point host ingress controllers and meshes inside the cluster (this tenant's
    // etcd, the host apiserver, a host Service by a short name, a cluster address) never do.
    for (name, target) in [
        ("etcd", "etcd.vcp-isox.svc.cluster.local"),
        ("apiserver", "kubernetes.default.svc.cluster.local"),
        ("short", "kubernetes.default"),
        ("address", "10.96.0.1"),
    ] {
        create::<Service>(&t.tenant, Some("apps"), external(name, target)).await?;
        warned(
            &t.tenant,
            "apps",
            name,
            "PolicyRefused",
            &["spec.externalName", "not copied to the host"],
        )
        .await?;
        assert!(
            host_svcs.get_opt(name).await?.is_none(),
            "{name} ({target}) reached the host"
        );
    }
    // A Service whose name stops being allowed loses its host copy.
    let tenant_svcs: Api<Service> = Api::namespaced(t.tenant.clone(), "apps");
    tenant_svcs
        .patch(
            "db",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({
                "spec": {"externalName": "kubernetes.default.svc.cluster.local"},
            })),
        )
        .await?;
    eventually("the host copy of db gone", WAIT, || async {
        Ok(host_svcs.get_opt("db").await?.is_none().then_some(()))
    })
    .await?;
    warned(
        &t.tenant,
        "apps",
        "db",
        "PolicyRefused",
        &["kubernetes.default.svc.cluster.local"],
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_secret_named_after_a_generated_token_keeps_its_pod_off_the_host() -> Res {
    let t = tenant("isoc", "{}").await?;
    namespace(&t.tenant, "apps").await?;
    let sa =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(t.tenant.clone(), "apps");
    eventually("default service account", WAIT, || async {
        Ok(sa.get_opt("default").await?)
    })
    .await?;
    let first = create::<Pod>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "first"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await?;
    let token = vcp_syncer::naming::token_secret_name(&first.uid().unwrap());
    let host_secrets = Api::<Secret>::namespaced(t.host.clone(), "isoc-apps");
    // Settled: a token Secret written before its host pod existed is written again once the
    // pod owns it (with a new token), which is not the overwrite this test looks for.
    let before = eventually(
        "the first pod's token Secret, owned by its host pod",
        WAIT,
        || async {
            Ok(host_secrets
                .get_opt(&token)
                .await?
                .filter(|s| !s.owner_references().is_empty()))
        },
    )
    .await?;
    // The tenant names a Secret after it and mounts it in a second pod.
    create::<Secret>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": token}, "stringData": {"token": "mine"},
        }),
    )
    .await?;
    create::<Pod>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "second"},
        "spec": {"containers": [{"name": "c", "image": "busybox", "volumeMounts": [{"name": "t", "mountPath": "/t"}]}],
            "volumes": [{"name": "t", "secret": {"secretName": token}}]},
    }))
    .await?;
    kept_off_the_host(
        &t,
        "isoc",
        "second",
        "HostConflict",
        &format!("secrets/{token}"),
    )
    .await?;
    let after = host_secrets.get(&token).await?;
    assert_eq!(
        after.data, before.data,
        "the generated token Secret was overwritten"
    );

    // An ephemeral volume whose claim template names a volume, a data source and a selector.
    create::<Pod>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "scratch"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}],
                "volumes": [{"name": "s", "ephemeral": {"volumeClaimTemplate": {"spec": {
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                    "volumeName": "someone-elses",
                    "dataSource": {"kind": "PersistentVolumeClaim", "name": "theirs"},
                    "selector": {"matchLabels": {"vcp.dev/tenant": "victim"}}}}}}]},
        }),
    )
    .await?;
    let host_pods = Api::<Pod>::namespaced(t.host.clone(), "isoc-apps");
    let scratch = eventually("host pod scratch", WAIT, || async {
        Ok(host_pods.get_opt("scratch").await?)
    })
    .await?;
    let template = scratch.spec.unwrap().volumes.unwrap()[0]
        .ephemeral
        .clone()
        .unwrap()
        .volume_claim_template
        .unwrap()
        .spec;
    assert_eq!(template.volume_name, None);
    assert_eq!(template.data_source, None);
    let sel = template.selector.unwrap().match_labels.unwrap();
    assert_eq!(sel[LABEL_TENANT], "isoc");
    assert_eq!(sel["t.vcp.dev/tenant"], "victim");
    Ok(())
}

#[tokio::test]
async fn a_well_behaved_app_runs_under_restricted_and_an_unhardened_pod_does_not() -> Res {
    let t = tenant("isod", "pod_security: restricted").await?;
    namespace(&t.tenant, "apps").await?;
    let hardened = serde_json::json!({
        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "web", "image": "nginxinc/nginx-unprivileged",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
    });
    let mut deploy_spec = hardened.clone();
    deploy_spec["volumes"] = serde_json::json!([{"name": "data", "emptyDir": {}}]);
    create::<Deployment>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": deploy_spec}},
        }),
    )
    .await?;
    create::<StatefulSet>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "db"},
        "spec": {"serviceName": "db", "replicas": 1, "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": hardened},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}]},
    }))
    .await?;
    create::<Service>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }))
    .await?;
    create::<ConfigMap>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({"metadata": {"name": "cfg"}, "data": {"a": "b"}}),
    )
    .await?;
    create::<Pod>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "unhardened"},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(t.tenant.clone(), "apps");
    eventually(
        "web and db running in the tenant",
        Duration::from_secs(120),
        || async {
            let l = pods.list(&ListParams::default()).await?;
            let up = l
                .items
                .iter()
                .filter(|p| p.name_any() != "unhardened" && running(p))
                .count();
            Ok((up == 3).then_some(()))
        },
    )
    .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(t.tenant.clone(), "apps");
    eventually("the db claim bound", Duration::from_secs(120), || async {
        let c = claims.get_opt("data-db-0").await?;
        Ok(c.filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")))
    })
    .await?;
    let host_ns = Api::<Namespace>::all(t.host.clone())
        .get("isod-apps")
        .await?;
    assert_eq!(
        host_ns.labels()["pod-security.kubernetes.io/enforce"],
        "restricted"
    );
    kept_off_the_host(&t, "isod", "unhardened", "PolicyRefused", "restricted").await?;
    Ok(())
}

#[tokio::test]
async fn host_namespaces_deny_by_default_and_tenant_network_policies_stay_inside_the_tenant() -> Res
{
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    // On a dev cluster of its own with the real node, whose kube-network-policies enforces
    // the host's copies: the objects are checked, then the connections they let through.
    let (_dir, cluster) = vcp_dev::testing::real_node_cluster().await?;
    let t = tenant_on(&cluster, "ison", vcp_dev::testing::REAL_NODE_PLACEMENT).await?;
    namespace(&t.tenant, "apps").await?;
    let host_nps = Api::<NetworkPolicy>::namespaced(t.host.clone(), "ison-apps");
    let names = eventually("vcp's policies in ison-apps", WAIT, || async {
        let mut names: Vec<String> = host_nps
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        names.sort();
        Ok((names.len() >= 4).then_some(names))
    })
    .await?;
    assert_eq!(
        names,
        [
            "vcp-control-plane",
            "vcp-isolate",
            "vcp-tenant-egress",
            "vcp-tenant-ingress"
        ]
    );
    let isolate = host_nps.get("vcp-isolate").await?.spec.unwrap();
    assert_eq!(isolate.policy_types.unwrap(), ["Ingress", "Egress"]);
    assert!(
        isolate.ingress.is_none() && isolate.egress.is_none(),
        "deny by default"
    );

    for (name, app) in [("db-0", "db"), ("web-0", "web")] {
        create::<Pod>(
            &t.tenant,
            Some("apps"),
            serde_json::json!({
                "metadata": {"name": name, "labels": {"app": app}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "c", "image": vcp_dev::images::BUSYBOX_IMAGE,
                        "command": ["sh", "-c", SERVE]}],
                },
            }),
        )
        .await?;
    }
    // The tenant isolates its database: reachable from its own namespaces only (an empty
    // namespace selector is "every namespace" in the tenant's view), and tries to open egress
    // to the whole private network.
    create::<NetworkPolicy>(&t.tenant, Some("apps"), serde_json::json!({
        "metadata": {"name": "db"},
        "spec": {"podSelector": {"matchLabels": {"app": "db"}}, "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [{"namespaceSelector": {}}]}],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}]},
    }))
    .await?;
    create::<NetworkPolicy>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "vcp-isolate"},
            "spec": {"podSelector": {}, "ingress": [{}]},
        }),
    )
    .await?;
    let db = eventually("host copy of policy db", WAIT, || async {
        Ok(host_nps.get_opt("db").await?)
    })
    .await?;
    let spec = db.spec.unwrap();
    let from = &spec.ingress.unwrap()[0].from.clone().unwrap()[0];
    assert_eq!(
        from.namespace_selector
            .as_ref()
            .unwrap()
            .match_labels
            .as_ref()
            .unwrap()[LABEL_TENANT],
        "ison",
        "every namespace of the tenant, and only those"
    );
    assert!(
        spec.egress.unwrap_or_default().is_empty(),
        "a rule whose only peer was refused is dropped, never left to mean anywhere"
    );
    warned(&t.tenant, "apps", "db", "PolicyRefused", &["ipBlock"]).await?;
    warned(&t.tenant, "apps", "vcp-isolate", "PolicyRefused", &["vcp-"]).await?;
    let isolate = host_nps.get("vcp-isolate").await?.spec.unwrap();
    assert!(
        isolate.ingress.is_none(),
        "the tenant's policy replaced vcp's own"
    );
    // The database pod is isolated by the tenant's policy, the web pod is not.
    let host_pods = Api::<Pod>::namespaced(t.host.clone(), "ison-apps");
    eventually("isolation labels on the host pods", WAIT, || async {
        let (Some(db), Some(web)) = (
            host_pods.get_opt("db-0").await?,
            host_pods.get_opt("web-0").await?,
        ) else {
            return Ok(None);
        };
        let iso = |p: &Pod, k: &str| p.labels().get(k).cloned();
        let ok = iso(&db, "vcp.dev/ingress-isolated").as_deref() == Some("true")
            && iso(&db, "vcp.dev/egress-isolated").as_deref() == Some("true")
            && iso(&web, "vcp.dev/ingress-isolated").is_none()
            && iso(&web, "vcp.dev/egress-isolated").is_none();
        Ok(ok.then_some(()))
    })
    .await?;

    // By traffic. A pod outside the tenant, on the same node, in a host namespace.
    let host = cluster.client();
    namespace(&host, "outsider").await?;
    create::<Pod>(
        &host,
        Some("outsider"),
        serde_json::json!({
            "metadata": {"name": "probe"},
            "spec": {
                "nodeSelector": {vcp_dev::node::NODE_LABEL.0: vcp_dev::node::NODE_LABEL.1},
                "tolerations": [{"key": vcp_dev::node::NODE_LABEL.0, "operator": "Exists"}],
                "terminationGracePeriodSeconds": 1,
                "containers": [{"name": "c", "image": vcp_dev::images::BUSYBOX_IMAGE,
                    "command": ["sh", "-c", SERVE]}],
            },
        }),
    )
    .await?;
    let db = host_pod_ip(&t.host, "ison-apps", "db-0").await?;
    let web = host_pod_ip(&t.host, "ison-apps", "web-0").await?;
    let probe = host_pod_ip(&t.host, "outsider", "probe").await?;
    // (from host namespace, pod, to, connects): the tenant's policy lets its own pods into
    // the database and lets the database reach nothing (its ipBlock was refused); no pod of
    // the tenant is reachable from outside it, whatever its "vcp-isolate" tried; and the
    // database's egress to the outsider, inside 10.0.0.0/8, stays shut.
    let mut seen = Vec::new();
    for (ns, from, to, expect) in [
        ("ison-apps", "web-0", &db, true),
        ("ison-apps", "db-0", &web, false),
        ("outsider", "probe", &db, false),
        ("outsider", "probe", &web, false),
        ("ison-apps", "db-0", &probe, false),
        ("ison-apps", "web-0", &probe, false),
    ] {
        let got = settled_connects(&cluster, ns, from, to, expect).await;
        seen.push(format!("{ns}/{from} -> {to}: {got}"));
        assert_eq!(got, expect, "{}", seen.join("\n"));
    }
    println!("{}", seen.join("\n"));
    Ok(())
}

/// A web server on 8080 (busybox's httpd).
const SERVE: &str = "mkdir -p /www && echo ok > /www/index.html && exec httpd -f -p 8080 -h /www";

/// Whether host pod `ns/pod` gets an answer from `ip:8080`, once settled: policies and their
/// host copies take a moment to apply, so the expected outcome is awaited for 30 s, and a
/// refusal must still hold 3 s later.
async fn settled_connects(
    cluster: &DevCluster,
    ns: &str,
    pod: &str,
    ip: &str,
    expect: bool,
) -> bool {
    let target = format!("{ip}:8080");
    let once = || {
        vcp_dev::testing::http_get_from_pod(cluster, cluster.kubeconfig_path(), ns, pod, &target)
    };
    let mut got = once();
    for _ in 0..15 {
        if got == expect {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        got = once();
    }
    if got == expect && !expect {
        tokio::time::sleep(Duration::from_secs(3)).await;
        got = once();
    }
    got
}

/// The IPv4 address of a running host pod `name` in host namespace `host_ns`.
async fn host_pod_ip(host: &Client, host_ns: &str, name: &str) -> Res<String> {
    let pods = Api::<Pod>::namespaced(host.clone(), host_ns);
    eventually(
        &format!("{host_ns}/{name} running with an address"),
        WAIT,
        || async {
            let p = pods.get_opt(name).await?.filter(running);
            Ok(p.and_then(|p| p.status?.pod_ip))
        },
    )
    .await
}

/// An address of the host's own control plane: a pod in a `vcp-*` or `kube-system` namespace,
/// else a node's InternalIP, else the host apiserver's ClusterIP (loopback addresses, which
/// process-run dev nodes have, are refused by the tenant apiserver already).
async fn control_plane_address(host: &Client) -> Res<String> {
    let usable = |ip: &str| {
        ip.parse::<std::net::Ipv4Addr>()
            .is_ok_and(|i| !i.is_loopback())
    };
    let pods = Api::<Pod>::all(host.clone())
        .list(&ListParams::default())
        .await?;
    let pod_ip = pods.items.iter().find_map(|p| {
        let ns = p.namespace()?;
        let ip = p.status.as_ref()?.pod_ip.clone()?;
        ((ns.starts_with("vcp-") || ns == "kube-system") && usable(&ip)).then_some(ip)
    });
    if let Some(ip) = pod_ip {
        return Ok(ip);
    }
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(host.clone())
        .list(&ListParams::default())
        .await?;
    let node_ip = nodes
        .items
        .iter()
        .flat_map(|n| n.status.iter().flat_map(|s| s.addresses.iter().flatten()))
        .find(|a| a.type_ == "InternalIP" && usable(&a.address))
        .map(|a| a.address.clone());
    if let Some(ip) = node_ip {
        return Ok(ip);
    }
    let api = Api::<Service>::namespaced(host.clone(), "default")
        .get("kubernetes")
        .await?;
    api.spec
        .and_then(|s| s.cluster_ip)
        .ok_or_else(|| anyhow::anyhow!("no host address to aim at"))
}

#[tokio::test]
async fn hand_written_endpoints_reach_the_host_only_with_the_tenants_own_pod_addresses() -> Res {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    let t = tenant("isoe", "{}").await?;
    let other = tenant("isof", "{}").await?;
    for (tn, pod) in [(&t, "own"), (&other, "theirs")] {
        namespace(&tn.tenant, "apps").await?;
        create::<Pod>(
            &tn.tenant,
            Some("apps"),
            serde_json::json!({
                "metadata": {"name": pod},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            }),
        )
        .await?;
    }
    // (a) its own pod, (b) the host's control plane, (c) another tenant's pod, (d) an outside
    // address the plan does not list.
    let own = host_pod_ip(&t.host, "isoe-apps", "own").await?;
    let theirs = host_pod_ip(&other.host, "isof-apps", "theirs").await?;
    let control_plane = control_plane_address(&t.host).await?;
    let outside = "192.0.2.10".to_owned();
    eprintln!("own {own}, control plane {control_plane}, other tenant {theirs}, outside {outside}");
    let addresses = [&own, &control_plane, &theirs, &outside];

    create::<Service>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({"metadata": {"name": "db"}, "spec": {"ports": [{"port": 5432}]}}),
    )
    .await?;
    create::<Endpoints>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "db"},
            "subsets": [{"addresses": addresses.iter().map(|ip| serde_json::json!({"ip": ip})).collect::<Vec<_>>(),
                "ports": [{"port": 5432}]}],
        }),
    )
    .await?;
    create::<EndpointSlice>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "db-manual", "labels": {
                "kubernetes.io/service-name": "db",
                "endpointslice.kubernetes.io/managed-by": "ops.example.com"}},
            "addressType": "IPv4",
            "endpoints": addresses.iter().map(|ip| serde_json::json!({"addresses": [ip]})).collect::<Vec<_>>(),
            "ports": [{"port": 5432}],
        }),
    )
    .await?;

    let host_eps = Api::<Endpoints>::namespaced(t.host.clone(), "isoe-apps");
    let host_slices = Api::<EndpointSlice>::namespaced(t.host.clone(), "isoe-apps");
    let ep = eventually("host copy of endpoints db", WAIT, || async {
        Ok(host_eps
            .get_opt("db")
            .await?
            .filter(|e| e.annotations().contains_key(vcp_core::naming::ANN_UID)))
    })
    .await?;
    let slice = eventually("host copy of slice db-manual", WAIT, || async {
        Ok(host_slices.get_opt("db-manual").await?)
    })
    .await?;

    let ep_ips: Vec<String> = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|s| {
            s.addresses
                .iter()
                .flatten()
                .chain(s.not_ready_addresses.iter().flatten())
        })
        .map(|a| a.ip.clone())
        .collect();
    assert_eq!(
        ep_ips,
        [own.as_str()],
        "the host endpoints carry only the tenant's pod"
    );
    let slice_ips: Vec<String> = slice
        .endpoints
        .iter()
        .flatten()
        .flat_map(|e| e.addresses.clone())
        .collect();
    assert_eq!(
        slice_ips,
        [own.as_str()],
        "the host slice carries only the tenant's pod"
    );
    // Nor does what the host mirrors from the copied Endpoints.
    let mirrored = host_slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=db"))
        .await?;
    for s in &mirrored.items {
        for e in s.endpoints.iter().flatten() {
            assert!(
                e.addresses.iter().all(|a| *a == own),
                "host slice {} routes to {:?}",
                s.name_any(),
                e.addresses
            );
        }
    }
    // The tenant is told what stayed off the host.
    let refused = [control_plane.as_str(), theirs.as_str(), outside.as_str()];
    warned(&t.tenant, "apps", "db", "PolicyRefused", &refused).await?;
    warned(&t.tenant, "apps", "db-manual", "PolicyRefused", &refused).await?;
    Ok(())
}

/// Tenant pods of `app` in `apps` in the quota's order: creation time, then name.
async fn in_line(pods: &Api<Pod>, app: &str) -> Res<Vec<Pod>> {
    let mut l = pods
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items;
    l.retain(|p| p.metadata.deletion_timestamp.is_none());
    l.sort_by_key(|p| {
        (
            p.metadata.creation_timestamp.clone().map(|t| t.0),
            p.name_any(),
        )
    });
    Ok(l)
}

#[tokio::test]
async fn the_tenant_quota_admits_in_creation_order_and_every_host_namespace_has_a_backstop() -> Res
{
    let t = tenant(
        "isoq",
        "quota: {pods: 3, requests_cpu: '1', services: 2, persistent_volume_claims: 1, namespaces: 2}",
    )
    .await?;
    namespace(&t.tenant, "apps").await?;
    let sas =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(t.tenant.clone(), "apps");
    eventually("default service account", WAIT, || async {
        Ok(sas.get_opt("default").await?)
    })
    .await?;
    // Five replicas that set no resources: the plan's defaults (100m each) fit the CPU, the
    // count of 3 does not.
    create::<Deployment>(
        &t.tenant,
        Some("apps"),
        serde_json::json!({
            "metadata": {"name": "web"},
            "spec": {"replicas": 5, "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "busybox"}]}}},
        }),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(t.tenant.clone(), "apps");
    let host_pods: Api<Pod> = Api::namespaced(t.host.clone(), "isoq-apps");
    let waiting = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter().any(|c| {
                    c.type_ == "PodScheduled"
                        && c.status == "False"
                        && c.reason.as_deref() == Some("TenantQuotaExceeded")
                })
            })
    };
    let line = eventually("3 pods on the host, 2 waiting", WAIT, || async {
        let line = in_line(&pods, "web").await?;
        let on_host = host_pods.list(&ListParams::default()).await?.items.len();
        let w = line.iter().filter(|p| waiting(p)).count();
        Ok((line.len() == 5 && on_host == 3 && w == 2).then_some(line))
    })
    .await?;
    // The first three the syncer saw run (creation order; pods of one ReplicaSet are created
    // within the same second, and one already running keeps its place), the others wait, and
    // the host never gets more.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut admitted = Vec::new();
    let mut queued = Vec::new();
    for p in &line {
        let p = pods.get(&p.name_any()).await?;
        if host_pods.get_opt(&p.name_any()).await?.is_some() {
            assert!(!waiting(&p), "{} runs and is marked waiting", p.name_any());
            admitted.push(p.name_any());
        } else {
            assert!(
                waiting(&p),
                "{} is neither on the host nor waiting",
                p.name_any()
            );
            assert_eq!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Pending")
            );
            queued.push(p.name_any());
        }
    }
    assert_eq!(
        (admitted.len(), queued.len()),
        (3, 2),
        "{admitted:?} {queued:?}"
    );
    warned(
        &t.tenant,
        "apps",
        &queued[0],
        "TenantQuotaExceeded",
        &["quota.pods"],
    )
    .await?;
    // A pod without requests gets the plan's defaults on the host.
    let host = host_pods.get(&admitted[0]).await?;
    let r = host.spec.unwrap().containers[0].resources.clone().unwrap();
    let (req, lim) = (r.requests.unwrap(), r.limits.unwrap());
    assert_eq!(
        (req["cpu"].0.as_str(), req["memory"].0.as_str()),
        ("100m", "128Mi")
    );
    assert_eq!(
        (lim["cpu"].0.as_str(), lim["memory"].0.as_str()),
        ("1", "512Mi")
    );
    // One admitted pod goes: the first in line of the waiting ones takes its place (its
    // controller's replacement is last in line). No resync needed: a waiting pod is looked at
    // again every few seconds.
    pods.delete(&admitted[1], &Default::default()).await?;
    let next = queued[0].clone();
    eventually(&format!("{next} on the host"), WAIT, || async {
        Ok(host_pods.get_opt(&next).await?)
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let on_host: Vec<String> = host_pods
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| p.name_any())
        .collect();
    assert_eq!(on_host.len(), 3, "{on_host:?}");
    assert!(!on_host.contains(&queued[1]), "{on_host:?}");

    // The host namespace carries the backstop.
    let rq =
        Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(t.host.clone(), "isoq-apps")
            .get("vcp-quota")
            .await?;
    assert_eq!(rq.labels()[LABEL_TENANT], "isoq");
    let hard = rq.spec.unwrap().hard.unwrap();
    assert_eq!(hard["pods"].0, "3");
    assert_eq!(hard["requests.cpu"].0, "1");
    assert_eq!(hard["services"].0, "2");
    assert_eq!(hard["persistentvolumeclaims"].0, "1");
    assert!(
        !hard.contains_key("requests.memory"),
        "not in the plan: unlimited"
    );
    let lr = Api::<k8s_openapi::api::core::v1::LimitRange>::namespaced(t.host.clone(), "isoq-apps")
        .get("vcp-limits")
        .await?;
    let item = &lr.spec.unwrap().limits[0];
    assert_eq!(item.default_request.as_ref().unwrap()["cpu"].0, "100m");
    assert_eq!(item.default.as_ref().unwrap()["memory"].0, "512Mi");

    // Services: the third is refused and has no host copy at all.
    let host_svcs: Api<Service> = Api::namespaced(t.host.clone(), "isoq-apps");
    for name in ["s1", "s2", "s3"] {
        create::<Service>(&t.tenant, Some("apps"), serde_json::json!({
            "metadata": {"name": name}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
        }))
        .await?;
    }
    warned(
        &t.tenant,
        "apps",
        "s3",
        "TenantQuotaExceeded",
        &["quota.services"],
    )
    .await?;
    for name in ["s1", "s2"] {
        eventually(&format!("host service {name}"), WAIT, || async {
            Ok(host_svcs.get_opt(name).await?)
        })
        .await?;
    }
    assert!(
        host_svcs.get_opt("s3").await?.is_none(),
        "s3 reached the host"
    );

    // Claims: the second is refused.
    for name in ["c1", "c2"] {
        create::<PersistentVolumeClaim>(&t.tenant, Some("apps"), serde_json::json!({
            "metadata": {"name": name},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .await?;
    }
    warned(
        &t.tenant,
        "apps",
        "c2",
        "TenantQuotaExceeded",
        &["quota.persistent_volume_claims"],
    )
    .await?;
    let host_claims: Api<PersistentVolumeClaim> = Api::namespaced(t.host.clone(), "isoq-apps");
    eventually("host claim c1", WAIT, || async {
        Ok(host_claims.get_opt("c1").await?)
    })
    .await?;
    assert!(
        host_claims.get_opt("c2").await?.is_none(),
        "c2 reached the host"
    );

    // Namespaces: a second one is fine, a third never reaches the host.
    namespace(&t.tenant, "second").await?;
    let host_ns: Api<Namespace> = Api::all(t.host.clone());
    eventually("host namespace isoq-second", WAIT, || async {
        Ok(host_ns.get_opt("isoq-second").await?)
    })
    .await?;
    namespace(&t.tenant, "third").await?;
    warned(
        &t.tenant,
        "default",
        "third",
        "TenantQuotaExceeded",
        &["quota.namespaces"],
    )
    .await?;
    // Objects in it wait calmly.
    create::<ConfigMap>(
        &t.tenant,
        Some("third"),
        serde_json::json!({"metadata": {"name": "cfg"}, "data": {"a": "b"}}),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        host_ns.get_opt("isoq-third").await?.is_none(),
        "isoq-third reached the host"
    );
    let log = std::fs::read_to_string(t.cp.syncer_log()).unwrap_or_default();
    assert!(
        !log.lines()
            .any(|l| l.contains("WARN") && l.contains("third")),
        "objects of the waiting namespace made the syncer warn"
    );
    Ok(())
}
