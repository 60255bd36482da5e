//! Every format the receiver takes, every way it may arrive, through the real binary into one
//! shared `docker-registry`:
//! every format of the corpus × the archive plain and compressed whole with gzip, xz and zstd
//! (the Debian tools) × its chunks in order, reversed and in a random (fixed) order × both
//! `RUNR_UPLOAD_COMPRESS` modes. One test per case, named
//! `matrix::<format>::<compression>::<order>_push_<mode>`. A wasm module is taken plain only
//! (detected by its own magic): compressed whole it is refused, which
//! `matrix::wasm_compressed_whole` checks.
//!
//! An in-order upload of a plain archive with a large blob holds its tail back until the
//! follower pushed that blob, so the case covers the push while the upload arrives and not
//! only the pass after `complete` (an upload faster than the follower leaves it all to the
//! pass).
//!
//! Each case must end `completed` with the very image the same plain archive pushes when it is
//! sent in one piece: the digest the status names, and the manifest (or index) the registry
//! serves for the tag (`skopeo inspect --raw`), hashed. That one-piece push is made once per
//! format and mode, and pulled back with skopeo and checked blob by blob
//! ([`crate::image::verify_pulled`]). Equal manifest digests mean equal configs and layers
//! (each is named by its digest), so the pulled-back image is byte-identical.
//!
//! The corpus: the small fixtures of tests/fixtures/make.sh (skopeo's `docker-archive`, with
//! layers uncompressed and gzip'ed, for `docker save` classic; the Docker ≥ 25 layout;
//! skopeo's `oci-archive`; `ctr export` of two images, narrowed by `RUNR_UPLOAD_NAME`; the
//! multi-platform index complete and partial; a wasm module) and three archives of an image
//! with a layer over 1 MiB, which the follower streams while the upload arrives: a classic
//! archive in Docker ≤ 24's order, skopeo's `oci-archive`, and a layout in BuildKit's
//! `--output type=oci` order (entries by name, blobs first; no BuildKit on the test machines).

use std::collections::HashMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use runr_testkit::oci::TestImage;
use runr_testkit::{skopeo, Registry};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::support::Receiver;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Format {
    /// skopeo's `docker-archive`, layers uncompressed (`docker save` of Docker ≤ 24).
    DockerClassic,
    /// The same with gzip'ed layers, linked by hard links.
    DockerClassicGzipLayers,
    /// A classic archive of a layer over 1 MiB, `manifest.json` last.
    DockerClassicLarge,
    /// Docker ≥ 25's `docker save`: an OCI layout plus `manifest.json`.
    DockerOci,
    /// `skopeo copy … oci-archive:`.
    SkopeoOciArchive,
    /// The same of an image with a layer over 1 MiB.
    SkopeoOciArchiveLarge,
    /// A layout in BuildKit's order (entries sorted by name: blobs, index.json, oci-layout).
    Buildx,
    /// `ctr export` of two images (the upload names one).
    CtrExport,
    /// An index of linux/amd64 and linux/arm64, every blob there.
    MultiPlatform,
    /// The same without the arm64 layer.
    MultiPlatformPartial,
    /// A WebAssembly module.
    Wasm,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Compression {
    Plain,
    Gzip,
    Xz,
    Zstd,
}

#[derive(Clone, Copy, Debug)]
enum Order {
    /// From byte 0 up, as the console and `runr images push` send.
    Forward,
    Reversed,
    Random,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Mode {
    None,
    Gzip,
}

impl Mode {
    fn env(self) -> &'static str {
        match self {
            Mode::None => "none",
            Mode::Gzip => "gzip",
        }
    }
}

fn tools() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo", "gzip", "xz", "zstd"])
}

/// The registry every case pushes into (each into its own repository, so none finds another's
/// blobs with a `HEAD`). Held by the running cases; the last one to finish stops it.
fn registry() -> Arc<Registry> {
    static SHARED: Mutex<Weak<Registry>> = Mutex::new(Weak::new());
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(reg) = shared.upgrade() {
        return reg;
    }
    let reg = Arc::new(Registry::start());
    *shared = Arc::downgrade(&reg);
    reg
}

/// Values made once per key for the whole test binary.
type Cache<K, V> = OnceLock<Mutex<HashMap<K, Arc<OnceLock<V>>>>>;

/// `make(key)`, once per key for the whole test binary (other keys are made meanwhile).
fn once<K, V>(cache: &'static Cache<K, V>, key: K, make: impl FnOnce() -> V) -> V
where
    K: Eq + std::hash::Hash,
    V: Clone,
{
    let cell = cache
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(key)
        .or_default()
        .clone();
    cell.get_or_init(make).clone()
}

/// An image with a layer the follower streams (over 1 MiB) and one it leaves to the pass.
fn large_image() -> TestImage {
    TestImage::random("1", &[1_300_000, 20_000])
}

/// A layout tar in the order BuildKit's OCI exporter writes it (containerd's archive writer:
/// entries sorted by name), the index naming the image as BuildKit does.
fn buildx_archive(image: &TestImage) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let dir = |b: &mut tar::Builder<Vec<u8>>, name: &str| {
        let mut h = tar::Header::new_ustar();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_mode(0o755);
        h.set_size(0);
        h.set_cksum();
        b.append_data(&mut h, name, std::io::empty()).unwrap();
    };
    let file = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_ustar();
        h.set_mode(0o644);
        h.set_size(data.len() as u64);
        h.set_cksum();
        b.append_data(&mut h, name, data).unwrap();
    };
    dir(&mut b, "blobs/");
    dir(&mut b, "blobs/sha256/");
    let mut blobs: Vec<_> = image.blobs().into_iter().chain([&image.manifest]).collect();
    blobs.sort_by(|a, b| a.digest.cmp(&b.digest));
    for blob in blobs {
        let hex = blob.digest.strip_prefix("sha256:").unwrap();
        file(&mut b, &format!("blobs/sha256/{hex}"), &blob.data);
    }
    let layout: Value =
        serde_json::from_slice(&std::fs::read(image.dir().join("index.json")).unwrap()).unwrap();
    let mut top = layout["manifests"][0].clone();
    top["annotations"] = serde_json::json!({
        "io.containerd.image.name": "docker.io/library/app:1",
        "org.opencontainers.image.ref.name": "1",
    });
    let index = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [top],
    });
    file(&mut b, "index.json", index.to_string().as_bytes());
    file(&mut b, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    b.into_inner().unwrap()
}

/// The plain archive of `format`, made once.
fn plain(format: Format) -> Arc<Vec<u8>> {
    static CACHE: Cache<Format, Arc<Vec<u8>>> = OnceLock::new();
    once(&CACHE, format, || {
        let fixture = |name: &str| std::fs::read(crate::image::fixture(name)).unwrap();
        let data = match format {
            Format::DockerClassic => fixture("docker-raw.tar"),
            Format::DockerClassicGzipLayers => fixture("docker-gzlayers.tar"),
            Format::DockerOci => fixture("docker25.tar"),
            Format::SkopeoOciArchive => fixture("oci-archive.tar"),
            Format::CtrExport => fixture("containerd-two.tar"),
            Format::MultiPlatform => fixture("multi.tar"),
            Format::MultiPlatformPartial => fixture("multi-partial.tar"),
            Format::Wasm => fixture("module.wasm"),
            Format::DockerClassicLarge => crate::stream::classic_archive(&large_image()),
            Format::SkopeoOciArchiveLarge => {
                let work = tempfile::tempdir().unwrap();
                crate::support::oci_archive(&large_image(), work.path())
            }
            Format::Buildx => buildx_archive(&large_image()),
        };
        Arc::new(data)
    })
}

/// `tool args` with `data` on its stdin; its stdout.
fn filter(tool: &str, args: &[&str], data: &[u8]) -> Vec<u8> {
    let mut child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let input = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool} {args:?}: {:?}", out.status);
    out.stdout
}

/// The archive of `format` as uploaded: plain, or compressed whole by the real tool.
fn archive(format: Format, compression: Compression) -> Arc<Vec<u8>> {
    static CACHE: Cache<(Format, Compression), Arc<Vec<u8>>> = OnceLock::new();
    once(&CACHE, (format, compression), || {
        let data = plain(format);
        match compression {
            Compression::Plain => data,
            Compression::Gzip => Arc::new(filter("gzip", &["-n", "-c"], &data)),
            Compression::Xz => Arc::new(filter("xz", &["-T1", "-c"], &data)),
            Compression::Zstd => Arc::new(filter("zstd", &["-q", "-c"], &data)),
        }
    })
}

/// `RUNR_UPLOAD_NAME` of an archive of several images.
fn upload_name(format: Format) -> Option<&'static str> {
    (format == Format::CtrExport).then_some("corpus/alpha:v1")
}

fn sha256(data: &[u8]) -> String {
    let hex: String = Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

/// Where an in-order upload holds back its tail: once the bytes before `at` are sent, it waits
/// until the follower pushed `blobs` blobs (its large ones) while the upload is still
/// `receiving`, so the case proves they streamed before `complete`.
#[derive(Clone, Copy)]
struct Hold {
    at: usize,
    blobs: u64,
}

/// Uploads `data` as the byte ranges `pieces`, in that order, into `repo`, completes and waits
/// for the end; the final status.
fn upload(
    reg: &Registry,
    repo: &str,
    format: Format,
    mode: Mode,
    data: &[u8],
    pieces: &[(usize, usize)],
    hold: Option<Hold>,
) -> Value {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("upload");
    std::fs::create_dir_all(&dir).unwrap();
    let target = format!("{}/{repo}:1", reg.host());
    let mut env = vec![
        ("RUNR_UPLOAD_TARGET", target.as_str()),
        ("RUNR_UPLOAD_COMPRESS", mode.env()),
    ];
    if let Some(name) = upload_name(format) {
        env.push(("RUNR_UPLOAD_NAME", name));
    }
    let r = Receiver::for_data(&dir, data, &env);
    for &(start, end) in pieces {
        if let Some(h) = hold.filter(|h| h.at == start) {
            let s = r.wait_status("the follower to push the large blobs", |s| {
                s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= h.blobs
            });
            assert_eq!(s["status"], "receiving", "{s}\n{}", r.log());
        }
        let (code, body) = r.put(start as u64, &data[start..end]);
        assert_eq!(code, 200, "the bytes {start}..{end}: {body}");
    }
    let (code, body) = r.complete();
    assert_eq!(code, 202, "{body}");
    // A mismatch reopens the upload (`ready` with a message): an end too.
    let s = r.wait_status("the push to end", |s| {
        s["status"] == "completed"
            || s["status"] == "failed"
            || (s["status"] == "ready" && s["message"].is_string())
    });
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    s
}

/// `chunks` (indexes of `chunk`-byte pieces of `len` bytes) as byte ranges; a range that
/// crosses `cut` is split there.
fn ranges(len: usize, chunk: usize, chunks: &[usize], cut: Option<usize>) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &i in chunks {
        let (start, end) = (i * chunk, ((i + 1) * chunk).min(len));
        match cut {
            Some(c) if start < c && c < end => out.extend([(start, c), (c, end)]),
            _ => out.push((start, end)),
        }
    }
    out
}

/// The digest of what the registry serves for `repo:1`, through skopeo.
fn tag_digest(reg: &Registry, repo: &str) -> String {
    let raw = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{}/{repo}:1", reg.host()),
    ]);
    sha256(raw.as_bytes())
}

/// The digest the plain archive of `format` pushes with `mode` when sent in one piece, made
/// once; pulled back with skopeo and checked blob by blob.
fn one_piece(format: Format, mode: Mode) -> String {
    static CACHE: Cache<(Format, Mode), String> = OnceLock::new();
    once(&CACHE, (format, mode), || {
        let reg = registry();
        let repo = format!(
            "runr-uploads/matrix/{}-{}-one-piece",
            slug(format),
            mode.env()
        );
        let data = plain(format);
        let s = upload(&reg, &repo, format, mode, &data, &[(0, data.len())], None);
        let digest = s["image"]["digest"].as_str().expect("a digest").to_string();
        assert_eq!(tag_digest(&reg, &repo), digest, "{s}");
        if format != Format::Wasm {
            let c = crate::image::Case {
                work: tempfile::tempdir().unwrap(),
                target: format!("{}/{repo}:1", reg.host()),
                repo: repo.clone(),
                tag: "1".to_string(),
            };
            let all = format == Format::MultiPlatform;
            assert!(crate::image::verify_pulled(&reg, &c, all) >= 1, "{s}");
        }
        digest
    })
}

fn slug(format: Format) -> String {
    let name = format!("{format:?}");
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('-');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

/// The chunk size of an upload of `len` bytes: about eight chunks, at most 256 KiB (so a large
/// blob streams across several).
fn chunk_size(len: usize) -> usize {
    len.div_ceil(8).clamp(1, 256 << 10)
}

/// The chunks' indexes in `order`; a random order is a fixed permutation (seeded by the
/// case's name), so a failure reproduces.
fn chunk_order(count: usize, order: Order, seed: &str) -> Vec<usize> {
    let mut v: Vec<usize> = (0..count).collect();
    match order {
        Order::Forward => {}
        Order::Reversed => v.reverse(),
        Order::Random => {
            let seed = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            runr_testkit::random::Rng::new(seed).shuffle(&mut v);
        }
    }
    v
}

/// One case: the archive of `format`, `compression`, in `order`, pushed with `mode`, is the
/// image its plain archive pushes in one piece.
fn check(format: Format, compression: Compression, order: Order, mode: Mode) {
    if !tools() {
        return;
    }
    let want = one_piece(format, mode);
    let data = archive(format, compression);
    let chunk = chunk_size(data.len());
    let repo = format!(
        "runr-uploads/matrix/{}-{compression:?}-{order:?}-{}",
        slug(format),
        mode.env()
    )
    .to_ascii_lowercase();
    let chunks = chunk_order(data.len().div_ceil(chunk), order, &repo);
    assert!(
        chunks.len() >= 2,
        "{repo}: {} bytes in one chunk",
        data.len()
    );
    // In order, a plain archive with a large blob is held before its tail until the follower
    // pushed that blob (a whole compressed archive is not followed: the pass pushes it).
    let large = matches!(
        format,
        Format::DockerClassicLarge | Format::SkopeoOciArchiveLarge | Format::Buildx
    );
    let hold = (large && compression == Compression::Plain && matches!(order, Order::Forward))
        .then(|| Hold {
            at: crate::stream::after_large_blobs(&data),
            blobs: 1,
        });
    let pieces = ranges(data.len(), chunk, &chunks, hold.map(|h| h.at));
    let reg = registry();
    let s = upload(&reg, &repo, format, mode, &data, &pieces, hold);
    assert_eq!(s["image"]["digest"], want.as_str(), "{repo}: {s}");
    assert_eq!(tag_digest(&reg, &repo), want, "{repo}: what the tag serves");
    assert_eq!(s["push"]["blobs_pushed"], s["push"]["blobs"], "{repo}: {s}");
    assert_eq!(s["push"]["bytes_pushed"], s["push"]["bytes"], "{repo}: {s}");
}

/// The six cases of one archive: three orders × two modes.
macro_rules! orders {
    ($format:expr, $compression:expr) => {
        #[test]
        fn in_order_push_none() {
            check($format, $compression, Order::Forward, Mode::None)
        }
        #[test]
        fn in_order_push_gzip() {
            check($format, $compression, Order::Forward, Mode::Gzip)
        }
        #[test]
        fn reversed_push_none() {
            check($format, $compression, Order::Reversed, Mode::None)
        }
        #[test]
        fn reversed_push_gzip() {
            check($format, $compression, Order::Reversed, Mode::Gzip)
        }
        #[test]
        fn random_push_none() {
            check($format, $compression, Order::Random, Mode::None)
        }
        #[test]
        fn random_push_gzip() {
            check($format, $compression, Order::Random, Mode::Gzip)
        }
    };
}

/// The 24 cases of one format: plain and compressed whole three ways.
macro_rules! compressions {
    ($format:expr) => {
        mod plain {
            use super::super::*;
            orders!($format, Compression::Plain);
        }
        mod gz {
            use super::super::*;
            orders!($format, Compression::Gzip);
        }
        mod xz {
            use super::super::*;
            orders!($format, Compression::Xz);
        }
        mod zst {
            use super::super::*;
            orders!($format, Compression::Zstd);
        }
    };
}

mod docker_classic {
    compressions!(Format::DockerClassic);
}
mod docker_classic_gzip_layers {
    compressions!(Format::DockerClassicGzipLayers);
}
mod docker_classic_large {
    compressions!(Format::DockerClassicLarge);
}
mod docker_oci {
    compressions!(Format::DockerOci);
}
mod skopeo_oci_archive {
    compressions!(Format::SkopeoOciArchive);
}
mod skopeo_oci_archive_large {
    compressions!(Format::SkopeoOciArchiveLarge);
}
mod buildx {
    compressions!(Format::Buildx);
}
mod ctr_export {
    compressions!(Format::CtrExport);
}
mod multi_platform {
    compressions!(Format::MultiPlatform);
}
mod multi_platform_partial {
    compressions!(Format::MultiPlatformPartial);
}
mod wasm {
    mod plain {
        use super::super::*;
        orders!(Format::Wasm, Compression::Plain);
    }
}

/// A wasm module is detected by its own magic only: compressed whole it is refused, naming
/// what the receiver takes (docs/image-upload.md, Formats), in whatever order it came.
mod wasm_compressed_whole {
    use super::*;

    fn refused(compression: Compression, order: Order) {
        if !tools() {
            return;
        }
        let data = archive(Format::Wasm, compression);
        let chunk = chunk_size(data.len());
        let repo =
            format!("runr-uploads/matrix/wasm-{compression:?}-{order:?}").to_ascii_lowercase();
        let chunks = chunk_order(data.len().div_ceil(chunk), order, &repo);
        let reg = registry();
        let work = tempfile::tempdir().unwrap();
        let dir = work.path().join("upload");
        std::fs::create_dir_all(&dir).unwrap();
        let target = format!("{}/{repo}:1", reg.host());
        let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_TARGET", target.as_str())]);
        for &i in &chunks {
            let start = i * chunk;
            let end = (start + chunk).min(data.len());
            assert_eq!(r.put(start as u64, &data[start..end]).0, 200);
        }
        assert_eq!(r.complete().0, 202);
        let s = r.wait_status("the upload to fail", |s| s["status"] == "failed");
        let message = s["message"].as_str().unwrap();
        assert!(
            message.contains("neither a docker save archive")
                && message.contains("WebAssembly module"),
            "{s}"
        );
        let status = runr_testkit::http_get_status(reg.addr(), &format!("/v2/{repo}/manifests/1"));
        assert_eq!(status, Some(404), "a tag for a refused upload");
    }

    #[test]
    fn gz_in_order_is_refused() {
        refused(Compression::Gzip, Order::Forward)
    }
    #[test]
    fn xz_reversed_is_refused() {
        refused(Compression::Xz, Order::Reversed)
    }
    #[test]
    fn zst_random_is_refused() {
        refused(Compression::Zstd, Order::Random)
    }
}
