//! Blobs pushed while the upload arrives (the follower behind the contiguous prefix), through
//! the real binary against the real `docker-registry`:
//!
//! - in order, an OCI archive (skopeo) and a classic archive with `manifest.json` last: the
//!   large blobs are in the registry before `POST /complete`, no tag or manifest is, and the
//!   image pushed is the very one the after-complete pass pushes for the same file sent last
//!   chunk first;
//! - in order, a classic archive with the default `RUNR_UPLOAD_COMPRESS=gzip`: its layers are
//!   gzip'ed as they arrive and in the registry before `complete`, nothing is compressed after
//!   it, and the manifest is the very one the after-complete pass writes (the same compressor,
//!   the same bytes); the layers pulled back decompress to their diff_ids;
//! - in order with `RUNR_UPLOAD_COMPRESS=none`: a classic layer streams from its first byte,
//!   bytes of it in the registry's upload session before its end arrived;
//! - a receiver killed while such a layer streams (gzip'ed or as it is): pushed again from
//!   byte 0 after the restart;
//! - such a layer whose bytes do not match the config's diff_id: `failed` naming it, no tag;
//! - a chunk sent again with other bytes inside a layer already streaming: nothing changes
//!   (the overlap rule), the image is the one of the bytes received first;
//! - a whole archive compressed with gzip, xz or zstd, in order: the follower indexes it
//!   through its decoder while it arrives and pushes its blobs from that one decode (as they
//!   are, or gzip'ed); nothing is decoded again after `complete`; last chunk first, the pass
//!   does it all after `complete`, as before;
//! - a SHA-256 mismatch after streaming: the upload is reopened, no tag and no manifest, only
//!   unreferenced blobs;
//! - a receiver killed with SIGKILL while a blob streams: the restarted one follows the prefix
//!   again from byte 0 and the push completes;
//! - chunks in a shuffled order: the same image;
//! - 32 concurrent `GET /status` readers during the push: every answer well-formed, the push
//!   progress never going back.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use runr_testkit::oci::TestImage;
use runr_testkit::tools::skopeo_output;
use runr_testkit::{have_tool, http_get_status, Registry};
use serde_json::Value;

use crate::support::{oci_archive, pulled_from, sha256_hex, Receiver};

/// Chunk size of these uploads: several chunks per large blob, so a blob streams across them.
const CHUNK: usize = 1 << 20;

fn tools() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo"])
}

/// Two layers the follower streams (≥ 1 MiB) and one it leaves to the pass.
fn image() -> TestImage {
    TestImage::random("1", &[4 << 20, 2 << 20, 100_000])
}

fn large(image: &TestImage) -> Vec<String> {
    image
        .layers
        .iter()
        .filter(|l| l.data.len() >= 1 << 20)
        .map(|l| l.digest.clone())
        .collect()
}

/// A classic `docker save` archive written the way Docker ≤ 24 orders it: each layer as
/// `<id>/layer.tar`, then the config, then `manifest.json` last.
pub(crate) fn classic_archive(image: &TestImage) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    let mut layers = Vec::new();
    for (i, l) in image.layers.iter().enumerate() {
        let name = format!("{i:064x}/layer.tar");
        add(&name, &l.data);
        layers.push(name);
    }
    let config = format!(
        "{}.json",
        image.config.digest.strip_prefix("sha256:").unwrap()
    );
    add(&config, &image.config.data);
    let manifest =
        serde_json::json!([{"Config": config, "RepoTags": ["stream/app:1"], "Layers": layers}]);
    add("manifest.json", manifest.to_string().as_bytes());
    b.into_inner().unwrap()
}

/// The same archive with `manifest.json` and the config first (as `bench/receiver.sh` writes
/// it, and tools that write the documents before the layers).
fn classic_archive_documents_first(image: &TestImage) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    let layers: Vec<String> = (0..image.layers.len())
        .map(|i| format!("{i:064x}/layer.tar"))
        .collect();
    let config = format!(
        "{}.json",
        image.config.digest.strip_prefix("sha256:").unwrap()
    );
    let manifest =
        serde_json::json!([{"Config": config, "RepoTags": ["stream/app:1"], "Layers": layers}]);
    add("manifest.json", manifest.to_string().as_bytes());
    add(&config, &image.config.data);
    for (name, l) in layers.iter().zip(&image.layers) {
        add(name, &l.data);
    }
    b.into_inner().unwrap()
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

fn receiver(
    work: &Path,
    reg: &Registry,
    repo: &str,
    data: &[u8],
    extra: &[(&str, &str)],
) -> Receiver {
    let dir = work.join(repo.replace('/', "_"));
    std::fs::create_dir_all(&dir).unwrap();
    let target = format!("{}/{repo}:1", reg.host());
    let mut env = vec![("RUNR_UPLOAD_TARGET", target.as_str())];
    env.extend_from_slice(extra);
    Receiver::for_data(&dir, data, &env)
}

fn put_range(r: &Receiver, data: &[u8], chunks: impl Iterator<Item = usize>) {
    for i in chunks {
        let start = i * CHUNK;
        let end = (start + CHUNK).min(data.len());
        let (code, body) = r.put(start as u64, &data[start..end]);
        assert_eq!(code, 200, "{body}");
    }
}

fn chunk_count(data: &[u8]) -> usize {
    data.len().div_ceil(CHUNK)
}

fn has_blob(reg: &Registry, repo: &str, digest: &str) -> bool {
    http_get_status(reg.addr(), &format!("/v2/{repo}/blobs/{digest}")) == Some(200)
}

fn has_manifest(reg: &Registry, repo: &str, reference: &str) -> bool {
    http_get_status(reg.addr(), &format!("/v2/{repo}/manifests/{reference}")) == Some(200)
}

/// Where the last entry of at least 1 MiB ends in the tar `data`: the bytes after it (small
/// entries, the end blocks) are what an in-order upload still has to send once every large
/// blob arrived.
pub(crate) fn after_large_blobs(data: &[u8]) -> usize {
    let mut tar = tar::Archive::new(data);
    let mut end = 0;
    for entry in tar.entries().unwrap() {
        let entry = entry.unwrap();
        if entry.size() >= 1 << 20 {
            end = end.max(entry.raw_file_position() + entry.size());
        }
    }
    assert!(end > 0 && (end as usize) < data.len());
    end as usize
}

/// Sends the file in order up to the end of its last large blob and waits until the follower
/// pushed every large blob, with nothing visible (no tag, no manifest); then the rest. The tail
/// is held back because the follower leaves to the pass what it reaches only once the whole
/// file is there.
fn streamed_before_complete(
    r: &Receiver,
    reg: &Registry,
    repo: &str,
    data: &[u8],
    blobs: &[String],
) {
    let tail = after_large_blobs(data);
    put_range(r, &data[..tail], 0..chunk_count(&data[..tail]));
    let s = r.wait_status("the follower to push the large blobs", |s| {
        s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= blobs.len() as u64
    });
    assert_eq!(s["status"], "receiving", "{s}");
    for d in blobs {
        assert!(
            has_blob(reg, repo, d),
            "{d} is not in the registry before complete"
        );
    }
    assert!(!has_manifest(reg, repo, "1"), "a tag before complete");
    let log = r.log();
    assert!(
        log.matches("blob pushed while the upload arrives").count() >= blobs.len(),
        "{log}"
    );
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
}

/// The same file, last chunk first, into `repo`: what the after-complete pass pushes.
fn pushed_after_complete(
    work: &Path,
    reg: &Registry,
    repo: &str,
    data: &[u8],
    extra: &[(&str, &str)],
) -> Value {
    let r = receiver(work, reg, repo, data, extra);
    put_range(&r, data, (0..chunk_count(data)).rev());
    r.completed()
}

fn in_order(data: &[u8], image: &TestImage, format: &str, extra: &[(&str, &str)]) {
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let repo = format!("runr-uploads/platform/{format}-stream");
    let r = receiver(work.path(), &reg, &repo, data, extra);
    streamed_before_complete(&r, &reg, &repo, data, &large(image));
    let s = r.completed();
    pulled_from(&reg, &repo, image);
    let blobs = image.blobs().len() as u64;
    let bytes = image.blob_bytes();
    assert_eq!(
        s["push"],
        serde_json::json!({"blobs": blobs, "blobs_pushed": blobs, "bytes": bytes, "bytes_pushed": bytes}),
        "{s}"
    );
    let today = pushed_after_complete(
        work.path(),
        &reg,
        &format!("runr-uploads/platform/{format}-pass"),
        data,
        extra,
    );
    assert_eq!(
        s["image"]["digest"], today["image"]["digest"],
        "{s}\n{today}"
    );
    assert_eq!(s["image"]["source_format"], format, "{s}");
}

#[test]
fn an_oci_archive_in_order_is_in_the_registry_before_complete() {
    if !tools() {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    in_order(&data, &image, "oci", &[]);
}

#[test]
fn a_classic_archive_in_order_is_in_the_registry_before_complete() {
    if !tools() {
        return;
    }
    let image = image();
    // Layers pushed as they are: with gzip the pass compresses them after complete.
    in_order(
        &classic_archive(&image),
        &image,
        "docker",
        &[("RUNR_UPLOAD_COMPRESS", "none")],
    );
}

/// The `(layer name, digest)` of every classic layer the follower pushed in a chunked upload
/// as it arrived (gzip'ed or not), from its log.
pub(crate) fn layers_pushed_while_arriving(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter(|l| l.contains("layer pushed while the upload arrives"))
        .map(|l| {
            let field = |k: &str| {
                let at = l
                    .find(&format!(" {k}="))
                    .unwrap_or_else(|| panic!("{k} in {l}"));
                let v = &l[at + k.len() + 2..];
                v.split_whitespace()
                    .next()
                    .unwrap()
                    .trim_matches('"')
                    .to_string()
            };
            (field("layer"), field("digest"))
        })
        .collect()
}

/// skopeo pulls the tag back: every gzip'ed layer decompresses to its diff_id (the image's
/// uncompressed layer), the config byte for byte.
pub(crate) fn pulled_gzipped(reg: &Registry, repo: &str, image: &TestImage) {
    let out = tempfile::tempdir().unwrap();
    let got = skopeo_output(&[
        "copy",
        "--retry-times",
        "0",
        "--src-tls-verify=false",
        &format!("docker://{}/{repo}:1", reg.host()),
        &format!("dir:{}", out.path().display()),
    ]);
    assert!(got.success(), "{got:?}");
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.path().join("manifest.json")).unwrap()).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), image.layers.len(), "{manifest}");
    for (l, want) in layers.iter().zip(&image.layers) {
        assert_eq!(
            l["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip",
            "{manifest}"
        );
        let hex = l["digest"]
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap();
        let blob = std::fs::read(out.path().join(hex)).unwrap();
        assert_eq!(blob.len() as u64, l["size"].as_u64().unwrap());
        let mut raw = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::MultiGzDecoder::new(&blob[..]), &mut raw)
            .unwrap();
        assert!(
            raw == want.data,
            "{} does not decompress to {}",
            l["digest"],
            want.digest
        );
    }
    let config = std::fs::read(
        out.path()
            .join(image.config.digest.strip_prefix("sha256:").unwrap()),
    )
    .unwrap();
    assert!(config == image.config.data);
}

#[test]
fn a_classic_archive_in_order_with_gzip_is_gzipped_and_pushed_before_complete() {
    if !tools() {
        return;
    }
    let image = image();
    let data = classic_archive(&image);
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let repo = "runr-uploads/platform/docker-gzip-stream";
    // The default RUNR_UPLOAD_COMPRESS: gzip.
    let r = receiver(work.path(), &reg, repo, &data, &[]);
    let tail = after_large_blobs(&data);
    put_range(&r, &data[..tail], 0..chunk_count(&data[..tail]));
    let large = large(&image).len();
    let s = r.wait_status("the follower to gzip and push the large layers", |s| {
        s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= large as u64
    });
    assert_eq!(s["status"], "receiving", "{s}");
    let gzipped = layers_pushed_while_arriving(&r.log());
    assert_eq!(gzipped.len(), large, "{}", r.log());
    for (name, digest) in &gzipped {
        assert!(name.ends_with("/layer.tar"), "{name}");
        assert!(
            has_blob(&reg, repo, digest),
            "{name} ({digest}) is not in the registry before complete"
        );
    }
    assert!(!has_manifest(&reg, repo, "1"), "a tag before complete");
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
    let s = r.completed();
    let log = r.log();
    // After complete only the small layer is gzip'ed (below the follower's 1 MiB).
    assert_eq!(
        log.matches("gzip'ing layer after complete").count(),
        image.layers.len() - large,
        "{log}"
    );
    let push = &s["push"];
    assert_eq!(push["blobs"], image.blobs().len() as u64, "{s}");
    assert_eq!(push["blobs_pushed"], push["blobs"], "{s}");
    assert_eq!(push["bytes_pushed"], push["bytes"], "{s}");
    pulled_gzipped(&reg, repo, &image);
    // Today's path (every layer gzip'ed after complete) writes the same manifest.
    let today = pushed_after_complete(
        work.path(),
        &reg,
        "runr-uploads/platform/docker-gzip-pass",
        &data,
        &[],
    );
    assert_eq!(
        s["image"]["digest"], today["image"]["digest"],
        "{s}\n{today}"
    );
    assert_eq!(push["bytes"], today["push"]["bytes"], "{s}\n{today}");
}

/// A classic layer pushed while it arrived (`compress`: as it is or gzip'ed) whose bytes do
/// not hash to the config's diff_id (one byte changed in the archive, whose SHA-256 is then the
/// upload's own): the check after `complete` fails the upload naming the layer, with no
/// manifest and no tag; the blob pushed stays unreferenced.
fn a_layer_pushed_as_it_arrived_that_fails_its_diff_id_leaves_no_tag(compress: &str) {
    if !tools() {
        return;
    }
    let image = image();
    let mut data = classic_archive(&image);
    let first = {
        let mut tar = tar::Archive::new(&data[..]);
        let e = tar.entries().unwrap().next().unwrap().unwrap();
        e.raw_file_position() as usize
    };
    data[first + 1000] ^= 0xff;
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let repo = format!("runr-uploads/platform/docker-{compress}-damaged");
    let r = receiver(
        work.path(),
        &reg,
        &repo,
        &data,
        &[("RUNR_UPLOAD_COMPRESS", compress)],
    );
    let tail = after_large_blobs(&data);
    put_range(&r, &data[..tail], 0..chunk_count(&data[..tail]));
    let large = large(&image).len();
    r.wait_status("the follower to push the large layers", |s| {
        s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= large as u64
    });
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    assert_eq!(s["status"], "failed", "{s}\n{}", r.log());
    let message = s["message"].as_str().unwrap();
    let says = match compress {
        "gzip" => "does not match its diff_id",
        _ => "in the file does not match its digest",
    };
    assert!(
        message.contains(says) && message.contains(&image.layers[0].digest),
        "{s}"
    );
    assert!(!has_manifest(&reg, &repo, "1"), "a tag after a mismatch");
    let pushed = layers_pushed_while_arriving(&r.log());
    assert_eq!(pushed.len(), large, "{}", r.log());
    for (name, digest) in &pushed {
        assert!(has_blob(&reg, &repo, digest), "{name} {digest}");
    }
}

#[test]
fn a_layer_gzipped_as_it_arrived_that_fails_its_diff_id_leaves_no_tag() {
    a_layer_pushed_as_it_arrived_that_fails_its_diff_id_leaves_no_tag("gzip");
}

#[test]
fn a_layer_pushed_as_it_is_as_it_arrived_that_fails_its_diff_id_leaves_no_tag() {
    a_layer_pushed_as_it_arrived_that_fails_its_diff_id_leaves_no_tag("none");
}

/// The first large layer of the classic archive `data`: where its bytes start and end.
fn first_layer(data: &[u8]) -> (usize, usize) {
    let mut tar = tar::Archive::new(data);
    let e = tar
        .entries()
        .unwrap()
        .map(Result::unwrap)
        .find(|e| e.size() >= 1 << 20)
        .expect("a large layer");
    let at = e.raw_file_position() as usize;
    (at, at + e.size() as usize)
}

/// With `RUNR_UPLOAD_COMPRESS=none` a classic layer streams into the registry from its first
/// byte (a chunked upload whose `PATCH` follows the prefix), not once it is whole: bytes of it
/// are pushed while its end has not arrived, and it is in the registry before `complete`; the
/// image is the one the after-complete pass pushes.
#[test]
fn a_classic_layer_with_none_streams_from_its_first_byte() {
    if !tools() {
        return;
    }
    let image = image();
    let data = classic_archive(&image);
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let repo = "runr-uploads/platform/docker-none-first-byte";
    let none = [("RUNR_UPLOAD_COMPRESS", "none")];
    let r = receiver(work.path(), &reg, repo, &data, &none);
    let (_, end) = first_layer(&data);
    let upto = (end - 1) / CHUNK;
    assert!(upto * CHUNK < end);
    put_range(&r, &data, 0..upto);
    let s = r.wait_status("the first layer to stream", |s| {
        s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
    });
    assert_eq!(s["push"]["blobs_pushed"], 0, "{s}");
    assert!(!has_blob(&reg, repo, &image.layers[0].digest));
    let tail = after_large_blobs(&data);
    put_range(&r, &data[..tail], upto..chunk_count(&data[..tail]));
    let large = large(&image);
    r.wait_status("the follower to push the large layers", |s| {
        s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= large.len() as u64
    });
    for d in &large {
        assert!(
            has_blob(&reg, repo, d),
            "{d} is not in the registry before complete"
        );
    }
    let pushed = layers_pushed_while_arriving(&r.log());
    // In the order their pushes ended.
    let mut digests: Vec<String> = pushed.into_iter().map(|(_, d)| d).collect();
    digests.sort();
    let mut want = large.clone();
    want.sort();
    assert_eq!(digests, want, "{}", r.log());
    assert!(!has_manifest(&reg, repo, "1"), "a tag before complete");
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
    let s = r.completed();
    pulled_from(&reg, repo, &image);
    let bytes = image.blob_bytes();
    assert_eq!(s["push"]["bytes_pushed"], bytes, "{s}");
    assert_eq!(s["push"]["bytes"], bytes, "{s}");
    let today = pushed_after_complete(
        work.path(),
        &reg,
        "runr-uploads/platform/docker-none-first-byte-pass",
        &data,
        &none,
    );
    assert_eq!(
        s["image"]["digest"], today["image"]["digest"],
        "{s}\n{today}"
    );
}

/// With `none`, a classic archive whose `manifest.json` and config come before the layers: each
/// layer is known by its diff_id from its first byte, so it streams in one `PUT` under it after
/// a `HEAD`; the same file uploaded again (into the same repository) sends no layer again: each
/// costs a `HEAD`, before `complete`.
#[test]
fn a_classic_archive_with_its_documents_first_is_pushed_by_diff_id_and_not_sent_twice() {
    if !tools() {
        return;
    }
    let image = image();
    let data = classic_archive_documents_first(&image);
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let none = [("RUNR_UPLOAD_COMPRESS", "none")];
    let large = large(&image);
    let repo = "runr-uploads/platform/docs-first";
    for round in 0..2 {
        let dir = work.path().join(format!("round-{round}"));
        std::fs::create_dir(&dir).unwrap();
        let r = receiver(&dir, &reg, repo, &data, &none);
        if round == 0 {
            // Half of the first layer: it streams under its diff_id, not committed yet.
            let (start, end) = first_layer(&data);
            let upto = (start + end) / 2 / CHUNK;
            put_range(&r, &data, 0..upto);
            r.wait_status("the first layer to stream", |s| {
                s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
            });
            assert!(!has_blob(&reg, repo, &image.layers[0].digest));
            let tail = after_large_blobs(&data);
            put_range(&r, &data[..tail], upto..chunk_count(&data[..tail]));
        } else {
            let tail = after_large_blobs(&data);
            put_range(&r, &data[..tail], 0..chunk_count(&data[..tail]));
        }
        let s = r.wait_status("the follower to push the large layers", |s| {
            s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= large.len() as u64
        });
        assert_eq!(s["status"], "receiving", "{s}");
        let log = r.log();
        for d in &large {
            assert!(
                has_blob(&reg, repo, d),
                "{d} is not in the registry before complete"
            );
            let there = log
                .lines()
                .any(|l| l.contains("blob already in the registry") && l.contains(d.as_str()));
            assert_eq!(there, round == 1, "{d}: {log}");
        }
        assert!(layers_pushed_while_arriving(&log).is_empty(), "{log}");
        let tail = after_large_blobs(&data);
        put_range(&r, &data, tail / CHUNK..chunk_count(&data));
        let s = r.completed();
        assert_eq!(s["push"]["bytes_pushed"], s["push"]["bytes"], "{s}");
        pulled_from(&reg, repo, &image);
    }
}

/// The overlap rule while a layer streams: a chunk sent again with other bytes over the part
/// of the layer already pushed changes nothing (it is answered, and only bytes nobody held are
/// written), so the layer in the registry, and the image, are the ones of the bytes received
/// first.
#[test]
fn a_chunk_rewritten_inside_a_streamed_layer_changes_nothing() {
    if !tools() {
        return;
    }
    for compress in ["none", "gzip"] {
        let image = image();
        let data = classic_archive(&image);
        let reg = Registry::start();
        let work = tempfile::tempdir().unwrap();
        let repo = format!("runr-uploads/platform/docker-{compress}-rewritten");
        let env = [("RUNR_UPLOAD_COMPRESS", compress)];
        let r = receiver(work.path(), &reg, &repo, &data, &env);
        let (start, end) = first_layer(&data);
        let upto = (end - 1) / CHUNK;
        put_range(&r, &data, 0..upto);
        r.wait_status("the first layer to stream", |s| {
            s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
        });
        // The chunk holding the layer's first bytes again, every byte flipped.
        let i = start / CHUNK;
        let other: Vec<u8> = data[i * CHUNK..(i + 1) * CHUNK]
            .iter()
            .map(|b| !b)
            .collect();
        let (code, body) = r.put((i * CHUNK) as u64, &other);
        assert_eq!(code, 200, "{body}");
        assert_eq!(body["uploaded_bytes"], (upto * CHUNK) as u64, "{body}");
        put_range(&r, &data, upto..chunk_count(&data));
        assert!(r.data_file() == data, "held bytes changed");
        r.completed();
        match compress {
            "gzip" => pulled_gzipped(&reg, &repo, &image),
            _ => pulled_from(&reg, &repo, &image),
        }
    }
}

/// `data` compressed whole with `tool` (`gzip`, `xz` or `zstd`).
fn compressed(tool: &str, data: &[u8]) -> Vec<u8> {
    let mut child = std::process::Command::new(tool)
        .args(["-c", "-q"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool}: {out:?}");
    out.stdout
}

/// A whole archive compressed with `tool`, sent in order: the follower indexes it through its
/// decoder while it arrives and pushes its blobs from that one decode, so its large blobs are
/// in the registry before the upload ends (no tag, no manifest), and after `complete` nothing
/// is decoded again; the image is the one the plain archive pushes.
fn a_whole_compressed_archive_in_order_is_pushed_while_it_arrives(
    tool: &str,
    format: &str,
    mode: &str,
) {
    if !tools() || !have_tool(tool) {
        return;
    }
    let image = TestImage::random("1", &[4 << 20, 4 << 20, 100_000]);
    let work = tempfile::tempdir().unwrap();
    let plain = match format {
        "oci" => oci_archive(&image, work.path()),
        _ => classic_archive(&image),
    };
    let data = compressed(tool, &plain);
    let reg = Registry::start();
    let repo = format!("runr-uploads/platform/{tool}-{format}-{mode}");
    let env = [("RUNR_UPLOAD_COMPRESS", mode)];
    let r = receiver(work.path(), &reg, &repo, &data, &env);
    // All but the last byte (of the compressed stream's trailer): every entry can be decoded,
    // and the blobs ordered by digest (skopeo's layout) may end just before the index.
    let tail = data.len() - 1;
    put_range(&r, &data[..tail], 0..chunk_count(&data[..tail]));
    let mut large = large(&image);
    if tool == "zstd" {
        // Its decoder hands out what is decoded only beyond the frame's window (2 MiB for
        // `zstd -c` of a stream): the last large layer comes out with the end of the frame.
        large.truncate(1);
    }
    // Named by their digests as they are (OCI, or classic with `none`), else by what gzip'ing
    // them made (the follower's log).
    let named = format == "oci" || mode == "none";
    let s = r.wait_status("the follower to push the large blobs", |_| {
        if named {
            large.iter().all(|d| has_blob(&reg, &repo, d))
        } else {
            let layers = layers_pushed_while_arriving(&r.log());
            layers.len() >= large.len() && layers.iter().all(|(_, d)| has_blob(&reg, &repo, d))
        }
    });
    assert_eq!(s["status"], "receiving", "{s}");
    assert!(!has_manifest(&reg, &repo, "1"), "a tag before complete");
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
    let s = r.completed();
    let log = r.log();
    assert!(log.contains("indexed while it arrived"), "{log}");
    assert!(
        log.contains("compressed archive read through its decoder decoders=1"),
        "{log}"
    );
    assert!(!log.contains("gzip'ing layer after complete"), "{log}");
    let push = &s["push"];
    assert_eq!(push["blobs"], image.blobs().len() as u64, "{s}");
    assert_eq!(push["blobs_pushed"], push["blobs"], "{s}");
    assert_eq!(push["bytes_pushed"], push["bytes"], "{s}");
    match mode {
        "gzip" => pulled_gzipped(&reg, &repo, &image),
        _ => pulled_from(&reg, &repo, &image),
    }
    let today = pushed_after_complete(
        work.path(),
        &reg,
        &format!("runr-uploads/platform/{tool}-{format}-{mode}-plain"),
        &plain,
        &env,
    );
    assert_eq!(
        s["image"]["digest"], today["image"]["digest"],
        "{s}\n{today}"
    );
}

#[test]
fn a_whole_gzip_oci_archive_in_order_is_pushed_while_it_arrives() {
    a_whole_compressed_archive_in_order_is_pushed_while_it_arrives("gzip", "oci", "none");
}

#[test]
fn a_whole_xz_classic_archive_in_order_is_gzipped_and_pushed_while_it_arrives() {
    a_whole_compressed_archive_in_order_is_pushed_while_it_arrives("xz", "docker", "gzip");
}

#[test]
fn a_whole_zstd_classic_archive_in_order_is_pushed_while_it_arrives() {
    a_whole_compressed_archive_in_order_is_pushed_while_it_arrives("zstd", "docker", "none");
}

/// Sent last chunk first, a whole compressed archive is not followed (the whole file is there
/// before its first bytes are): the pass indexes and pushes it after `complete`, as before.
#[test]
fn a_whole_gzip_archive_sent_last_chunk_first_is_pushed_after_complete() {
    if !tools() {
        return;
    }
    let image = image();
    let data = gzip(&classic_archive(&image));
    let reg = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let repo = "runr-uploads/platform/gz";
    let r = receiver(
        work.path(),
        &reg,
        repo,
        &data,
        &[("RUNR_UPLOAD_COMPRESS", "none")],
    );
    put_range(&r, &data, (0..chunk_count(&data)).rev());
    r.completed();
    let log = r.log();
    assert!(
        !log.contains("blob pushed while the upload arrives"),
        "{log}"
    );
    assert!(!log.contains("indexed while it arrived"), "{log}");
    pulled_from(&reg, repo, &image);
}

#[test]
fn a_mismatch_after_streaming_leaves_no_tag_and_no_manifest() {
    if !tools() {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let reg = Registry::start();
    let repo = "runr-uploads/platform/mismatch";
    let wrong = sha256_hex(b"another file");
    let r = receiver(
        work.path(),
        &reg,
        repo,
        &data,
        &[("RUNR_UPLOAD_SHA256", wrong.as_str())],
    );
    streamed_before_complete(&r, &reg, repo, &data, &large(&image));
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("the upload to be reopened", |s| {
        s["status"] == "ready" && s["message"].is_string()
    });
    assert!(s["message"].as_str().unwrap().contains(&wrong), "{s}");
    assert!(!has_manifest(&reg, repo, "1"), "a tag after a mismatch");
    assert!(
        !has_manifest(&reg, repo, &image.manifest.digest),
        "the manifest after a mismatch"
    );
    // What was streamed stays, unreferenced, for the registry's garbage collection.
    for d in large(&image) {
        assert!(has_blob(&reg, repo, &d), "{d}");
    }
}

/// The same for a whole `.tar.gz`, whose blobs the follower pushed from its decoder before the
/// upload ended: the reopened upload leaves no tag and no manifest, only unreferenced blobs.
#[test]
fn a_mismatch_after_streaming_a_gzip_archive_leaves_no_tag_and_no_manifest() {
    if !tools() {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = gzip(&oci_archive(&image, work.path()));
    let reg = Registry::start();
    let repo = "runr-uploads/platform/mismatch-gz";
    let wrong = sha256_hex(b"another file");
    let r = receiver(
        work.path(),
        &reg,
        repo,
        &data,
        &[("RUNR_UPLOAD_SHA256", wrong.as_str())],
    );
    let tail = data.len() - 1;
    put_range(&r, &data[..tail], 0..chunk_count(&data[..tail]));
    let large = large(&image);
    r.wait_status("the follower to push the large blobs", |_| {
        large.iter().all(|d| has_blob(&reg, repo, d))
    });
    let (code, body) = r.put(tail as u64, &data[tail..]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("the upload to be reopened", |s| {
        s["status"] == "ready" && s["message"].is_string()
    });
    assert!(s["message"].as_str().unwrap().contains(&wrong), "{s}");
    assert!(!has_manifest(&reg, repo, "1"), "a tag after a mismatch");
    assert!(
        !has_manifest(&reg, repo, &image.manifest.digest),
        "the manifest after a mismatch"
    );
    for d in large {
        assert!(has_blob(&reg, repo, &d), "{d}");
    }
}

/// A receiver killed with SIGKILL while the follower pushes the blobs of a whole `.tar.xz`
/// from its decoder: the restarted one decodes it again from byte 0 (what the registry has
/// costs a HEAD) and the image is whole.
#[test]
fn a_receiver_killed_while_a_compressed_archive_streams_follows_again_from_byte_0() {
    if !tools() || !have_tool("xz") {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = compressed("xz", &oci_archive(&image, work.path()));
    let reg = Registry::start();
    let repo = "runr-uploads/platform/killed-xz";
    let mut r = receiver(work.path(), &reg, repo, &data, &[]);
    let upto = chunk_count(&data) / 2;
    put_range(&r, &data, 0..upto);
    r.wait_status("a blob to stream", |s| {
        s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
    });
    r.kill9();
    r.restart();
    put_range(&r, &data, upto..chunk_count(&data));
    let s = r.completed();
    assert_eq!(s["push"]["blobs_pushed"], s["push"]["blobs"], "{s}");
    pulled_from(&reg, repo, &image);
}

#[test]
fn a_receiver_killed_while_a_blob_streams_follows_again_from_byte_0() {
    if !tools() {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let reg = Registry::start();
    let repo = "runr-uploads/platform/killed";
    let mut r = receiver(work.path(), &reg, repo, &data, &[]);
    // The first chunks only: the first large blob's push is under way, its end not there yet.
    let first = &image.layers[0];
    let name = format!(
        "blobs/sha256/{}",
        first.digest.strip_prefix("sha256:").unwrap()
    );
    let at = data
        .windows(name.len())
        .position(|w| w == name.as_bytes())
        .expect("the blob's tar header");
    let upto = (at + first.data.len() / 2) / CHUNK;
    put_range(&r, &data, 0..upto);
    r.wait_status("the first large blob to stream", |s| {
        s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
    });
    assert!(!has_blob(&reg, repo, &first.digest));
    r.kill9();
    r.restart();
    put_range(&r, &data, upto..chunk_count(&data));
    r.completed();
    pulled_from(&reg, repo, &image);
}

/// The same with a classic layer the follower pushes in a chunked upload (`compress`: as it is
/// or gzip'ed), killed part way through it: the restarted receiver pushes it again from byte 0
/// and the image is whole.
fn a_receiver_killed_while_a_classic_layer_streams_follows_again_from_byte_0(compress: &str) {
    if !tools() {
        return;
    }
    let image = image();
    let data = classic_archive(&image);
    let work = tempfile::tempdir().unwrap();
    let reg = Registry::start();
    let repo = format!("runr-uploads/platform/killed-{compress}");
    let env = [("RUNR_UPLOAD_COMPRESS", compress)];
    let mut r = receiver(work.path(), &reg, &repo, &data, &env);
    let (_, end) = first_layer(&data);
    // All but the layer's last bytes: its first pieces are sent (a gzip member goes once the
    // compressor read two blocks further and the next member came), its upload not committed.
    let upto = (end - 1) / CHUNK;
    assert!(upto * CHUNK < end);
    put_range(&r, &data, 0..upto);
    r.wait_status("the first layer to stream", |s| {
        s["push"]["bytes_pushed"].as_u64().unwrap_or(0) > 0
    });
    r.kill9();
    r.restart();
    put_range(&r, &data, upto..chunk_count(&data));
    r.completed();
    match compress {
        "gzip" => pulled_gzipped(&reg, &repo, &image),
        _ => pulled_from(&reg, &repo, &image),
    }
}

#[test]
fn a_receiver_killed_while_a_layer_is_gzipped_follows_again_from_byte_0() {
    a_receiver_killed_while_a_classic_layer_streams_follows_again_from_byte_0("gzip");
}

#[test]
fn a_receiver_killed_while_a_layer_streams_as_it_is_follows_again_from_byte_0() {
    a_receiver_killed_while_a_classic_layer_streams_follows_again_from_byte_0("none");
}

#[test]
fn many_status_readers_during_the_push_see_monotone_progress() {
    if !tools() {
        return;
    }
    let image = TestImage::random("1", &[8 << 20, 8 << 20, 4 << 20, 100_000]);
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let reg = Registry::start();
    let repo = "runr-uploads/platform/readers";
    let r = receiver(work.path(), &reg, repo, &data, &[]);
    let addr = r.addr;
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..32)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                let (mut blobs, mut bytes, mut answers) = (0u64, 0u64, 0u64);
                while !done.load(Ordering::SeqCst) {
                    let (code, s) = crate::support::request(
                        addr,
                        "GET",
                        "/status",
                        &[],
                        crate::support::Body::None,
                    );
                    assert_eq!(code, 200, "{s}");
                    assert!(s["status"].is_string() && s["size"].is_u64(), "{s}");
                    answers += 1;
                    let push = &s["push"];
                    if push.is_null() {
                        assert_eq!((blobs, bytes), (0, 0), "push disappeared: {s}");
                        continue;
                    }
                    let get = |k: &str| push[k].as_u64().unwrap_or_else(|| panic!("{k}: {s}"));
                    let (bp, b, yp, y) = (
                        get("blobs_pushed"),
                        get("blobs"),
                        get("bytes_pushed"),
                        get("bytes"),
                    );
                    assert!(bp <= b && yp <= y, "more done than known: {s}");
                    assert!(bp >= blobs && yp >= bytes, "progress went back: {s}");
                    (blobs, bytes) = (bp, yp);
                }
                answers
            })
        })
        .collect();
    put_range(&r, &data, 0..chunk_count(&data));
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    done.store(true, Ordering::SeqCst);
    for reader in readers {
        assert!(reader.join().expect("a reader panicked") > 0);
    }
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(s["push"]["bytes_pushed"], image.blob_bytes(), "{s}");
    pulled_from(&reg, repo, &image);
}

/// Chunks in a shuffled order: the prefix grows in jumps, the follower takes what it reaches
/// before the whole file is there, the pass the rest; the image is the one pushed in order.
#[test]
fn a_shuffled_upload_is_pushed_whole() {
    if !tools() {
        return;
    }
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let reg = Registry::start();
    let repo = "runr-uploads/platform/shuffled";
    let r = receiver(work.path(), &reg, repo, &data, &[]);
    let mut order: Vec<usize> = (0..chunk_count(&data)).collect();
    // A fixed permutation, so a failure reproduces.
    runr_testkit::random::Rng::new(0x2545_f491_4f6c_dd1d).shuffle(&mut order);
    put_range(&r, &data, order.into_iter());
    let s = r.completed();
    assert_eq!(s["push"]["bytes_pushed"], image.blob_bytes(), "{s}");
    pulled_from(&reg, repo, &image);
    let today = pushed_after_complete(
        work.path(),
        &reg,
        "runr-uploads/platform/shuffled-pass",
        &data,
        &[],
    );
    assert_eq!(
        s["image"]["digest"], today["image"]["digest"],
        "{s}\n{today}"
    );
}
