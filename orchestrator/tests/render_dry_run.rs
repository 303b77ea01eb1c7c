//! Every object the templates render passes server-side dry-run on the dev cluster's real
//! apiserver, for every version in the catalog and for single-member and HA plans.

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};
use std::collections::BTreeMap;
use vcp_dev::cluster::DevCluster;
use vcp_orchestrator::provision::host;
use vcp_orchestrator::render::{self, Catalog, Component, Expose, Input, Plan, Renderer, Settings};

#[tokio::test]
async fn every_rendered_object_passes_server_side_dry_run() -> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let catalog = Catalog::builtin();
    let renderer = Renderer::builtin()?;
    let settings = Settings {
        service_cidr: vcp_dev::cluster::SERVICE_CIDR.into(),
        cluster_domain: "cluster.local".into(),
        syncer_image: vcp_dev::platform::DEV_SYNCER_IMAGE.into(),
        tools_image: vcp_dev::platform::DEV_TOOLS_IMAGE.into(),
        expose: Expose::NodePort {
            address: "127.0.0.1".into(),
        },
    };
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
                stopped: false,
            };
            for (component, objects) in renderer.render_all(&input)? {
                assert!(!objects.is_empty(), "{component:?} renders nothing");
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
    println!("{checked} objects passed dry-run");
    assert!(checked >= 60, "only {checked} objects checked");
    Ok(())
}
