use super::*;

fn settings() -> Settings {
    Settings {
        service_cidr: "10.96.0.0/16".into(),
        cluster_domain: "cluster.local".into(),
        syncer_image: "ghcr.io/vcp-dev/vcp-syncer:0.1.0".into(),
        expose: Expose::NodePort {
            address: "127.0.0.1".into(),
        },
    }
}

fn dev_plan() -> Plan {
    parse_plans(
        r#"
dev:
  node_selector: {vcp.dev/runtime: process}
  tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
  resources:
    kube-apiserver: {requests: {cpu: 100m, memory: 256Mi}}
"#,
    )
    .unwrap()
    .remove("dev")
    .unwrap()
}

fn render_yaml(minor: &str, plan: &Plan) -> String {
    let catalog = Catalog::builtin();
    let version = catalog.get(minor).unwrap();
    let settings = settings();
    let input = Input {
        name: "demo",
        key: "demoabc123",
        version,
        plan,
        settings: &settings,
        rollout: [("apiserver".to_owned(), "d1".to_owned())].into(),
    };
    let mut out = String::new();
    for (c, objs) in Renderer::builtin().unwrap().render_all(&input).unwrap() {
        for o in objs {
            out.push_str(&format!("# {}\n---\n", c.as_str()));
            out.push_str(&serde_yaml::to_string(&o.0).unwrap());
        }
    }
    out
}

/// Compares with the committed golden file; `VCP_UPDATE_GOLDEN=1` rewrites it.
fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/render/golden")
        .join(name);
    if std::env::var_os("VCP_UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (run with VCP_UPDATE_GOLDEN=1)", path.display()));
    if want != actual {
        let line = want
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(want.lines().count().min(actual.lines().count()));
        panic!(
            "{} differs from the rendering at line {}:\n  golden:   {:?}\n  rendered: {:?}\n(run with VCP_UPDATE_GOLDEN=1 after checking the change)",
            path.display(),
            line + 1,
            want.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

#[test]
fn dev_plan_renders_like_the_golden_files_for_both_minors() {
    golden("v1.37-dev.yaml", &render_yaml("1.37", &dev_plan()));
    golden("v1.36-dev.yaml", &render_yaml("1.36", &dev_plan()));
}

#[test]
fn three_member_etcd_and_three_apiservers_render_like_the_golden_file() {
    let plan = Plan {
        etcd_replicas: 3,
        apiserver_replicas: 3,
        storage_class: Some("fast".into()),
        ..Plan::default()
    };
    golden("v1.37-ha.yaml", &render_yaml("1.37", &plan));
}

#[test]
fn every_object_is_in_the_control_plane_namespace_or_named_after_the_key() {
    let text = render_yaml("1.37", &Plan::default());
    assert!(text.contains("namespace: vcp-demoabc123"));
    assert!(text.contains("name: vcp-syncer-demoabc123"));
    assert!(!text.contains("{{"), "unrendered expression");
}

#[test]
fn a_template_that_escapes_its_namespace_is_refused() {
    let mut sources: Vec<(String, String)> = TEMPLATES
        .iter()
        .map(|(_, n, s)| ((*n).to_owned(), (*s).to_owned()))
        .collect();
    sources[0].1 =
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x, namespace: kube-system}\n".into();
    let r = Renderer::from_sources(sources.clone()).unwrap();
    let plan = Plan::default();
    let s = settings();
    let catalog = Catalog::builtin();
    let input = Input {
        name: "demo",
        key: "demoabc123",
        version: catalog.resolve(None).unwrap(),
        plan: &plan,
        settings: &s,
        rollout: BTreeMap::new(),
    };
    let e = r.render(Component::Network, &input).unwrap_err();
    assert!(matches!(e, RenderError::Escape { .. }), "{e}");
    sources[0].1 =
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: admin}\n"
            .into();
    let e = Renderer::from_sources(sources.clone())
        .unwrap()
        .render(Component::Network, &input)
        .unwrap_err();
    assert!(matches!(e, RenderError::Escape { .. }), "{e}");
    sources[0].1 = "kind: ConfigMap\nmetadata: {name: x}\n".into();
    let e = Renderer::from_sources(sources.clone())
        .unwrap()
        .render(Component::Network, &input)
        .unwrap_err();
    assert!(
        matches!(
            e,
            RenderError::Shape {
                field: "apiVersion",
                ..
            }
        ),
        "{e}"
    );
    sources[0].1 = "{{ no_such_variable }}".into();
    let e = Renderer::from_sources(sources)
        .unwrap()
        .render(Component::Network, &input)
        .unwrap_err();
    assert!(e.to_string().contains("no_such_variable"), "{e}");
}

#[test]
fn plans_are_checked() {
    assert!(parse_plans("{}").unwrap().contains_key("default"));
    for bad in [
        "x: {etcd_replicas: 2}",
        "x: {apiserver_replicas: 0}",
        "x: {apiserver_replicas: 4}",
        "x: {dns_replicas: 9}",
        "x: {no_such_field: 1}",
        "x: [",
    ] {
        assert!(parse_plans(bad).is_err(), "{bad}");
    }
}

#[test]
fn in_cluster_kubeconfigs_point_at_mounted_files() {
    let k = kubeconfig::in_cluster("https://a:6443", "/p");
    let v: serde_yaml::Value = serde_yaml::from_str(&k).unwrap();
    assert_eq!(v["users"][0]["user"]["client-key"], "/p/tls.key");
    assert_eq!(v["clusters"][0]["cluster"]["server"], "https://a:6443");
}
