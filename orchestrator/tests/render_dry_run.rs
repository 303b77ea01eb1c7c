//! Every object the templates render passes server-side dry-run on the dev cluster's real
//! apiserver, for every version in the catalog and for single-member and HA plans.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use vcp_dev::cluster::DevCluster;
use vcp_orchestrator::host::ssa as host;
use vcp_orchestrator::render::{self, Catalog, Component, Expose, Input, Plan, Renderer, Settings};

/// What the dev cluster's `vcp serve` renders with.
fn dev_settings() -> Settings {
    Settings {
        service_cidr: vcp_dev::cluster::SERVICE_CIDR.into(),
        cluster_domain: "cluster.local".into(),
        syncer_image: vcp_dev::platform::DEV_SYNCER_IMAGE.into(),
        tools_image: vcp_dev::platform::DEV_TOOLS_IMAGE.into(),
        expose: Expose::NodePort {
            address: "127.0.0.1".into(),
        },
        host_roles_prefix: "vcp".into(),
        datastores: render::datastore::parse_datastores(vcp_dev::platform::DEV_DATASTORES)
            .expect("the dev datastores parse"),
        // As the chart sets it: the apiserver's audit flags and Secret are rendered too.
        audit_url: Some("http://vcp.vcp-system.svc:8081/audit/v1/events".into()),
    }
}

#[tokio::test]
async fn every_rendered_object_passes_server_side_dry_run() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let catalog = Catalog::builtin();
    let renderer = Renderer::builtin()?;
    let settings = dev_settings();
    let mut plans = render::parse_plans(vcp_dev::platform::DEV_PLANS)?;
    plans.insert(
        "ha".into(),
        Plan {
            etcd_replicas: 3,
            apiserver_replicas: 3,
            dns_replicas: 2,
            storage_class: Some("standard".into()),
            ..Plan::default()
        },
    );
    let mut checked = 0;
    for version in &catalog.versions {
        for (plan_name, plan) in &plans {
            let key = vcp_core::naming::TenantKey::new(&format!(
                "dry{}{}",
                version.minor.replace('.', ""),
                &plan_name[..2]
            ))?;
            let ns = format!("vcp-{key}");
            // Namespaced objects need their namespace to exist, even for a dry run.
            let namespaces: Api<Namespace> = Api::all(client.clone());
            let _ = namespaces
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
                )
                .await;
            let input = Input {
                name: "dry",
                key: &key,
                version,
                plan,
                settings: &settings,
                rollout: BTreeMap::from([("etcd".to_owned(), "abc".to_owned())]),
                run: vcp_orchestrator::render::Run::Up,
            };
            for (component, objects) in renderer.render_all(&input)? {
                // A tenant on a shared datastore has no etcd of its own.
                let own_etcd = plan.datastore.is_none() || component != Component::Etcd;
                assert_eq!(
                    !objects.is_empty(),
                    own_etcd,
                    "{component:?} of plan {plan_name}"
                );
                for o in &objects {
                    host::apply(&client, o, true).await.map_err(|e| {
                        anyhow::anyhow!(
                            "{} {} of {component:?} ({} plan {plan_name}) fails dry-run: {}",
                            o.kind(),
                            o.name(),
                            version.minor,
                            e.public()
                        )
                    })?;
                    checked += 1;
                }
            }
            assert!(
                renderer
                    .render(Component::Syncer, &input)?
                    .iter()
                    .any(|o| o.kind() == "ClusterRole")
            );
        }
    }
    // The shared datastores' own objects and admin Jobs, in their namespaces.
    for (name, spec) in &settings.datastores {
        let ns = render::datastore::namespace(name);
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let _ = namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))?,
            )
            .await;
        let images = (
            catalog.versions[0].images["etcd"].as_str(),
            settings.tools_image.as_str(),
        );
        let mut objects = renderer.render_datastore(name, spec, images, "abc")?;
        for admin in [
            render::datastore::Admin::Init,
            render::datastore::Admin::Grant { key: "k1".into() },
            render::datastore::Admin::Revoke {
                key: "k1".into(),
                keep_data: false,
            },
        ] {
            objects.extend(renderer.render_datastore_job(name, spec, images, &admin)?);
        }
        for o in &objects {
            host::apply(&client, o, true).await.map_err(|e| {
                anyhow::anyhow!(
                    "{} {} of datastore {name} fails dry-run: {}",
                    o.kind(),
                    o.name(),
                    e.public()
                )
            })?;
            checked += 1;
        }
    }
    println!("{checked} objects passed dry-run");
    assert!(checked >= 60, "only {checked} objects checked");
    Ok(())
}

/// The pods of vcp's own images (the syncer and the snapshot Job) are admitted by Pod Security
/// `restricted`, enforced by the real apiserver: each pod template as a Pod, dry-run in a
/// namespace that enforces it. (A restore runs as root on etcd's data and is not.)
#[tokio::test]
async fn pods_of_vcps_images_are_admitted_under_an_enforced_restricted_pod_security()
-> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let ns = "vcp-dryrestricted";
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let _ = namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": ns, "labels": {
                "pod-security.kubernetes.io/enforce": "restricted",
            }}}))?,
        )
        .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let _ = accounts
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": "vcp-syncer"}}))?,
        )
        .await;
    let catalog = Catalog::builtin();
    let renderer = Renderer::builtin()?;
    let settings = dev_settings();
    let plan = Plan::default();
    let key = vcp_core::naming::TenantKey::new("dryrestricted")?;
    let input = Input {
        name: "dry",
        key: &key,
        version: catalog.get(&catalog.versions[0].minor).expect("listed"),
        plan: &plan,
        settings: &settings,
        rollout: BTreeMap::new(),
        run: vcp_orchestrator::render::Run::Up,
    };
    let mut objects = renderer.render(Component::Syncer, &input)?;
    objects.extend(renderer.render_job(
        render::JobKind::Snapshot,
        &input,
        serde_json::json!({"job": "etcd-snapshot-1", "file": "1.db"}),
    )?);
    objects.extend(renderer.render_job(
        render::JobKind::Member,
        &input,
        serde_json::json!({"job": "etcd-member-add-1-abc", "step": "add",
            "voting_servers": "https://etcd-0.etcd.vcp-dryrestricted.svc:2379",
            "peer_url": "https://etcd-1.etcd.vcp-dryrestricted.svc:2380"}),
    )?);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut admitted = Vec::new();
    for o in objects
        .iter()
        .filter(|o| o.kind() == "Deployment" || o.kind() == "Job")
    {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": o.name(), "namespace": ns},
            "spec": o.0["spec"]["template"]["spec"],
        }))?;
        pods.create(&dry, &pod).await.map_err(|e| {
            anyhow::anyhow!(
                "the pod of {} {} is not admitted under restricted: {e}",
                o.kind(),
                o.name()
            )
        })?;
        admitted.push(o.name().to_owned());
    }
    admitted.sort();
    assert_eq!(
        admitted,
        ["etcd-member-add-1-abc", "etcd-snapshot-1", "vcp-syncer"]
    );
    Ok(())
}
