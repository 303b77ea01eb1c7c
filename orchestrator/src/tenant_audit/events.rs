//! What a tenant apiserver's audit webhook sends, made into rows (pure).
//!
//! body (an `audit.k8s.io/v1` `EventList`, as the webhook's batch mode posts it) ->
//! [`parse_batch`] -> one [`EventRow`] per event of a stage vcp keeps, each with the columns the
//! owner filters by and the event itself, bounded and without secrets ([`stored_event`]).
//!
//! Nothing in an event says which tenant it is from: the ingest knows that from the token the
//! request carried ([`super::ingest`]), so an event claiming anything about its origin changes
//! nothing. Within the tenant, the apiserver fills every field from the request it served.
//!
//! **Who.** `user` is who authenticated. Under sudo (impersonation) the apiserver records the
//! sudoer as `user` and the identity it acted as as `impersonatedUser`: both are kept. A
//! break-glass certificate's user is `vcp:break-glass:<admin token name>`: the admin is read
//! out of it ([`break_glass_admin`]).

use serde_json::Value;
use time::OffsetDateTime;

/// Most events one batch may hold; the apiserver sends at most 100 (templates).
pub const MAX_BATCH_EVENTS: usize = 1_000;

/// Largest ingest body, in bytes; the apiserver's batches are at most 3 MiB (templates).
pub const MAX_BODY: usize = 4 * 1024 * 1024;

/// Largest event stored, in bytes of JSON; a larger one loses its bodies, then its
/// annotations, then everything but the columns.
pub const MAX_EVENT: usize = 64 * 1024;

/// Longest text column; longer values are cut (at a character boundary).
pub const MAX_TEXT: usize = 1_024;

/// Most groups kept of a user.
pub const MAX_GROUPS: usize = 64;

/// The stages kept: one event per request.
pub const STAGES: [&str; 2] = ["ResponseComplete", "Panic"];

/// The prefix of a break-glass certificate's user (`crate::kubeconfigs`).
pub const BREAK_GLASS_PREFIX: &str = "vcp:break-glass:";

/// One event as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRow {
    pub at: OffsetDateTime,
    pub audit_id: String,
    pub stage: String,
    pub username: String,
    pub groups: Vec<String>,
    pub impersonated_user: Option<String>,
    pub impersonated_groups: Option<Vec<String>>,
    pub verb: String,
    pub api_group: Option<String>,
    pub resource: Option<String>,
    pub subresource: Option<String>,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub request_uri: String,
    pub response_code: Option<i32>,
    pub event: Value,
}

/// A batch that is not an `EventList`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// Not JSON, or not an object with `items`.
    Malformed(String),
    /// More than [`MAX_BATCH_EVENTS`] events.
    TooMany(usize),
}

/// A batch read: the rows to store, and how many events were left out (a stage not kept, or
/// an event without the fields every event has).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Batch {
    pub rows: Vec<EventRow>,
    pub other_stages: usize,
    pub malformed: usize,
}

/// Reads a webhook body.
pub fn parse_batch(body: &[u8]) -> Result<Batch, BatchError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| BatchError::Malformed(e.to_string()))?;
    if v.get("kind").and_then(Value::as_str) != Some("EventList") {
        return Err(BatchError::Malformed(
            "not an audit.k8s.io EventList".into(),
        ));
    }
    let items = v
        .get("items")
        .and_then(Value::as_array)
        .ok_or_else(|| BatchError::Malformed("an EventList without items".into()))?;
    if items.len() > MAX_BATCH_EVENTS {
        return Err(BatchError::TooMany(items.len()));
    }
    let mut out = Batch::default();
    for item in items {
        match row(item) {
            Some(Ok(r)) => out.rows.push(r),
            Some(Err(())) => out.malformed += 1,
            None => out.other_stages += 1,
        }
    }
    Ok(out)
}

fn text(v: &Value) -> Option<String> {
    v.as_str().filter(|s| !s.is_empty()).map(cut)
}

/// `s` cut to [`MAX_TEXT`] bytes at a character boundary.
fn cut(s: &str) -> String {
    if s.len() <= MAX_TEXT {
        return s.to_owned();
    }
    let mut end = MAX_TEXT;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

fn groups(v: &Value) -> Option<Vec<String>> {
    v.as_array().map(|a| {
        a.iter()
            .filter_map(Value::as_str)
            .take(MAX_GROUPS)
            .map(cut)
            .collect()
    })
}

/// One event: `None` for a stage not kept, `Some(Err)` for an event without its identity
/// (audit id, time, verb, user, URI).
pub fn row(e: &Value) -> Option<Result<EventRow, ()>> {
    let stage = e.get("stage").and_then(Value::as_str).unwrap_or_default();
    if !STAGES.contains(&stage) {
        return None;
    }
    Some(kept_row(e, stage).ok_or(()))
}

fn kept_row(e: &Value, stage: &str) -> Option<EventRow> {
    let at = e
        .get("requestReceivedTimestamp")
        .and_then(Value::as_str)
        .and_then(|t| OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).ok())
        // Paging cursors count microseconds from the epoch: none is before it.
        .filter(|t| t.unix_timestamp() >= 0)?;
    let obj = &e["objectRef"];
    Some(EventRow {
        at,
        audit_id: text(&e["auditID"]).filter(|s| s.len() <= 64)?,
        stage: stage.to_owned(),
        username: text(&e["user"]["username"])?,
        groups: groups(&e["user"]["groups"]).unwrap_or_default(),
        impersonated_user: text(&e["impersonatedUser"]["username"]),
        impersonated_groups: groups(&e["impersonatedUser"]["groups"]),
        verb: text(&e["verb"])?,
        api_group: text(&obj["apiGroup"]),
        resource: text(&obj["resource"]),
        subresource: text(&obj["subresource"]),
        namespace: text(&obj["namespace"]),
        name: text(&obj["name"]),
        request_uri: text(&e["requestURI"])?,
        response_code: e["responseStatus"]["code"]
            .as_i64()
            .and_then(|c| i32::try_from(c).ok()),
        event: stored_event(e),
    })
}

/// Whether an event is about Secrets (in the core group): its bodies are never stored, even
/// if a policy sent them.
fn about_secrets(e: &Value) -> bool {
    let obj = &e["objectRef"];
    obj["resource"] == "secrets" && obj["apiGroup"].as_str().unwrap_or_default().is_empty()
}

fn size(v: &Value) -> usize {
    serde_json::to_vec(v).map_or(usize::MAX, |b| b.len())
}

/// The event as stored: without a Secret's request and response bodies, and at most
/// [`MAX_EVENT`] bytes (dropping the bodies, then the annotations, then all but the
/// identifying fields, in that order, until it fits).
pub fn stored_event(e: &Value) -> Value {
    let mut e = e.clone();
    let strip = |e: &mut Value, keys: &[&str]| {
        if let Some(o) = e.as_object_mut() {
            for k in keys {
                o.remove(*k);
            }
        }
    };
    if about_secrets(&e) {
        strip(&mut e, &["requestObject", "responseObject"]);
    }
    if size(&e) > MAX_EVENT {
        strip(&mut e, &["requestObject", "responseObject"]);
    }
    if size(&e) > MAX_EVENT {
        strip(&mut e, &["annotations", "userAgent", "sourceIPs"]);
    }
    if size(&e) > MAX_EVENT {
        let keep = [
            "kind",
            "apiVersion",
            "level",
            "auditID",
            "stage",
            "verb",
            "requestReceivedTimestamp",
            "stageTimestamp",
        ];
        let mut small = serde_json::Map::new();
        for k in keep {
            if let Some(v) = e.get(k) {
                small.insert(k.to_owned(), v.clone());
            }
        }
        small.insert("truncated".to_owned(), Value::Bool(true));
        e = Value::Object(small);
    }
    e
}

/// The admin token's name a break-glass user was issued to (`vcp:break-glass:<name>`).
pub fn break_glass_admin(user: &str) -> Option<&str> {
    user.strip_prefix(BREAK_GLASS_PREFIX)
        .filter(|n| !n.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ResponseComplete event of `user` doing `verb` on `resource`.
    fn event(id: &str, user: &str, verb: &str, resource: &str) -> Value {
        json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": id, "stage": "ResponseComplete",
            "requestURI": format!("/api/v1/namespaces/a/{resource}"), "verb": verb,
            "user": {"username": user, "groups": ["edit", "system:authenticated"]},
            "objectRef": {"resource": resource, "namespace": "a", "name": "x", "apiVersion": "v1"},
            "responseStatus": {"metadata": {}, "code": 201},
            "requestReceivedTimestamp": "2026-03-01T12:00:00.123456Z",
            "stageTimestamp": "2026-03-01T12:00:00.200000Z",
        })
    }

    fn list(items: Vec<Value>) -> Vec<u8> {
        serde_json::to_vec(
            &json!({"kind": "EventList", "apiVersion": "audit.k8s.io/v1", "items": items}),
        )
        .unwrap()
    }

    #[test]
    fn an_event_becomes_a_row_with_its_user_verb_and_object() {
        let b = parse_batch(&list(vec![event("a1", "dave", "create", "configmaps")])).unwrap();
        assert_eq!((b.other_stages, b.malformed), (0, 0));
        let r = &b.rows[0];
        assert_eq!(r.audit_id, "a1");
        assert_eq!(r.username, "dave");
        assert_eq!(r.groups, ["edit", "system:authenticated"]);
        assert_eq!(r.impersonated_user, None);
        assert_eq!(r.verb, "create");
        assert_eq!(r.resource.as_deref(), Some("configmaps"));
        assert_eq!(r.api_group, None, "the core group is empty");
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref()),
            (Some("a"), Some("x"))
        );
        assert_eq!(r.response_code, Some(201));
        assert_eq!(r.at.unix_timestamp(), 1_772_366_400);
        assert_eq!(r.at.microsecond(), 123_456);
        assert_eq!(r.event["auditID"], "a1");
    }

    #[test]
    fn sudo_keeps_the_real_user_beside_the_identity_it_acted_as() {
        let mut e = event("s1", "dave", "create", "namespaces");
        e["impersonatedUser"] = json!({"username": "dave", "groups": ["vcp:sudo"]});
        let r = row(&e).unwrap().unwrap();
        assert_eq!(r.username, "dave");
        assert_eq!(r.impersonated_user.as_deref(), Some("dave"));
        assert_eq!(r.impersonated_groups, Some(vec!["vcp:sudo".to_owned()]));
        assert_eq!(
            break_glass_admin("vcp:break-glass:ops-admin"),
            Some("ops-admin")
        );
        assert_eq!(break_glass_admin("vcp:break-glass:"), None);
        assert_eq!(break_glass_admin("dave"), None);
    }

    #[test]
    fn only_completed_requests_are_kept_and_broken_events_are_counted_not_fatal() {
        let mut started = event("w1", "dave", "watch", "pods");
        started["stage"] = json!("ResponseStarted");
        let mut panic = event("p1", "dave", "get", "pods");
        panic["stage"] = json!("Panic");
        let mut no_user = event("n1", "dave", "get", "pods");
        no_user["user"] = json!({});
        let mut bad_time = event("t1", "dave", "get", "pods");
        bad_time["requestReceivedTimestamp"] = json!("yesterday");
        let mut long_id = event(&"x".repeat(65), "dave", "get", "pods");
        long_id["verb"] = json!("get");
        let b = parse_batch(&list(vec![
            event("a1", "dave", "get", "pods"),
            started,
            panic,
            no_user,
            bad_time,
            long_id,
        ]))
        .unwrap();
        assert_eq!(b.rows.len(), 2);
        assert_eq!(b.rows[1].stage, "Panic");
        assert_eq!((b.other_stages, b.malformed), (1, 3));
    }

    #[test]
    fn what_is_not_an_event_list_is_refused_whole() {
        for body in [
            &b"not json"[..],
            br#"{"kind": "Event"}"#,
            br#"{"kind": "EventList"}"#,
            br#"{"kind": "EventList", "items": {}}"#,
            br#"[]"#,
        ] {
            assert!(
                matches!(parse_batch(body), Err(BatchError::Malformed(_))),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        let many = list(vec![event("a", "u", "get", "pods"); MAX_BATCH_EVENTS + 1]);
        assert_eq!(
            parse_batch(&many),
            Err(BatchError::TooMany(MAX_BATCH_EVENTS + 1))
        );
        let most = list(vec![event("a", "u", "get", "pods"); MAX_BATCH_EVENTS]);
        assert_eq!(parse_batch(&most).unwrap().rows.len(), MAX_BATCH_EVENTS);
    }

    #[test]
    fn a_secrets_body_is_never_stored_and_events_stay_bounded() {
        let mut e = event("s", "dave", "create", "secrets");
        e["requestObject"] = json!({"data": {"password": "aHVudGVyMg=="}});
        e["responseObject"] = json!({"data": {"password": "aHVudGVyMg=="}});
        let stored = row(&e).unwrap().unwrap().event;
        assert!(!stored.to_string().contains("aHVudGVyMg"), "{stored}");
        assert_eq!(stored["objectRef"]["resource"], "secrets");
        // An RBAC write keeps its bodies (the default policy asks for them).
        let mut rb = event("r", "dave", "create", "rolebindings");
        rb["objectRef"]["apiGroup"] = json!("rbac.authorization.k8s.io");
        rb["requestObject"] = json!({"roleRef": {"name": "admin"}});
        assert_eq!(
            stored_event(&rb)["requestObject"]["roleRef"]["name"],
            "admin"
        );
        // Too large: the bodies go first, then the rest.
        let mut big = event("b", "dave", "update", "configmaps");
        big["requestObject"] = json!({"data": {"k": "x".repeat(MAX_EVENT)}});
        let s = stored_event(&big);
        assert!(s.get("requestObject").is_none());
        assert_eq!(s["objectRef"]["name"], "x");
        let mut huge = event("h", "dave", "update", "configmaps");
        huge["objectRef"]["name"] = json!("x".repeat(MAX_EVENT));
        let s = stored_event(&huge);
        assert!(serde_json::to_vec(&s).unwrap().len() <= MAX_EVENT);
        assert_eq!(s["truncated"], true);
        assert_eq!(s["auditID"], "h");
        // Text columns are cut, at a character boundary.
        let r = row(&huge).unwrap().unwrap();
        assert_eq!(r.name.as_deref().map(str::len), Some(MAX_TEXT));
        assert_eq!(cut(&"é".repeat(MAX_TEXT)).len(), MAX_TEXT);
    }
}
