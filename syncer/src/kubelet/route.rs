//! Kubelet API calls of the tenant apiserver -> host apiserver subresources (pure).
//!
//! The tenant apiserver serves `pods/log`, `pods/exec`, `pods/attach` and `pods/portforward` by
//! calling the kubelet of the pod's node at paths of the kubelet API, with the tenant's
//! namespace and pod name in them. [`parse`] reads such a path and query into a [`Call`];
//! [`Call::host_uri`] names the same call on the host apiserver, as the subresource of the
//! pod's host copy (`<key>-<namespace>`, same name). Only those four calls exist here: every
//! other kubelet path (`/run`, `/pods`, `/configz`, `/debug`, stats) is refused, so nothing
//! about the host node or other tenants can be asked through this endpoint.
//!
//! Query parameters are translated one by one (the kubelet's `input`/`output`/`error` are the
//! apiserver's `stdin`/`stdout`/`stderr`, `port` is `ports`); parameters a call does not take
//! are dropped, never passed on.

use std::fmt;
use vcp_core::naming::{self, TenantKey};

/// Which subresource a call is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Logs,
    Exec,
    Attach,
    PortForward,
}

impl Kind {
    /// The host apiserver's subresource name.
    pub fn subresource(self) -> &'static str {
        match self {
            Kind::Logs => "log",
            Kind::Exec => "exec",
            Kind::Attach => "attach",
            Kind::PortForward => "portforward",
        }
    }

    /// Whether the call is a streaming upgrade (SPDY or WebSocket) rather than a plain body.
    pub fn upgrades(self) -> bool {
        !matches!(self, Kind::Logs)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.subresource())
    }
}

/// One kubelet API call, in the tenant's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub kind: Kind,
    pub namespace: String,
    pub pod: String,
    /// The tenant pod's UID when the path names it (`/exec/<ns>/<pod>/<uid>/<container>`).
    pub uid: Option<String>,
    pub container: Option<String>,
    /// The host apiserver's query parameters, in order.
    pub query: Vec<(String, String)>,
}

/// Why a request is not a call this endpoint serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error("no such kubelet call: {0}")]
    NotFound(String),
    #[error("{what} {value:?} is not a valid name")]
    BadName { what: &'static str, value: String },
}

/// Reads a kubelet API request (`path` without the query, `query` as sent).
pub fn parse(path: &str, query: Option<&str>) -> Result<Call, Refused> {
    let not_found = || Refused::NotFound(path.to_owned());
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (kind, rest) = match parts.split_first() {
        Some((&"containerLogs", rest)) => (Kind::Logs, rest),
        Some((&"exec", rest)) => (Kind::Exec, rest),
        Some((&"attach", rest)) => (Kind::Attach, rest),
        Some((&"portForward", rest)) => (Kind::PortForward, rest),
        _ => return Err(not_found()),
    };
    // ns/pod[/uid]/container, or ns/pod[/uid] for port forwarding.
    let (ns, pod, uid, container) = match (kind, rest) {
        (Kind::PortForward, [ns, pod]) => (ns, pod, None, None),
        (Kind::PortForward, [ns, pod, uid]) => (ns, pod, Some(uid), None),
        (Kind::Logs, [ns, pod, c]) => (ns, pod, None, Some(c)),
        (Kind::Exec | Kind::Attach, [ns, pod, c]) => (ns, pod, None, Some(c)),
        (Kind::Exec | Kind::Attach, [ns, pod, uid, c]) => (ns, pod, Some(uid), Some(c)),
        _ => return Err(not_found()),
    };
    let checked = |what: &'static str, value: &str, subdomain: bool| -> Result<String, Refused> {
        let max = if subdomain {
            naming::MAX_SUBDOMAIN
        } else {
            naming::MAX_NAMESPACE
        };
        if is_dns_name(value, max) && (subdomain || !value.contains('.')) {
            Ok(value.to_owned())
        } else {
            Err(Refused::BadName {
                what,
                value: value.to_owned(),
            })
        }
    };
    let namespace = checked("namespace", ns, false)?;
    let pod = checked("pod", pod, true)?;
    let container = container
        .map(|c| checked("container", c, false))
        .transpose()?;
    let uid = uid.map(|u| checked("uid", u, false)).transpose()?;
    let mut out = Vec::new();
    if let Some(c) = &container {
        out.push(("container".to_owned(), c.clone()));
    }
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        out.extend(translate_param(kind, &k, &v));
    }
    Ok(Call {
        kind,
        namespace,
        pod,
        uid,
        container,
        query: out,
    })
}

/// The host apiserver's parameters for one kubelet parameter of a call (none if dropped).
fn translate_param(kind: Kind, k: &str, v: &str) -> Vec<(String, String)> {
    let flag = |name: &str| {
        let on = matches!(v, "1" | "true" | "True");
        vec![(name.to_owned(), on.to_string())]
    };
    match (kind, k) {
        (
            Kind::Logs,
            "follow" | "previous" | "timestamps" | "sinceSeconds" | "sinceTime" | "tailLines"
            | "limitBytes",
        ) => vec![(k.to_owned(), v.to_owned())],
        (Kind::Exec | Kind::Attach, "input" | "stdin") => flag("stdin"),
        (Kind::Exec | Kind::Attach, "output" | "stdout") => flag("stdout"),
        (Kind::Exec | Kind::Attach, "error" | "stderr") => flag("stderr"),
        (Kind::Exec | Kind::Attach, "tty") => flag("tty"),
        (Kind::Exec, "command") => vec![("command".to_owned(), v.to_owned())],
        (Kind::PortForward, "port" | "ports") => v
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| ("ports".to_owned(), p.to_owned()))
            .collect(),
        _ => Vec::new(),
    }
}

/// Whether `s` is a lowercase DNS name (labels of `[a-z0-9-]` joined by dots) of at most `max`
/// characters: what namespace, pod and container names are, and nothing that could step out
/// of a path segment.
fn is_dns_name(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.split('.').all(|l| {
            !l.is_empty()
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

impl Call {
    /// The host namespace of the call's pod.
    pub fn host_namespace(&self, key: &TenantKey) -> String {
        naming::host_namespace(key, &self.namespace)
    }

    /// Path and query of the same call on the host apiserver.
    pub fn host_uri(&self, key: &TenantKey) -> String {
        let mut q = form_urlencoded::Serializer::new(String::new());
        for (k, v) in &self.query {
            q.append_pair(k, v);
        }
        let q = q.finish();
        let mut uri = format!(
            "/api/v1/namespaces/{}/pods/{}/{}",
            self.host_namespace(key),
            self.pod,
            self.kind.subresource()
        );
        if !q.is_empty() {
            uri.push('?');
            uri.push_str(&q);
        }
        uri
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> TenantKey {
        TenantKey::new("demo").unwrap()
    }

    #[test]
    fn exec_becomes_the_host_pods_exec_with_the_apiservers_parameter_names() {
        let c = parse(
            "/exec/apps/web-0/app",
            Some("command=sh&command=-c&command=echo+hi&input=1&output=1&error=1&tty=1"),
        )
        .unwrap();
        assert_eq!(c.kind, Kind::Exec);
        assert_eq!(
            c.host_uri(&key()),
            "/api/v1/namespaces/demo-apps/pods/web-0/exec?container=app&command=sh&command=-c\
             &command=echo+hi&stdin=true&stdout=true&stderr=true&tty=true"
        );
    }

    #[test]
    fn logs_keep_their_options_and_drop_everything_else() {
        let c = parse(
            "/containerLogs/apps/web-0/side",
            Some("follow=true&tailLines=5&previous=true&limitBytes=10&insecureSkipTLSVerifyBackend=true&x=1"),
        )
        .unwrap();
        assert_eq!(
            c.host_uri(&key()),
            "/api/v1/namespaces/demo-apps/pods/web-0/log?container=side&follow=true&tailLines=5&previous=true&limitBytes=10"
        );
        assert!(!c.kind.upgrades());
    }

    #[test]
    fn port_forward_and_attach_with_and_without_a_uid() {
        let pf = parse("/portForward/apps/web-0", Some("port=8080,9090")).unwrap();
        assert_eq!(
            pf.host_uri(&key()),
            "/api/v1/namespaces/demo-apps/pods/web-0/portforward?ports=8080&ports=9090"
        );
        let pf = parse("/portForward/apps/web-0/0b9e-11", None).unwrap();
        assert_eq!(pf.uid.as_deref(), Some("0b9e-11"));
        assert_eq!(
            pf.host_uri(&key()),
            "/api/v1/namespaces/demo-apps/pods/web-0/portforward"
        );
        let at = parse("/attach/apps/web-0/u1/app", Some("output=1&command=rm")).unwrap();
        assert_eq!(
            (at.uid.as_deref(), at.container.as_deref()),
            (Some("u1"), Some("app"))
        );
        assert_eq!(
            at.host_uri(&key()),
            "/api/v1/namespaces/demo-apps/pods/web-0/attach?container=app&stdout=true",
            "attach takes no command"
        );
    }

    #[test]
    fn other_kubelet_paths_and_odd_names_are_refused() {
        for path in [
            "/run/apps/web-0/app",
            "/pods",
            "/stats/summary",
            "/configz",
            "/logs/",
            "/exec/apps/web-0",
            "/exec/apps/web-0/a/b/c",
            "/containerLogs/apps/web-0/u1/app",
            "/portForward/apps",
        ] {
            assert!(
                matches!(parse(path, None), Err(Refused::NotFound(_))),
                "{path}"
            );
        }
        for path in [
            "/exec/../web-0/app",
            "/exec/apps/%2e%2e/app",
            "/exec/Apps/web-0/app",
            "/exec/apps/web-0/",
            "/containerLogs/apps/-x/app",
            "/exec/a.b/web-0/app",
        ] {
            assert!(
                matches!(parse(path, None), Err(Refused::BadName { .. })),
                "{path}"
            );
        }
    }

    proptest! {
        /// Whatever the tenant's apiserver asks, a call lands on a pod subresource in one of
        /// the tenant's own host namespaces, with names that cannot leave their path segment.
        #[test]
        fn every_call_stays_inside_the_tenants_host_namespaces(
            rest in "[a-z0-9.%/-]{1,40}", q in ".{0,40}",
        ) {
            for kind in ["exec", "attach", "containerLogs", "portForward"] {
                if let Ok(c) = parse(&format!("/{kind}/{rest}"), Some(&q)) {
                    let uri = c.host_uri(&key());
                    let want = format!(
                        "/api/v1/namespaces/demo-{}/pods/{}/{}",
                        c.namespace, c.pod, c.kind.subresource()
                    );
                    prop_assert!(uri.starts_with(&want), "{uri}");
                    let fields = [Some(&c.namespace), Some(&c.pod), c.container.as_ref(), c.uid.as_ref()];
                    for f in fields.into_iter().flatten() {
                        prop_assert!(f.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'), "{f}");
                        prop_assert!(f.as_str() != "." && f.as_str() != "..");
                    }
                }
            }
        }
    }
}
