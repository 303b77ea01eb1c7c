//! The schemas of the strings the server checks by a rule (names, versions, plans, labels,
//! TTLs, serials), built from the rules' own constants in [`crate::names`] and from the
//! server's versions and plans, so that the OpenAPI document states what the handlers enforce.
//! Each feature's bodies refer to them; [`with_choices`] fills in a server's versions and plans.

use crate::names;
use serde::Deserialize;
use std::borrow::Cow;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{OpenApi, RefOr};
use utoipa::{PartialSchema, ToSchema};

/// A field that is there (even as `null`) is `Some`: tells "set to null" from "absent".
pub fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Declares `$T`, a unit type whose schema is `$build`, named `$name` in the document (so
/// bodies refer to it with `#[schema(value_type = $T)]` and the document holds it once).
macro_rules! named_schema {
    ($(#[$doc:meta])* $T:ident = $name:literal, $build:block) => {
        $(#[$doc])*
        pub struct $T;

        impl PartialSchema for $T {
            fn schema() -> RefOr<Schema> {
                $build
            }
        }

        impl ToSchema for $T {
            fn name() -> Cow<'static, str> {
                $name.into()
            }
        }
    };
}

// Schemas of the strings the server checks by a rule. Each states the rule's pattern and
// lengths from the constants the server's check uses (`crate::names`), so the document and
// the server cannot drift apart; `names` proves each pattern and its check agree.

named_schema!(
    /// The schema of a tenant or token name, `Name` in the document.
    NameSchema = "Name",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A tenant or token name: lowercase letters, digits and `-`, starting with a \
                 letter and not ending with `-`, 1 to {} characters.",
                names::MAX_NAME_LEN
            )))
            .pattern(Some(names::NAME_PATTERN))
            .min_length(Some(1))
            .max_length(Some(names::MAX_NAME_LEN))
            .examples(["team-a"])
            .into()
    }
);

named_schema!(
    /// The schema of a kubeconfig user or group, `Subject` in the document.
    SubjectSchema = "Subject",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A kubeconfig user or group: 1 to {} printable ASCII characters without \
                 spaces, not starting with `system:` or `vcp:` (Kubernetes' and vcp's own \
                 identities).",
                names::MAX_SUBJECT_LEN
            )))
            .pattern(Some(names::SUBJECT_PATTERN))
            .min_length(Some(1))
            .max_length(Some(names::MAX_SUBJECT_LEN))
            .examples(["alice"])
            .into()
    }
);

named_schema!(
    /// The schema of a certificate serial, `Serial` in the document.
    SerialSchema = "Serial",
    {
        let (min, max) = vcp_core::revocation::SERIAL_LEN;
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(format!(
                "A kubeconfig's certificate serial as vcp reports it: lowercase hex, {min} to \
                 {max} digits."
            )))
            .pattern(Some(vcp_core::revocation::SERIAL_PATTERN))
            .min_length(Some(min))
            .max_length(Some(max))
            .examples(["4f1c0e9a7b2d4c6e8f0a1b2c3d4e5f60"])
            .into()
    }
);

named_schema!(
    /// The schema of a tenant's labels, `Labels` in the document.
    LabelsSchema = "Labels",
    {
        let text = |pattern: &str, min: usize, max: usize| {
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(pattern))
                .min_length(Some(min))
                .max_length(Some(max))
        };
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .description(Some(format!(
                "Free-form labels: at most {} keys of 1 to {} and values of up to {} \
                 characters of `[A-Za-z0-9-_./]`.",
                names::MAX_LABELS,
                names::MAX_LABEL_KEY_LEN,
                names::MAX_LABEL_VALUE_LEN
            )))
            .property_names(Some(text(
                names::LABEL_KEY_PATTERN,
                1,
                names::MAX_LABEL_KEY_LEN,
            )))
            .additional_properties(Some(text(
                names::LABEL_VALUE_PATTERN,
                0,
                names::MAX_LABEL_VALUE_LEN,
            )))
            .max_properties(Some(names::MAX_LABELS))
            .examples([serde_json::json!({"team": "shop"})])
            .into()
    }
);

named_schema!(
    /// The schema of a kubeconfig lifetime, `Ttl` in the document.
    TtlSchema = "Ttl",
    {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A lifetime: a positive number and a unit, `s` (or none), `m`, `h` or `d` \
                 (`90m`, `12h`, `7d`). The server caps it at its maximum \
                 (`--max-kubeconfig-ttl-hours`, 168 hours unless configured).",
            ))
            .pattern(Some(names::TTL_PATTERN))
            .examples(["12h"])
            .into()
    }
);

named_schema!(
    /// The schema of a requested Kubernetes version, `KubernetesVersion` in the document: the
    /// spellings the server's catalog resolves (the built-in catalog here; [`with_choices`] puts
    /// a server's own in the document it serves).
    VersionSchema = "KubernetesVersion",
    {
        VersionSchema::of(crate::render::Catalog::builtin().spellings())
    }
);

impl VersionSchema {
    fn of(spellings: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A Kubernetes version this server provisions (`GET /v1/versions`): a minor \
                 (`1.37`, `v1.37`) or its release (`v1.37.1`, `1.37.1`).",
            ))
            .enum_values(Some(spellings))
            .into()
    }
}

named_schema!(
    /// The schema of a fleet upgrade's target, `UpgradeTarget` in the document: the spellings
    /// of the catalog's versions that are not `expired` ([`with_choices`] puts a server's own
    /// in the document it serves).
    TargetSchema = "UpgradeTarget",
    {
        TargetSchema::of(target_spellings(&crate::render::Catalog::builtin()))
    }
);

/// The spellings of a catalog's versions that may be upgrade targets (not `expired`).
pub fn target_spellings(catalog: &crate::render::Catalog) -> Vec<String> {
    let live = crate::render::Catalog {
        default: catalog.default.clone(),
        versions: catalog
            .versions
            .iter()
            .filter(|v| v.class != crate::render::catalog::Class::Expired)
            .cloned()
            .collect(),
    };
    live.spellings()
}

impl TargetSchema {
    fn of(spellings: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A Kubernetes version tenants may be upgraded to (`GET /v1/versions`, any class \
                 but `expired`): a minor (`1.37`, `v1.37`) or its release (`v1.37.1`).",
            ))
            .enum_values(Some(spellings))
            .into()
    }
}

named_schema!(
    /// The schema of a plan name, `Plan` in the document: the plans configured on the server
    /// (`default` alone here; [`with_choices`] puts a server's own in the document it serves).
    PlanSchema = "Plan",
    {
        let builtin = crate::render::parse_plans("{}").unwrap_or_default();
        PlanSchema::of(builtin.into_keys().collect())
    }
);

impl PlanSchema {
    fn of(plans: Vec<String>) -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .description(Some(
                "A placement plan configured on this server (`--plans`; `default` always \
                 exists).",
            ))
            .enum_values(Some(plans))
            .into()
    }
}

/// States a server's own versions (all of them, and those that may be upgrade targets) and
/// plans in its document.
pub fn with_choices(
    doc: &mut OpenApi,
    versions: Vec<String>,
    targets: Vec<String>,
    plans: Vec<String>,
) {
    if let Some(c) = doc.components.as_mut() {
        c.schemas
            .insert(TargetSchema::name().into_owned(), TargetSchema::of(targets));
        c.schemas.insert(
            VersionSchema::name().into_owned(),
            VersionSchema::of(versions),
        );
        c.schemas
            .insert(PlanSchema::name().into_owned(), PlanSchema::of(plans));
    }
}
