//! The versions catalog (`templates/versions.yaml`): which Kubernetes releases vcp provisions,
//! with which images and flags (pure).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One supported Kubernetes minor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Version {
    /// `"1.37"`.
    pub minor: String,
    /// The release the images carry, `"v1.37.1"`.
    pub kubernetes: String,
    /// Component name (`etcd`, `kube-apiserver`, `kube-controller-manager`, `coredns`) -> image.
    pub images: BTreeMap<String, String>,
    /// Extra kube-apiserver flags for this minor.
    #[serde(default)]
    pub apiserver_flags: Vec<String>,
    /// Extra kube-controller-manager flags for this minor.
    #[serde(default)]
    pub controller_manager_flags: Vec<String>,
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
        if !c.versions.iter().any(|v| v.minor == c.default) {
            return Err(CatalogError::BadDefault(c.default.clone()));
        }
        Ok(c)
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
                supported: self
                    .versions
                    .iter()
                    .map(|v| v.minor.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
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
                "1.37", "v1.37", "v1.37.1", "1.37.1", "1.36", "v1.36", "v1.36.4", "1.36.4"
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
    fn builtin_catalog_has_both_minors_the_dev_cluster_builds() {
        let c = Catalog::builtin();
        assert_eq!(c.resolve(None).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.36")).unwrap().kubernetes, "v1.36.4");
        assert_eq!(c.resolve(Some("v1.36")).unwrap().minor, "1.36");
        assert_eq!(c.resolve(Some("v1.37.1")).unwrap().minor, "1.37");
        assert_eq!(c.resolve(Some("1.37.1")).unwrap().minor, "1.37");
    }

    #[test]
    fn unknown_versions_name_the_supported_ones() {
        let e = Catalog::builtin().resolve(Some("1.12")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown version \"1.12\"; supported: 1.37, 1.36"
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
