//! `vcp-dev conformance`: the Kubernetes conformance suite against the dev cluster's host, or
//! against a tenant vcp provisioned there, and the parity between the two.
//!
//! Data flow: the suite (`e2e.test` of one release) and its runner (`ginkgo`) come from the
//! kube-bin cache, where the opt-in group `conformance` builds them
//! (`VCP_KUBE_BIN_EXTRA=conformance tests/kube-bin/build.sh`). ginkgo runs the suite with
//! `--procs N` against the target's kubeconfig (the host's admin one, or the tenant's from
//! `vcp-dev up`) and writes one JUnit report under `<state-dir>/conformance/<target>-<time>/`,
//! beside the run's log. The report is read back ([`parse_junit`], pure) into one summary line
//! and the names of the failed tests (`failed.txt`); `--compare` runs the host and then the
//! tenant with the same selection and lists the tests that pass on the host and not in the
//! tenant ([`parity`]): that list is vcp's to empty.

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::{Duration, Instant};
use vcp_dev::bins;

/// What the suite runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// The dev cluster itself (its admin kubeconfig).
    Host,
    /// A tenant vcp provisioned in it (`<state-dir>/<tenant>.kubeconfig`).
    Tenant,
}

impl Target {
    fn as_str(self) -> &'static str {
        match self {
            Target::Host => "host",
            Target::Tenant => "tenant",
        }
    }
}

/// The flags of `vcp-dev conformance`.
#[derive(Debug, Clone, clap::Args)]
pub struct Opts {
    /// State dir of a dev cluster started with `vcp-dev up --real-node`.
    #[arg(long, env = "VCP_DEV_STATE_DIR")]
    pub state_dir: PathBuf,
    /// Run against the host or a tenant.
    #[arg(
        long,
        env = "VCP_CONFORMANCE_TARGET",
        value_enum,
        default_value = "tenant"
    )]
    pub target: Target,
    /// The tenant, for `--target tenant` and `--compare`.
    #[arg(long, env = "VCP_DEV_TENANT", default_value = "demo")]
    pub tenant: String,
    /// The release whose suite runs, by minor (`1.37`); the host's by default.
    #[arg(long, env = "VCP_CONFORMANCE_MINOR")]
    pub minor: Option<String>,
    /// Which tests run (ginkgo `--focus`, a regular expression on their names), among those
    /// `--labels` selects.
    #[arg(
        long,
        env = "VCP_CONFORMANCE_FOCUS",
        default_value = r"\[Conformance\]"
    )]
    pub focus: String,
    /// The suite's labels a test must have (ginkgo `--label-filter`): the conformance tests by
    /// default, so a `--focus` narrows them and never adds a test outside them.
    #[arg(long, env = "VCP_CONFORMANCE_LABELS", default_value = "Conformance")]
    pub labels: String,
    /// Which of them do not (ginkgo `--skip`): the tests that take the cluster for
    /// themselves or break it on purpose, which a shared dev cluster cannot give them.
    #[arg(
        long,
        env = "VCP_CONFORMANCE_SKIP",
        default_value = r"\[Serial\]|\[Disruptive\]"
    )]
    pub skip: String,
    /// Ginkgo processes running tests at once.
    #[arg(long, env = "VCP_CONFORMANCE_PARALLEL", default_value_t = 2)]
    pub parallel: u32,
    /// Attempts a failing test gets before it counts as failed (ginkgo `--flake-attempts`). A
    /// test that passes only on a later attempt counts as passed and is named as flaky.
    #[arg(long, env = "VCP_CONFORMANCE_FLAKE_ATTEMPTS", default_value_t = 1)]
    pub flake_attempts: u32,
    /// How long the whole run may take (ginkgo `--timeout`), in minutes.
    #[arg(long, env = "VCP_CONFORMANCE_TIMEOUT_MINUTES", default_value_t = 60)]
    pub timeout_minutes: u64,
    /// The order ginkgo runs the tests in (`--seed`): one number gives one order. With
    /// `--compare` both runs take the same one (chosen at random without this flag), so a run
    /// stopped by `--timeout-minutes` covers the same tests on both targets.
    #[arg(long, env = "VCP_CONFORMANCE_SEED")]
    pub seed: Option<u64>,
    /// Run the host and then the tenant, and list the tests that pass only on the host.
    #[arg(long, env = "VCP_CONFORMANCE_COMPARE")]
    pub compare: bool,
    /// Further flags for e2e.test itself (after `--`).
    #[arg(last = true)]
    pub e2e_args: Vec<String>,
}

/// How one test ended, as the report gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Passed,
    Failed,
    Skipped,
}

/// One entry of a JUnit report: a test (`[It] ...`), or a suite-level node (`[BeforeSuite]`,
/// `[SynchronizedBeforeSuite]`, `[ReportAfterSuite] ...`) whose failure means the tests never
/// ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Case {
    pub name: String,
    pub status: Status,
    pub test: bool,
}

/// The entries of a ginkgo JUnit report. Ginkgo writes each spec as a `<testcase>` with a
/// `status` attribute (`passed`, `failed`, `skipped`, `pending`, `panicked`, `timedout`,
/// `interrupted`, `aborted`); a test's name starts with `[It] `, which is dropped here.
pub fn parse_junit(xml: &str) -> Vec<Case> {
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find("<testcase") {
        rest = &rest[i + "<testcase".len()..];
        let end = rest.find('>').unwrap_or(rest.len());
        let tag = &rest[..end];
        let (Some(name), Some(status)) = (attr(tag, "name"), attr(tag, "status")) else {
            continue;
        };
        let status = match status.as_str() {
            "passed" => Status::Passed,
            "skipped" | "pending" => Status::Skipped,
            _ => Status::Failed,
        };
        let (name, test) = match name.strip_prefix("[It] ") {
            Some(n) => (n.to_owned(), true),
            None => (name, false),
        };
        out.push(Case { name, status, test });
    }
    out
}

/// The value of attribute `key` in the inside of a start tag, unescaped.
fn attr(tag: &str, key: &str) -> Option<String> {
    let mut at = 0;
    while let Some(i) = tag[at..].find(key) {
        let start = at + i;
        let before_ok = start == 0 || tag.as_bytes()[start - 1].is_ascii_whitespace();
        let after = &tag[start + key.len()..];
        if before_ok && let Some(v) = after.strip_prefix("=\"") {
            let close = v.find('"')?;
            return Some(unescape(&v[..close]));
        }
        at = start + key.len();
    }
    None
}

fn unescape(s: &str) -> String {
    s.replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&apos;", "'")
        .replace("&#39;", "'")
        .replace("&amp;", "&")
}

/// The tests that ginkgo's log names as passing only on a later attempt: the line after its
/// `[FLAKEY TEST - TOOK n ATTEMPTS TO PASS]` mark is the test's name.
pub fn flaky_tests(log: &str) -> Vec<String> {
    let lines: Vec<&str> = log.lines().collect();
    let mut out: Vec<String> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.contains("[FLAKEY TEST - TOOK"))
        .filter_map(|(i, _)| lines.get(i + 1).map(|n| n.trim().to_owned()))
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Counts of one run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
    /// Suite-level nodes that failed (the tests behind them did not run).
    pub suite_failures: usize,
    /// Tests that passed only on a later attempt (`--flake-attempts`), counted in `passed`.
    pub flaky: usize,
}

pub fn tally(cases: &[Case]) -> Tally {
    let mut t = Tally::default();
    for c in cases {
        match (c.test, c.status) {
            (true, Status::Passed) => t.passed += 1,
            (true, Status::Failed) => t.failed += 1,
            (true, Status::Skipped) => t.skipped += 1,
            (false, Status::Failed) => t.suite_failures += 1,
            (false, _) => {}
        }
    }
    t
}

/// Where the host and the tenant stand apart, over the tests that passed on the host.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parity {
    /// Tests that ran on both (passed or failed on each).
    pub both_ran: usize,
    /// Passed on the host, failed in the tenant: vcp's to fix. Sorted by name.
    pub host_only: Vec<String>,
    /// Passed on the host, never run in the tenant (its run was cut off first, say): no
    /// verdict either way. Sorted by name.
    pub not_run_in_tenant: Vec<String>,
}

/// The parity of a host run and a tenant run of the same selection.
pub fn parity(host: &[Case], tenant: &[Case]) -> Parity {
    use std::collections::BTreeMap;
    let ran = |cases: &[Case]| -> BTreeMap<String, Status> {
        cases
            .iter()
            .filter(|c| c.test && c.status != Status::Skipped)
            .map(|c| (c.name.clone(), c.status))
            .collect()
    };
    let (h, t) = (ran(host), ran(tenant));
    let mut p = Parity {
        both_ran: h.keys().filter(|n| t.contains_key(*n)).count(),
        ..Parity::default()
    };
    for (name, status) in &h {
        if *status != Status::Passed {
            continue;
        }
        match t.get(name) {
            Some(Status::Passed) => {}
            Some(_) => p.host_only.push(name.clone()),
            None => p.not_run_in_tenant.push(name.clone()),
        }
    }
    p
}

/// The summary line of one run.
pub fn summary(target: Target, minor: &str, t: Tally, secs: f64, report: &Path) -> String {
    format!(
        "conformance target={} minor={minor} passed={} failed={} skipped={} suite_failures={} flaky={} duration_s={secs:.0} report={}",
        target.as_str(),
        t.passed,
        t.failed,
        t.skipped,
        t.suite_failures,
        t.flaky,
        report.display()
    )
}

/// The Kubernetes release of `minor` among those built for vcp (the host's without one).
fn release(minor: Option<&str>) -> anyhow::Result<&'static str> {
    let Some(minor) = minor else {
        return Ok(bins::host_kubernetes_version());
    };
    let m = minor.trim_start_matches('v');
    bins::supported_kubernetes_versions()
        .into_iter()
        .find(|v| {
            v.trim_start_matches('v')
                .strip_prefix(m)
                .is_some_and(|rest| rest.starts_with('.'))
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "minor {minor:?} is not one vcp builds ({})",
                bins::supported_kubernetes_versions().join(", ")
            )
        })
}

/// A binary of the suite, or an error that says how to build it.
fn suite_binary(component: &str, version: &str) -> anyhow::Result<PathBuf> {
    bins::binary(component, version).map_err(|_| {
        anyhow::anyhow!(
            "{component} {version} is not built: it is opt-in, build it with \
             `VCP_KUBE_BIN_EXTRA={} tests/kube-bin/build.sh` (about 20 minutes cold)",
            suite_group(version)
        )
    })
}

/// The opt-in group of `tests/kube-bin/build.sh` that builds the suite of `version`: the
/// newest minor's is `conformance`, the oldest's `conformance-oldest`, any other's
/// `conformance-v1.<minor>`.
fn suite_group(version: &str) -> String {
    let supported = bins::supported_kubernetes_versions();
    let minor = |v: &str| {
        v.trim_start_matches('v')
            .rsplit_once('.')
            .map(|(m, _)| m.to_owned())
    };
    let this = minor(version);
    if this == supported.first().and_then(|v| minor(v)) {
        "conformance".into()
    } else if this == supported.last().and_then(|v| minor(v)) {
        "conformance-oldest".into()
    } else {
        format!("conformance-v{}", this.unwrap_or_default())
    }
}

/// The taint that keeps the suite's pods off a node of the host while it runs there.
const ELSEWHERE: &str = "vcp.dev/conformance";

/// A node's taints while the suite runs on the host, if they change: the real node loses the
/// taint that keeps it for vcp's pods ([`vcp_dev::node::NODE_LABEL`]), and every other node
/// that takes pods without a toleration (the kwok workers) gets one that keeps the suite's pods
/// off it. On the real node the suite's pods run in containers; on a kwok worker they would
/// only seem to, and the tenant's pods run on the real node too.
pub fn suite_taints(real: bool, taints: &[Taint]) -> Option<Vec<Taint>> {
    let (key, _) = vcp_dev::node::NODE_LABEL;
    if real {
        let kept: Vec<Taint> = taints.iter().filter(|t| t.key != key).cloned().collect();
        return (kept.len() != taints.len()).then_some(kept);
    }
    if taints
        .iter()
        .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    {
        return None;
    }
    let mut more = taints.to_vec();
    more.push(Taint {
        key: ELSEWHERE.to_owned(),
        value: Some("elsewhere".to_owned()),
        effect: "NoSchedule".to_owned(),
        time_added: None,
    });
    Some(more)
}

/// A node's taints outside a run, from what it carries now: a run killed outright (its
/// process gone before it could give them back) left the kwok workers tainted
/// [`ELSEWHERE`] and the real node without its own taint ([`vcp_dev::node::NODE_LABEL`],
/// which the node registers with). Both are the dev cluster's, never a user's, so they are
/// put right here and the run's end restores this.
pub fn outside_a_run(real: bool, taints: &[Taint]) -> Vec<Taint> {
    let mut out: Vec<Taint> = taints
        .iter()
        .filter(|t| t.key != ELSEWHERE)
        .cloned()
        .collect();
    let (key, value) = vcp_dev::node::NODE_LABEL;
    if real && !out.iter().any(|t| t.key == key) {
        out.push(Taint {
            key: key.to_owned(),
            value: Some(value.to_owned()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        });
    }
    out
}

/// The host as a one-node cluster of its real node for the suite ([`suite_taints`]); returns
/// each changed node's taints as they were, for [`restore_taints`], and the keys of the
/// taints that now keep the suite off the other nodes (which the suite must be told not to
/// wait out: `--non-blocking-taints`).
async fn one_real_node(
    client: &kube::Client,
) -> anyhow::Result<(Vec<(String, Vec<Taint>)>, BTreeSet<String>)> {
    let nodes: Api<Node> = Api::all(client.clone());
    let (key, value) = vcp_dev::node::NODE_LABEL;
    let mut before = Vec::new();
    let mut blocking = BTreeSet::new();
    let mut real = 0;
    for n in nodes.list(&ListParams::default()).await? {
        let name = n.metadata.name.clone().unwrap_or_default();
        let is_real = n
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(key))
            .is_some_and(|v| v == value);
        real += usize::from(is_real);
        let found = n.spec.and_then(|s| s.taints).unwrap_or_default();
        let taints = outside_a_run(is_real, &found);
        let now = suite_taints(is_real, &taints);
        if !is_real {
            blocking.extend(
                now.as_ref()
                    .unwrap_or(&taints)
                    .iter()
                    .map(|t| t.key.clone()),
            );
        }
        let during = now.unwrap_or_else(|| taints.clone());
        if during != found {
            set_taints(&nodes, &name, &during).await?;
        }
        if during != taints {
            before.push((name, taints));
        } else if taints != found {
            // Put right for good: this run does not change it.
            tracing::info!(node = %name, "taints of an interrupted run removed");
        }
    }
    anyhow::ensure!(
        real > 0,
        "the host has no real node: start the dev cluster with `vcp-dev up --real-node`"
    );
    Ok((before, blocking))
}

async fn set_taints(nodes: &Api<Node>, name: &str, taints: &[Taint]) -> anyhow::Result<()> {
    let patch = serde_json::json!({"spec": {"taints": taints}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn restore_taints(client: &kube::Client, before: &[(String, Vec<Taint>)]) {
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, taints) in before {
        if let Err(e) = set_taints(&nodes, name, taints).await {
            eprintln!(
                "vcp-dev: could not give node {name} its taints back ({e}); they were {taints:?}"
            );
        }
    }
}

/// One run of the suite against `target`; returns its entries and its summary line.
async fn run_once(o: &Opts, target: Target) -> anyhow::Result<(Vec<Case>, String)> {
    if target == Target::Tenant {
        return suite(o, target, &[]).await;
    }
    let client = vcp_dev::cluster::client_from(&o.state_dir.join("host.kubeconfig")).await?;
    let (before, blocking) = one_real_node(&client).await?;
    let mut keys = vec!["node-role.kubernetes.io/control-plane".to_owned()];
    keys.extend(blocking);
    let flag = format!("--non-blocking-taints={}", keys.join(","));
    // Interrupted, the host still gets its taints back (the suite's processes are killed
    // with the future that runs them).
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let r = tokio::select! {
        r = suite(o, target, std::slice::from_ref(&flag)) => r,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        _ = term.recv() => Err(anyhow::anyhow!("terminated")),
    };
    restore_taints(&client, &before).await;
    r
}

/// ginkgo's own flags for a run of `o` that writes its report into `out`.
pub fn ginkgo_flags(o: &Opts, out: &Path) -> Vec<String> {
    let mut flags = vec![
        format!("--procs={}", o.parallel.max(1)),
        format!("--timeout={}m", o.timeout_minutes),
        format!("--flake-attempts={}", o.flake_attempts.max(1)),
    ];
    flags.extend(o.seed.map(|s| format!("--seed={s}")));
    flags.extend([
        format!("--focus={}", o.focus),
        format!("--skip={}", o.skip),
        format!("--label-filter={}", o.labels),
        format!("--output-dir={}", out.display()),
        "--junit-report=junit.xml".to_owned(),
        "--no-color".to_owned(),
        "--silence-skips".to_owned(),
    ]);
    flags
}

/// The suite's run itself; `extra` goes to e2e.test before the caller's own flags.
/// A kubeconfig that names its server by address and sends the tenant's host name as
/// `tls-server-name` (a tenant behind the gateway, dialled by address), rewritten for the
/// suite: the e2e framework always overrides the server (`framework.LoadConfig`), and
/// client-go's clientcmd then drops `tls-server-name` with it, so the suite's clients would
/// send no server name and the gateway would refuse them. The suite gets the name as its
/// server instead, and the hosts entry that resolves it to the address: what a platform's
/// wildcard DNS gives its users. `None` for a kubeconfig without `tls-server-name`.
pub fn by_name(kubeconfig: &str) -> anyhow::Result<Option<(String, String)>> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(kubeconfig)?;
    let Some(clusters) = doc
        .get_mut("clusters")
        .and_then(serde_yaml::Value::as_sequence_mut)
    else {
        return Ok(None);
    };
    let mut hosts = String::new();
    for c in clusters {
        let Some(cluster) = c
            .get_mut("cluster")
            .and_then(serde_yaml::Value::as_mapping_mut)
        else {
            continue;
        };
        let Some(name) = cluster
            .remove("tls-server-name")
            .and_then(|v| v.as_str().map(str::to_owned))
        else {
            continue;
        };
        let server = cluster
            .get("server")
            .and_then(serde_yaml::Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let authority = server.strip_prefix("https://").unwrap_or(&server);
        let (address, port) = authority
            .rsplit_once(':')
            .map_or((authority, None), |(a, p)| (a, Some(p)));
        let address = address.trim_start_matches('[').trim_end_matches(']');
        anyhow::ensure!(
            address.parse::<std::net::IpAddr>().is_ok(),
            "the kubeconfig's server {server:?} with tls-server-name {name:?} is not an address"
        );
        let named = match port {
            Some(p) => format!("https://{name}:{p}"),
            None => format!("https://{name}"),
        };
        cluster.insert("server".into(), named.into());
        hosts.push_str(&format!("{address} {name}\n"));
    }
    if hosts.is_empty() {
        return Ok(None);
    }
    Ok(Some((serde_yaml::to_string(&doc)?, hosts)))
}

async fn suite(o: &Opts, target: Target, extra: &[String]) -> anyhow::Result<(Vec<Case>, String)> {
    let version = release(o.minor.as_deref())?;
    let minor = version
        .trim_start_matches('v')
        .rsplit_once('.')
        .map_or(version, |(m, _)| m);
    let e2e = suite_binary("e2e.test", version)?;
    let ginkgo = suite_binary("ginkgo", version)?;
    let kubectl = bins::binary("kubectl", version)?;
    let kubeconfig = match target {
        Target::Host => o.state_dir.join("host.kubeconfig"),
        Target::Tenant => o.state_dir.join(format!("{}.kubeconfig", o.tenant)),
    };
    anyhow::ensure!(
        kubeconfig.is_file(),
        "{} is missing: start the dev cluster with `vcp-dev up --real-node --state-dir {}`",
        kubeconfig.display(),
        o.state_dir.display()
    );
    let stamp = time::OffsetDateTime::now_utc().unix_timestamp();
    let out = std::path::absolute(
        o.state_dir
            .join("conformance")
            .join(format!("{}-{stamp}", target.as_str())),
    )?;
    std::fs::create_dir_all(&out)?;
    let log_path = out.join("ginkgo.log");
    // ginkgo runs a compiled suite only by a name ending in `.test`; the cache names it
    // `e2e.test-<version>`.
    let suite = out.join("e2e.test");
    std::os::unix::fs::symlink(&e2e, &suite)?;
    let log = std::fs::File::create(&log_path)?;
    // Behind the gateway: the suite dials the tenant by name, resolved by a hosts file of its
    // own mount namespace (nothing of the machine's changes), as `by_name` says.
    let (mut command, kubeconfig) = match by_name(&std::fs::read_to_string(&kubeconfig)?)? {
        None => (tokio::process::Command::new(&ginkgo), kubeconfig),
        Some((named, entries)) => {
            let named_path = out.join("suite.kubeconfig");
            std::fs::write(&named_path, named)?;
            let hosts = out.join("hosts");
            let system = std::fs::read_to_string("/etc/hosts").unwrap_or_default();
            std::fs::write(&hosts, format!("{system}\n{entries}"))?;
            let mut c = tokio::process::Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg(r#"mount --bind "$0" /etc/hosts && exec "$@""#)
                .arg(&hosts)
                .arg(&ginkgo);
            (c, named_path)
        }
    };
    let started = Instant::now();
    let status = command
        .args(ginkgo_flags(o, &out))
        .arg(&suite)
        .arg("--")
        .arg(format!(
            "--kubeconfig={}",
            std::path::absolute(&kubeconfig)?.display()
        ))
        .arg(format!("--kubectl-path={}", kubectl.display()))
        .arg("--provider=skeleton")
        .arg(format!("--report-dir={}", out.display()))
        .args(extra)
        .args(&o.e2e_args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .kill_on_drop(true)
        .status()
        .await?;
    let secs = started.elapsed().as_secs_f64();
    let report = out.join("junit.xml");
    let xml = std::fs::read_to_string(&report).map_err(|e| {
        anyhow::anyhow!(
            "ginkgo ({status}) wrote no report {} ({e}); its log: {}",
            report.display(),
            log_path.display()
        )
    })?;
    let cases = parse_junit(&xml);
    let failed: Vec<&str> = cases
        .iter()
        .filter(|c| c.status == Status::Failed)
        .map(|c| c.name.as_str())
        .collect();
    std::fs::write(out.join("failed.txt"), failed.join("\n") + "\n")?;
    let flaky = flaky_tests(&std::fs::read_to_string(&log_path).unwrap_or_default());
    std::fs::write(out.join("flaky.txt"), flaky.join("\n") + "\n")?;
    let t = Tally {
        flaky: flaky.len(),
        ..tally(&cases)
    };
    let line = summary(target, minor, t, secs, &report);
    Ok((cases, line))
}

/// `vcp-dev conformance`: prints one summary line per run (and the parity with `--compare`);
/// exits 1 if a test failed (or, with `--compare`, if a test passes only on the host).
pub async fn run(o: Opts) -> anyhow::Result<ExitCode> {
    if !o.compare {
        let (cases, line) = run_once(&o, o.target).await?;
        println!("{line}");
        let t = tally(&cases);
        return Ok(if t.failed + t.suite_failures == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let o = Opts {
        seed: Some(o.seed.unwrap_or_else(|| {
            time::OffsetDateTime::now_utc()
                .unix_timestamp()
                .unsigned_abs()
        })),
        ..o
    };
    println!("conformance-compare seed={}", o.seed.unwrap_or_default());
    let (host, line) = run_once(&o, Target::Host).await?;
    println!("{line}");
    // The two runs share the machine; the second starts once the first's namespaces are
    // going, which the suite itself waits for.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (tenant, line) = run_once(&o, Target::Tenant).await?;
    println!("{line}");
    let p = parity(&host, &tenant);
    println!(
        "conformance-parity host_passed={} tenant_passed={} both_ran={} host_only={} not_run_in_tenant={}",
        tally(&host).passed,
        tally(&tenant).passed,
        p.both_ran,
        p.host_only.len(),
        p.not_run_in_tenant.len()
    );
    for name in &p.host_only {
        println!("  host only: {name}");
    }
    for name in &p.not_run_in_tenant {
        println!("  not run in the tenant: {name}");
    }
    Ok(if p.host_only.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_kubeconfig_dialled_by_address_is_named_for_the_suite() {
        let kc = "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: https://10.243.0.2:31443\n    tls-server-name: k1.tenants.vcp.test\n    certificate-authority-data: Q0E=\nusers: []\n";
        let (named, hosts) = by_name(kc).unwrap().expect("rewritten");
        let v: serde_yaml::Value = serde_yaml::from_str(&named).unwrap();
        let c = &v["clusters"][0]["cluster"];
        assert_eq!(
            c["server"].as_str(),
            Some("https://k1.tenants.vcp.test:31443")
        );
        assert!(c.get("tls-server-name").is_none());
        assert_eq!(c["certificate-authority-data"].as_str(), Some("Q0E="));
        assert_eq!(hosts, "10.243.0.2 k1.tenants.vcp.test\n");
        // Without a server name there is nothing to do.
        let plain = "clusters:\n- name: h\n  cluster:\n    server: https://127.0.0.1:6443\n";
        assert!(by_name(plain).unwrap().is_none());
        // A name over a name is not something a hosts file can say.
        let odd = kc.replace("10.243.0.2", "gw.example");
        assert!(by_name(&odd).is_err());
    }

    use super::*;

    #[test]
    fn each_minors_suite_names_the_build_group_that_makes_it() {
        let [newest, middle, oldest] = bins::supported_kubernetes_versions();
        assert_eq!(suite_group(newest), "conformance");
        assert_eq!(suite_group(oldest), "conformance-oldest");
        let minor = middle.trim_start_matches('v').rsplit_once('.').unwrap().0;
        assert_eq!(suite_group(middle), format!("conformance-v{minor}"));
        // Each group is one build.sh knows.
        let script = include_str!("../../kube-bin/build.sh");
        for v in [newest, middle, oldest] {
            let optin = format!("optin={} ", suite_group(v));
            assert!(script.contains(&optin), "{optin} in build.sh");
        }
    }

    const REPORT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="4" disabled="0" errors="0" failures="1" time="12.5">
  <testsuite name="Kubernetes e2e suite" package="/x" tests="4" skipped="1" disabled="0" errors="0" failures="1" time="12.5">
    <testcase name="[SynchronizedBeforeSuite]" classname="Kubernetes e2e suite" status="passed" time="1.0"></testcase>
    <testcase name="[It] [sig-network] DNS should provide DNS for services  [Conformance]" classname="Kubernetes e2e suite" status="passed" time="3.2"></testcase>
    <testcase name="[It] [sig-node] Pods should get a host IP &quot;fast&quot; &amp; right [NodeConformance] [Conformance]" classname="Kubernetes e2e suite" status="failed" time="5.0">
      <failure message="timed out" type="failed">[FAILED] timed out</failure>
    </testcase>
    <testcase name="[It] [sig-apps] Job should run a job [Conformance]" classname="Kubernetes e2e suite" status="skipped" time="0"><skipped message="skipped"></skipped></testcase>
    <testcase name="[It] [sig-cli] Kubectl proxy should support proxy [Conformance]" classname="Kubernetes e2e suite" status="timedout" time="9"></testcase>
    <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" classname="Kubernetes e2e suite" status="panicked" time="0"></testcase>
  </testsuite>
</testsuites>"#;

    #[test]
    fn ginkgo_gets_the_order_and_the_attempts_asked_for() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            o: Opts,
        }
        let parse = |args: &[&str]| {
            Cli::try_parse_from([&["x", "--state-dir", "/s"], args].concat())
                .unwrap()
                .o
        };
        let flags = ginkgo_flags(&parse(&[]), Path::new("/out"));
        assert!(
            flags.contains(&"--flake-attempts=1".to_owned()),
            "{flags:?}"
        );
        assert!(!flags.iter().any(|f| f.starts_with("--seed")), "{flags:?}");
        assert!(flags.contains(&"--label-filter=Conformance".to_owned()));
        let flags = ginkgo_flags(
            &parse(&["--seed", "42", "--flake-attempts", "2", "--parallel", "3"]),
            Path::new("/out"),
        );
        for f in [
            "--seed=42",
            "--flake-attempts=2",
            "--procs=3",
            "--output-dir=/out",
        ] {
            assert!(flags.contains(&f.to_owned()), "{f} in {flags:?}");
        }
    }

    #[test]
    fn a_test_that_passed_on_a_later_attempt_is_named_as_flaky() {
        let log = "••\n------------------------------\n\
            • [FLAKEY TEST - TOOK 2 ATTEMPTS TO PASS] [31.2 seconds]\n\
            [sig-api-machinery] CustomResourceDefinition resources [It] creating/deleting works [Conformance]\n\
            k8s.io/kubernetes/test/e2e/apimachinery/custom_resource_definition.go:61\n\
            ••\n";
        assert_eq!(
            flaky_tests(log),
            [
                "[sig-api-machinery] CustomResourceDefinition resources [It] creating/deleting works [Conformance]"
            ]
        );
        assert!(flaky_tests("••• [FAILED] [1.0 seconds]\nx\n").is_empty());
    }

    #[test]
    fn a_ginkgo_report_reads_as_tests_and_suite_nodes() {
        let cases = parse_junit(REPORT);
        assert_eq!(cases.len(), 6);
        assert_eq!(
            cases[2].name,
            r#"[sig-node] Pods should get a host IP "fast" & right [NodeConformance] [Conformance]"#,
            "[It] dropped, entities unescaped"
        );
        assert!(cases[2].test && !cases[0].test);
        assert_eq!(
            tally(&cases),
            Tally {
                passed: 1,
                failed: 2,
                skipped: 1,
                suite_failures: 1,
                flaky: 0
            },
            "a timed-out test fails; a suite node that failed is told apart"
        );
        assert!(parse_junit("<testsuites></testsuites>").is_empty());
        assert!(
            parse_junit("<testcase name=\"[It] x\"").is_empty(),
            "no status"
        );
    }

    #[test]
    fn attributes_are_matched_by_whole_name() {
        let tag = r#" classname="a" name="b" status="passed""#;
        assert_eq!(attr(tag, "name").as_deref(), Some("b"));
        assert_eq!(attr(tag, "status").as_deref(), Some("passed"));
        assert_eq!(attr(tag, "time"), None);
    }

    #[test]
    fn parity_lists_what_passes_on_the_host_only() {
        let case = |name: &str, status| Case {
            name: name.to_owned(),
            status,
            test: true,
        };
        let host = vec![
            case("a", Status::Passed),
            case("b", Status::Passed),
            case("c", Status::Failed),
            case("d", Status::Passed),
        ];
        let tenant = vec![
            case("a", Status::Passed),
            case("b", Status::Failed),
            case("c", Status::Passed),
        ];
        let mut tenant = tenant;
        tenant.push(case("e", Status::Skipped));
        let mut host = host;
        host.push(case("e", Status::Passed));
        assert_eq!(
            parity(&host, &tenant),
            Parity {
                both_ran: 3,
                host_only: vec!["b".into()],
                not_run_in_tenant: vec!["d".into(), "e".into()],
            },
            "failed, or never ran (absent or skipped)"
        );
        assert_eq!(
            parity(&tenant, &tenant),
            Parity {
                both_ran: 3,
                ..Parity::default()
            }
        );
    }

    #[test]
    fn on_the_host_the_suite_gets_the_real_node_only() {
        let taint = |key: &str, effect: &str| Taint {
            key: key.to_owned(),
            value: Some("v".to_owned()),
            effect: effect.to_owned(),
            time_added: None,
        };
        let real = taint("vcp.dev/node", "NoSchedule");
        let other = taint("example.com/x", "PreferNoSchedule");
        assert_eq!(
            suite_taints(true, &[real.clone(), other.clone()]),
            Some(vec![other.clone()]),
            "the real node takes the suite's pods"
        );
        assert_eq!(
            suite_taints(true, std::slice::from_ref(&other)),
            None,
            "nothing to change"
        );
        let kwok = suite_taints(false, std::slice::from_ref(&other)).unwrap();
        assert_eq!(kwok.len(), 2);
        assert_eq!(
            (kwok[1].key.as_str(), kwok[1].effect.as_str()),
            (ELSEWHERE, "NoSchedule")
        );
        assert_eq!(
            suite_taints(false, &[taint("vcp.dev/runtime", "NoSchedule")]),
            None,
            "a node already kept from untolerating pods (the devnode) stays as it is"
        );
    }

    #[test]
    fn a_killed_runs_taints_are_put_right() {
        let elsewhere = Taint {
            key: ELSEWHERE.to_owned(),
            value: Some("elsewhere".to_owned()),
            effect: "NoSchedule".to_owned(),
            time_added: None,
        };
        let (key, value) = vcp_dev::node::NODE_LABEL;
        // A kwok worker left tainted: the taint goes, and the run taints it again as usual.
        assert!(outside_a_run(false, std::slice::from_ref(&elsewhere)).is_empty());
        // The real node left bare: its own taint comes back, for the run's end to restore.
        let real = outside_a_run(true, &[]);
        assert_eq!(
            (
                real[0].key.as_str(),
                real[0].value.as_deref(),
                real[0].effect.as_str()
            ),
            (key, Some(value), "NoSchedule")
        );
        assert_eq!(outside_a_run(true, &real), real, "nothing to put right");
        assert_eq!(suite_taints(true, &real), Some(vec![]));
    }

    #[test]
    fn a_minor_names_one_of_the_built_releases() {
        let [newest, previous, oldest] = bins::supported_kubernetes_versions();
        assert_eq!(release(None).unwrap(), newest);
        let minor = |v: &str| {
            v.trim_start_matches('v')
                .rsplit_once('.')
                .unwrap()
                .0
                .to_owned()
        };
        assert_eq!(release(Some(&minor(previous))).unwrap(), previous);
        assert_eq!(
            release(Some(&format!("v{}", minor(oldest)))).unwrap(),
            oldest
        );
        assert!(release(Some("1.3")).is_err(), "1.3 is not 1.35");
        assert!(release(Some("1.99")).is_err());
    }
}
