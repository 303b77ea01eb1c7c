use crate::render::*;

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
        host_roles_prefix: "vcp".into(),
        datastores: Default::default(),
        audit_url: Some("http://vcp.vcp-system.svc:8081/audit/v1/events".into()),
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
        rollout: [
            ("apiserver".to_owned(), "d1".to_owned()),
            ("encryption".to_owned(), "e1".to_owned()),
        ]
        .into(),
        run: crate::render::Run::Up,
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
            run: crate::render::Run::Up,
        };
        for (_, objects) in Renderer::builtin().unwrap().render_all(&input).unwrap() {
            for o in objects {
                assert!(
                    crate::host::ssa::supported(o.api_version(), o.kind()),
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
        run: crate::render::Run::Up,
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
                run: crate::render::Run::Up,
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
    let init = spec["initContainers"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for c in spec["containers"].as_array().unwrap().iter().chain(&init) {
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
        run: crate::render::Run::Up,
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
    // With a backup store: the snapshot first, then the upload, both as restricted, the
    // upload reading the snapshot's report and the tenant's backup Secret.
    let backup = serde_json::json!({"secret": "vcp-backup", "mount": "/etc/vcp-backup",
        "endpoint": "https://s3.example:8443", "bucket": "b", "region": "r", "port": 8443, "key_id": 4,
        "key_file": "/etc/vcp-backup/key-4", "object": "p/k/1.db.enc"});
    let uploaded = renderer
        .render_job(
            JobKind::Snapshot,
            &input,
            serde_json::json!({"job": "etcd-snapshot-1", "file": "1.db", "backup": backup}),
        )
        .unwrap();
    let spec = pod_spec(&uploaded, "Job", "etcd-snapshot-1");
    assert_restricted_non_root(spec, "an uploaded snapshot");
    assert_eq!(spec["initContainers"][0]["name"], "snapshot", "{spec}");
    assert!(
        spec["initContainers"][0]["args"]
            .as_array()
            .unwrap()
            .contains(&serde_json::json!("--report=/snapshots/1.db.report"))
    );
    let upload = &spec["containers"][0];
    assert_eq!(
        upload["command"],
        serde_json::json!(["vcp", "tool", "backup-upload"])
    );
    for arg in [
        "--report-in=/snapshots/1.db.report",
        "--object=p/k/1.db.enc",
        "--key-id=4",
    ] {
        assert!(
            upload["args"]
                .as_array()
                .unwrap()
                .contains(&serde_json::json!(arg)),
            "{arg}"
        );
    }
    assert!(
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["secret"]["secretName"] == "vcp-backup"),
        "{spec}"
    );
    // Its pods may dial the store's port, wherever the store is.
    let egress = uploaded
        .iter()
        .find(|o| o.kind() == "NetworkPolicy" && o.name() == "control-plane-egress-backup-store")
        .expect("the backup store's egress policy");
    assert_eq!(egress.0["spec"]["egress"][0]["ports"][0]["port"], 8443);
    assert!(
        !snapshot.iter().any(|o| o.kind() == "NetworkPolicy"),
        "none without a store"
    );
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
    assert_eq!(
        spec["initContainers"][0]["name"], "check",
        "no fetch: {spec}"
    );
    // An uploaded snapshot is fetched onto the claim before it is checked.
    let fetched = renderer
        .render_job(
            JobKind::Restore,
            &input,
            serde_json::json!({"job": "etcd-restore-1-0", "file": "1.db", "sha256": "0",
                "member": 0, "staging": "/var/lib/etcd/restore-1",
                "keep": "/var/lib/etcd/data.before-restore", "revision_bump": 1,
                "fetch": backup}),
        )
        .unwrap();
    let spec = pod_spec(&fetched, "Job", "etcd-restore-1-0");
    let names: Vec<&str> = spec["initContainers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["fetch", "check", "restore"]);
    let import = renderer
        .render_job(
            JobKind::Import,
            &input,
            serde_json::json!({"job": "etcd-restore-1-0", "file": "1.vcpl", "sha256": "0",
                "fetch": backup}),
        )
        .unwrap();
    let spec = pod_spec(&import, "Job", "etcd-restore-1-0");
    assert_restricted_non_root(spec, "an import fetching its snapshot");
    assert_eq!(spec["initContainers"][0]["name"], "fetch", "{spec}");
}

#[test]
fn a_growing_etcd_starts_only_its_new_member_told_to_join_and_its_jobs_reach_the_voters() {
    let catalog = Catalog::builtin();
    let settings = settings();
    let mut plan = dev_plan();
    plan.etcd_replicas = 3;
    let input = Input {
        name: "demo",
        key: &key(),
        version: catalog.get("1.37").unwrap(),
        plan: &plan,
        settings: &settings,
        rollout: Default::default(),
        run: crate::render::Run::Up,
    };
    let renderer = Renderer::builtin().unwrap();
    let set = |objects: &[Object]| {
        objects
            .iter()
            .find(|o| o.kind() == "StatefulSet")
            .unwrap()
            .0
            .clone()
    };
    let args = |s: &serde_json::Value| -> Vec<String> {
        s["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let ns = control_plane_namespace(&key());
    // As the plan says: three members, a new cluster, nothing held back.
    let planned = set(&renderer.render(Component::Etcd, &input).unwrap());
    assert_eq!(planned["spec"]["replicas"], 3);
    assert_eq!(
        planned["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        0
    );
    assert_eq!(
        planned["metadata"]["annotations"]["vcp.dev/etcd-members"],
        "3"
    );
    assert!(args(&planned).contains(&"--initial-cluster-state=new".to_owned()));
    // Member 2 starting: three pods, the two that vote kept as they are, the new one joining
    // the three as the cluster lists them.
    let step = crate::lifecycle::members::Growth::Start(2);
    let shape = crate::lifecycle::members::shape(&step).unwrap();
    let growing = set(&renderer
        .render_with(
            Component::Etcd,
            &input,
            serde_json::json!({ "etcd_growth": shape }),
        )
        .unwrap());
    assert_eq!(growing["spec"]["replicas"], 3);
    assert_eq!(
        growing["spec"]["updateStrategy"]["rollingUpdate"]["partition"],
        2
    );
    assert_eq!(
        growing["metadata"]["annotations"]["vcp.dev/etcd-members"],
        "2"
    );
    let a = args(&growing);
    assert!(
        a.contains(&"--initial-cluster-state=existing".to_owned()),
        "{a:?}"
    );
    let cluster: Vec<String> = (0..3)
        .map(|m| format!("etcd-{m}=https://etcd-{m}.etcd.{ns}.svc:2380"))
        .collect();
    assert!(
        a.contains(&format!("--initial-cluster={}", cluster.join(","))),
        "{a:?}"
    );
    // The Job: restricted, the voters only, the step last.
    let job = renderer
        .render_job(
            JobKind::Member,
            &input,
            serde_json::json!({"job": "etcd-member-add-1-abc", "step": "add",
                "voting_servers": format!("https://etcd-0.etcd.{ns}.svc:2379"),
                "peer_url": format!("https://etcd-1.etcd.{ns}.svc:2380")}),
        )
        .unwrap();
    let spec = pod_spec(&job, "Job", "etcd-member-add-1-abc");
    assert_restricted_non_root(spec, "a member Job");
    let c = &spec["containers"][0];
    assert_eq!(
        c["command"],
        serde_json::json!(["vcp", "tool", "etcd-member"])
    );
    let a: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(a.last(), Some(&"add"));
    assert!(a.contains(&format!("--endpoints=https://etcd-0.etcd.{ns}.svc:2379").as_str()));
    // Labelled as the snapshot Jobs: the pods the tenant's NetworkPolicies let reach etcd.
    let snapshot = renderer
        .render_job(
            JobKind::Snapshot,
            &input,
            serde_json::json!({"job": "etcd-snapshot-1", "file": "1.db"}),
        )
        .unwrap();
    let labels = |o: &[Object], name: &str| {
        o.iter()
            .find(|o| o.kind() == "Job" && o.name() == name)
            .unwrap()
            .0["spec"]["template"]["metadata"]["labels"]
            .clone()
    };
    assert_eq!(
        labels(&job, "etcd-member-add-1-abc"),
        labels(&snapshot, "etcd-snapshot-1")
    );
}

fn dev_objects() -> Vec<Object> {
    objects_of(&dev_plan())
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
    // Every replica reads the same etcd: readiness leaves it out (a blip would empty the
    // Service), the startup probe asks it (a replica that cannot read etcd never serves).
    assert_eq!(
        api["readinessProbe"]["httpGet"]["path"],
        "/readyz?exclude=etcd&exclude=etcd-readiness"
    );
    assert_eq!(api["startupProbe"]["httpGet"]["path"], "/readyz");
}

/// A peer of a connection, as NetworkPolicy sees it: a pod's labels and its namespace's, or an
/// address outside every pod (`labels: None`).
struct Peer {
    namespace: String,
    namespace_labels: serde_json::Value,
    labels: Option<serde_json::Value>,
}

/// Whether a label selector (`matchLabels`, `matchExpressions` with `In`) selects `labels`.
fn selects(selector: &serde_json::Value, labels: &serde_json::Value) -> bool {
    let by_labels = selector["matchLabels"]
        .as_object()
        .into_iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector["matchExpressions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|e| {
            assert_eq!(e["operator"], "In", "the evaluator knows In only: {e}");
            let values = e["values"].as_array().unwrap();
            labels
                .get(e["key"].as_str().unwrap())
                .is_some_and(|v| values.contains(v))
        });
    by_labels && by_expressions
}

/// Whether the policies in `all` let a pod with `from` labels in namespace `ns` open a
/// connection to `to` on `port`/`protocol`: allowed when no Egress policy selects the pod
/// (it is not isolated) or when one rule of one that does admits the peer and port.
fn egress_allowed(
    all: &[Object],
    ns: &str,
    from: &serde_json::Value,
    to: &Peer,
    port: u16,
    protocol: &str,
) -> bool {
    let applying: Vec<&serde_json::Value> = all
        .iter()
        .filter(|o| o.kind() == "NetworkPolicy" && o.0["metadata"]["namespace"] == ns)
        .map(|o| &o.0["spec"])
        .filter(|s| {
            s["policyTypes"]
                .as_array()
                .unwrap()
                .contains(&json!("Egress"))
                && selects(&s["podSelector"], from)
        })
        .collect();
    if applying.is_empty() {
        return true;
    }
    applying.iter().any(|spec| {
        spec["egress"].as_array().into_iter().flatten().any(|rule| {
            let port_ok = rule["ports"].as_array().is_none_or(|ports| {
                ports.iter().any(|p| {
                    p["port"] == port && p["protocol"].as_str().unwrap_or("TCP") == protocol
                })
            });
            let peer_ok = rule["to"].as_array().is_none_or(|peers| {
                peers.iter().any(|p| {
                    assert!(p.get("ipBlock").is_none(), "the evaluator knows no ipBlock");
                    let Some(labels) = &to.labels else {
                        return false;
                    };
                    let pods = p.get("podSelector").is_none_or(|s| selects(s, labels));
                    match p.get("namespaceSelector") {
                        Some(s) => selects(s, &to.namespace_labels) && pods,
                        None => to.namespace == ns && pods,
                    }
                })
            });
            port_ok && peer_ok
        })
    })
}

#[test]
fn the_apiserver_dials_only_its_etcd_its_syncer_dns_and_the_tenants_pods() {
    let all = dev_objects();
    let ns = "vcp-demoabc123";
    let cp_ns = json!({"kubernetes.io/metadata.name": ns, LABEL_CONTROL_PLANE_OF: "demoabc123"});
    let labels_of = |kind: &str, name: &str| -> serde_json::Value {
        all.iter()
            .find(|o| o.kind() == kind && o.name() == name)
            .unwrap()
            .0["spec"]["template"]["metadata"]["labels"]
            .clone()
    };
    let apiserver = labels_of("Deployment", "kube-apiserver");
    let etcd = labels_of("StatefulSet", "etcd");
    let syncer = labels_of("Deployment", "vcp-syncer");
    let kcm = labels_of("Deployment", "kube-controller-manager");
    let coredns = labels_of("Deployment", "coredns");
    let snapshot = labels("demoabc123", "etcd-snapshot").0;
    let here = |labels: &serde_json::Value| Peer {
        namespace: ns.into(),
        namespace_labels: cp_ns.clone(),
        labels: Some(labels.clone()),
    };
    let tenant_pod = Peer {
        namespace: "demoabc123-apps".into(),
        namespace_labels: json!({"kubernetes.io/metadata.name": "demoabc123-apps", "vcp.dev/tenant": "demoabc123"}),
        labels: Some(json!({"app": "web"})),
    };
    let other_tenant_pod = Peer {
        namespace: "other00001-apps".into(),
        namespace_labels: json!({"kubernetes.io/metadata.name": "other00001-apps", "vcp.dev/tenant": "other00001"}),
        labels: Some(json!({"app": "web"})),
    };
    let other_cp = |labels: &serde_json::Value| Peer {
        namespace: "vcp-other00001".into(),
        namespace_labels: json!({"kubernetes.io/metadata.name": "vcp-other00001", LABEL_CONTROL_PLANE_OF: "other00001"}),
        labels: Some(labels.clone()),
    };
    let vcp_api = Peer {
        namespace: "vcp-system".into(),
        namespace_labels: json!({"kubernetes.io/metadata.name": "vcp-system"}),
        labels: Some(json!({"app.kubernetes.io/name": "vcp"})),
    };
    // The host apiserver, node ports, anything that is no pod.
    let outside = Peer {
        namespace: String::new(),
        namespace_labels: json!({}),
        labels: None,
    };
    let can = |from: &serde_json::Value, to: &Peer, port: u16| {
        egress_allowed(&all, ns, from, to, port, "TCP")
    };

    // The apiserver.
    assert!(can(&apiserver, &here(&etcd), 2379));
    assert!(!can(&apiserver, &here(&etcd), 2381), "etcd's metrics");
    assert!(
        can(&apiserver, &here(&syncer), 10250),
        "kubelet calls, webhook, egress proxy"
    );
    assert!(
        !can(&apiserver, &here(&syncer), 8080),
        "the syncer's probes and metrics"
    );
    assert!(can(&apiserver, &tenant_pod, 8080) && can(&apiserver, &tenant_pod, 1));
    assert!(
        egress_allowed(&all, ns, &apiserver, &outside, 53, "UDP"),
        "DNS"
    );
    assert!(!can(&apiserver, &other_tenant_pod, 8080));
    assert!(
        !can(&apiserver, &other_cp(&syncer), 8080),
        "another tenant's syncer"
    );
    assert!(
        !can(&apiserver, &other_cp(&etcd), 2381),
        "another tenant's etcd"
    );
    assert!(!can(&apiserver, &vcp_api, 8080), "vcp's API");
    assert!(!can(&apiserver, &outside, 6443), "the host apiserver");
    assert!(
        !can(&apiserver, &outside, 5432),
        "Postgres outside the cluster"
    );
    assert!(!can(&apiserver, &here(&kcm), 10257));

    // The others reach what they need, and not what the apiserver may not.
    assert!(can(&etcd, &here(&etcd), 2380) && can(&etcd, &here(&etcd), 2379));
    assert!(!can(&etcd, &tenant_pod, 80) && !can(&etcd, &outside, 6443));
    for client in [&kcm, &coredns] {
        assert!(can(client, &here(&apiserver), 6443));
        assert!(!can(client, &tenant_pod, 80) && !can(client, &here(&etcd), 2379));
        assert!(!can(client, &outside, 6443));
    }
    assert!(
        egress_allowed(&all, ns, &coredns, &outside, 53, "UDP"),
        "upstream DNS"
    );
    assert!(can(&syncer, &here(&apiserver), 6443));
    assert!(can(&syncer, &outside, 6443), "the host apiserver");
    assert!(
        can(&syncer, &tenant_pod, 8080),
        "the egress proxy dials the tenant's pods"
    );
    assert!(!can(&syncer, &here(&etcd), 2379) && !can(&syncer, &other_tenant_pod, 80));
    assert!(can(&snapshot, &here(&etcd), 2379) && !can(&snapshot, &tenant_pod, 80));

    // No pod of the namespace is left without an egress policy.
    for pod in [&apiserver, &etcd, &syncer, &kcm, &coredns, &snapshot] {
        assert!(!can(pod, &vcp_api, 8080), "{pod}");
    }
}

#[test]
fn the_apiserver_dials_the_cluster_through_its_syncers_egress_proxy() {
    let all = dev_objects();
    let cm = all
        .iter()
        .find(|o| o.kind() == "ConfigMap" && o.name() == "kube-apiserver-authz")
        .unwrap();
    let egress: serde_json::Value =
        serde_yaml::from_str(cm.0["data"]["egress.yaml"].as_str().unwrap()).unwrap();
    let selections = egress["egressSelections"].as_array().unwrap();
    let names: Vec<&str> = selections
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    // `controlplane` (the authorization webhook, webhooks by URL) through the authorizer's
    // relay on the pod's shared socket: the authorizer answers there while the syncer (the
    // proxy) is down, and the relay passes every other target to the proxy.
    assert_eq!(names, ["cluster", "controlplane"]);
    let cp = &selections[1]["connection"];
    assert_eq!(cp["proxyProtocol"], "HTTPConnect");
    assert_eq!(
        cp["transport"],
        json!({"uds": {"udsName": vcp_core::revocation::egress_socket()}})
    );
    for s in &selections[..1] {
        let c = &s["connection"];
        assert_eq!(c["proxyProtocol"], "HTTPConnect");
        let tcp = &c["transport"]["tcp"];
        assert_eq!(tcp["url"], "https://vcp-syncer.vcp-demoabc123.svc:10250");
        // The kubelet endpoint admits this client certificate only, signed by the tenant CA.
        assert_eq!(
            tcp["tlsConfig"]["clientCert"],
            "/etc/kubernetes/pki/kubelet-client/tls.crt"
        );
        assert_eq!(
            tcp["tlsConfig"]["caBundle"],
            "/etc/kubernetes/pki/serving/ca.crt"
        );
    }
    let spec = pod_spec(&all, "Deployment", "kube-apiserver");
    let api = &spec["containers"][0];
    assert!(api["args"].as_array().unwrap().contains(&json!(
        "--egress-selector-config-file=/etc/kubernetes/authz/egress.yaml"
    )));

    // The relay: the authorizer serves the socket, chaining to the syncer's proxy with the
    // files the cluster selection uses.
    let authz = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "vcp-authorizer")
        .unwrap();
    let args: Vec<&str> = authz["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let socket = vcp_core::revocation::egress_socket();
    for want in [
        format!("--egress-socket={socket}"),
        "--egress-proxy=https://vcp-syncer.vcp-demoabc123.svc:10250".to_owned(),
        "--egress-ca=/etc/vcp/egress-tls/ca.crt".to_owned(),
        "--egress-client-cert=/etc/vcp/egress-tls/tls.crt".to_owned(),
        "--egress-client-key=/etc/vcp/egress-tls/tls.key".to_owned(),
    ] {
        assert!(args.contains(&want.as_str()), "{want} in {args:?}");
    }
    // The socket's directory is one emptyDir in both containers, read-only for the apiserver.
    let mount = |c: &serde_json::Value, name: &str| {
        c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .cloned()
    };
    let dir = vcp_core::revocation::EGRESS_DIR;
    assert!(socket.starts_with(&format!("{dir}/")));
    assert_eq!(
        mount(api, "egress"),
        Some(json!({"name": "egress", "mountPath": dir, "readOnly": true}))
    );
    assert_eq!(mount(authz, "egress").unwrap()["mountPath"], dir);
    let volume = |name: &str| {
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(volume("egress")["emptyDir"], json!({}));
    // The relay's files: the kubelet client pair and the tenant CA, never the serving key.
    let tls = mount(authz, "authorizer-egress-tls").unwrap();
    assert_eq!(tls["mountPath"], "/etc/vcp/egress-tls");
    assert_eq!(tls["readOnly"], true);
    assert!(mount(api, "authorizer-egress-tls").is_none());
    assert_eq!(
        volume("authorizer-egress-tls")["projected"]["sources"],
        json!([
            {"secret": {"name": "apiserver-kubelet-client", "items": [
                {"key": "tls.crt", "path": "tls.crt"}, {"key": "tls.key", "path": "tls.key"}]}},
            {"secret": {"name": "apiserver", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        ])
    );
}

#[test]
fn the_syncers_metrics_are_on_loopback_and_its_probes_on_the_pod_ip() {
    let all = dev_objects();
    let syncer = &pod_spec(&all, "Deployment", "vcp-syncer")["containers"][0];
    let args = syncer["args"].as_array().unwrap();
    assert!(args.contains(&json!("--metrics-listen=127.0.0.1:8081")));
    assert!(args.contains(&json!("--listen=$(POD_IP):8080")));
    assert_eq!(syncer["readinessProbe"]["httpGet"]["port"], 8080);
    assert_eq!(syncer["livenessProbe"]["httpGet"]["port"], 8080);
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

#[test]
fn only_a_privileged_plan_lets_the_tenant_apiserver_admit_privileged_containers() {
    let args_for = |plan: &Plan| {
        let objs = Renderer::builtin()
            .unwrap()
            .render(
                Component::Apiserver,
                &Input {
                    name: "demo",
                    key: &key(),
                    version: Catalog::builtin().get("1.37").unwrap(),
                    plan,
                    settings: &settings(),
                    rollout: BTreeMap::new(),
                    run: crate::render::Run::Up,
                },
            )
            .unwrap();
        let dep = objs.iter().find(|o| o.0["kind"] == "Deployment").unwrap();
        dep.0["spec"]["template"]["spec"]["containers"][0]["args"].to_string()
    };
    assert!(!args_for(&dev_plan()).contains("--allow-privileged"));
    let mut privileged = dev_plan();
    privileged.policy.pod_security = vcp_policy::Level::Privileged;
    assert!(args_for(&privileged).contains("\"--allow-privileged=true\""));
}

/// Every object rendered for tenant `demo` on 1.37 with `plan`.
fn objects_of(plan: &Plan) -> Vec<Object> {
    let catalog = Catalog::builtin();
    let settings = settings();
    let input = Input {
        name: "demo",
        key: &key(),
        version: catalog.get("1.37").unwrap(),
        plan,
        settings: &settings,
        rollout: Default::default(),
        run: crate::render::Run::Up,
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
fn a_tuned_plan_reaches_each_components_flags_environment_and_corefile() {
    let plan = parse_plans(
        "lean: {tuning: {gogc: 50, memory_limit_mib: {kube-apiserver: 160, etcd: 48},
                apiserver_watch_cache: false, etcd_quota_mib: 256, etcd_snapshot_count: 2000,
                dns_cache_seconds: 0, apiserver_runtime_config: [flowcontrol.apiserver.k8s.io/v1=false],
                disabled_controllers: [ttl]}}",
    )
    .unwrap()
    .remove("lean")
    .unwrap();
    let objects = objects_of(&plan);
    let container =
        |kind: &str, name: &str| pod_spec(&objects, kind, name)["containers"][0].clone();
    let env = |c: &serde_json::Value, var: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == var)
            .and_then(|e| e["value"].as_str().map(str::to_owned))
    };
    let args = |c: &serde_json::Value| -> Vec<String> {
        c["args"]
            .as_array()
            .or(c["command"].as_array())
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let apiserver = container("Deployment", "kube-apiserver");
    assert!(args(&apiserver).contains(&"--watch-cache=false".to_owned()));
    assert_eq!(env(&apiserver, "GOGC").as_deref(), Some("50"));
    assert_eq!(env(&apiserver, "GOMEMLIMIT").as_deref(), Some("160MiB"));
    assert_eq!(
        env(&apiserver, "POD_IP"),
        None,
        "POD_IP comes from the downward API"
    );
    let etcd = container("StatefulSet", "etcd");
    assert!(args(&etcd).contains(&"--quota-backend-bytes=268435456".to_owned()));
    assert!(args(&etcd).contains(&"--snapshot-count=2000".to_owned()));
    assert_eq!(env(&etcd, "GOMEMLIMIT").as_deref(), Some("48MiB"));
    assert!(
        args(&apiserver)
            .contains(&"--runtime-config=flowcontrol.apiserver.k8s.io/v1=false".to_owned())
    );
    let kcm = container("Deployment", "kube-controller-manager");
    assert!(args(&kcm).contains(&"--controllers=*,-nodelifecycle,-ttl".to_owned()));
    assert_eq!(
        args(&kcm)
            .iter()
            .filter(|a| a.starts_with("--controllers"))
            .count(),
        1
    );
    assert_eq!(env(&kcm, "GOGC").as_deref(), Some("50"));
    assert_eq!(env(&kcm, "GOMEMLIMIT"), None, "no limit named for it");
    let coredns = container("Deployment", "coredns");
    assert_eq!(env(&coredns, "GOGC").as_deref(), Some("50"));
    let corefile = objects
        .iter()
        .find(|o| o.0["kind"] == "ConfigMap" && o.0["data"]["Corefile"].is_string())
        .map(|o| o.0["data"]["Corefile"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(!corefile.contains("cache"), "{corefile}");
    assert!(corefile.contains("loadbalance"), "{corefile}");
    // Untuned, the same components get none of it (the golden files hold the whole render).
    let plain = objects_of(&Plan::default());
    let apiserver = pod_spec(&plain, "Deployment", "kube-apiserver")["containers"][0].clone();
    assert_eq!(env(&apiserver, "GOGC"), None);
    assert!(
        !args(&apiserver)
            .iter()
            .any(|a| a.starts_with("--watch-cache"))
    );
}

#[test]
fn a_plan_with_tuning_out_of_range_is_refused_naming_plan_and_field() {
    let err = parse_plans("small: {tuning: {gogc: 1}}")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("small") && err.contains("tuning.gogc"),
        "{err}"
    );
}

#[test]
fn only_behind_the_gateway_does_the_apiserver_service_name_a_route() {
    let catalog = Catalog::builtin();
    let version = catalog.get("1.37").unwrap();
    let plan = dev_plan();
    let service_of = |expose: Expose| {
        let settings = Settings {
            expose,
            ..settings()
        };
        let input = Input {
            name: "demo",
            key: &key(),
            version,
            plan: &plan,
            settings: &settings,
            rollout: Default::default(),
            run: crate::render::Run::Up,
        };
        let objs = Renderer::builtin()
            .unwrap()
            .render(Component::Apiserver, &input)
            .unwrap();
        objs.into_iter()
            .find(|o| o.kind() == "Service")
            .expect("an apiserver Service")
            .0
    };
    let gateway = service_of(Expose::Gateway {
        domain: "tenants.vcp.test".into(),
        port: 443,
        address: None,
    });
    assert_eq!(gateway["spec"]["type"], "ClusterIP");
    assert_eq!(
        gateway["metadata"]["labels"][LABEL_GATEWAY_NAME],
        key().as_str(),
        "the route is the key: names repeat across owners"
    );
    // The selector is the pods', not the Service's labels.
    assert!(
        gateway["spec"]["selector"]
            .get(LABEL_GATEWAY_NAME)
            .is_none()
    );
    for other in [
        settings().expose,
        Expose::LoadBalancer,
        Expose::Hostname {
            domain: "tenants.vcp.test".into(),
        },
    ] {
        let svc = service_of(other);
        assert!(svc["metadata"]["labels"].get(LABEL_GATEWAY_NAME).is_none());
    }
}

#[test]
fn asleep_every_workload_has_no_replicas_but_dns_while_workloads_run() {
    let catalog = Catalog::builtin();
    let version = catalog.get("1.37").unwrap();
    let plan = dev_plan();
    let settings = settings();
    let render = |run: Run| {
        let input = Input {
            name: "demo",
            key: &key(),
            version,
            plan: &plan,
            settings: &settings,
            rollout: Default::default(),
            run,
        };
        let mut replicas = std::collections::BTreeMap::new();
        let mut annotated = None;
        for (_, objs) in Renderer::builtin().unwrap().render_all(&input).unwrap() {
            for o in objs {
                if matches!(o.kind(), "Deployment" | "StatefulSet") {
                    replicas.insert(
                        o.name().to_owned(),
                        o.0["spec"]["replicas"].as_u64().unwrap(),
                    );
                }
                if o.kind() == "Service" && o.name() == "kube-apiserver" {
                    annotated = o.0["metadata"]["annotations"][ANNOTATION_ASLEEP]
                        .as_str()
                        .map(str::to_owned);
                }
            }
        }
        (replicas, annotated)
    };
    let (up, note) = render(Run::Up);
    assert!(up.values().all(|r| *r > 0), "{up:?}");
    assert_eq!(note, None);
    let (stopped, note) = render(Run::Stopped);
    assert_eq!(note, None, "a restore is no sleep");
    assert!(stopped["coredns"] > 0);
    assert!(
        stopped
            .iter()
            .filter(|(n, _)| *n != "coredns")
            .all(|(_, r)| *r == 0)
    );
    let (asleep, note) = render(Run::Asleep { dns: false });
    assert_eq!(note.as_deref(), Some("true"));
    assert!(
        asleep.values().all(|r| *r == 0),
        "no pod at all: {asleep:?}"
    );
    let (dns, _) = render(Run::Asleep { dns: true });
    assert_eq!(dns["coredns"], up["coredns"]);
    assert!(
        dns.iter()
            .filter(|(n, _)| *n != "coredns")
            .all(|(_, r)| *r == 0)
    );
    assert_eq!(
        up.keys().collect::<Vec<_>>(),
        asleep.keys().collect::<Vec<_>>()
    );
}

#[test]
fn a_tenant_on_a_shared_datastore_has_no_etcd_and_its_apiserver_keeps_to_its_prefix() {
    let catalog = Catalog::builtin();
    let version = catalog.get("1.37").unwrap();
    let mut plan = dev_plan();
    plan.datastore = Some("shared".into());
    let settings = Settings {
        datastores: datastore::parse_datastores("shared: {}").unwrap(),
        ..settings()
    };
    let input = Input {
        name: "demo",
        key: &key(),
        version,
        plan: &plan,
        settings: &settings,
        rollout: Default::default(),
        run: crate::render::Run::Up,
    };
    let r = Renderer::builtin().unwrap();
    assert!(
        r.render(Component::Etcd, &input).unwrap().is_empty(),
        "no etcd of its own"
    );
    let api = r.render(Component::Apiserver, &input).unwrap();
    let deploy = api.iter().find(|o| o.kind() == "Deployment").unwrap();
    let args: Vec<&str> = deploy.0["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    assert!(args.contains(&"--etcd-prefix=/vcp/demoabc123"), "{args:?}");
    assert!(args.contains(&"--etcd-compaction-interval=0"));
    let servers = args
        .iter()
        .find_map(|a| a.strip_prefix("--etcd-servers="))
        .unwrap();
    assert_eq!(servers.split(',').count(), 3);
    assert!(servers.contains(".etcd.vcp-datastore-shared.svc:2379"));
    // Its apiserver may dial the datastore's namespace, on the client port only.
    let net = r.render(Component::Network, &input).unwrap();
    let egress = net
        .iter()
        .find(|o| o.name() == "control-plane-egress-apiserver")
        .unwrap();
    let first = &egress.0["spec"]["egress"][0];
    assert_eq!(
        first["to"][0]["namespaceSelector"]["matchLabels"][datastore::LABEL_DATASTORE],
        "shared"
    );
    assert_eq!(first["ports"][0]["port"], 2379);
    // Its snapshot Jobs too: they export its keys (a logical snapshot) as its etcd user, with
    // the certificate that names no user, never the apiserver's.
    let jobs = net
        .iter()
        .find(|o| o.name() == "control-plane-egress-etcd-jobs")
        .unwrap();
    assert_eq!(
        jobs.0["spec"]["egress"][0]["to"][0]["namespaceSelector"]["matchLabels"]
            [datastore::LABEL_DATASTORE],
        "shared"
    );
    for (kind, job, command, extra) in [
        (
            JobKind::Snapshot,
            "etcd-snapshot-1",
            "etcd-export",
            serde_json::json!({"job": "etcd-snapshot-1", "file": "snapshot-1.vcpl", "logical": true}),
        ),
        (
            JobKind::Import,
            "etcd-restore-1-0",
            "etcd-import",
            serde_json::json!({"job": "etcd-restore-1-0", "file": "snapshot-1.vcpl", "sha256": "ab"}),
        ),
    ] {
        let objects = r.render_job(kind, &input, extra).unwrap();
        let spec = pod_spec(&objects, "Job", job);
        let c = &spec["containers"][0];
        assert_eq!(c["command"][2], command, "{c}");
        let args = c["args"].to_string();
        assert!(args.contains("--prefix=/vcp/demoabc123"), "{args}");
        assert!(
            args.contains(".etcd.vcp-datastore-shared.svc:2379"),
            "{args}"
        );
        assert_eq!(
            c["env"][0]["valueFrom"]["secretKeyRef"]["name"],
            "datastore-user"
        );
        let secrets = spec["volumes"].to_string();
        assert!(secrets.contains("\"datastore-client\"") && secrets.contains("\"datastore-user\""));
        assert!(!secrets.contains("apiserver-etcd-client"), "{secrets}");
        assert_restricted_non_root(spec, "a logical snapshot job");
    }
    let admitted = r
        .render_datastore(
            "shared",
            &settings.datastores["shared"],
            ("etcd:x", "vcp:y"),
            "abc",
        )
        .unwrap();
    let policy = admitted
        .iter()
        .find(|o| o.kind() == "NetworkPolicy" && o.name() == "datastore")
        .unwrap();
    assert!(
        policy.0.to_string().contains("etcd-snapshot"),
        "{}",
        policy.0
    );

    // The same tenant on its own etcd: no prefix, its own members.
    let own = Plan {
        datastore: None,
        ..plan.clone()
    };
    let input = Input {
        plan: &own,
        ..input
    };
    let api = r.render(Component::Apiserver, &input).unwrap();
    let text: String = api.iter().map(|o| o.0.to_string()).collect();
    assert!(!text.contains("--etcd-prefix"));
    assert!(!r.render(Component::Etcd, &input).unwrap().is_empty());
    let snapshot = r
        .render_job(
            JobKind::Snapshot,
            &input,
            serde_json::json!({"job": "etcd-snapshot-1", "file": "snapshot-1.db"}),
        )
        .unwrap();
    let c = &pod_spec(&snapshot, "Job", "etcd-snapshot-1")["containers"][0];
    assert_eq!(c["command"][2], "etcd-snapshot", "{c}");
    // A move out of its own etcd exports its keys under the apiserver's default prefix, with
    // the apiserver's certificate (no authentication there); the import into it likewise.
    for (kind, job, extra) in [
        (
            JobKind::Snapshot,
            "etcd-snapshot-2",
            serde_json::json!({"job": "etcd-snapshot-2", "file": "snapshot-2.vcpl", "logical": true}),
        ),
        (
            JobKind::Import,
            "etcd-restore-2-0",
            serde_json::json!({"job": "etcd-restore-2-0", "file": "snapshot-2.vcpl", "sha256": "ab"}),
        ),
    ] {
        let objects = r.render_job(kind, &input, extra).unwrap();
        let spec = pod_spec(&objects, "Job", job);
        let args = spec["containers"][0]["args"].to_string();
        assert!(args.contains("--prefix=/registry"), "{args}");
        assert!(!args.contains("password"), "{args}");
        assert!(
            spec["volumes"]
                .to_string()
                .contains("apiserver-etcd-client")
        );
    }
}

#[test]
fn a_datastore_renders_in_its_namespace_and_its_jobs_carry_the_range() {
    let spec = datastore::parse_datastores(
        "shared: {members: 3, quota_bytes: 4294967296, snapshot_count: 1000, gogc: 50, memory_limit_mib: 64}",
    )
        .unwrap()
        .remove("shared")
        .unwrap();
    let r = Renderer::builtin().unwrap();
    let objs = r
        .render_datastore("shared", &spec, ("etcd:x", "vcp:y"), "abc")
        .unwrap();
    assert!(
        objs.iter()
            .all(|o| o.namespace() == Some("vcp-datastore-shared"))
    );
    let sts = objs.iter().find(|o| o.kind() == "StatefulSet").unwrap();
    assert_eq!(sts.0["spec"]["replicas"], 3);
    let args = sts.0["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for want in [
        "--client-cert-auth",
        "--auto-compaction-mode=periodic",
        "--quota-backend-bytes=4294967296",
        "etcd-2=https://etcd-2.etcd.vcp-datastore-shared.svc:2380",
        "--snapshot-count=1000",
    ] {
        assert!(args.contains(want), "{want} in {args}");
    }
    let env = sts.0["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(env.contains(r#"{"name":"GOGC","value":"50"}"#), "{env}");
    assert!(
        env.contains(r#"{"name":"GOMEMLIMIT","value":"64MiB"}"#),
        "{env}"
    );
    let job = r
        .render_datastore_job(
            "shared",
            &spec,
            ("etcd:x", "vcp:y"),
            &datastore::Admin::Grant { key: "k1".into() },
        )
        .unwrap();
    let job = &job[0];
    assert_eq!(job.name(), "grant-k1");
    let c = &job.0["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], "vcp:y");
    let args = c["args"].to_string();
    assert!(args.contains("--range-start=/vcp/k1/"), "{args}");
    assert!(args.contains("--user=tenant-k1"));
    assert!(args.contains("--password-file=/etc/etcd-root/password"));
}

#[test]
fn plans_may_name_only_declared_datastores() {
    let plans = parse_plans("a: {datastore: shared}").unwrap();
    let none = Default::default();
    let e = check_datastores(&plans, &none).unwrap_err().to_string();
    assert!(e.contains("datastore \"shared\" is not declared"), "{e}");
    let declared = datastore::parse_datastores("shared: {}").unwrap();
    check_datastores(&plans, &declared).unwrap();
}

#[test]
fn the_apiserver_reads_its_encryption_configuration_from_a_secret_and_rolls_with_it() {
    let catalog = Catalog::builtin();
    let settings = settings();
    let plan = dev_plan();
    let render = |digest: &str| {
        let input = Input {
            name: "demo",
            key: &key(),
            version: catalog.get("1.37").unwrap(),
            plan: &plan,
            settings: &settings,
            rollout: [("encryption".to_owned(), digest.to_owned())].into(),
            run: Run::Up,
        };
        Renderer::builtin()
            .unwrap()
            .render(Component::Apiserver, &input)
            .unwrap()
    };
    let objects = render("e1");
    let d = objects.iter().find(|o| o.kind() == "Deployment").unwrap();
    let pod = &d.0["spec"]["template"];
    assert_eq!(pod["metadata"]["annotations"]["vcp.dev/encryption"], "e1");
    let c = &pod["spec"]["containers"][0];
    let flag = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .find_map(|a| a.strip_prefix("--encryption-provider-config="))
        .expect("the flag");
    assert_eq!(flag, "/etc/kubernetes/encryption/encryption.yaml");
    assert_eq!(flag.rsplit('/').next(), Some(encryption::FILE));
    // Read once, at start: a changed configuration is a roll (docs/orchestrator.md).
    assert!(
        !c["args"].to_string().contains("automatic-reload"),
        "no automatic reload"
    );
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/kubernetes/encryption")
        .expect("the mount");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], encryption::SECRET);
    assert_eq!(volume["secret"]["defaultMode"], 256);
    // No ConfigMap carries it, and another digest is another pod template.
    assert!(
        objects
            .iter()
            .filter(|o| o.kind() == "ConfigMap")
            .all(|o| !o.0.to_string().contains("EncryptionConfiguration"))
    );
    let other = render("e2");
    let other = other.iter().find(|o| o.kind() == "Deployment").unwrap();
    assert_ne!(other.0["spec"]["template"], d.0["spec"]["template"]);
}

#[test]
fn plans_name_what_they_encrypt_and_a_bad_list_is_refused_naming_the_plan() {
    let plans = parse_plans("vault: {encryption: {resources: [secrets, configmaps]}}\n").unwrap();
    assert_eq!(
        plans["vault"].encryption.resources,
        ["secrets", "configmaps"]
    );
    assert_eq!(plans["default"].encryption.resources, ["secrets"]);
    for bad in [
        "x: {encryption: {resources: [configmaps]}}",
        "x: {encryption: {resources: [secrets, '*.apps']}}",
        "x: {encryption: {resources: [secrets], provider: aescbc}}",
    ] {
        let e = parse_plans(bad).unwrap_err().to_string();
        assert!(
            e.contains("x") && e.contains("encryption") || e.contains("provider"),
            "{bad}: {e}"
        );
    }
}
