//! Image names compared the way Docker normalizes them, to pick one image out of an archive that
//! holds several: `corpus/app:v1` = `docker.io/corpus/app:v1`, `alpine` =
//! `docker.io/library/alpine:latest`.
//!
//! Hand-written (a few lines) because oci-spec's `Reference` parser normalizes differently
//! (it keeps `index.docker.io`-style hosts apart and rejects some names tools write into
//! annotations), and only equality of normalized names matters here.

/// A name normalized for comparison: `registry/repository` and tag (`latest` when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// `docker.io/library/alpine`, `ghcr.io/org/app`, `localhost:5000/app`.
    pub repository: String,
    /// The tag, `latest` when the name has none.
    pub tag: String,
}

impl std::fmt::Display for Normalized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.repository, self.tag)
    }
}

/// Normalizes `name` (`[registry/]path[:tag][@digest]`); `None` when it is empty or malformed.
pub fn normalize(name: &str) -> Option<Normalized> {
    let name = name.trim();
    // A digest does not take part in the comparison: archives name images by tag.
    let name = name.split('@').next()?;
    if name.is_empty() {
        return None;
    }
    // The tag is after the last ':' that comes after the last '/' (a ':' before it is a port).
    let slash = name.rfind('/');
    let (path, tag) = match name.rfind(':') {
        Some(colon) if slash.is_none_or(|s| colon > s) => (&name[..colon], &name[colon + 1..]),
        _ => (name, "latest"),
    };
    if path.is_empty() || tag.is_empty() {
        return None;
    }
    let (registry, rest) = match path.split_once('/') {
        // The first component is a registry when it looks like a host (Docker's rule).
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            (first.to_string(), rest.to_string())
        }
        _ => ("docker.io".to_string(), path.to_string()),
    };
    let registry = match registry.as_str() {
        "index.docker.io" | "registry-1.docker.io" => "docker.io".to_string(),
        _ => registry,
    };
    let rest = if registry == "docker.io" && !rest.contains('/') {
        format!("library/{rest}")
    } else {
        rest
    };
    Some(Normalized {
        repository: format!("{registry}/{}", rest.to_ascii_lowercase()),
        tag: tag.to_string(),
    })
}

/// True when an `org.opencontainers.image.ref.name` holds only a tag (`v1`, `1.0`), not a name:
/// such a value is compared with the upload's tag.
pub fn is_bare_tag(ref_name: &str) -> bool {
    !ref_name.is_empty() && !ref_name.contains(['/', ':', '@'])
}

/// True when a name found in an archive (`found`) designates the image the user named
/// (`wanted`, from `RUNR_UPLOAD_NAME`).
pub fn matches(wanted: &str, found: &str) -> bool {
    let Some(w) = normalize(wanted) else {
        return false;
    };
    if is_bare_tag(found) {
        // A bare word could also be a repository (`alpine`): accept either reading.
        return w.tag == found || normalize(found).is_some_and(|f| f == w);
    }
    normalize(found).is_some_and(|f| f == w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn docker_normalization() {
        let n = |s| normalize(s).unwrap().to_string();
        assert_eq!(n("alpine"), "docker.io/library/alpine:latest");
        assert_eq!(n("corpus/app:v1"), "docker.io/corpus/app:v1");
        assert_eq!(n("docker.io/corpus/app:v1"), "docker.io/corpus/app:v1");
        assert_eq!(
            n("index.docker.io/library/alpine"),
            "docker.io/library/alpine:latest"
        );
        assert_eq!(n("localhost:5000/app"), "localhost:5000/app:latest");
        assert_eq!(n("127.0.0.1:5000/a/b:2@sha256:00"), "127.0.0.1:5000/a/b:2");
        assert_eq!(n("ghcr.io/Org/App:1.0"), "ghcr.io/org/app:1.0");
        assert!(normalize("").is_none());
        assert!(normalize("app:").is_none());
    }

    #[test]
    fn matching() {
        assert!(matches("corpus/app:v1", "docker.io/corpus/app:v1"));
        assert!(matches("alpine", "docker.io/library/alpine:latest"));
        assert!(matches("app:v1", "v1"));
        assert!(matches("alpine", "alpine"));
        assert!(!matches("app:v1", "v2"));
        assert!(!matches("corpus/app:v1", "other/app:v1"));
        assert!(!matches("app:v1", "docker.io/library/app:v2"));
    }
}
