//! The versions catalog (`templates/versions.yaml`): which Kubernetes releases vcp provisions,
//! with which images and flags, and where each minor is in its life ([`Class`]) (pure).
//!
//! New tenants resolve their version here ([`Catalog::resolve_new`]: no `expired` minor, a
//! `preview` one only on request); upgrades plan their hops from it (`crate::upgrade::skew`).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One supported Kubernetes minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// `"1.37"`.
    pub minor: String,
    /// The release the images carry, `"v1.37.1"`.
    pub kubernetes: String,
    /// Where this minor is in its life.
    pub class: Class,
    /// Component name (`etcd`, `kube-apiserver`, `kube-controller-manager`, `coredns`) -> image.
    pub images: BTreeMap<String, String>,
    /// Extra kube-apiserver flags for this minor.
    #[serde(default)]
    pub apiserver_flags: Vec<String>,
    /// Extra kube-controller-manager flags for this minor.
    #[serde(default)]
    pub controller_manager_flags: Vec<String>,
}

/// Where a minor is in its life, as the platform offers it.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    /// New tenants get it only when they ask with `allow_preview`; never the default.
    Preview,
    /// The normal case.
    Supported,
    /// Still provisioned and upgraded to; its tenants should move on.
    Deprecated,
    /// No new tenants; the next fleet upgrade moves existing ones off it, opted out or not.
    Expired,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Class::Preview => "preview",
            Class::Supported => "supported",
            Class::Deprecated => "deprecated",
            Class::Expired => "expired",
        }
    }
}

/// Every supported minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub default: String,
    pub versions: Vec<Version>,
}

/// Components every catalog entry must name an image for.
pub const COMPONENTS: [&str; 4] = [
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "coredns",
];

/// Why a catalog or a version request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CatalogError {
    #[error("versions catalog is not valid YAML: {0}")]
    Yaml(String),
    #[error("versions catalog: minor {minor:?} has no image for {component}")]
    MissingImage { minor: String, component: String },
    #[error("versions catalog: release {kubernetes:?} does not belong to minor {minor:?}")]
    Mismatch { minor: String, kubernetes: String },
    #[error("versions catalog: default {0:?} is not one of its versions")]
    BadDefault(String),
    #[error("versions catalog: minor {0:?} is listed twice")]
    Duplicate(String),
    #[error(
        "versions catalog: the default {minor:?} is {class}; the default must be supported or deprecated"
    )]
    DefaultClass { minor: String, class: &'static str },
    #[error("versions catalog: {0:?} is not a minor like \"1.37\"")]
    BadMinor(String),
    #[error("version {minor} is expired: no new tenants; pick one of {supported}")]
    Expired { minor: String, supported: String },
    #[error("version {minor} is a preview: ask for it with allow_preview")]
    Preview { minor: String },
    #[error("unknown version {requested:?}; supported: {supported}")]
    Unknown {
        requested: String,
        supported: String,
    },
}

impl Catalog {
    /// The catalog shipped with this build.
    pub fn builtin() -> Catalog {
        Catalog::parse(include_str!("../../../templates/versions.yaml"))
            .expect("the built-in versions catalog is checked by tests")
    }

    /// Parses and checks a catalog.
    pub fn parse(yaml: &str) -> Result<Catalog, CatalogError> {
        let c: Catalog =
            serde_yaml::from_str(yaml).map_err(|e| CatalogError::Yaml(e.to_string()))?;
        let mut seen = std::collections::BTreeSet::new();
        for v in &c.versions {
            if minor_number(&v.minor).is_none() {
                return Err(CatalogError::BadMinor(v.minor.clone()));
            }
            if !seen.insert(&v.minor) {
                return Err(CatalogError::Duplicate(v.minor.clone()));
            }
            if !v
                .kubernetes
                .strip_prefix('v')
                .is_some_and(|r| r.starts_with(&format!("{}.", v.minor)))
            {
                return Err(CatalogError::Mismatch {
                    minor: v.minor.clone(),
                    kubernetes: v.kubernetes.clone(),
                });
            }
            if let Some(c) = COMPONENTS.iter().find(|c| !v.images.contains_key(**c)) {
                return Err(CatalogError::MissingImage {
                    minor: v.minor.clone(),
                    component: (*c).to_owned(),
                });
            }
        }
        match c.versions.iter().find(|v| v.minor == c.default) {
            None => return Err(CatalogError::BadDefault(c.default.clone())),
            Some(v) if matches!(v.class, Class::Preview | Class::Expired) => {
                return Err(CatalogError::DefaultClass {
                    minor: v.minor.clone(),
                    class: v.class.as_str(),
                });
            }
            Some(_) => {}
        }
        Ok(c)
    }

    /// The version a new tenant gets: [`Catalog::resolve`], then its class: never `expired`,
    /// and `preview` only with `allow_preview`.
    pub fn resolve_new(
        &self,
        requested: Option<&str>,
        allow_preview: bool,
    ) -> Result<&Version, CatalogError> {
        let v = self.resolve(requested)?;
        match v.class {
            Class::Expired => Err(CatalogError::Expired {
                minor: v.minor.clone(),
                supported: self.listed(|v| !matches!(v.class, Class::Expired | Class::Preview)),
            }),
            Class::Preview if !allow_preview => Err(CatalogError::Preview {
                minor: v.minor.clone(),
            }),
            _ => Ok(v),
        }
    }

    /// The minors that pass `keep`, for messages.
    fn listed(&self, keep: impl Fn(&Version) -> bool) -> String {
        self.versions
            .iter()
            .filter(|v| keep(v))
            .map(|v| v.minor.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The version a request names: a minor (`1.37`, `v1.37`), its exact release
    /// (`v1.37.1`), or nothing for the default.
    pub fn resolve(&self, requested: Option<&str>) -> Result<&Version, CatalogError> {
        let Some(req) = requested else {
            return Ok(self
                .versions
                .iter()
                .find(|v| v.minor == self.default)
                .expect("checked by parse"));
        };
        let bare = req.strip_prefix('v').unwrap_or(req);
        self.versions
            .iter()
            .find(|v| v.minor == bare || v.kubernetes == req || v.kubernetes[1..] == *bare)
            .ok_or_else(|| CatalogError::Unknown {
                requested: req.to_owned(),
                supported: self.listed(|_| true),
            })
    }

    /// Every spelling [`Catalog::resolve`] takes, version by version: the minor (`1.37`), the
    /// minor with a `v`, the release (`v1.37.1`) and the release without its `v`.
    pub fn spellings(&self) -> Vec<String> {
        self.versions
            .iter()
            .flat_map(|v| {
                [
                    v.minor.clone(),
                    format!("v{}", v.minor),
                    v.kubernetes.clone(),
                    v.kubernetes[1..].to_owned(),
                ]
            })
            .collect()
    }

    /// The entry for a stored minor.
    pub fn get(&self, minor: &str) -> Option<&Version> {
        self.versions.iter().find(|v| v.minor == minor)
    }
}

/// The minor number of `"1.37"` (37); `None` for anything else.
pub fn minor_number(minor: &str) -> Option<u32> {
    let n = minor.strip_prefix("1.")?;
    // Digits only and no leading zero, so one minor has one spelling.
    (!n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) && !(n.len() > 1 && n.starts_with('0')))
        .then(|| n.parse().ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spellings_are_exactly_what_resolve_takes() {
        let c = Catalog::builtin();
        let spellings = c.spellings();
        assert_eq!(
            spellings,
            [
                "1.37", "v1.37", "v1.37.1", "1.37.1", "1.36", "v1.36", "v1.36.4", "1.36.4", "1.35",
                "v1.35", "v1.35.4", "1.35.4"
            ]
        );
        for s in &spellings {
            assert!(c.resolve(Some(s)).is_ok(), "{s}");
        }
        // Every string near a spelling: each one cut short, extended, or with a character
        // changed to another that versions use.
        for s in &spellings {
            for i in 0..=s.len() {
                for ch in ["", "v", "V", ".", "0", "1", "3", "7", " "] {
                    for cut in [0, 1] {
                        let near = format!("{}{ch}{}", &s[..i], &s[(i + cut).min(s.len())..]);
                        assert_eq!(
                            c.resolve(Some(&near)).is_ok(),
                            spellings.contains(&near),
                            "{near:?}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn builtin_catalog_has_the_three_minors_the_dev_cluster_builds() {
        let c = Catalog::builtin();
        assert_eq!(c.resolve(None).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.36")).unwrap().kubernetes, "v1.36.4");
        assert_eq!(c.resolve(Some("v1.36")).unwrap().minor, "1.36");
        assert_eq!(c.resolve(Some("v1.37.1")).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.37.1")).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.35")).unwrap().kubernetes, "v1.35.4");
        let minors: Vec<u32> = c
            .versions
            .iter()
            .filter_map(|v| minor_number(&v.minor))
            .collect();
        assert_eq!(minors, [37, 36, 35], "the last three minors, newest first");
        // What tests/kube-bin builds: every release the catalog names.
        let build = include_str!("../../../tests/kube-bin/build.sh");
        for v in &c.versions {
            let dir = format!("\"k8s-v{}|", v.minor);
            assert!(build.contains(&dir), "tests/kube-bin builds no {}", v.minor);
        }
    }

    #[test]
    fn new_tenants_never_get_an_expired_minor_and_a_preview_only_on_request() {
        let ok = include_str!("../../../templates/versions.yaml");
        let c = Catalog::parse(&ok.replacen("class: deprecated", "class: expired", 1)).unwrap();
        assert_eq!(
            c.resolve_new(Some("1.35"), true).unwrap_err().to_string(),
            "version 1.35 is expired: no new tenants; pick one of 1.37, 1.36"
        );
        assert!(
            c.resolve(Some("1.35")).is_ok(),
            "existing tenants still resolve it"
        );
        let c = Catalog::parse(
            &ok.replacen("class: supported", "class: preview", 2)
                .replacen("class: preview", "class: supported", 1),
        )
        .unwrap();
        assert_eq!(c.get("1.36").unwrap().class, Class::Preview);
        assert_eq!(
            c.resolve_new(Some("1.36"), false).unwrap_err(),
            CatalogError::Preview {
                minor: "1.36".into()
            }
        );
        assert_eq!(c.resolve_new(Some("1.36"), true).unwrap().minor, "1.36");
        assert_eq!(c.resolve_new(None, false).unwrap().minor, "1.37");
        assert_eq!(
            c.resolve_new(Some("1.35"), false).unwrap().class,
            Class::Deprecated
        );
        // The default can be neither.
        for class in ["preview", "expired"] {
            assert!(matches!(
                Catalog::parse(&ok.replacen("class: supported", &format!("class: {class}"), 1))
                    .unwrap_err(),
                CatalogError::DefaultClass { .. }
            ));
        }
        assert!(matches!(
            Catalog::parse(&ok.replacen("class: supported", "class: retired", 1)).unwrap_err(),
            CatalogError::Yaml(_)
        ));
    }

    #[test]
    fn minor_numbers_have_one_spelling() {
        assert_eq!(minor_number("1.37"), Some(37));
        assert_eq!(minor_number("1.0"), Some(0));
        for bad in ["1.037", "2.37", "1.", "1.3a", "v1.37", "1.37.1", "", "1.-1"] {
            assert_eq!(minor_number(bad), None, "{bad}");
        }
    }

    #[test]
    fn unknown_versions_name_the_supported_ones() {
        let e = Catalog::builtin().resolve(Some("1.12")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown version \"1.12\"; supported: 1.37, 1.36, 1.35"
        );
        assert!(Catalog::builtin().resolve(Some("v1.37.9")).is_err());
        assert!(Catalog::builtin().resolve(Some("")).is_err());
    }

    #[test]
    fn broken_catalogs_are_refused_with_a_reason() {
        let ok = include_str!("../../../templates/versions.yaml");
        assert!(matches!(
            Catalog::parse("versions: [").unwrap_err(),
            CatalogError::Yaml(_)
        ));
        assert_eq!(
            Catalog::parse(&ok.replace("default: \"1.37\"", "default: \"1.99\"")).unwrap_err(),
            CatalogError::BadDefault("1.99".into())
        );
        assert!(matches!(
            Catalog::parse(&ok.replace("kubernetes: v1.36.4", "kubernetes: v1.35.0")).unwrap_err(),
            CatalogError::Mismatch { .. }
        ));
        assert!(matches!(
            Catalog::parse(&ok.replacen(
                "      coredns: registry.k8s.io/coredns/coredns:v1.15.0\n",
                "",
                1
            ))
            .unwrap_err(),
            CatalogError::MissingImage { .. }
        ));
        assert_eq!(
            Catalog::parse(&ok.replace("minor: \"1.36\"", "minor: \"1.37\"")).unwrap_err(),
            CatalogError::Duplicate("1.37".into())
        );
    }
}
