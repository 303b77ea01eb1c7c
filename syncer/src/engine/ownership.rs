//! Field ownership of the syncer's host objects, for server-side apply (pure).
//!
//! The syncer creates a host object with a plain create (so a name someone else holds is never
//! overwritten: the create fails, see [`super::create_or_adopt`]) and changes it afterwards with
//! server-side apply. The apiserver records the create as an `Update` by the syncer's field
//! manager, and fields an `Update` owns are never removed by a later apply that leaves them
//! out: a port, label or data key the tenant deleted would stay on the host. So the first
//! apply that finds such an entry hands its fields over to the syncer's `Apply` entry
//! ([`handover`]) and applies again, after which leaving a field out removes it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Value, json};

/// A JSON patch that moves the fields of `manager`'s `Update` entry (of the object itself, not
/// a subresource) into its `Apply` entry, or makes that entry an `Apply` one if it has none;
/// `None` when there is no such entry. Each step is guarded by `test` operations on the entries
/// it touches, so a patch made from a stale view of the object fails instead of mangling
/// another writer's entry.
pub fn handover(entries: &[ManagedFieldsEntry], manager: &str) -> Option<Value> {
    let ours = |e: &ManagedFieldsEntry, op: &str| {
        e.manager.as_deref() == Some(manager)
            && e.operation.as_deref() == Some(op)
            && e.subresource.as_deref().unwrap_or_default().is_empty()
    };
    let update = entries.iter().position(|e| ours(e, "Update"))?;
    let test = |i: usize, op: &str| {
        [
            json!({"op": "test", "path": format!("/metadata/managedFields/{i}/manager"), "value": manager}),
            json!({"op": "test", "path": format!("/metadata/managedFields/{i}/operation"), "value": op}),
        ]
    };
    let mut ops: Vec<Value> = test(update, "Update").into();
    match entries.iter().position(|e| ours(e, "Apply")) {
        None => ops.push(json!({
            "op": "replace",
            "path": format!("/metadata/managedFields/{update}/operation"),
            "value": "Apply",
        })),
        Some(apply) => {
            ops.extend(test(apply, "Apply"));
            let field_set = |e: &ManagedFieldsEntry| {
                e.fields_v1
                    .as_ref()
                    .map_or_else(|| json!({}), |f| f.0.clone())
            };
            let mut merged = field_set(&entries[apply]);
            union(&mut merged, &field_set(&entries[update]));
            ops.push(json!({
                "op": "replace",
                "path": format!("/metadata/managedFields/{apply}/fieldsV1"),
                "value": merged,
            }));
            ops.push(json!({"op": "remove", "path": format!("/metadata/managedFields/{update}")}));
        }
    }
    Some(Value::Array(ops))
}

/// Adds field set `b` to field set `a` (both in the `FieldsV1` trie form: objects keyed by
/// `f:`, `k:`, `v:` and `.`).
fn union(a: &mut Value, b: &Value) {
    let (Value::Object(a), Value::Object(b)) = (a, b) else {
        return;
    };
    for (k, v) in b {
        match a.get_mut(k) {
            Some(existing) => union(existing, v),
            None => {
                a.insert(k.clone(), v.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(manager: &str, op: &str, fields: Value, sub: Option<&str>) -> ManagedFieldsEntry {
        serde_json::from_value(json!({
            "manager": manager, "operation": op, "apiVersion": "v1",
            "fieldsType": "FieldsV1", "fieldsV1": fields, "subresource": sub,
        }))
        .unwrap()
    }

    /// `patch` applied to `{"metadata": {"managedFields": entries}}` (test, replace, remove).
    fn run(entries: &[ManagedFieldsEntry], patch: &Value) -> Result<Vec<Value>, String> {
        let mut doc = json!({"metadata": {"managedFields": entries}});
        for op in patch.as_array().unwrap() {
            let path = op["path"].as_str().unwrap();
            match op["op"].as_str().unwrap() {
                "test" if doc.pointer(path) != Some(&op["value"]) => return Err(path.into()),
                "test" => {}
                "replace" => *doc.pointer_mut(path).unwrap() = op["value"].clone(),
                "remove" => {
                    let (parent, idx) = path.rsplit_once('/').unwrap();
                    let list = doc.pointer_mut(parent).unwrap().as_array_mut().unwrap();
                    list.remove(idx.parse().unwrap());
                }
                other => panic!("{other}"),
            }
        }
        Ok(doc["metadata"]["managedFields"].as_array().unwrap().clone())
    }

    #[test]
    fn the_creates_fields_join_the_apply_entry_and_nothing_else_moves() {
        let created = json!({"f:spec": {"f:ports": {
            "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}},
            "k:{\"port\":80,\"protocol\":\"UDP\"}": {".": {}, "f:name": {}}}}});
        let applied = json!({"f:spec": {"f:ports": {
            "k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:name": {}, "f:targetPort": {}}}},
            "f:metadata": {"f:labels": {"f:app": {}}}});
        let entries = [
            entry(
                "kube-controller-manager",
                "Update",
                json!({"f:status": {}}),
                None,
            ),
            entry(
                "vcp-syncer",
                "Update",
                json!({"f:status": {"f:x": {}}}),
                Some("status"),
            ),
            entry("vcp-syncer", "Apply", applied, None),
            entry("vcp-syncer", "Update", created, None),
        ];
        let patch = handover(&entries, "vcp-syncer").expect("an Update entry of ours");
        let after = run(&entries, &patch).unwrap();
        assert_eq!(after.len(), 3, "the create's entry is gone");
        assert_eq!(
            after[0],
            serde_json::to_value(&entries[0]).unwrap(),
            "not ours"
        );
        assert_eq!(
            after[1],
            serde_json::to_value(&entries[1]).unwrap(),
            "a subresource's"
        );
        let ports = &after[2]["fieldsV1"]["f:spec"]["f:ports"];
        assert!(ports["k:{\"port\":80,\"protocol\":\"UDP\"}"]["f:name"].is_object());
        assert!(ports["k:{\"port\":80,\"protocol\":\"TCP\"}"]["f:targetPort"].is_object());
        assert!(after[2]["fieldsV1"]["f:metadata"]["f:labels"]["f:app"].is_object());
        assert_eq!(
            handover(
                &serde_json::from_value::<Vec<ManagedFieldsEntry>>(Value::Array(after)).unwrap(),
                "vcp-syncer"
            ),
            None,
            "once only"
        );
        // A view of the object that is no longer true fails the tests, and changes nothing.
        let mut moved = entries.to_vec();
        moved.swap(0, 3);
        assert!(run(&moved, &patch).is_err());
    }

    #[test]
    fn an_object_only_created_gets_its_entry_turned_into_an_apply() {
        let entries = [entry(
            "vcp-syncer",
            "Update",
            json!({"f:data": {"f:a": {}}}),
            None,
        )];
        let after = run(&entries, &handover(&entries, "vcp-syncer").unwrap()).unwrap();
        assert_eq!(after[0]["operation"], "Apply");
        assert_eq!(after[0]["fieldsV1"], json!({"f:data": {"f:a": {}}}));
        assert_eq!(handover(&[], "vcp-syncer"), None);
        let theirs = [entry("someone", "Update", json!({}), None)];
        assert_eq!(handover(&theirs, "vcp-syncer"), None);
    }
}
