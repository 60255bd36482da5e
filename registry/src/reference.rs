//! Image references as the two binaries meet them:
//!
//! - [`ImageRef`]: `repository:tag` or `repository@sha256:…` in a registry named elsewhere
//!   (prewarm's `RUNR_PREWARM_IMAGES`);
//! - [`parse_push_target`] and [`check_image_name`]: the receiver's `RUNR_UPLOAD_TARGET`
//!   (`host[:port]/path/repository:tag`) and `RUNR_UPLOAD_NAME` (`repository[:tag]`);
//! - [`normalize`] and [`names_match`]: names found inside an archive compared the way Docker
//!   normalizes them, to pick one image out of an archive that holds several.
//!
//! The grammar (characters, lengths, where a host ends) is [`oci_spec::distribution::Reference`]'s
//! everywhere; what it cannot say is checked on the text, with a note at each place: it fills in
//! `docker.io` for a missing host and `latest` for a missing tag, so "the user wrote a host" and
//! "the user wrote a tag" are only visible before parsing.

use std::fmt;

use oci_spec::distribution::Reference;

use crate::digest::is_sha256;

/// A host used only to let the reference grammar tell a repository's first path segment from a
/// registry host; it never reaches the network.
const PARSE_HOST: &str = "prewarm.invalid";

// === impl ImageRef ===

/// One image in a registry that is configured separately (prewarm's cache): a repository and a
/// tag, a digest, or both.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    /// The entry as written, for log lines and the summary.
    pub text: String,
    /// The repository in the registry, e.g. `library/python`.
    pub repository: String,
    /// The tag, when the entry has one.
    pub tag: Option<String>,
    /// `sha256:<hex>`, when the entry pins one; it wins over the tag.
    pub digest: Option<String>,
}

impl ImageRef {
    /// Parses `repository:tag`, `repository@sha256:<64 hex>` or `repository:tag@sha256:<hex>`
    /// with the distribution reference grammar. A tag or a digest is required (the grammar would
    /// supply `latest`), and a registry host is refused (the grammar would take one).
    pub fn parse(text: &str) -> Result<ImageRef, String> {
        // Checked on the text: after parsing, a missing tag reads as `latest`.
        let last = text.rsplit('/').next().unwrap_or(text);
        if !last.contains(':') && !text.contains('@') {
            return Err("expected repository:tag or repository@sha256:<digest>".into());
        }
        let parsed = Reference::try_from(format!("{PARSE_HOST}/{text}"))
            .map_err(|e| format!("not an image reference: {e}"))?;
        // With our host in front, a first segment that looks like a host (`r:5000/x`) has
        // become part of the repository unless the grammar refused it; one it kept as the
        // registry means the entry started with a host.
        if parsed.registry() != PARSE_HOST {
            return Err("expected a repository in the cache, without a registry host".into());
        }
        if let Some(d) = parsed.digest() {
            // The grammar accepts sha384/sha512 and upper-case hex; we check sha256 only.
            if !is_sha256(d) {
                return Err("only sha256:<64 lowercase hex> digests are supported".into());
            }
        }
        Ok(ImageRef {
            text: text.to_string(),
            repository: parsed.repository().to_string(),
            tag: parsed.tag().map(str::to_string),
            digest: parsed.digest().map(str::to_string),
        })
    }

    /// What goes after `/manifests/`: the digest when pinned, else the tag.
    pub fn manifest_reference(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

// === the receiver's push target and upload name ===

/// `host[:port]/path/repository:tag`, the receiver's `RUNR_UPLOAD_TARGET`: the registry host
/// must be explicit (a name with a dot or a port, or `localhost`), and so must the tag; a
/// digest is refused because the receiver pushes a tag and reads it back. Returns the target as
/// given.
pub fn parse_push_target(v: &str) -> Result<String, String> {
    const SHAPE: &str = "expected host[:port]/path/repository:tag";
    if v.contains('@') {
        return Err(format!("{SHAPE} (a tag, not a digest)"));
    }
    // Host and tag are checked on the text: the grammar would supply docker.io and latest.
    let Some((host, rest)) = v.split_once('/') else {
        return Err(format!("{SHAPE} (no registry host)"));
    };
    if !looks_like_host(host) {
        return Err(format!("{SHAPE} ({host:?} is not a registry host)"));
    }
    let last = rest.rsplit('/').next().unwrap_or(rest);
    if !last.contains(':') {
        return Err(format!("{SHAPE} (no tag)"));
    }
    // The grammar checks the rest (characters, lengths).
    Reference::try_from(v).map_err(|e| format!("{SHAPE} ({e})"))?;
    Ok(v.to_string())
}

/// `repository[:tag]` in the grammar of image references (lowercase path components, no host
/// check, no digest): the receiver's `RUNR_UPLOAD_NAME`.
pub fn check_image_name(v: &str) -> Result<(), String> {
    match Reference::try_from(format!("localhost/{v}")) {
        Ok(_) if !v.contains('@') => Ok(()),
        _ => Err("expected repository[:tag], e.g. myapp:1.0".into()),
    }
}

/// Docker's rule (and the grammar's) for whether a reference's first path component is a
/// registry host.
fn looks_like_host(first: &str) -> bool {
    first.contains(['.', ':']) || first == "localhost"
}

// === names inside archives ===

/// A name normalized for comparison: `registry/repository` and tag (`latest` when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Normalized {
    /// `docker.io/library/alpine`, `ghcr.io/org/app`, `localhost:5000/app`.
    pub repository: String,
    /// The tag, `latest` when the name has none.
    pub tag: String,
}

impl fmt::Display for Normalized {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.repository, self.tag)
    }
}

/// Normalizes `name` (`[registry/]path[:tag][@digest]`) the way Docker does (`corpus/app:v1` =
/// `docker.io/corpus/app:v1`, `alpine` = `docker.io/library/alpine:latest`); `None` when it is
/// empty or malformed.
///
/// Hand-written rather than through [`Reference`]: the names come from annotations and
/// `manifest.json` files that tools write, which the grammar refuses in places (upper case in
/// a repository) where only equality of normalized names matters, and it does not fold
/// `registry-1.docker.io` into `docker.io`.
pub fn normalize(name: &str) -> Option<Normalized> {
    // A digest does not take part in the comparison: archives name images by tag.
    let name = name.split('@').next()?.trim();
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
        Some((first, rest)) if looks_like_host(first) => (first.to_string(), rest.to_string()),
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
pub fn names_match(wanted: &str, found: &str) -> bool {
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

    const DIGEST: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

    #[test]
    fn image_refs_keep_nested_repositories() {
        let r = ImageRef::parse("docker.io/library/python:3.12-slim").unwrap();
        assert_eq!(r.repository, "docker.io/library/python");
        assert_eq!(r.tag.as_deref(), Some("3.12-slim"));
        assert_eq!(r.manifest_reference(), "3.12-slim");
        let r = ImageRef::parse(&format!("runr-runtimes/go:1.23@{DIGEST}")).unwrap();
        assert_eq!(r.manifest_reference(), DIGEST);
        assert_eq!(r.tag.as_deref(), Some("1.23"));
        let r = ImageRef::parse(&format!("library/go@{DIGEST}")).unwrap();
        assert_eq!(r.repository, "library/go");
        assert_eq!((r.tag, r.digest.as_deref()), (None, Some(DIGEST)));
        assert_eq!(r.text, format!("library/go@{DIGEST}"));
        assert_eq!(ImageRef::parse("node:22").unwrap().to_string(), "node:22");
    }

    #[test]
    fn image_refs_refused_with_a_reason() {
        for (text, needle) in [
            ("python", "expected repository:tag"),
            ("library/python", "expected repository:tag"),
            ("Python:3", "not an image reference"),
            ("python@sha256:abc", "not an image reference"),
            ("python:", "not an image reference"),
            (":3", "not an image reference"),
            (
                &format!("python@sha256:{}", "A".repeat(64)),
                "only sha256:<64 lowercase hex>",
            ),
            (
                &format!("python@sha512:{}", "a".repeat(128)),
                "only sha256:<64 lowercase hex>",
            ),
        ] {
            let err = ImageRef::parse(text).unwrap_err();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    // Moved from image-receiver's config tests (`target_forms`).
    #[test]
    fn push_target_forms() {
        for ok in [
            "127.0.0.1:5000/runr-uploads/platform/app:1.0",
            "registry.example.com/a/b/c:latest",
            "localhost/app:v1",
            "10.43.0.5:5000/app:1",
        ] {
            assert_eq!(parse_push_target(ok).as_deref(), Ok(ok), "{ok}");
        }
        for (bad, why) in [
            ("app:1.0", "(no registry host)"),
            ("corpus/app:1.0", "(\"corpus\" is not a registry host)"),
            ("registry.example.com/app", "(no tag)"),
            (
                "127.0.0.1:5000/app@sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
                "(a tag, not a digest)",
            ),
            ("127.0.0.1:5000/App:1", "(invalid reference format)"),
            ("127.0.0.1:5000/:1", "(invalid reference format)"),
        ] {
            let err = parse_push_target(bad).unwrap_err();
            assert_eq!(err, format!("expected host[:port]/path/repository:tag {why}"), "{bad}");
        }
    }

    // The receiver's RUNR_UPLOAD_NAME (its config test used `corpus/app:v1` and `Bad Name`).
    #[test]
    fn image_name_forms() {
        for ok in ["corpus/app:v1", "app", "app:1.0", "a/b/c"] {
            assert_eq!(check_image_name(ok), Ok(()), "{ok}");
        }
        for bad in ["Bad Name", "App:1", "app@sha256:00", "", "app:"] {
            assert_eq!(
                check_image_name(bad).unwrap_err(),
                "expected repository[:tag], e.g. myapp:1.0",
                "{bad}"
            );
        }
    }

    // Moved from image-receiver's reference tests.
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
        assert_eq!(
            n("registry-1.docker.io/alpine:3"),
            "docker.io/library/alpine:3"
        );
        assert_eq!(n("localhost:5000/app"), "localhost:5000/app:latest");
        assert_eq!(n("127.0.0.1:5000/a/b:2@sha256:00"), "127.0.0.1:5000/a/b:2");
        assert_eq!(n("ghcr.io/Org/App:1.0"), "ghcr.io/org/app:1.0");
        assert!(normalize("").is_none());
        assert!(normalize("app:").is_none());
        assert!(normalize("@sha256:00").is_none());
        // Blanks before a digest are not part of the tag.
        assert_eq!(n("app:v1 @sha256:00"), "docker.io/library/app:v1");
    }

    #[test]
    fn matching() {
        assert!(names_match("corpus/app:v1", "docker.io/corpus/app:v1"));
        assert!(names_match("alpine", "docker.io/library/alpine:latest"));
        assert!(names_match("app:v1", "v1"));
        assert!(names_match("alpine", "alpine"));
        assert!(!names_match("app:v1", "v2"));
        assert!(!names_match("corpus/app:v1", "other/app:v1"));
        assert!(!names_match("app:v1", "docker.io/library/app:v2"));
        assert!(!names_match("", "v1"));
        assert!(is_bare_tag("1.0") && !is_bare_tag("a/b") && !is_bare_tag(""));
    }

    /// The entry spelled from its parts: equal to the text when nothing was filled in or
    /// rewritten (no `library/`, no `latest`).
    fn spelled(r: &ImageRef) -> String {
        let mut s = r.repository.clone();
        if let Some(t) = &r.tag {
            s = format!("{s}:{t}");
        }
        if let Some(d) = &r.digest {
            s = format!("{s}@{d}");
        }
        s
    }

    proptest::proptest! {
        // Names come from archives a user uploaded: any text gives a name or none, never a
        // panic, and a normalized name is a fixed point (its own normal form).
        #[test]
        fn normalize_never_panics_and_is_idempotent(name in "\\PC{0,40}") {
            if let Some(n) = normalize(&name) {
                proptest::prop_assert_eq!(normalize(&n.to_string()), Some(n.clone()));
                proptest::prop_assert!(names_match(&n.to_string(), &name));
            }
        }

        #[test]
        fn normalize_handles_reference_shaped_text(
            name in "([a-zA-Z0-9.:-]{1,12}/){0,3}[a-zA-Z0-9._-]{1,12}(:[a-zA-Z0-9._-]{0,8})?( ?@sha256:([0-9a-f]{64}|[0-9a-f]{0,4}))?"
        ) {
            if let Some(n) = normalize(&name) {
                proptest::prop_assert_eq!(normalize(&n.to_string()), Some(n));
            }
            let _ = parse_push_target(&name);
            let _ = check_image_name(&name);
            if let Ok(r) = ImageRef::parse(&name) {
                proptest::prop_assert_eq!(spelled(&r), name);
            }
        }

        // Config values are typed by hand: every parser gives a value or a reason.
        #[test]
        fn parsers_never_panic(text in "\\PC{0,60}") {
            let _ = parse_push_target(&text);
            let _ = check_image_name(&text);
            if let Ok(r) = ImageRef::parse(&text) {
                proptest::prop_assert_eq!(spelled(&r), text);
            }
        }
    }
}
