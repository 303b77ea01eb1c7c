//! The devnode's resource metrics: what a kubelet serves on `/metrics/resource` and
//! metrics-server scrapes for `kubectl top`, here measured on the processes the devnode runs.
//!
//! Data flow: for every running container of a pod bound here, its process (the status'
//! `containerID`, `devnode://<pid>`) and that process's descendants are read from `/proc`
//! ([`sample`]): CPU time (the scheduler's nanoseconds on a CPU, from `schedstat`; the
//! 10 ms ticks of `stat` where that is missing) and resident memory, which stands in for the
//! working set. Nanoseconds matter: metrics-server drops a whole pod when one container reports
//! exactly zero CPU, which a sleeping process does in ticks. The node's figures are the sums over its containers: the devnode shares the
//! machine with everything else, and the rest of the machine is not its load. [`render`] writes
//! the Prometheus text metrics-server reads (pure).

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Nanoseconds per clock tick of `/proc/<pid>/stat` times (USER_HZ is 100 in Linux's ABI).
const NANOS_PER_TICK: u64 = 10_000_000;

/// One container's usage.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU time since the process started, in seconds.
    pub cpu_seconds: f64,
    /// Resident memory, in bytes.
    pub memory_bytes: u64,
}

impl Usage {
    fn plus(self, o: Usage) -> Usage {
        Usage {
            cpu_seconds: self.cpu_seconds + o.cpu_seconds,
            memory_bytes: self.memory_bytes + o.memory_bytes,
        }
    }
}

/// A running container and its usage.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    /// When the container started, in seconds since the epoch.
    pub started: f64,
    pub usage: Usage,
}

/// From `/proc/<pid>/stat`: the parent pid and the CPU ticks (utime + stime).
pub fn parse_stat(stat: &str) -> Option<(u32, u64)> {
    // The command name is in parentheses and may hold spaces or parentheses itself.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(0) ppid(1) ... utime(11) stime(12).
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// From `/proc/<pid>/status`: resident memory in bytes (`VmRSS`, in kB there).
pub fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `root` and every descendant of it, given each process's parent.
pub fn tree(root: u32, parents: &BTreeMap<u32, u32>) -> Vec<u32> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        out.extend(
            parents
                .iter()
                .filter(|&(&child, &parent)| parent == p && child != p)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    out
}

/// Every process's (parent, CPU nanoseconds, resident bytes), read from `/proc`.
fn processes() -> BTreeMap<u32, (u32, u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let Some((ppid, ticks)) = parse_stat(&stat) else {
            continue;
        };
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let nanos = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
            .ok()
            .and_then(|s| parse_schedstat(&s))
            .unwrap_or(0)
            .max(ticks * NANOS_PER_TICK);
        out.insert(pid, (ppid, nanos, parse_rss(&status).unwrap_or(0)));
    }
    out
}

/// From `/proc/<pid>/schedstat`: nanoseconds spent on a CPU.
pub fn parse_schedstat(schedstat: &str) -> Option<u64> {
    schedstat.split_whitespace().next()?.parse().ok()
}

/// The usage of each `(pid, container)`: the process and its descendants.
pub fn sample<T: Clone>(roots: &[(u32, T)]) -> Vec<(T, Usage)> {
    let procs = processes();
    let parents: BTreeMap<u32, u32> = procs.iter().map(|(p, (pp, _, _))| (*p, *pp)).collect();
    roots
        .iter()
        .filter(|(pid, _)| procs.contains_key(pid))
        .map(|(pid, t)| {
            let usage = tree(*pid, &parents)
                .iter()
                .filter_map(|p| procs.get(p))
                .fold(Usage::default(), |acc, (_, nanos, rss)| {
                    acc.plus(Usage {
                        // Below 2^52 ns (52 days of CPU) exact as f64, and close beyond.
                        #[allow(clippy::cast_precision_loss)]
                        cpu_seconds: *nanos as f64 / 1e9,
                        memory_bytes: *rss,
                    })
                });
            // A process that exists has run, if too briefly to measure: never exactly zero,
            // which would make metrics-server drop the pod.
            let cpu_seconds = usage.cpu_seconds.max(1e-9);
            (
                t.clone(),
                Usage {
                    cpu_seconds,
                    ..usage
                },
            )
        })
        .collect()
}

/// A container series: its name, its Prometheus type and its value.
type Series = (&'static str, &'static str, fn(&ContainerUsage) -> String);

/// Prometheus text of `containers` and their node's sums at `now_ms` (milliseconds since the
/// epoch), as a kubelet's `/metrics/resource` has them.
pub fn render(containers: &[ContainerUsage], now_ms: i64) -> String {
    let node = containers
        .iter()
        .fold(Usage::default(), |acc, c| acc.plus(c.usage));
    let mut out = String::new();
    let labels = |c: &ContainerUsage| {
        format!(
            "container=\"{}\",namespace=\"{}\",pod=\"{}\"",
            c.container, c.namespace, c.pod
        )
    };
    let _ = writeln!(out, "# TYPE node_cpu_usage_seconds_total counter");
    let _ = writeln!(
        out,
        "node_cpu_usage_seconds_total {} {now_ms}",
        node.cpu_seconds
    );
    let _ = writeln!(out, "# TYPE node_memory_working_set_bytes gauge");
    let _ = writeln!(
        out,
        "node_memory_working_set_bytes {} {now_ms}",
        node.memory_bytes
    );
    let series: [Series; 3] = [
        ("container_cpu_usage_seconds_total", "counter", |c| {
            c.usage.cpu_seconds.to_string()
        }),
        ("container_memory_working_set_bytes", "gauge", |c| {
            c.usage.memory_bytes.to_string()
        }),
        ("container_start_time_seconds", "gauge", |c| {
            c.started.to_string()
        }),
    ];
    for (name, kind, value) in series {
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for c in containers {
            let _ = writeln!(out, "{name}{{{}}} {} {now_ms}", labels(c), value(c));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_give_the_parent_and_cpu_ticks_even_with_odd_names() {
        let stat = "4242 (kube apiserver (x)) S 17 4242 4242 0 -1 4194560 1 0 0 0 150 25 0 0 20 0 12 0 100 0 0";
        assert_eq!(parse_stat(stat), Some((17, 175)));
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn schedstat_gives_nanoseconds_on_a_cpu() {
        assert_eq!(parse_schedstat("123456789 2000 15\n"), Some(123_456_789));
        assert_eq!(parse_schedstat(""), None);
    }

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\tetcd\nVmPeak:\t 9000 kB\nVmRSS:\t   2048 kB\nThreads:\t9\n";
        assert_eq!(parse_rss(status), Some(2048 * 1024));
        assert_eq!(parse_rss("Name:\tkthreadd\n"), None);
    }

    #[test]
    fn a_tree_holds_the_root_and_every_descendant_only() {
        let parents = BTreeMap::from([(1, 0), (10, 1), (11, 10), (12, 11), (20, 1), (21, 20)]);
        let mut t = tree(10, &parents);
        t.sort_unstable();
        assert_eq!(t, [10, 11, 12]);
        assert_eq!(tree(12, &parents), [12]);
    }

    #[test]
    fn the_text_has_every_series_metrics_server_reads_and_node_sums() {
        let c = |pod: &str, cpu: f64, mem: u64| ContainerUsage {
            namespace: "vcp-x".into(),
            pod: pod.into(),
            container: "etcd".into(),
            started: 1_700_000_000.0,
            usage: Usage {
                cpu_seconds: cpu,
                memory_bytes: mem,
            },
        };
        let text = render(
            &[c("etcd-0", 1.5, 1000), c("etcd-1", 2.0, 500)],
            1_700_000_100_000,
        );
        assert!(
            text.contains("node_cpu_usage_seconds_total 3.5 1700000100000\n"),
            "{text}"
        );
        assert!(
            text.contains("node_memory_working_set_bytes 1500 1700000100000\n"),
            "{text}"
        );
        assert!(text.contains(
            "container_cpu_usage_seconds_total{container=\"etcd\",namespace=\"vcp-x\",pod=\"etcd-1\"} 2 1700000100000\n"
        ), "{text}");
        assert!(text.contains("container_memory_working_set_bytes{container=\"etcd\",namespace=\"vcp-x\",pod=\"etcd-0\"} 1000 "), "{text}");
        assert!(text.contains("container_start_time_seconds{container=\"etcd\",namespace=\"vcp-x\",pod=\"etcd-0\"} 1700000000 "), "{text}");
    }

    #[test]
    fn this_process_is_sampled_with_cpu_and_memory() {
        let me = std::process::id();
        let got = sample(&[(me, "me"), (u32::MAX, "gone")]);
        assert_eq!(got.len(), 1, "a pid that does not exist is left out");
        assert!(got[0].1.memory_bytes > 0, "{got:?}");
        assert!(
            got[0].1.cpu_seconds > 0.0,
            "a running test has used some CPU: {got:?}"
        );
    }
}
