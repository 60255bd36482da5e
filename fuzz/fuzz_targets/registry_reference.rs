//! runr-registry's reference parsing, through its public API, on any text a user or an archive
//! can supply (RUNR_UPLOAD_TARGET, RUNR_UPLOAD_NAME, RUNR_PREWARM_IMAGES entries, names in
//! index.json annotations and manifest.json RepoTags): a value or a reason, never a panic; a
//! normalized name is its own normal form and designates what it came from; an accepted image
//! reference spells back as written; an accepted push target is a valid upload name below its
//! host.
#![no_main]

use libfuzzer_sys::fuzz_target;
use runr_registry::reference::{
    check_image_name, is_bare_tag, names_match, normalize, parse_push_target, ImageRef,
};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(n) = normalize(text) {
        let shown = n.to_string();
        assert_eq!(normalize(&shown), Some(n.clone()), "{text:?} -> {shown:?}");
        assert!(
            names_match(&shown, text),
            "{shown:?} does not match {text:?}"
        );
        assert!(n.repository.contains('/'), "{shown:?} has no registry");
    }
    if is_bare_tag(text) {
        assert!(!text.contains(['/', ':', '@']));
    }
    if let Ok(r) = ImageRef::parse(text) {
        let mut spelled = r.repository.clone();
        if let Some(t) = &r.tag {
            spelled = format!("{spelled}:{t}");
        }
        if let Some(d) = &r.digest {
            spelled = format!("{spelled}@{d}");
        }
        assert_eq!(spelled, text);
        assert!(r.tag.is_some() || r.digest.is_some());
    }
    if let Ok(target) = parse_push_target(text) {
        assert_eq!(target, text);
        let (_, rest) = target.split_once('/').expect("a host");
        assert_eq!(
            check_image_name(rest),
            Ok(()),
            "{rest:?} below the host of {text:?}"
        );
    }
    let _ = check_image_name(text);
    // Splitting the input in two: matching never panics and a name matches itself.
    let mid = text
        .char_indices()
        .nth(text.chars().count() / 2)
        .map_or(0, |(i, _)| i);
    let (a, b) = text.split_at(mid);
    let _ = names_match(a, b);
    if normalize(a).is_some() {
        assert!(names_match(a, a), "{a:?}");
    }
});
