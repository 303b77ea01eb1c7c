//! The Helm chart that installs vcp (`charts/vcp`), checked against vcp itself and against the
//! dev cluster's real apiserver, without running vcp in the cluster:
//!
//! - `helm lint` and `helm template` with the default values and with every optional block on;
//! - what the Deployment runs is a command line `vcp serve` accepts (its flags parsed by vcp's
//!   own clap definition), and the files it points at (the plans and templates ConfigMaps at
//!   their mount paths) load as `vcp serve` loads them;
//! - bad values (unknown keys, wrong types, invalid plans) fail `helm template` and
//!   `helm install` with a message naming the value;
//! - every key of values.yaml is in the schema and in docs/install.md's values reference;
//! - the rendered output passes `kubectl apply --dry-run=server` on the dev cluster, and the
//!   chart's ClusterRole, impersonated, is enough to apply every object vcp renders for a tenant.
//!
//! helm and kubectl are the pinned builds of `tests/kube-bin` (`vcp_dev::bins`).

use base64::Engine as _;
use clap::CommandFactory;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use vcp_dev::cluster::DevCluster;

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/vcp")
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// Runs the pinned helm with `args` (and `KUBECONFIG`, when given).
fn helm(args: &[&str], kubeconfig: Option<&Path>) -> anyhow::Result<Output> {
    let bin = vcp_dev::bins::tool("helm")?;
    let mut cmd = Command::new(bin);
    cmd.args(args);
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    Ok(cmd.output()?)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Values with every optional block of the chart on.
const ALL_ON: &str = r#"
replicas: 3
tenantAccess: service-name
expose: {mode: node-port, address: 192.0.2.10}
postgresql: {enabled: true, storage: {size: 2Gi, storageClass: standard}}
adminToken: {existingSecret: my-admin, secretKey: secret}
service: {type: NodePort, nodePort: 30080, annotations: {example.com/a: b}}
ingress: {enabled: true, className: nginx, host: vcp.example.com, annotations: {example.com/x: z}, tls: {secretName: vcp-tls}}
serviceMonitor: {enabled: true, labels: {release: prom}}
networkPolicy:
  apiFrom: [{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: ingress}}}]
  extraEgress: [{ports: [{port: 9000, protocol: TCP}]}]
versionsCatalog: ""
templates: {network.yaml: "{#- replaced -#}\n"}
plans:
  default:
    node_selector: {vcp.dev/runtime: process}
    tolerations: [{key: vcp.dev/runtime, operator: Equal, value: process, effect: NoSchedule}]
    policy:
      placement: {node_selector: {type: kwok}}
  ha:
    etcd_replicas: 3
    apiserver_replicas: 2
    dns_replicas: 2
    storage_class: standard
    etcd_storage: 2Gi
    resources:
      kube-apiserver: {requests: {cpu: 100m, memory: 256Mi}}
    policy:
      pod_security: restricted
      services: {node_port_services: 2, load_balancers: 1, node_ports: 4}
      quota: {pods: 100, requests_cpu: "8", limits: {default_request: {cpu: 100m, memory: 128Mi}, default_limit: {cpu: "1", memory: 512Mi}}}
    maintenance_window: {days: [sat, sun], start: "02:00", duration_minutes: 240}
    auto_update: patch
    encryption: {resources: [secrets, configmaps, deployments.apps]}
    audit: {policy: metadata, retention_days: 7}
    sleep: {after_idle_minutes: 30}
podAnnotations: {example.com/a: b}
podLabels: {team: platform}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Exists, effect: NoSchedule}]
priorityClassName: high
imagePullSecrets: [{name: regcred}]
serviceAccount: {annotations: {example.com/x: z}}
"#;

/// An external database with a private CA: the block ALL_ON cannot hold (it runs the
/// evaluation Postgres, which has no TLS, and then `database.*` is not read).
const DATABASE_CA: &str = r#"
database: {existingSecret: prod-db, secretKey: uri, tls: {caSecret: db-ca, caKey: root.pem}}
"#;

/// `helm template` of the chart with `values` (a values file's text; empty: the defaults) in
/// namespace `ns`: the rendered text.
fn template(release: &str, ns: &str, values: &str, extra: &[&str]) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("values.yaml");
    std::fs::write(&file, values)?;
    let chart = chart_dir();
    let mut args = vec![
        "template",
        release,
        chart.to_str().unwrap(),
        "--namespace",
        ns,
        "-f",
        file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = helm(&args, None)?;
    anyhow::ensure!(
        out.status.success(),
        "helm template failed: {}",
        text(&out.stderr)
    );
    Ok(text(&out.stdout))
}

/// The documents of a multi-document YAML stream, as JSON.
fn documents(yaml: &str) -> anyhow::Result<Vec<Value>> {
    let mut out = Vec::new();
    for d in serde_yaml::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(d)?;
        if !v.is_null() {
            out.push(v);
        }
    }
    Ok(out)
}

fn find<'a>(docs: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .ok_or_else(|| anyhow::anyhow!("no {kind} rendered"))
}

fn kinds(docs: &[Value]) -> BTreeSet<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn the_chart_lints_with_default_values_and_with_every_optional_block_on() -> anyhow::Result<()> {
    let chart = chart_dir();
    let dir = tempfile::tempdir()?;
    let all_on = dir.path().join("all-on.yaml");
    std::fs::write(&all_on, ALL_ON)?;
    let database_ca = dir.path().join("database-ca.yaml");
    std::fs::write(&database_ca, DATABASE_CA)?;
    for extra in [
        vec![],
        vec!["-f", all_on.to_str().unwrap()],
        vec!["-f", database_ca.to_str().unwrap()],
    ] {
        let mut args = vec!["lint", "--strict", chart.to_str().unwrap()];
        args.extend(extra.iter().copied());
        let out = helm(&args, None)?;
        println!("{}", text(&out.stdout));
        anyhow::ensure!(
            out.status.success(),
            "helm {args:?} failed: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    Ok(())
}

#[test]
fn default_values_render_two_restricted_replicas_of_the_workspace_version() -> anyhow::Result<()> {
    let chart: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("Chart.yaml"))?)?;
    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        chart["appVersion"], version,
        "appVersion is the workspace version"
    );
    assert_eq!(chart["version"], version, "one chart per workspace version");

    let docs = documents(&template("vcp", "vcp-system", "", &[])?)?;
    let want: BTreeSet<String> = [
        "ClusterRole",
        "ClusterRoleBinding",
        "ConfigMap",
        "Deployment",
        "NetworkPolicy",
        "PodDisruptionBudget",
        "Secret",
        "Service",
        "ServiceAccount",
    ]
    .map(String::from)
    .into();
    assert_eq!(
        kinds(&docs),
        want,
        "default values render exactly these kinds"
    );

    let d = find(&docs, "Deployment")?;
    assert_eq!(d["spec"]["replicas"], 2);
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(c["image"], format!("ghcr.io/vcp-dev/vcp:{version}"));
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--tenant-access=service"), "{args:?}");
    assert!(
        args.contains(&format!("--syncer-image=ghcr.io/vcp-dev/vcp-syncer:{version}").as_str()),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.starts_with("--host-kubeconfig")),
        "in-cluster: no host kubeconfig"
    );
    let env = |name: &str| {
        c["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    assert_eq!(
        env("VCP_REPLICA_ID")["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name",
        "the replica id is the pod's name"
    );
    assert_eq!(
        env("VCP_DATABASE_URL")["valueFrom"]["secretKeyRef"]["name"],
        "vcp-database"
    );
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert!(c["resources"]["requests"]["cpu"].is_string());
    assert!(c["resources"]["requests"]["memory"].is_string());
    // Pod Security `restricted`, field by field.
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    assert_eq!(c["securityContext"]["capabilities"]["drop"][0], "ALL");

    let svc = find(&docs, "Service")?;
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let pdb = find(&docs, "PodDisruptionBudget")?;
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let token = find(&docs, "Secret")?;
    assert_eq!(token["metadata"]["name"], "vcp-admin-token");
    assert_eq!(
        token["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "uninstall leaves the generated admin token"
    );
    // The inventory key: generated, 32 bytes of base64 (what --inventory-key takes), kept.
    let kek = docs
        .iter()
        .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "vcp-inventory-key")
        .ok_or_else(|| anyhow::anyhow!("no inventory key Secret"))?;
    assert_eq!(
        kek["metadata"]["annotations"]["helm.sh/resource-policy"], "keep",
        "uninstall leaves the inventory key"
    );
    let b64 = String::from_utf8(
        base64::engine::general_purpose::STANDARD
            .decode(kek["data"]["key"].as_str().unwrap_or_default())?,
    )?;
    vcp_orchestrator::pki::seal::InventoryKey::from_base64(&b64)?;
    let env = &c["env"];
    assert!(
        env.as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "VCP_INVENTORY_KEY"
                && e["valueFrom"]["secretKeyRef"]["name"] == "vcp-inventory-key"),
        "{env}"
    );
    Ok(())
}

#[test]
fn every_optional_block_renders_its_objects() -> anyhow::Result<()> {
    let docs = documents(&template("vcp", "vcp-system", ALL_ON, &[])?)?;
    let k = kinds(&docs);
    for want in ["Ingress", "ServiceMonitor", "StatefulSet"] {
        assert!(k.contains(want), "no {want} in {k:?}");
    }
    let configmaps: Vec<&str> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap")
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(configmaps, ["vcp-plans", "vcp-templates"]);
    let policies = docs.iter().filter(|d| d["kind"] == "NetworkPolicy").count();
    assert_eq!(policies, 2, "vcp's and the evaluation Postgres'");
    let pg = find(&docs, "StatefulSet")?;
    assert_eq!(
        pg["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"],
        "standard"
    );
    let d = find(&docs, "Deployment")?;
    let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
    let db = env
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "VCP_DATABASE_URL")
        .unwrap();
    assert_eq!(
        db["valueFrom"]["secretKeyRef"]["name"], "vcp-postgresql",
        "postgresql.enabled: vcp uses the chart's Postgres"
    );
    Ok(())
}

#[test]
fn a_private_database_ca_is_mounted_where_the_database_driver_reads_it() -> anyhow::Result<()> {
    let docs = documents(&template("vcp", "vcp-system", DATABASE_CA, &[])?)?;
    let pod = &find(&docs, "Deployment")?["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "database-ca")
        .ok_or_else(|| anyhow::anyhow!("no database-ca mount: {}", c["volumeMounts"]))?;
    assert_eq!(mount["mountPath"], "/etc/vcp/database-ca");
    assert_eq!(mount["readOnly"], true);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "database-ca")
        .ok_or_else(|| anyhow::anyhow!("no database-ca volume"))?;
    assert_eq!(volume["secret"]["secretName"], "db-ca");
    assert_eq!(
        volume["secret"]["items"],
        serde_json::json!([{"key": "root.pem", "path": "ca.crt"}]),
        "the CA's key, under the name the driver is pointed at"
    );
    let env: BTreeMap<&str, &Value> = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e))
        .collect();
    assert_eq!(env["PGSSLROOTCERT"]["value"], "/etc/vcp/database-ca/ca.crt");
    assert_eq!(env["PGSSLMODE"]["value"], "verify-full");
    assert_eq!(
        env["VCP_DATABASE_URL"]["valueFrom"]["secretKeyRef"],
        serde_json::json!({"name": "prod-db", "key": "uri"})
    );
    // Off by default, and with the evaluation Postgres (no TLS there; database.* unread).
    for values in [
        "",
        "postgresql: {enabled: true}\ndatabase: {tls: {caSecret: db-ca}}\n",
    ] {
        let rendered = template("vcp", "vcp-system", values, &[])?;
        assert!(
            !rendered.contains("database-ca") && !rendered.contains("PGSSL"),
            "{values:?}"
        );
    }
    Ok(())
}

/// The flag of `vcp serve` each environment variable stands for (`VCP_WORKERS` -> `workers`).
/// Each argument's env variable -> its long flag.
fn env_flags_of<'a>(args: impl Iterator<Item = &'a clap::Arg>) -> BTreeMap<String, String> {
    args.filter_map(|a| {
        Some((
            a.get_env()?.to_string_lossy().into_owned(),
            a.get_long()?.to_owned(),
        ))
    })
    .collect()
}

fn env_flags() -> BTreeMap<String, String> {
    let cmd = vcp_orchestrator::Args::command();
    let serve = cmd
        .find_subcommand("serve")
        .expect("vcp has a serve command");
    env_flags_of(serve.get_arguments().chain(cmd.get_arguments()))
}

/// A container's env as the flags its program reads them as (`flags`: env -> flag), but
/// those `skip` says are read otherwise; a value from a Secret or the downward API becomes
/// `placeholder`.
fn env_as_flags(
    container: &Value,
    flags: &BTreeMap<String, String>,
    skip: impl Fn(&str) -> bool,
    placeholder: &str,
) -> anyhow::Result<Vec<String>> {
    let mut line = Vec::new();
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().unwrap();
        if skip(name) {
            continue;
        }
        let flag = flags
            .get(name)
            .ok_or_else(|| anyhow::anyhow!("env {name} is no flag"))?;
        let value = e["value"].as_str().unwrap_or(placeholder);
        line.push(format!("--{flag}={value}"));
    }
    Ok(line)
}

/// The Deployment's command line as `vcp serve` would see it, with each mounted ConfigMap
/// written under `root` at its mount path and the flags pointed there; env values from
/// Secrets and the downward API become placeholders.
fn command_line(docs: &[Value], root: &Path) -> anyhow::Result<Vec<String>> {
    let d = find(docs, "Deployment")?;
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let mut mounts = Vec::new();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        let path = m["mountPath"].as_str().unwrap();
        let volume = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .ok_or_else(|| anyhow::anyhow!("mount {path} has no volume"))?;
        if volume.get("secret").is_some() {
            // A Secret's files (the database CA) are read by the database driver, not named
            // by a flag: nothing to point a flag at.
            continue;
        }
        let cm_name = &volume["configMap"]["name"];
        let cm = docs
            .iter()
            .find(|d| d["kind"] == "ConfigMap" && d["metadata"]["name"] == *cm_name)
            .ok_or_else(|| anyhow::anyhow!("volume of {path}: ConfigMap {cm_name} not rendered"))?;
        let dir = root.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)?;
        for (k, v) in cm["data"].as_object().unwrap() {
            std::fs::write(dir.join(k), v.as_str().unwrap())?;
        }
        mounts.push(path.to_owned());
    }
    let mut line: Vec<String> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .chain(c["args"].as_array().unwrap())
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    // RUST_LOG is read by the log filter; PGSSLROOTCERT and PGSSLMODE by the database driver
    // as libpq reads them (inventory.rs runs vcp with them against a TLS server).
    line.extend(env_as_flags(
        c,
        &env_flags(),
        |name| name == "RUST_LOG" || name.starts_with("PGSSL"),
        "postgres://from-a-secret/vcp",
    )?);
    // The inventory key from its Secret: one of the form vcp checks at start.
    for a in &mut line {
        if a.starts_with("--inventory-key=") {
            *a = format!("--inventory-key={}", vcp_dev::platform::DEV_INVENTORY_KEY);
        }
    }
    for a in &mut line {
        for m in &mounts {
            if let Some((flag, rest)) = a.split_once('=')
                && let Some(sub) = rest.strip_prefix(m.as_str())
            {
                *a = format!(
                    "{flag}={}{sub}",
                    root.join(m.trim_start_matches('/')).display()
                );
            }
        }
    }
    Ok(line)
}

#[test]
fn the_deployment_runs_a_command_line_vcp_serve_accepts_with_files_it_loads() -> anyhow::Result<()>
{
    for (what, values) in [
        ("default values", ""),
        ("every block on", ALL_ON),
        ("a database CA", DATABASE_CA),
        ("the gateway", GATEWAY),
    ] {
        let docs = documents(&template("vcp", "vcp-system", values, &[])?)?;
        let root = tempfile::tempdir()?;
        let line = command_line(&docs, root.path())?;
        println!("{what}: {}", line.join(" "));
        let args = <vcp_orchestrator::Args as clap::Parser>::try_parse_from(&line)
            .map_err(|e| anyhow::anyhow!("{what}: vcp refuses the chart's command line: {e}"))?;
        let vcp_orchestrator::Command::Serve(serve) = args.command else {
            anyhow::bail!("{what}: the chart does not run `vcp serve`");
        };
        assert!(serve.host_kubeconfig.is_none(), "in-cluster configuration");
        assert!(serve.replica_id.is_some(), "{what}: a replica id is passed");
        let config = vcp_orchestrator::serve::config(&serve)
            .map_err(|e| anyhow::anyhow!("{what}: vcp serve would not start: {e}"))?;
        // By cluster IP unless the values ask for the name.
        let access = if values == ALL_ON {
            vcp_orchestrator::host::TenantAccess::ServiceName
        } else {
            vcp_orchestrator::host::TenantAccess::Service
        };
        assert_eq!(config.access, access, "{what}");
        if values != ALL_ON {
            assert!(serve.templates.is_none(), "built-in templates by default");
            assert_eq!(config.plans.keys().collect::<Vec<_>>(), ["default"]);
        } else {
            assert!(serve.templates.is_some(), "templates mounted");
            assert_eq!(
                config.plans.keys().collect::<Vec<_>>(),
                ["default", "ha"],
                "the plans of the values"
            );
            assert_eq!(config.plans["ha"].etcd_replicas, 3);
            assert_eq!(serve.expose_address.as_deref(), Some("192.0.2.10"));
        }
        if values == GATEWAY {
            assert_eq!(
                config.settings.expose,
                vcp_orchestrator::render::Expose::Gateway {
                    domain: "tenants.example.net".into(),
                    port: 31443,
                    address: Some("192.0.2.10".into()),
                }
            );
        }
    }
    Ok(())
}

/// Values that put tenants behind the gateway, dialled at an address (no wildcard DNS).
const GATEWAY: &str = r#"
expose: {mode: gateway, domain: tenants.example.net, address: 192.0.2.10, port: 31443}
gateway: {service: {type: NodePort, port: 443, nodePort: 31443}}
database: {existingSecret: db}
"#;

#[test]
fn the_gateway_runs_only_behind_its_mode_and_reads_nothing_but_services() -> anyhow::Result<()> {
    let named = |docs: &[Value], kind: &str| -> Option<Value> {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == "vcp-gateway")
            .cloned()
    };
    let without = documents(&template("vcp", "vcp-system", "", &[])?)?;
    assert!(
        named(&without, "Deployment").is_none(),
        "not deployed by default"
    );

    let docs = documents(&template("vcp", "vcp-system", GATEWAY, &[])?)?;
    let d = named(&docs, "Deployment").ok_or_else(|| anyhow::anyhow!("no gateway Deployment"))?;
    let pod = &d["spec"]["template"]["spec"];
    assert_eq!(d["spec"]["replicas"], 2);
    let c = &pod["containers"][0];
    assert_eq!(
        c["image"],
        format!("ghcr.io/vcp-dev/vcp-gateway:{}", env!("CARGO_PKG_VERSION"))
    );
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(args.contains(&"--domain=tenants.example.net"), "{args:?}");
    // Flags the gateway takes, with the values the schema lets through; each env variable is
    // one of its flags (a Secret's value stands in as a placeholder).
    let mut line: Vec<String> = std::iter::once("vcp-gateway".to_owned())
        .chain(args.iter().map(|a| (*a).to_owned()))
        .collect();
    line.extend(env_as_flags(
        c,
        &env_flags_of(<vcp_gateway::Args as clap::CommandFactory>::command().get_arguments()),
        |name| name == "RUST_LOG",
        "vcp_gw_from_a_secret_0123456789",
    )?);
    let parsed = <vcp_gateway::Args as clap::Parser>::try_parse_from(&line)
        .map_err(|e| anyhow::anyhow!("vcp-gateway refuses the chart's arguments: {e}"))?;
    assert_eq!(parsed.domain.as_str(), "tenants.example.net");
    assert_eq!(parsed.listen, "0.0.0.0:8443");
    // vcp's API by its Service, the port the chart gives it.
    assert_eq!(
        parsed.vcp_url.as_ref().map(|u| u.as_str()),
        Some("http://vcp.vcp-system.svc:8080")
    );
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(pod["serviceAccountName"], "vcp-gateway");
    // Its pods are not the API's: the API Service must not send requests to them.
    let api = docs
        .iter()
        .find(|d| d["kind"] == "Service" && d["metadata"]["name"] == "vcp")
        .unwrap();
    let gateway_labels = &d["spec"]["template"]["metadata"]["labels"];
    assert_ne!(
        api["spec"]["selector"]["app.kubernetes.io/component"],
        gateway_labels["app.kubernetes.io/component"]
    );

    let svc = named(&docs, "Service").unwrap();
    assert_eq!(svc["spec"]["type"], "NodePort");
    assert_eq!(svc["spec"]["ports"][0]["nodePort"], 31443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "tls");
    assert_eq!(svc["spec"]["selector"], *gateway_labels);

    // Read-only, and only Services: it routes by them and holds nothing else of the host.
    let role = named(&docs, "ClusterRole").unwrap();
    assert_eq!(
        role["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["services"], "verbs": ["list", "watch"]}])
    );
    let binding = named(&docs, "ClusterRoleBinding").unwrap();
    assert_eq!(binding["subjects"][0]["name"], "vcp-gateway");
    let policy = named(&docs, "NetworkPolicy").unwrap();
    assert_eq!(
        policy["spec"]["podSelector"]["matchLabels"],
        *gateway_labels
    );
    assert_eq!(policy["spec"]["ingress"][0]["ports"][0]["port"], 8443);
    assert!(named(&docs, "PodDisruptionBudget").is_some());

    // vcp names tenants under the gateway's domain.
    let vcp = find(&docs, "Deployment")?;
    let vcp_args = vcp["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
    for flag in [
        "--expose=gateway",
        "--expose-domain=tenants.example.net",
        "--expose-port=31443",
        "--expose-address=192.0.2.10",
    ] {
        assert!(vcp_args.contains(flag), "{flag} in {vcp_args}");
    }

    // A gateway needs its domain, and the domain must be a DNS name.
    for (set, named_value) in [
        ("expose.mode=gateway", "/expose/domain"),
        ("expose.domain=Tenants_Example", "/expose/domain"),
        (
            "gateway.handshakeTimeoutMs=10",
            "/gateway/handshakeTimeoutMs",
        ),
    ] {
        let out = helm(
            &[
                "template",
                "vcp",
                chart_dir().to_str().unwrap(),
                "--set",
                "database.existingSecret=db",
                "--set",
                "expose.mode=gateway",
                "--set",
                set,
            ],
            None,
        )?;
        assert!(!out.status.success(), "{set} accepted");
        let err = text(&out.stderr);
        assert!(err.contains(named_value), "{set}: {err}");
    }
    Ok(())
}

#[test]
fn the_chart_mounts_the_templates_of_its_own_version() -> anyhow::Result<()> {
    // The chart's files/templates is a link to the repository's templates/; a replaced
    // template and a catalog from values win over them.
    let catalog = std::fs::read_to_string(repo_file("templates/versions.yaml"))?;
    let mine = format!("{catalog}# the platform's own catalog\n");
    let values = format!(
        "templates: {{etcd.yaml: \"{{#- mine -#}}\\n\"}}\nversionsCatalog: {}\n",
        serde_json::to_string(&mine)?
    );
    let docs = documents(&template("vcp", "vcp-system", &values, &[])?)?;
    let cm = docs
        .iter()
        .find(|d| d["metadata"]["name"] == "vcp-templates")
        .ok_or_else(|| anyhow::anyhow!("no templates ConfigMap"))?;
    let data = cm["data"].as_object().unwrap();
    let mut names = Vec::new();
    for f in std::fs::read_dir(repo_file("templates"))? {
        let name = f?.file_name().to_string_lossy().into_owned();
        // host-roles.yaml is installed by the chart itself, not given to vcp to render.
        if !name.ends_with(".yaml") || name == "host-roles.yaml" {
            continue;
        }
        let got = data
            .get(&name)
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow::anyhow!("{name} missing from the templates ConfigMap"))?;
        let want = match name.as_str() {
            "etcd.yaml" => "{#- mine -#}\n".to_owned(),
            "versions.yaml" => mine.clone(),
            _ => std::fs::read_to_string(repo_file("templates").join(&name))?,
        };
        assert_eq!(got, want, "{name}");
        names.push(name);
    }
    assert_eq!(data.len(), names.len(), "nothing but the templates");
    assert!(names.len() >= 9, "{names:?}");
    Ok(())
}

/// Bad values: each `--set` and the part of the message that must name it.
const BAD: [(&str, &str, &str); 13] = [
    ("an unknown key", "colour=red", "colour"),
    (
        "an unknown tenant access",
        "tenantAccess=dns",
        "/tenantAccess",
    ),
    (
        "an unknown key of the database CA",
        "database.tls.ca=db-ca",
        "/database/tls",
    ),
    (
        "an empty database CA key",
        "database.tls.caKey=",
        "/database/tls/caKey",
    ),
    ("an unknown nested key", "expose.adress=10.0.0.1", "adress"),
    ("a wrong type", "replicas=two", "/replicas"),
    (
        "a wrong type deep down",
        "usage.intervalSeconds=often",
        "/usage/intervalSeconds",
    ),
    (
        "a value out of range",
        "maxKubeconfigTTLHours=9000",
        "/maxKubeconfigTTLHours",
    ),
    (
        "node-port without an address",
        "expose.mode=node-port",
        "/expose/address",
    ),
    (
        "an invalid plan",
        "plans.gold.etcd_replicas=2",
        "/plans/gold/etcd_replicas",
    ),
    (
        "an unknown plan field",
        "plans.gold.etcd_replica=3",
        "etcd_replica",
    ),
    (
        "an invalid tenant policy",
        "plans.gold.policy.pod_security=strict",
        "/plans/gold/policy/pod_security",
    ),
    (
        "encryption without secrets",
        "plans.gold.encryption.resources={configmaps}",
        "/plans/gold/encryption/resources",
    ),
];

#[test]
fn bad_values_fail_helm_template_naming_the_value() -> anyhow::Result<()> {
    let chart = chart_dir();
    for (what, set, named) in BAD {
        let out = helm(
            &["template", "vcp", chart.to_str().unwrap(), "--set", set],
            None,
        )?;
        let err = text(&out.stderr);
        println!("{what} ({set}): {}", err.trim());
        assert!(!out.status.success(), "{what} ({set}) renders");
        assert!(
            err.contains(named),
            "{what} ({set}): {err:?} does not name {named:?}"
        );
    }
    // And nothing but a database: no Secret and no evaluation Postgres.
    let out = helm(
        &[
            "template",
            "vcp",
            chart.to_str().unwrap(),
            "--set",
            "database.existingSecret=",
        ],
        None,
    )?;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("/database/existingSecret"));
    Ok(())
}

/// Dotted paths of every leaf (and of every map whose keys are the user's: plans, templates,
/// annotations, ...) in a values tree.
fn value_paths(v: &Value, prefix: &str, schema: &Value, out: &mut Vec<String>) {
    let free_keys = schema["properties"].is_null();
    match v {
        Value::Object(m) if !free_keys && !m.is_empty() => {
            for (k, sub) in m {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                value_paths(sub, &path, &resolve(&schema["properties"][k]), out);
            }
        }
        _ => out.push(prefix.to_owned()),
    }
}

/// Follows a `$ref` into the root schema's definitions.
fn resolve(s: &Value) -> Value {
    static ROOT: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    let root = ROOT.get_or_init(|| {
        serde_json::from_str(
            &std::fs::read_to_string(chart_dir().join("values.schema.json")).unwrap(),
        )
        .unwrap()
    });
    match s["$ref"].as_str() {
        Some(r) => {
            let name = r.trim_start_matches("#/definitions/");
            root["definitions"][name].clone()
        }
        None => s.clone(),
    }
}

#[test]
fn every_value_is_in_the_schema_and_documented_in_install_md() -> anyhow::Result<()> {
    let schema: Value = serde_json::from_str(&std::fs::read_to_string(
        chart_dir().join("values.schema.json"),
    )?)?;
    let values: Value =
        serde_yaml::from_str(&std::fs::read_to_string(chart_dir().join("values.yaml"))?)?;
    let docs = std::fs::read_to_string(repo_file("docs/install.md"))?;
    let reference = docs
        .split("## Values reference")
        .nth(1)
        .ok_or_else(|| anyhow::anyhow!("docs/install.md has no \"## Values reference\""))?;
    let mut paths = Vec::new();
    value_paths(&values, "", &schema, &mut paths);
    assert!(paths.len() > 40, "{paths:?}");
    for p in &paths {
        // In the schema: every step of the path is a declared property.
        let mut s = schema.clone();
        for step in p.split('.') {
            let next = resolve(&s["properties"][step]);
            assert!(!next.is_null(), "{p}: {step} is not in values.schema.json");
            s = next;
        }
        assert!(
            reference.contains(&format!("`{p}`")),
            "{p} is not in docs/install.md's values reference"
        );
    }
    // And the other way: the schema declares nothing values.yaml does not set.
    let mut declared = Vec::new();
    schema_paths(&schema, "", &mut declared);
    for d in &declared {
        assert!(
            paths
                .iter()
                .any(|p| p == d || p.starts_with(&format!("{d}."))),
            "{d} is in the schema but not in values.yaml"
        );
    }
    // Every section is closed.
    assert_eq!(schema["additionalProperties"], false);
    Ok(())
}

fn schema_paths(s: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(props) = s["properties"].as_object() else {
        out.push(prefix.to_owned());
        return;
    };
    for (k, sub) in props {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        // Plans and policies are vcp's own format, documented in docs/orchestrator.md.
        if path.starts_with("plans") {
            continue;
        }
        schema_paths(&resolve(sub), &path, out);
    }
}

/// A minimal ServiceMonitor CRD, so a dry run can take the chart's ServiceMonitor (the dev
/// cluster has no prometheus-operator). It checks the object's kind and group, not its fields.
const SERVICE_MONITOR_CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
  "spec": {"group": "monitoring.coreos.com", "scope": "Namespaced",
    "names": {"kind": "ServiceMonitor", "plural": "servicemonitors", "singular": "servicemonitor", "listKind": "ServiceMonitorList"},
    "versions": [{"name": "v1", "served": true, "storage": true,
      "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
}"#;

fn kubectl(cluster: &DevCluster, args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    use std::io::Write;
    let mut child = Command::new(cluster.kubectl())
        .args(args)
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut pipe = child.stdin.take().unwrap();
    if let Some(s) = stdin {
        pipe.write_all(s.as_bytes())?;
    }
    drop(pipe);
    Ok(child.wait_with_output()?)
}

#[tokio::test]
async fn the_rendered_chart_passes_server_side_dry_run_and_bad_values_fail_helm_install()
-> anyhow::Result<()> {
    let cluster = DevCluster::shared().await?;
    let out = kubectl(cluster, &["apply", "-f", "-"], Some(SERVICE_MONITOR_CRD))?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    // The CRD is established before a ServiceMonitor can be dry-run.
    let out = kubectl(
        cluster,
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
        ],
        None,
    )?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    for (ns, values) in [
        ("chart-default", ""),
        ("chart-all-on", ALL_ON),
        ("chart-database-ca", DATABASE_CA),
    ] {
        let _ = kubectl(cluster, &["create", "namespace", ns], None)?;
        let rendered = template("vcp", ns, values, &[])?;
        let n = documents(&rendered)?.len();
        let out = kubectl(
            cluster,
            &["apply", "--dry-run=server", "-n", ns, "-f", "-"],
            Some(&rendered),
        )?;
        println!("{ns}: {}", text(&out.stdout));
        anyhow::ensure!(
            out.status.success(),
            "{ns}: server-side dry run failed: {}",
            text(&out.stderr)
        );
        let applied = text(&out.stdout)
            .lines()
            .filter(|l| l.contains("(server dry run)"))
            .count();
        assert_eq!(applied, n, "{ns}: every rendered object was dry-run");
    }
    // Every pod the chart runs (vcp's and the evaluation Postgres') is admitted by Pod
    // Security `restricted`, enforced: each pod template as a Pod, dry-run in a namespace
    // that enforces it.
    let ns = "chart-restricted";
    let manifest = format!(
        r#"{{"apiVersion": "v1", "kind": "Namespace", "metadata": {{"name": "{ns}", "labels": {{"pod-security.kubernetes.io/enforce": "restricted"}}}}}}"#
    );
    let out = kubectl(cluster, &["apply", "-f", "-"], Some(&manifest))?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    // (The ServiceAccount admission wants vcp's account to exist.)
    let _ = kubectl(
        cluster,
        &["-n", ns, "create", "serviceaccount", "vcp"],
        None,
    )?;
    let docs = documents(&template("vcp", ns, "postgresql: {enabled: true}", &[])?)?;
    let mut pods = 0;
    for w in docs
        .iter()
        .filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet")
    {
        let mut spec = w["spec"]["template"]["spec"].clone();
        // A StatefulSet's claims become volumes of its pods.
        for c in w["spec"]["volumeClaimTemplates"]
            .as_array()
            .into_iter()
            .flatten()
        {
            spec["volumes"]
                .as_array_mut()
                .unwrap()
                .push(serde_json::json!({
                    "name": c["metadata"]["name"], "persistentVolumeClaim": {"claimName": "any"},
                }));
        }
        let pod = serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": w["metadata"]["name"], "namespace": ns},
            "spec": spec,
        });
        let out = kubectl(
            cluster,
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&pod.to_string()),
        )?;
        anyhow::ensure!(
            out.status.success(),
            "the pod of {} {} is not admitted under restricted: {}",
            w["kind"],
            w["metadata"]["name"],
            text(&out.stderr)
        );
        pods += 1;
    }
    assert_eq!(pods, 2, "vcp and the evaluation Postgres");
    // `helm install` refuses bad values before it touches the cluster.
    let chart = chart_dir();
    for (what, set, named) in BAD {
        let out = helm(
            &[
                "install",
                "bad",
                chart.to_str().unwrap(),
                "--namespace",
                "chart-default",
                "--dry-run=server",
                "--set",
                set,
            ],
            Some(cluster.kubeconfig_path()),
        )?;
        let err = text(&out.stderr);
        assert!(!out.status.success(), "helm install takes {what} ({set})");
        assert!(
            err.contains(named),
            "{what} ({set}): {err:?} does not name {named:?}"
        );
    }
    // The same install with good values gets through (the refusals above are the values').
    let out = helm(
        &[
            "install",
            "good",
            chart.to_str().unwrap(),
            "--namespace",
            "chart-default",
            "--dry-run=server",
        ],
        Some(cluster.kubeconfig_path()),
    )?;
    anyhow::ensure!(
        out.status.success(),
        "helm install --dry-run=server: {}",
        text(&out.stderr)
    );
    Ok(())
}

/// A host client acting as the chart's ServiceAccount `sa` in namespace `ns`.
async fn impersonating(cluster: &DevCluster, ns: &str, sa: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await?;
    config.auth_info.impersonate = Some(format!("system:serviceaccount:{ns}:{sa}"));
    config.auth_info.impersonate_groups = Some(vec![
        "system:serviceaccounts".into(),
        format!("system:serviceaccounts:{ns}"),
        "system:authenticated".into(),
    ]);
    Ok(kube::Client::try_from(config)?)
}

#[tokio::test]
async fn the_chart_cluster_role_is_enough_for_everything_vcp_applies_and_no_more()
-> anyhow::Result<()> {
    use vcp_orchestrator::host::ssa as host;
    use vcp_orchestrator::render::{self, Catalog, Expose, Input, Renderer, Settings};
    let cluster = DevCluster::shared().await?;
    let ns = "chart-rbac";
    let release = "rbac";
    let _ = kubectl(cluster, &["create", "namespace", ns], None)?;
    // The chart's ServiceAccount, ClusterRole and binding, for real.
    let rbac = template(release, ns, "", &["--show-only", "templates/rbac.yaml"])?;
    let out = kubectl(cluster, &["apply", "-f", "-"], Some(&rbac))?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    let sa = "rbac-vcp";
    let vcp = impersonating(cluster, ns, sa).await?;

    // Everything vcp renders for a tenant, applied as vcp: the namespace and the RBAC objects
    // for real (the escalation check of a RoleBinding or ClusterRoleBinding reads the role it
    // binds), the rest as a server-side dry run, which authorizes like the real write.
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
        // The chart's release: `<release>-vcp` (VCP_HOST_ROLES_PREFIX in its Deployment).
        host_roles_prefix: sa.into(),
        datastores: Default::default(),
        audit_url: None,
    };
    let plans = render::parse_plans(vcp_dev::platform::DEV_PLANS)?;
    let key = vcp_core::naming::TenantKey::new("chartrbac1")?;
    let input = Input {
        name: "chart-rbac",
        key: &key,
        version: &catalog.versions[0],
        plan: &plans["default"],
        settings: &settings,
        rollout: BTreeMap::new(),
        run: vcp_orchestrator::render::Run::Up,
    };
    let cp_ns = format!("vcp-{key}");
    let namespace = render::Object(serde_json::json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": cp_ns, "labels": {"vcp.dev/control-plane-of": key.to_string()}},
    }));
    host::apply(&vcp, &namespace, false)
        .await
        .map_err(|e| anyhow::anyhow!("vcp cannot create a control-plane namespace: {e}"))?;
    // As `vcp serve` starts: it knows who it is, finds the chart's shared roles as it expects
    // them (checking, not writing: it may not), and binds its namespace role to itself in the
    // namespace, as every pass does.
    let me = host::identity(&vcp).await?;
    assert_eq!(me, format!("system:serviceaccount:{ns}:{sa}"));
    host::ensure_host_roles(&vcp, sa)
        .await
        .map_err(|e| anyhow::anyhow!("vcp does not accept the chart's shared roles: {e}"))?;
    host::apply(
        &vcp,
        &render::host_rbac::own_binding(&cp_ns, &me, sa),
        false,
    )
    .await
    .map_err(|e| anyhow::anyhow!("vcp cannot bind its role in its namespace: {e}"))?;
    let mut objects = Vec::new();
    for (_, objs) in renderer.render_all(&input)? {
        objects.extend(objs);
    }
    objects.extend(renderer.render_job(
        render::JobKind::Snapshot,
        &input,
        serde_json::json!({"job": "snapshot-1", "file": "1.db"}),
    )?);
    let real = ["ServiceAccount", "Role", "ClusterRole"];
    // Roles before the bindings that name them.
    objects.sort_by_key(|o| !real.contains(&o.kind()));
    let mut checked = BTreeSet::new();
    for o in &objects {
        host::apply(&vcp, o, !real.contains(&o.kind()))
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "the chart's ClusterRole does not let vcp apply {} {}: {}",
                    o.kind(),
                    o.name(),
                    e.public()
                )
            })?;
        checked.insert(o.kind().to_owned());
    }
    println!("vcp applied {} objects of kinds {checked:?}", objects.len());
    assert!(checked.len() >= 15, "{checked:?}");

    // A shared datastore, as vcp's datastore loop makes one: its namespace, vcp's binding in
    // it, its objects and an admin Job; then the Job deleted, as a failed one is.
    let datastores = render::datastore::parse_datastores(vcp_dev::platform::DEV_DATASTORES)?;
    let (ds_name, ds_spec) = datastores.iter().next().expect("a dev datastore");
    let ds_ns = render::datastore::namespace(ds_name);
    host::apply(
        &vcp,
        &render::Object(serde_json::json!({
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": ds_ns, "labels": {render::datastore::LABEL_DATASTORE: ds_name}},
        })),
        false,
    )
    .await
    .map_err(|e| anyhow::anyhow!("vcp cannot create a datastore namespace: {e}"))?;
    host::apply(
        &vcp,
        &render::host_rbac::own_binding(&ds_ns, &me, sa),
        false,
    )
    .await
    .map_err(|e| anyhow::anyhow!("vcp cannot bind its role in a datastore namespace: {e}"))?;
    let images = (
        catalog.versions[0].images["etcd"].as_str(),
        settings.tools_image.as_str(),
    );
    let mut ds_objects = renderer.render_datastore(ds_name, ds_spec, images, "abc")?;
    let grant = render::datastore::Admin::Grant {
        key: key.to_string(),
    };
    ds_objects.extend(renderer.render_datastore_job(ds_name, ds_spec, images, &grant)?);
    for o in &ds_objects {
        host::apply(&vcp, o, true).await.map_err(|e| {
            anyhow::anyhow!(
                "the chart's ClusterRole does not let vcp apply {} {} of a datastore: {}",
                o.kind(),
                o.name(),
                e.public()
            )
        })?;
    }

    // What vcp reads, lists and deletes besides applying (provision/mod.rs tear_down,
    // snapshots.rs, kubeconfig.rs, usage.rs), and what it must not be able to do.
    let user = format!("system:serviceaccount:{ns}:{sa}");
    let can = |args: &[&str]| -> anyhow::Result<bool> {
        let mut a = vec!["auth", "can-i"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["--as", &user]);
        let out = kubectl(cluster, &a, None)?;
        Ok(text(&out.stdout).trim() == "yes")
    };
    for allowed in [
        ["list", "namespaces"],
        ["delete", "namespaces"],
        ["list", "persistentvolumes"],
        ["patch", "persistentvolumes"],
        ["delete", "persistentvolumes"],
        ["list", "pods"],
        ["list", "services"],
        ["list", "persistentvolumeclaims"],
        ["get", "jobs.batch"],
        ["get", "deployments.apps"],
        ["delete", "deployments.apps"],
        ["get", "statefulsets.apps"],
        ["delete", "clusterroles.rbac.authorization.k8s.io"],
        ["delete", "clusterrolebindings.rbac.authorization.k8s.io"],
        [
            "delete",
            "validatingadmissionpolicies.admissionregistration.k8s.io",
        ],
        [
            "delete",
            "validatingadmissionpolicybindings.admissionregistration.k8s.io",
        ],
    ] {
        assert!(can(&allowed)?, "vcp may not {allowed:?}");
    }
    // Secrets only where vcp bound itself: its tenants' and its datastores' namespaces; and
    // there its admin Jobs may be deleted, to run again.
    for allowed in [
        ["list", "secrets", "-n", &cp_ns],
        ["update", "secrets", "-n", &cp_ns],
        ["create", "secrets", "-n", &ds_ns],
        ["delete", "jobs.batch", "-n", &ds_ns],
    ] {
        assert!(can(&allowed)?, "vcp may not {allowed:?}");
    }
    for denied in [
        &["list", "secrets", "--all-namespaces"][..],
        &["get", "secrets", "-n", "kube-system"],
        &["get", "secrets", "-n", ns],
        &["create", "pods", "--subresource=exec", "-n", "kube-system"],
        &["create", "pods", "--subresource=exec", "-n", &cp_ns],
        &["get", "pods", "--subresource=log", "-n", "kube-system"],
        &[
            "create",
            "pods",
            "--subresource=portforward",
            "-n",
            "default",
        ],
        &[
            "bind",
            "clusterroles.rbac.authorization.k8s.io/cluster-admin",
        ],
        &["bind", "clusterroles.rbac.authorization.k8s.io/admin"],
        &[
            "escalate",
            &format!("clusterroles.rbac.authorization.k8s.io/{sa}:tenant-namespace"),
        ],
    ] {
        assert!(!can(denied)?, "vcp may {denied:?}");
    }
    // For real: a Secret in a namespace vcp does not own stays unreadable, and cluster-admin
    // cannot be bound, cluster-wide or in one namespace.
    let other = "chart-rbac-other";
    let _ = kubectl(cluster, &["create", "namespace", other], None)?;
    let _ = kubectl(
        cluster,
        &[
            "create",
            "secret",
            "generic",
            "s",
            "-n",
            other,
            "--from-literal=k=v",
        ],
        None,
    )?;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(vcp.clone(), other);
    match secrets.get("s").await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => anyhow::bail!(
            "vcp reads a Secret of another namespace: {:?}",
            other.map(|_| ())
        ),
    }
    for (kind, ns_arg) in [("clusterrolebinding", None), ("rolebinding", Some(other))] {
        let mut args = vec!["create", kind, "grab", "--clusterrole=cluster-admin"];
        let subject = format!("--serviceaccount={ns}:{sa}");
        args.push(&subject);
        if let Some(n) = ns_arg {
            args.extend(["-n", n]);
        }
        args.extend(["--as", &user]);
        let out = kubectl(cluster, &args, None)?;
        anyhow::ensure!(
            !out.status.success() && text(&out.stderr).contains("forbidden"),
            "vcp binds cluster-admin ({kind}): {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    let denied: [&[&str]; 9] = [
        &["escalate", "clusterroles.rbac.authorization.k8s.io"],
        &["impersonate", "users"],
        &["create", "customresourcedefinitions.apiextensions.k8s.io"],
        &[
            "create",
            "mutatingwebhookconfigurations.admissionregistration.k8s.io",
        ],
        &[
            "create",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
        ],
        &["patch", "nodes"],
        &["create", "pods", "--subresource=eviction"],
        &["create", "serviceaccounts", "--subresource=token"],
        &["create", "certificatesigningrequests.certificates.k8s.io"],
    ];
    for d in denied {
        assert!(!can(d)?, "vcp may {d:?}");
    }
    // The client above really acts as vcp: what the role lacks is refused to it too.
    let crds: kube::Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        kube::Api::all(vcp.clone());
    match crds.list(&Default::default()).await {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => anyhow::bail!(
            "vcp's client lists CRDs: {:?}",
            other.map(|l| l.items.len())
        ),
    }

    // The tenant's cluster-scoped objects go as vcp deletes them.
    for (kind, name) in [
        ("clusterrole", format!("vcp-syncer-{key}")),
        // Tenants provisioned before the shared role still have their own (deleted with them).
        ("clusterrole", format!("vcp-syncer-namespaced-{key}")),
        ("namespace", cp_ns.clone()),
    ] {
        let out = kubectl(
            cluster,
            &[
                "delete",
                kind,
                &name,
                "--ignore-not-found",
                "--wait=false",
                "--as",
                &user,
            ],
            None,
        )?;
        anyhow::ensure!(
            out.status.success(),
            "vcp cannot delete {kind} {name}: {}",
            text(&out.stderr)
        );
    }
    Ok(())
}

#[test]
fn each_image_the_chart_names_has_a_static_non_root_dockerfile() -> anyhow::Result<()> {
    // ghcr.io/vcp-dev/vcp from orchestrator/Dockerfile, ghcr.io/vcp-dev/vcp-syncer from
    // syncer/Dockerfile, ghcr.io/vcp-dev/vcp-gateway from gateway/Dockerfile: multi-stage, the binary the chart's command names, a static base,
    // a non-root user.
    let docs = documents(&template("vcp", "vcp-system", "", &[])?)?;
    let d = find(&docs, "Deployment")?;
    assert_eq!(
        d["spec"]["template"]["spec"]["containers"][0]["command"][0],
        "vcp"
    );
    for (file, bin) in [
        ("orchestrator/Dockerfile", "vcp"),
        ("syncer/Dockerfile", "vcp-syncer"),
        ("gateway/Dockerfile", "vcp-gateway"),
    ] {
        let text = std::fs::read_to_string(repo_file(file))?;
        let stages = text.lines().filter(|l| l.starts_with("FROM ")).count();
        assert!(stages >= 2, "{file}: multi-stage");
        assert!(
            text.contains(&format!("--bin {bin} ")),
            "{file} builds {bin}"
        );
        assert!(
            text.contains(&format!("/usr/local/bin/{bin}")),
            "{file}: {bin} on PATH"
        );
        assert!(text.contains("-alpine"), "{file}: a musl (static) build");
        assert!(text.contains("distroless/static"), "{file}: a static base");
        let user = text
            .lines()
            .rev()
            .find_map(|l| l.strip_prefix("USER "))
            .ok_or_else(|| anyhow::anyhow!("{file}: no USER"))?;
        assert!(
            !user.starts_with('0') && !user.starts_with("root"),
            "{file}: runs as {user}"
        );
    }
    Ok(())
}

/// A Secret's value under `key`, decoded; `None` when the Secret does not exist.
async fn secret_value(
    client: &kube::Client,
    ns: &str,
    name: &str,
    key: &str,
) -> anyhow::Result<Option<String>> {
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), ns);
    let Some(s) = secrets.get_opt(name).await? else {
        return Ok(None);
    };
    let v = s
        .data
        .and_then(|d| d.get(key).cloned())
        .ok_or_else(|| anyhow::anyhow!("secret {name} has no {key}"))?;
    Ok(Some(String::from_utf8(v.0)?))
}

#[tokio::test]
async fn generated_secrets_survive_upgrade_uninstall_and_reinstall() -> anyhow::Result<()> {
    // A real install on the dev cluster. vcp's pods land on its simulated kwok workers (the
    // process node does not run vcp's images yet), so this checks Helm's side only: what the
    // chart generates once is kept by upgrades, left by uninstall and taken up by a reinstall.
    let cluster = DevCluster::shared().await?;
    let client = cluster.connect().await?;
    let kubeconfig = cluster.kubeconfig_path();
    let (release, ns) = ("lifecycle-vcp", "chart-lifecycle");
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let run = |verb: &str, extra: &[&str]| -> anyhow::Result<()> {
        let mut args = vec![verb, release];
        if verb != "uninstall" {
            args.extend_from_slice(&[
                chart,
                "--set",
                "postgresql.enabled=true",
                "--set",
                "expose.mode=node-port",
                "--set",
                "expose.address=127.0.0.1",
            ]);
        }
        args.extend_from_slice(&["--namespace", ns]);
        args.extend_from_slice(extra);
        let out = helm(&args, Some(kubeconfig))?;
        anyhow::ensure!(
            out.status.success(),
            "helm {verb}: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
        Ok(())
    };
    let token = || secret_value(&client, ns, "lifecycle-vcp-admin-token", "token");
    let kek = || secret_value(&client, ns, "lifecycle-vcp-inventory-key", "key");
    let password = || secret_value(&client, ns, "lifecycle-vcp-postgresql", "password");
    let url = || secret_value(&client, ns, "lifecycle-vcp-postgresql", "url");

    run("install", &["--create-namespace"])?;
    let t1 = token()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no admin token"))?;
    let p1 = password()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no password"))?;
    assert!(t1.starts_with("vcp_") && t1.len() == 52, "{t1:?}");
    let k1 = kek()
        .await?
        .ok_or_else(|| anyhow::anyhow!("no inventory key"))?;
    vcp_orchestrator::pki::seal::InventoryKey::from_base64(&k1)?;
    assert!(p1.len() == 32);
    assert!(
        url()
            .await?
            .unwrap()
            .contains(&format!(":{p1}@lifecycle-vcp-postgresql."))
    );

    run("upgrade", &["--set", "workers=2"])?;
    assert_eq!(
        token().await?.as_deref(),
        Some(t1.as_str()),
        "upgrade kept the token"
    );
    assert_eq!(
        kek().await?.as_deref(),
        Some(k1.as_str()),
        "upgrade kept the inventory key"
    );
    assert_eq!(
        password().await?.as_deref(),
        Some(p1.as_str()),
        "and the password"
    );
    let deployments: kube::Api<k8s_openapi::api::apps::v1::Deployment> =
        kube::Api::namespaced(client.clone(), ns);
    let d = serde_json::to_value(deployments.get(release).await?)?;
    let args = &d["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(
        args.as_array().unwrap().contains(&"--workers=2".into()),
        "{args}"
    );

    // The evaluation Postgres' claim exists before the uninstall (the StatefulSet made it).
    let pvcs: kube::Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        kube::Api::namespaced(client.clone(), ns);
    let claim = "data-lifecycle-vcp-postgresql-0";
    vcp_dev::testing::eventually(
        "the evaluation Postgres' claim",
        std::time::Duration::from_secs(60),
        || async { Ok(pvcs.get_opt(claim).await?.map(|_| ())) },
    )
    .await?;

    run("uninstall", &["--wait"])?;
    assert!(deployments.get_opt(release).await?.is_none(), "vcp is gone");
    assert_eq!(
        token().await?.as_deref(),
        Some(t1.as_str()),
        "uninstall left the token"
    );
    assert_eq!(
        kek().await?.as_deref(),
        Some(k1.as_str()),
        "and the inventory key"
    );
    assert_eq!(
        password().await?.as_deref(),
        Some(p1.as_str()),
        "and the password"
    );
    assert!(pvcs.get_opt(claim).await?.is_some(), "and Postgres' data");

    run("install", &[])?;
    assert_eq!(
        token().await?.as_deref(),
        Some(t1.as_str()),
        "a reinstall takes the same token"
    );
    assert_eq!(
        kek().await?.as_deref(),
        Some(k1.as_str()),
        "and the same inventory key"
    );
    assert_eq!(
        password().await?.as_deref(),
        Some(p1.as_str()),
        "and the same password"
    );
    run("uninstall", &[])?;
    Ok(())
}

/// `NOTES.txt` as `helm install` prints it (a client-side dry run: no cluster involved).
fn notes(set: &[&str]) -> anyhow::Result<String> {
    let chart = chart_dir();
    let mut args = vec![
        "install",
        "vcp",
        chart.to_str().unwrap(),
        "--namespace",
        "vcp-system",
        "--dry-run=client",
    ];
    for s in set {
        args.extend_from_slice(&["--set", s]);
    }
    let out = Command::new(vcp_dev::bins::tool("helm")?)
        .args(&args)
        .env("KUBECONFIG", "/nonexistent")
        .output()?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    let all = text(&out.stdout);
    Ok(all
        .split_once("NOTES:")
        .map(|(_, n)| n.to_owned())
        .unwrap_or_default())
}

#[test]
fn notes_say_how_to_reach_the_api_and_get_the_first_admin_token() -> anyhow::Result<()> {
    let n = notes(&[])?;
    println!("{n}");
    assert!(
        n.contains("port-forward service/vcp 8080:8080"),
        "a ClusterIP API is reached by port-forward"
    );
    assert!(n.contains("get secret vcp-admin-token -o jsonpath='{.data.token}' | base64 -d"));
    let n = notes(&[
        "ingress.enabled=true",
        "ingress.host=vcp.example.com",
        "ingress.tls.secretName=tls",
        "adminToken.existingSecret=mine",
        "adminToken.secretKey=t",
    ])?;
    assert!(
        n.contains("export VCP_API_URL=https://vcp.example.com"),
        "{n}"
    );
    assert!(n.contains("get secret mine -o jsonpath='{.data.t}'"), "{n}");
    Ok(())
}
