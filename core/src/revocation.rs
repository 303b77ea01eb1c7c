//! Revocable kubeconfigs: what the orchestrator and the tenant's revocation authorizer agree on.
//!
//! Data flow: every kubeconfig vcp issues carries, beside the user's own groups, one group
//! naming its certificate's serial ([`group_of`]). When an owner revokes it, the orchestrator
//! records that in its inventory and writes the tenant's revoked serials ([`render_list`]) to
//! the ConfigMap [`CONFIGMAP`] in the tenant's control-plane namespace on the host. The
//! authorizer, a sidecar in the tenant apiserver's own pod (`vcp-syncer authorize`), reads
//! that ConfigMap ([`parse_list`]) from its volume and from a watch, and answers the
//! apiserver's authorization webhook on the pod's loopback ([`AUTHORIZER_LISTEN`],
//! [`WEBHOOK_PATH`]): a request whose groups name a revoked serial is denied ([`decide`]),
//! anything else gets no opinion and goes on to RBAC. The apiserver calls the webhook only for
//! requests that carry such a group ([`MATCH_CONDITION`]), so the tenant's own components and
//! service accounts never depend on it, and refuses those requests when it cannot answer.
//!
//! Pure: strings in, decisions out.

use std::collections::BTreeSet;

/// The prefix of the group that names a kubeconfig's certificate serial.
pub const GROUP_PREFIX: &str = "vcp:kubeconfig:";

/// The host ConfigMap, in the tenant's control-plane namespace, holding its revoked serials.
pub const CONFIGMAP: &str = "vcp-revocations";

/// The ConfigMap key: one serial per line.
pub const KEY: &str = "serials";

/// The path of the authorization webhook the authorizer serves.
pub const WEBHOOK_PATH: &str = "/vcp/authorize";

/// Where the authorizer listens: the loopback of the apiserver's pod, which only the pod's own
/// containers reach, so the webhook is plain HTTP and needs no certificate of its own.
pub const AUTHORIZER_LISTEN: &str = "127.0.0.1:10262";

/// The URL the tenant apiserver calls the authorizer at.
pub fn authorizer_url() -> String {
    format!("http://{AUTHORIZER_LISTEN}{WEBHOOK_PATH}")
}

/// The directory, shared by the apiserver's and the authorizer's containers (an emptyDir),
/// that holds [`egress_socket`].
pub const EGRESS_DIR: &str = "/run/vcp-egress";

/// The Unix socket on which the authorizer relays the apiserver's control-plane egress
/// (`vcp-syncer authorize --egress-socket`): the apiserver dials its authorization webhook and
/// webhooks by URL through it, and its egress configuration names it.
pub fn egress_socket() -> String {
    format!("{EGRESS_DIR}/controlplane.sock")
}

/// The CEL condition the tenant apiserver evaluates before calling the webhook.
pub const MATCH_CONDITION: &str =
    "has(request.groups) && request.groups.exists(g, g.startsWith('vcp:kubeconfig:'))";

/// The group a kubeconfig with certificate serial `serial` (lowercase hex) carries.
pub fn group_of(serial: &str) -> String {
    format!("{GROUP_PREFIX}{serial}")
}

/// The pattern of [`is_serial`], for documents that state it (2 to 64 characters).
pub const SERIAL_PATTERN: &str = "^[0-9a-f]+$";
/// The length bounds of a serial.
pub const SERIAL_LEN: (usize, usize) = (2, 64);

/// A serial as the inventory and the group write it: lowercase hex, 2 to 64 digits.
pub fn is_serial(s: &str) -> bool {
    (SERIAL_LEN.0..=SERIAL_LEN.1).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The ConfigMap value for a set of revoked serials: sorted, one per line, so equal sets give
/// equal text and an unchanged list is not rewritten.
pub fn render_list<'a>(serials: impl IntoIterator<Item = &'a str>) -> String {
    let set: BTreeSet<&str> = serials.into_iter().collect();
    let mut out = String::new();
    for s in set {
        out.push_str(s);
        out.push('\n');
    }
    out
}

/// The revoked serials in a ConfigMap value. Lines that are not serials are ignored: only vcp
/// writes the list, and a stray line must not make every answer fail.
pub fn parse_list(text: &str) -> BTreeSet<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| is_serial(l))
        .map(str::to_owned)
        .collect()
}

/// What the webhook answers for a request by a user in `groups`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Refused: the request's credential names this revoked serial.
    Denied { serial: String },
    /// Not this authorizer's business: RBAC decides.
    NoOpinion,
}

/// Denies a request whose groups name any revoked serial.
pub fn decide<'a>(
    groups: impl IntoIterator<Item = &'a str>,
    revoked: &BTreeSet<String>,
) -> Decision {
    for g in groups {
        if let Some(serial) = g.strip_prefix(GROUP_PREFIX)
            && revoked.contains(serial)
        {
            return Decision::Denied {
                serial: serial.to_owned(),
            };
        }
    }
    Decision::NoOpinion
}

/// The reason a denied request's user reads (kubectl prints it after "forbidden:").
pub fn denied_reason(serial: &str) -> String {
    format!(
        "the kubeconfig with certificate serial {serial} was revoked; ask the tenant's owner for a new one"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_revoked_serial_is_denied_and_others_get_no_opinion() {
        let revoked = parse_list("0abc\n\nnot a serial\n  ff01  \n");
        assert_eq!(revoked.len(), 2);
        assert_eq!(
            decide(["edit", &group_of("ff01")].map(|s| s as &str), &revoked),
            Decision::Denied {
                serial: "ff01".into()
            }
        );
        assert_eq!(
            decide(["edit", &group_of("ff02")].map(|s| s as &str), &revoked),
            Decision::NoOpinion
        );
        // A user or a group that merely contains a serial is not the credential's group.
        assert_eq!(
            decide(["ff01", "x:vcp:kubeconfig:ff01"], &revoked),
            Decision::NoOpinion
        );
        assert_eq!(decide([], &revoked), Decision::NoOpinion);
    }

    #[test]
    fn the_authorizer_is_called_on_the_pods_loopback() {
        assert_eq!(authorizer_url(), "http://127.0.0.1:10262/vcp/authorize");
    }

    #[test]
    fn the_match_condition_names_the_group_prefix() {
        assert!(MATCH_CONDITION.contains(&format!("'{GROUP_PREFIX}'")));
    }

    proptest! {
        #[test]
        fn a_list_reads_back_as_written(serials in proptest::collection::btree_set("[0-9a-f]{2,40}", 0..20)) {
            let text = render_list(serials.iter().map(String::as_str));
            prop_assert_eq!(parse_list(&text), serials.clone());
            // Order-independent: the same set renders the same text.
            let reversed: Vec<&str> = serials.iter().rev().map(String::as_str).collect();
            prop_assert_eq!(render_list(reversed), text);
        }

        #[test]
        fn every_listed_serial_is_denied(serials in proptest::collection::btree_set("[0-9a-f]{2,40}", 1..10)) {
            let revoked = parse_list(&render_list(serials.iter().map(String::as_str)));
            for s in &serials {
                let g = group_of(s);
                prop_assert_eq!(decide([g.as_str()], &revoked), Decision::Denied { serial: s.clone() });
            }
        }
    }
}
