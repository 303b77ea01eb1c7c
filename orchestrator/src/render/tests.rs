use super::*;

fn key() -> TenantKey {
    TenantKey::new("demoabc123").unwrap()
}

fn settings() -> Settings {
    Settings {
        service_cidr: "10.96.0.0/16".into(),
        cluster_domain: "cluster.local".into(),
        syncer_image: "ghcr.io/vcp-dev/vcp-syncer:0.1.0".into(),
        tools_image: "ghcr.io/vcp-dev/vcp:0.1.0".into(),
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
        key: &key(),
        version,
        plan,
        settings: &settings,
        rollout: [("apiserver".to_owned(), "d1".to_owned())].into(),
        stopped: false,
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
fn every_rendered_object_is_of_a_kind_the_host_writer_knows() {
    // A comment that trims the newline after `---` glues the separator to the next line, and
    // the object comes out as `v1/<Kind>` with a `---apiVersion` key: caught here, not on a
    // live cluster.
    let catalog = Catalog::builtin();
    let settings = settings();
    for minor in ["1.36", "1.37"] {
        let plan = Plan::default();
        let input = Input {
            name: "demo",
            key: &key(),
            version: catalog.get(minor).unwrap(),
            plan: &plan,
            settings: &settings,
            rollout: Default::default(),
            stopped: false,
        };
        for (_, objects) in Renderer::builtin().unwrap().render_all(&input).unwrap() {
            for o in objects {
                assert!(
                    crate::provision::host::supported(o.api_version(), o.kind()),
                    "{} {}: not a kind the host writer applies",
                    o.api_version(),
                    o.kind()
                );
            }
        }
    }
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
        key: &key(),
        version: catalog.resolve(None).unwrap(),
        plan: &plan,
        settings: &s,
        rollout: BTreeMap::new(),
        stopped: false,
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

#[test]
fn the_static_band_is_what_kubernetes_keeps_for_chosen_addresses() {
    let band = |c: &str| static_band(c).unwrap().to_string();
    assert_eq!(band("10.96.0.0/12"), "10.96.0.0/24", "256 at most");
    assert_eq!(band("10.96.0.0/16"), "10.96.0.0/24");
    assert_eq!(band("10.96.0.0/20"), "10.96.0.0/24", "4096 / 16 = 256");
    assert_eq!(band("10.96.0.0/22"), "10.96.0.0/26", "1024 / 16 = 64");
    assert_eq!(band("10.96.0.0/24"), "10.96.0.0/28", "16 at least");
    assert_eq!(
        band("10.96.0.0/28"),
        "10.96.0.0/28",
        "a tiny range is all static"
    );
    assert_eq!(band("fd00:10:96::/112"), "fd00:10:96::/120");
    assert!(static_band("not a cidr").is_none());
}

#[test]
fn the_syncer_policy_keeps_tenants_off_control_plane_nodes_and_reserved_addresses() {
    let plan = dev_plan();
    let p = syncer_policy(&plan, &settings());
    assert_eq!(p.placement.avoid_node_labels["vcp.dev/runtime"], "process");
    assert_eq!(
        p.services.reserved_cluster_ips,
        ["10.96.0.0/24".parse::<ipnet::IpNet>().unwrap()]
    );
    assert_eq!(p.pod_security, vcp_policy::Level::Baseline, "the default");
    // The rendered syncer reads exactly this, and rolls when it changes.
    let objs = Renderer::builtin()
        .unwrap()
        .render(
            Component::Syncer,
            &Input {
                name: "demo",
                key: &key(),
                version: Catalog::builtin().get("1.37").unwrap(),
                plan: &plan,
                settings: &settings(),
                rollout: BTreeMap::new(),
                stopped: false,
            },
        )
        .unwrap();
    let cm = objs.iter().find(|o| o.kind() == "ConfigMap").unwrap();
    let text = cm.0["data"]["policy.yaml"].as_str().unwrap();
    assert_eq!(vcp_policy::TenantPolicy::from_yaml(text).unwrap(), p);
    let deploy = objs.iter().find(|o| o.kind() == "Deployment").unwrap();
    let annotations = &deploy.0["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["vcp.dev/policy"], json!(digest(text)));
    let args = deploy.0["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    assert!(args.contains("--policy=/etc/vcp/kubeconfig/policy.yaml"));
}

#[test]
fn a_plan_whose_pool_is_its_control_plane_nodes_does_not_avoid_them() {
    let plans = parse_plans(
        r#"
shared:
  node_selector: {vcp.dev/runtime: process, zone: a}
  policy:
    placement:
      node_selector: {vcp.dev/runtime: process}
"#,
    )
    .unwrap();
    let p = syncer_policy(&plans["shared"], &settings());
    assert_eq!(
        p.placement.avoid_node_labels,
        BTreeMap::from([("zone".to_owned(), "a".to_owned())]),
        "only the label the pool asks for is shared"
    );
}

#[test]
fn plans_with_a_policy_that_cannot_work_are_refused() {
    let err = parse_plans("default: {policy: {services: {node_port_services: 1}}}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("policy") && err.contains("node_ports"),
        "{err}"
    );
    let err = parse_plans("default: {policy: {pod_securty: baseline}}")
        .unwrap_err()
        .to_string();
    assert!(err.contains("pod_securty"), "{err}");
}

/// The pod spec of the first object of `kind` named `name` among `objects`.
fn pod_spec<'a>(objects: &'a [Object], kind: &str, name: &str) -> &'a serde_json::Value {
    let o = objects
        .iter()
        .find(|o| o.0["kind"] == kind && o.0["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name}"));
    &o.0["spec"]["template"]["spec"]
}

/// Pod Security `restricted` as vcp's own images need it: the image's non-root user, a group
/// that may read the 0400 Secret mounts, and nothing a container could gain.
fn assert_restricted_non_root(spec: &serde_json::Value, what: &str) {
    let pod = &spec["securityContext"];
    assert_eq!(pod["runAsNonRoot"], true, "{what}: {pod}");
    assert_eq!(pod["runAsUser"], 65532, "{what}: the images' user");
    assert_eq!(
        pod["fsGroup"], 65532,
        "{what}: Secrets readable by the image's user"
    );
    assert_eq!(pod["seccompProfile"]["type"], "RuntimeDefault", "{what}");
    for c in spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}: {c}");
        assert_eq!(
            sc["capabilities"]["drop"],
            serde_json::json!(["ALL"]),
            "{what}"
        );
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
    }
}

#[test]
fn pods_of_vcps_own_images_run_as_their_non_root_user_and_can_read_their_secrets() {
    let catalog = Catalog::builtin();
    let (plan, settings) = (dev_plan(), settings());
    let input = Input {
        name: "demo",
        key: &key(),
        version: catalog.get("1.37").unwrap(),
        plan: &plan,
        settings: &settings,
        rollout: Default::default(),
        stopped: false,
    };
    let renderer = Renderer::builtin().unwrap();
    let all: Vec<Object> = renderer
        .render_all(&input)
        .unwrap()
        .into_iter()
        .flat_map(|(_, o)| o)
        .collect();
    assert_restricted_non_root(pod_spec(&all, "Deployment", "vcp-syncer"), "the syncer");
    let snapshot = renderer
        .render_job(
            JobKind::Snapshot,
            &input,
            serde_json::json!({"job": "etcd-snapshot-1", "file": "1.db"}),
        )
        .unwrap();
    assert_restricted_non_root(pod_spec(&snapshot, "Job", "etcd-snapshot-1"), "a snapshot");
    // A restore rewrites etcd's root-owned data: it says so, rather than failing as the
    // image's user.
    let restore = renderer
        .render_job(
            JobKind::Restore,
            &input,
            serde_json::json!({"job": "etcd-restore-1-0", "file": "1.db", "sha256": "0",
                "member": 0, "staging": "/var/lib/etcd/restore-1",
                "keep": "/var/lib/etcd/data.before-restore", "revision_bump": 1}),
        )
        .unwrap();
    let spec = pod_spec(&restore, "Job", "etcd-restore-1-0");
    assert_eq!(spec["securityContext"]["runAsUser"], 0, "{spec}");
}

fn dev_objects() -> Vec<Object> {
    let catalog = Catalog::builtin();
    let (plan, settings) = (dev_plan(), settings());
    let input = Input {
        name: "demo",
        key: &key(),
        version: catalog.get("1.37").unwrap(),
        plan: &plan,
        settings: &settings,
        rollout: Default::default(),
        stopped: false,
    };
    Renderer::builtin()
        .unwrap()
        .render_all(&input)
        .unwrap()
        .into_iter()
        .flat_map(|(_, o)| o)
        .collect()
}

#[test]
fn the_syncers_name_resolves_before_it_is_ready() {
    // The tenant apiserver calls the syncer's webhook by this name; a name published only
    // once the pod is ready is cached as missing by the caller's resolver for seconds.
    let all = dev_objects();
    let svc = all
        .iter()
        .find(|o| o.kind() == "Service" && o.name() == "vcp-syncer")
        .unwrap();
    assert_eq!(svc.0["spec"]["publishNotReadyAddresses"], true, "{}", svc.0);
}

#[test]
fn etcd_is_ready_only_after_three_reads_in_a_row_whatever_finds_it_started() {
    let all = dev_objects();
    let etcd = &pod_spec(&all, "StatefulSet", "etcd")["containers"][0];
    let ready = &etcd["readinessProbe"];
    // Rolls (CA rotations) restart the next member only behind this: three linearizable
    // reads, 2 s apart. The startup probe only finds the process serving sooner.
    assert_eq!(ready["httpGet"]["path"], "/readyz");
    assert_eq!(ready["successThreshold"], 3);
    assert_eq!(ready["periodSeconds"], 2);
    assert_eq!(etcd["startupProbe"]["httpGet"]["path"], "/livez");
    assert_eq!(etcd["startupProbe"]["periodSeconds"], 1);
    let api = &pod_spec(&all, "Deployment", "kube-apiserver")["containers"][0];
    assert_eq!(api["startupProbe"]["periodSeconds"], 1);
    assert_eq!(api["readinessProbe"]["failureThreshold"], 3);
    assert_eq!(api["readinessProbe"]["periodSeconds"], 2);
}

#[test]
fn the_apiserver_pod_runs_its_revocation_authorizer_which_denies_when_it_cannot_answer() {
    use vcp_core::revocation as r;
    let all = dev_objects();
    let spec = pod_spec(&all, "Deployment", "kube-apiserver");
    let containers = spec["containers"].as_array().unwrap();
    let api = &containers[0];
    let authz = containers
        .iter()
        .find(|c| c["name"] == "vcp-authorizer")
        .expect("the authorizer beside the apiserver");
    assert_eq!(authz["command"], json!(["vcp-syncer", "authorize"]));
    let args = authz["args"].to_string();
    assert!(
        args.contains(&format!("--listen={}", r::AUTHORIZER_LISTEN)),
        "{args}"
    );
    assert!(
        args.contains(&format!(
            "--revocations-file=/etc/vcp/revocations/{}",
            r::KEY
        )),
        "{args}"
    );
    // The authorizer's own restricted context, in a pod whose apiserver runs as before.
    let sc = &authz["securityContext"];
    assert_eq!(sc["runAsNonRoot"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
    // Only the authorizer holds a token (of an identity that reads one ConfigMap).
    assert_eq!(spec["serviceAccountName"], "vcp-authorizer");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert!(!api["volumeMounts"].to_string().contains("serviceaccount"));
    assert!(
        authz["volumeMounts"]
            .to_string()
            .contains("/var/run/secrets/kubernetes.io/serviceaccount")
    );
    let role = all
        .iter()
        .find(|o| o.kind() == "Role" && o.0["metadata"]["name"] == "vcp-authorizer")
        .unwrap();
    assert_eq!(
        role.0["rules"],
        json!([{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"],
                "resourceNames": [r::CONFIGMAP]}])
    );
    // Started before the pod takes traffic; never taken out of the Service by a probe.
    assert_eq!(authz["startupProbe"]["httpGet"]["path"], "/readyz");
    assert!(authz.get("readinessProbe").is_none(), "{authz}");
    let volumes = spec["volumes"].to_string();
    assert!(
        volumes.contains(&format!("\"name\":\"{}\"", r::CONFIGMAP)),
        "{volumes}"
    );

    // The apiserver asks it on the loopback, only for kubeconfigs vcp issued, and refuses
    // what it cannot answer.
    let cm = all
        .iter()
        .find(|o| o.kind() == "ConfigMap" && o.0["metadata"]["name"] == "kube-apiserver-authz")
        .unwrap();
    let config: serde_json::Value =
        serde_yaml::from_str(cm.0["data"]["authorization.yaml"].as_str().unwrap()).unwrap();
    let webhook = &config["authorizers"][0]["webhook"];
    assert_eq!(webhook["failurePolicy"], "Deny");
    assert_eq!(
        webhook["matchConditions"][0]["expression"],
        r::MATCH_CONDITION
    );
    assert_eq!(config["authorizers"][1]["type"], "RBAC");
    let kubeconfig: serde_json::Value =
        serde_yaml::from_str(cm.0["data"]["webhook.kubeconfig"].as_str().unwrap()).unwrap();
    assert_eq!(
        kubeconfig["clusters"][0]["cluster"]["server"],
        r::authorizer_url()
    );
}
