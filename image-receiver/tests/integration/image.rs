//! The image half against a real registry (`docker-registry`) with inputs made by real tools
//! (tests/fixtures/make.sh: umoci, skopeo, gzip; `docker save` where an engine answers).
//! Every valid input is pulled back with skopeo and checked blob by blob (digests and diff_ids);
//! every bad one must fail with a message naming the problem and leave no tag behind.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use runr_image_upload::image::pipeline::{
    process, process_with, Compress, ImageInfo, Kind, ProcessOptions, SourceFormat,
};
use runr_registry::{Backoff, RegistryConfig};
use runr_testkit::proxy::{Hook, Proxy, RequestHead, Verdict};
use runr_testkit::{docker_available, http_get_status, skopeo, Registry};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

/// The fixtures, built once per test binary. Statics are never dropped, so they live under
/// cargo's target/tmp rather than /tmp.
fn fixtures() -> &'static Path {
    static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = tempfile::Builder::new()
            .prefix("runr-fixtures-")
            .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
            .unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/make.sh");
        let out = Command::new("bash")
            .arg(&script)
            .arg(dir.path())
            .output()
            .expect("run make.sh");
        assert!(
            out.status.success(),
            "make.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
    .path()
}

pub(crate) fn fixture(name: &str) -> PathBuf {
    fixtures().join(name)
}

pub(crate) struct Case {
    pub(crate) work: tempfile::TempDir,
    pub(crate) target: String,
    pub(crate) repo: String,
    pub(crate) tag: String,
}

pub(crate) fn case(reg: &Registry, repo: &str, tag: &str) -> Case {
    Case {
        work: tempfile::tempdir().unwrap(),
        target: format!("{}/{repo}:{tag}", reg.host()),
        repo: repo.to_string(),
        tag: tag.to_string(),
    }
}

pub(crate) fn options(
    c: &Case,
    file: &Path,
    name: Option<&str>,
    compress: Compress,
) -> ProcessOptions {
    ProcessOptions {
        work_dir: c.work.path().to_path_buf(),
        target: c.target.clone(),
        upload_name: name.map(str::to_string),
        filename: file.file_name().map(|n| n.to_string_lossy().into_owned()),
        compress,
        registry: RegistryConfig {
            plain_http: true,
            ..RegistryConfig::default()
        },
        progress: Default::default(),
        streamed: Default::default(),
    }
}

fn fast() -> Backoff {
    Backoff {
        base: Duration::from_millis(20),
        max: Duration::from_millis(100),
    }
}

fn sha256_file(path: &Path) -> String {
    format!(
        "sha256:{}",
        hex(&Sha256::digest(std::fs::read(path).unwrap()))
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Pulls the tag back with skopeo into a dir: and checks every image manifest in it: each blob
/// hashes to its name, each layer decompresses to its diff_id. Returns the manifests checked.
pub(crate) fn verify_pulled(reg: &Registry, c: &Case, all: bool) -> usize {
    let out = tempfile::tempdir().unwrap();
    let src = format!("docker://{}/{}:{}", reg.host(), c.repo, c.tag);
    let dest = format!("dir:{}", out.path().display());
    let mut args = vec!["copy", "-q", "--src-tls-verify=false"];
    if all {
        args.push("--all");
    }
    args.extend([src.as_str(), dest.as_str()]);
    skopeo(&args);
    let mut checked = 0;
    for entry in std::fs::read_dir(out.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.ends_with("manifest.json") {
            continue;
        }
        let m: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        let Some(layers) = m["layers"].as_array() else {
            continue;
        };
        let blob = |d: &str| out.path().join(d.strip_prefix("sha256:").unwrap());
        let config_digest = m["config"]["digest"].as_str().unwrap();
        assert_eq!(sha256_file(&blob(config_digest)), config_digest);
        let config: Value =
            serde_json::from_slice(&std::fs::read(blob(config_digest)).unwrap()).unwrap();
        let diff_ids = config["rootfs"]["diff_ids"].as_array().unwrap();
        assert_eq!(diff_ids.len(), layers.len(), "{name}");
        for (layer, diff_id) in layers.iter().zip(diff_ids) {
            let d = layer["digest"].as_str().unwrap();
            let data = std::fs::read(blob(d)).unwrap();
            assert_eq!(format!("sha256:{}", hex(&Sha256::digest(&data))), d);
            assert_eq!(layer["size"].as_u64().unwrap(), data.len() as u64);
            let raw = if data.starts_with(&[0x1f, 0x8b]) {
                let mut v = Vec::new();
                flate2::read::MultiGzDecoder::new(&data[..])
                    .read_to_end(&mut v)
                    .unwrap();
                v
            } else {
                data
            };
            assert_eq!(
                format!("sha256:{}", hex(&Sha256::digest(&raw))),
                diff_id.as_str().unwrap(),
                "layer {d} of {name}"
            );
        }
        checked += 1;
    }
    checked
}

fn assert_no_tag(reg: &Registry, c: &Case) {
    let status = http_get_status(reg.addr(), &format!("/v2/{}/manifests/{}", c.repo, c.tag));
    assert_eq!(status, Some(404), "a tag was left behind for {}", c.target);
}

/// The digest umoci's layout gives the image tagged `tag`.
fn layout_digest(tag: &str) -> String {
    let index: Value =
        serde_json::from_slice(&std::fs::read(fixture("oci/index.json")).unwrap()).unwrap();
    index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

pub(crate) fn assert_tag_is(reg: &Registry, c: &Case, info: &ImageInfo) {
    let raw = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{}/{}:{}", reg.host(), c.repo, c.tag),
    ]);
    assert_eq!(
        format!("sha256:{}", hex(&Sha256::digest(raw.as_bytes()))),
        info.digest
    );
    assert_eq!(info.tag_ref, c.target);
    assert_eq!(
        info.image_ref,
        format!("{}/{}@{}", reg.host(), c.repo, info.digest)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oci_archive_is_pushed_byte_for_byte() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/app", "1.0");
    let file = fixture("oci-archive.tar");
    let info = process(&file, &options(&c, &file, Some("app:1.0"), Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(info.digest, layout_digest("v1"));
    assert_eq!(info.source_format, SourceFormat::Oci);
    assert_eq!(info.kind, Kind::Image);
    assert_eq!(info.layers, 2);
    assert_eq!(info.platforms, ["linux/amd64"]);
    assert_eq!(info.note, None);
    assert_tag_is(&reg, &c, &info);
    assert_eq!(verify_pulled(&reg, &c, false), 1);

    // Again: every blob is there, the digest is the same.
    let again = process(&file, &options(&c, &file, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(again, info);

    // Gzip'ed whole: the layout inside is pushed byte for byte all the same.
    let c = case(&reg, "runr-uploads/platform/app", "gz");
    let file = fixture("oci-archive.tar.gz");
    let gz = process(&file, &options(&c, &file, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(gz.digest, info.digest);
    assert_eq!(verify_pulled(&reg, &c, false), 1);
    assert_eq!(std::fs::read_dir(c.work.path()).unwrap().count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_archives_classic_gzip_none_links_and_whole_gzip() {
    let reg = Registry::start();
    for (file, compress, tag) in [
        ("docker-raw.tar", Compress::Gzip, "gzip"),
        ("docker-raw.tar", Compress::None, "none"),
        ("docker-archive.tar", Compress::Gzip, "symlinks"),
        ("docker-gzlayers.tar", Compress::None, "gzlayers"),
        ("docker-raw.tar.gz", Compress::Gzip, "targz"),
    ] {
        let c = case(&reg, "runr-uploads/platform/classic", tag);
        let path = fixture(file);
        let info = process(&path, &options(&c, &path, None, compress))
            .await
            .unwrap_or_else(|e| panic!("{file} ({tag}): {e}"));
        assert_eq!(info.source_format, SourceFormat::Docker, "{file}");
        assert_eq!(info.layers, 2, "{file}");
        assert_eq!(info.platforms, ["linux/amd64"], "{file}");
        assert_tag_is(&reg, &c, &info);
        assert_eq!(verify_pulled(&reg, &c, false), 1, "{file}");
        let manifest: Value = serde_json::from_str(&skopeo(&[
            "inspect",
            "--raw",
            "--tls-verify=false",
            &format!("docker://{}", c.target),
        ]))
        .unwrap();
        let want = if compress == Compress::None && file == "docker-raw.tar" {
            "application/vnd.oci.image.layer.v1.tar"
        } else {
            "application/vnd.oci.image.layer.v1.tar+gzip"
        };
        for l in manifest["layers"].as_array().unwrap() {
            assert_eq!(l["mediaType"], want, "{file} ({tag})");
        }
        // No temporary file is left in the work directory.
        assert_eq!(std::fs::read_dir(c.work.path()).unwrap().count(), 0);
    }
    // A second upload of the same file to the same tag reuses the compressed layers.
    let c = case(&reg, "runr-uploads/platform/classic", "gzip");
    let path = fixture("docker-raw.tar");
    let first = skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{}", c.target),
    ]);
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(
        info.digest,
        format!("sha256:{}", hex(&Sha256::digest(first.as_bytes())))
    );
}

/// Runs `tool args`, failing the test with its stderr.
fn run(tool: &str, args: &[&str]) {
    let out = Command::new(tool)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Samples, until [`DiskPeak::peak`], the most bytes process `pid` (`self`: this one) holds in
/// `dir`: the files in it plus the files it has open there (an unlinked temporary file counts
/// as long as it is open; a file both open and named counts twice, which only overstates).
struct DiskPeak {
    stop: Arc<std::sync::atomic::AtomicBool>,
    sampler: Option<std::thread::JoinHandle<u64>>,
}

impl DiskPeak {
    fn watch(dir: &Path, pid: &str) -> DiskPeak {
        let dir = dir.canonicalize().unwrap();
        let fds = format!("/proc/{pid}/fd");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut peak = 0;
                while !stop.load(Ordering::SeqCst) {
                    let mut held = 0u64;
                    let Ok(open) = std::fs::read_dir(&fds) else {
                        break;
                    };
                    for fd in open.flatten() {
                        let Ok(target) = std::fs::read_link(fd.path()) else {
                            continue;
                        };
                        // Named files are counted below.
                        let unlinked = target.to_string_lossy().ends_with(" (deleted)");
                        if unlinked && target.starts_with(&dir) {
                            held += std::fs::metadata(fd.path()).map_or(0, |m| m.len());
                        }
                    }
                    for f in std::fs::read_dir(&dir).unwrap().flatten() {
                        held += f.metadata().map_or(0, |m| m.len());
                    }
                    peak = peak.max(held);
                    // A sampling period, not a wait: a temporary file of the sizes at stake
                    // takes far longer than this to be written.
                    std::thread::sleep(Duration::from_millis(2));
                }
                peak
            })
        };
        DiskPeak {
            stop,
            sampler: Some(sampler),
        }
    }

    fn peak(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        self.sampler.take().unwrap().join().unwrap()
    }
}

/// A classic archive of one 80 MiB layer whose tar is more than 8× its `gzip`: umoci's image of
/// the file, skopeo's `docker-archive` with the layer uncompressed, then `gzip`; built once.
/// `(tar, tar.gz)`.
fn eight_times() -> &'static (PathBuf, PathBuf) {
    static MADE: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();
    MADE.get_or_init(|| {
        let dir = fixtures().join("eight-times");
        std::fs::create_dir_all(&dir).unwrap();
        let dir = &dir;
        let d = |name: &str| dir.join(name).display().to_string();
        // 80 MiB: in each 4 KiB, 480 pseudo-random bytes, then zeros (gzip: ~8.5×).
        let mut rng = runr_testkit::random::Rng::new(0x9e37_79b9_7f4a_7c15);
        let mut data = vec![0u8; 80 << 20];
        for block in data.chunks_mut(4096) {
            rng.fill(&mut block[..480]);
        }
        std::fs::write(d("big.bin"), &data).unwrap();
        drop(data);
        let root = Command::new("id").arg("-u").output().unwrap().stdout == b"0\n";
        let layout = d("oci");
        run("umoci", &["init", "--layout", &layout]);
        run("umoci", &["new", "--image", &format!("{layout}:v1")]);
        let mut insert = vec!["insert"];
        if !root {
            insert.push("--rootless");
        }
        let image = format!("{layout}:v1");
        let big = d("big.bin");
        insert.extend(["--image", &image, &big, "/big.bin"]);
        run("umoci", &insert);
        std::fs::remove_file(&big).unwrap();
        let tar = dir.join("big.tar");
        run(
            "skopeo",
            &[
                "--insecure-policy",
                "copy",
                "-q",
                "--dest-decompress",
                &format!("oci:{layout}:v1"),
                &format!("docker-archive:{}:corpus/big:v1", tar.display()),
            ],
        );
        let gz = dir.join("big.tar.gz");
        let out = Command::new("gzip").arg("-c").arg(&tar).output().unwrap();
        assert!(out.status.success());
        std::fs::write(&gz, &out.stdout).unwrap();
        let (tar_len, gz_len) = (
            std::fs::metadata(&tar).unwrap().len(),
            out.stdout.len() as u64,
        );
        assert!(tar_len >= 8 * gz_len, "{tar_len} is not 8 × {gz_len}");
        std::fs::remove_dir_all(&layout).unwrap();
        (tar, gz)
    })
}

fn len(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// A classic archive of one layer whose tar is more than 8× its `gzip` ([`eight_times`]),
/// compressed whole with gzip, xz and zstd: pushed through the decoder without a decompressed
/// copy — nothing at all is written to `RUNR_UPLOAD_DIR`, with `gzip` either (the layer is
/// gzip'ed as it streams) — and pulled back as the same image (the same manifest digest) the tar
/// itself makes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compressed_archive_of_eight_times_its_size_needs_no_decompressed_copy() {
    let reg = Registry::start();
    let (tar, gz) = eight_times();
    let (tar_len, gz_len) = (len(tar), len(gz));
    // The same tar through the other two decoders (xz -1: a 1 MiB dictionary, quick to make).
    let mut packed = vec![("gz", gz.clone())];
    for (tool, args, ext) in [
        ("xz", &["-1", "-T2", "-c"][..], "xz"),
        ("zstd", &["-q", "-c"], "zst"),
    ] {
        let out = Command::new(tool).args(args).arg(tar).output().unwrap();
        assert!(out.status.success(), "{tool}");
        let path = tar.with_extension(format!("tar.{ext}"));
        std::fs::write(&path, &out.stdout).unwrap();
        packed.push((ext, path));
    }
    for (compress, mode) in [(Compress::None, "none"), (Compress::Gzip, "gzip")] {
        let c = case(&reg, "runr-uploads/platform/big-tar", mode);
        let plain = process(tar, &options(&c, tar, None, compress))
            .await
            .unwrap();
        for (ext, file) in &packed {
            let tag = format!("{ext}-{mode}");
            let c = case(&reg, "runr-uploads/platform/big-packed", &tag);
            let peak = DiskPeak::watch(c.work.path(), "self");
            let info = process(file, &options(&c, file, None, compress))
                .await
                .unwrap_or_else(|e| panic!("{tag}: {e}"));
            let peak = peak.peak();
            eprintln!(
                "{tag}: the work dir held at most {peak} bytes (file {}, tar {tar_len})",
                len(file)
            );
            assert_eq!(
                info.digest, plain.digest,
                "{tag}: the tar and its {ext} make one image"
            );
            assert_eq!(peak, 0, "{tag}: nothing is written to the work dir");
            assert_tag_is(&reg, &c, &info);
            assert_eq!(verify_pulled(&reg, &c, false), 1, "{tag}");
        }
    }
    assert!(tar_len >= 8 * gz_len);
}

/// The 8× `.tar.gz` through the real receiver, in 8 MiB chunks in order, with the default
/// `RUNR_UPLOAD_COMPRESS=gzip`: what it holds in `RUNR_UPLOAD_DIR` never passes the upload's
/// size plus 1 MiB (its state), and its peak RSS stays within 64 MiB.
#[test]
fn a_gzip_archive_of_eight_times_its_size_through_the_chunk_api_needs_its_size_on_disk() {
    let reg = Registry::start();
    let (_, gz) = eight_times();
    let data = std::fs::read(gz).unwrap();
    let c = case(&reg, "runr-uploads/platform/e2e-eight", "v1");
    let dir = c.work.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let r = crate::support::Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", c.target.as_str()),
            ("RUNR_UPLOAD_FILENAME", "big.tar.gz"),
        ],
    );
    let disk = DiskPeak::watch(&dir, &r.pid().to_string());
    let chunk = 8 << 20;
    for (i, part) in data.chunks(chunk).enumerate() {
        assert_eq!(r.put((i * chunk) as u64, part).0, 200);
    }
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    let disk = disk.peak();
    let rss = r.peak_rss_kib();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(verify_pulled(&reg, &c, false), 1);
    // In order: one decoder, the follower's, which indexed it and pushed its blobs while it
    // arrived; the pass after `complete` read nothing through a decoder again.
    let log = r.log();
    assert!(
        log.contains("compressed archive read through its decoder decoders=1"),
        "{log}"
    );
    assert!(log.contains("indexed while it arrived"), "{log}");
    let size = data.len() as u64;
    eprintln!(
        "upload of {size} bytes: at most {disk} bytes in RUNR_UPLOAD_DIR, peak RSS {rss} KiB"
    );
    assert!(
        disk <= size + (1 << 20),
        "{disk} bytes for an upload of {size}"
    );
    assert!(rss <= 64 * 1024, "peak RSS {rss} KiB");
}

/// The 8× tar itself ([`eight_times`]: a classic archive, its 80 MiB layer uncompressed)
/// through the real receiver in 8 MiB chunks in order, with the default
/// `RUNR_UPLOAD_COMPRESS=gzip`: the follower gzip's the layer as it arrives, so
/// `RUNR_UPLOAD_DIR` never holds more than the upload's size plus 1 MiB (no compressed copy),
/// nothing is compressed after `complete`, and the peak RSS stays within 64 MiB.
#[test]
fn a_classic_tar_gzipped_as_it_arrives_needs_its_size_on_disk() {
    let reg = Registry::start();
    let (tar, _) = eight_times();
    let data = std::fs::read(tar).unwrap();
    let c = case(&reg, "runr-uploads/platform/e2e-eight-tar", "v1");
    let dir = c.work.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let r = crate::support::Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", c.target.as_str()),
            ("RUNR_UPLOAD_FILENAME", "big.tar"),
        ],
    );
    let disk = DiskPeak::watch(&dir, &r.pid().to_string());
    // Up to the layer's end, then the small documents once it is pushed: the follower leaves
    // to the pass what it reaches only when the whole file is there.
    let tail = crate::stream::after_large_blobs(&data);
    let chunk = 8 << 20;
    for start in (0..tail).step_by(chunk) {
        let stop = (start + chunk).min(tail);
        assert_eq!(r.put(start as u64, &data[start..stop]).0, 200);
    }
    r.wait_status("the follower to push the layer", |s| {
        s["push"]["blobs_pushed"].as_u64().unwrap_or(0) >= 1
    });
    assert_eq!(r.put(tail as u64, &data[tail..]).0, 200);
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    let disk = disk.peak();
    let rss = r.peak_rss_kib();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(verify_pulled(&reg, &c, false), 1);
    let log = r.log();
    assert_eq!(
        crate::stream::layers_pushed_while_arriving(&log).len(),
        1,
        "{log}"
    );
    assert!(!log.contains("gzip'ing layer after complete"), "{log}");
    let size = data.len() as u64;
    eprintln!(
        "upload of {size} bytes: at most {disk} bytes in RUNR_UPLOAD_DIR, peak RSS {rss} KiB"
    );
    assert!(
        disk <= size + (1 << 20),
        "{disk} bytes for an upload of {size}"
    );
    assert!(rss <= 64 * 1024, "peak RSS {rss} KiB");
}

/// `docker save … | xz` and `| zstd` (Debian's xz-utils and zstd, tests/fixtures/make.sh): the
/// tar inside is pushed exactly as the tar itself would be, concatenated streams and frames
/// included; other compressions, a second layer and windows beyond the bounds fail naming what
/// was found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn xz_and_zstd_whole_archives_are_pushed_like_the_tar() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/xz", "raw");
    let raw = fixture("docker-raw.tar");
    let plain = process(&raw, &options(&c, &raw, None, Compress::None))
        .await
        .unwrap();
    for (file, tag) in [
        ("docker-raw.tar.xz", "xz"),
        ("docker-raw.tar.zst", "zst"),
        ("docker-raw.multi.tar.xz", "multi-xz"),
        ("docker-raw.multi.tar.zst", "multi-zst"),
    ] {
        let c = case(&reg, "runr-uploads/platform/xz", tag);
        let path = fixture(file);
        let info = process(&path, &options(&c, &path, None, Compress::None))
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(info.digest, plain.digest, "{file}");
        assert_eq!(info.source_format, SourceFormat::Docker, "{file}");
        assert_tag_is(&reg, &c, &info);
        assert_eq!(verify_pulled(&reg, &c, false), 1, "{file}");
        assert_eq!(
            std::fs::read_dir(c.work.path()).unwrap().count(),
            0,
            "{file}"
        );
    }
    for (file, tag) in [
        ("oci-archive.tar.xz", "oci-xz"),
        ("oci-archive.tar.zst", "oci-zst"),
    ] {
        let c = case(&reg, "runr-uploads/platform/xz", tag);
        let path = fixture(file);
        let info = process(&path, &options(&c, &path, None, Compress::Gzip))
            .await
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(info.digest, layout_digest("v1"), "{file}");
        assert_eq!(verify_pulled(&reg, &c, false), 1, "{file}");
    }

    let scratch = tempfile::tempdir().unwrap();
    let xz = std::fs::read(fixture("docker-raw.tar.xz")).unwrap();
    let zst = std::fs::read(fixture("docker-raw.tar.zst")).unwrap();
    let mut damaged = xz.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x55;
    let refused: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "bz2",
            std::fs::read(fixture("docker-raw.tar.bz2")).unwrap(),
            "the file is bzip2-compressed, which the receiver does not unpack",
        ),
        (
            "lz4",
            std::fs::read(fixture("docker-raw.tar.lz4")).unwrap(),
            "the file is lz4-compressed, which the receiver does not unpack",
        ),
        (
            "gzgz",
            std::fs::read(fixture("docker-raw.tar.gz.gz")).unwrap(),
            "the file is gzip-compressed and what it holds is gzip-compressed again",
        ),
        (
            "dict128",
            std::fs::read(fixture("docker-raw.dict128.tar.xz")).unwrap(),
            "the xz-compressed file could not be decompressed: its dictionary is 128 MiB, more than the 64 MiB",
        ),
        (
            "long",
            std::fs::read(fixture("docker-raw.long.tar.zst")).unwrap(),
            "the zstd-compressed file could not be decompressed: its window is 256 MiB, more than the 128 MiB",
        ),
        (
            "damaged",
            damaged,
            "the xz-compressed file could not be decompressed: ",
        ),
        (
            "truncated-xz",
            xz[..xz.len() - 30].to_vec(),
            "the xz-compressed file could not be decompressed: it ends early",
        ),
        (
            "truncated-zst",
            zst[..zst.len() * 2 / 3].to_vec(),
            "the zstd-compressed file could not be decompressed: it ends early",
        ),
    ];
    for (name, data, want) in refused {
        let c = case(&reg, "runr-uploads/platform/xz", name);
        let path = scratch.path().join(format!("{name}.tar.x"));
        std::fs::write(&path, &data).unwrap();
        let err = process(&path, &options(&c, &path, None, Compress::None))
            .await
            .expect_err(name)
            .to_string();
        assert!(
            err.starts_with(&format!("{name}.tar.x: {want}")),
            "{name}: {err}"
        );
        assert_no_tag(&reg, &c);
        assert_eq!(
            std::fs::read_dir(c.work.path()).unwrap().count(),
            0,
            "{name}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_platform_complete_and_partial() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/multi", "1.0");
    let path = fixture("multi.tar");
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    let layout = std::fs::read_to_string(fixture("multi.digest")).unwrap();
    assert_eq!(info.digest, layout.trim());
    assert_eq!(info.media_type, "application/vnd.oci.image.index.v1+json");
    assert_eq!(info.platforms, ["linux/amd64", "linux/arm64"]);
    assert_eq!(info.layers, 3);
    assert_eq!(info.note, None);
    assert_tag_is(&reg, &c, &info);
    assert_eq!(verify_pulled(&reg, &c, true), 2);

    let c = case(&reg, "runr-uploads/platform/partial", "1.0");
    let path = fixture("multi-partial.tar");
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(info.platforms, ["linux/amd64"]);
    assert_eq!(
        info.media_type,
        "application/vnd.oci.image.manifest.v1+json"
    );
    let note = info.note.clone().expect("a note");
    assert!(note.contains("linux/arm64"), "{note}");
    assert_tag_is(&reg, &c, &info);
    assert_eq!(verify_pulled(&reg, &c, false), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_indexes_and_a_partial_index_of_three() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/nested", "1.0");
    let path = fixture("nested.tar");
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    let layout = std::fs::read_to_string(fixture("nested.digest")).unwrap();
    assert_eq!(info.digest, layout.trim());
    assert_eq!(info.platforms, ["linux/amd64", "linux/arm64"]);
    assert_tag_is(&reg, &c, &info);

    // Two of three platforms complete: a new index of those two.
    let c = case(&reg, "runr-uploads/platform/three", "1.0");
    let path = fixture("multi3-partial.tar");
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(info.media_type, "application/vnd.oci.image.index.v1+json");
    assert_eq!(info.platforms, ["linux/amd64", "linux/s390x"]);
    assert_eq!(info.layers, 4);
    let note = info.note.clone().expect("a note");
    assert!(note.contains("linux/arm64"), "{note}");
    assert_tag_is(&reg, &c, &info);
    assert_eq!(verify_pulled(&reg, &c, true), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_25_archive_keeps_the_layout_digest() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/d25", "v1");
    let path = fixture("docker25.tar");
    let info = process(
        &path,
        &options(&c, &path, Some("corpus/app:v1"), Compress::Gzip),
    )
    .await
    .unwrap();
    assert_eq!(info.source_format, SourceFormat::Oci);
    assert_eq!(info.digest, layout_digest("v1"));
    assert_tag_is(&reg, &c, &info);
    assert_eq!(verify_pulled(&reg, &c, false), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_images_are_narrowed_by_name() {
    let reg = Registry::start();
    let path = fixture("two-images.tar");
    let c = case(&reg, "runr-uploads/platform/two", "v2");
    let err = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("holds 2 images"), "{err}");
    assert!(err.to_string().contains("one image per file"), "{err}");
    assert_no_tag(&reg, &c);

    let err = process(&path, &options(&c, &path, Some("app:v9"), Compress::Gzip))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("none of them named like"), "{err}");
    assert_no_tag(&reg, &c);

    // ref.name holds only a tag: it matches the upload's tag.
    let info = process(
        &path,
        &options(&c, &path, Some("corpus/app:v2"), Compress::Gzip),
    )
    .await
    .unwrap();
    assert_eq!(info.digest, layout_digest("v2"));
    assert_eq!(verify_pulled(&reg, &c, false), 1);
}

/// The digest index.json of `archive` names for the image whose `io.containerd.image.name` is
/// `name`, read with the tar crate.
fn containerd_digest(archive: &Path, name: &str) -> String {
    let index: Value = serde_json::from_slice(&tar_entry(archive, "index.json").1).unwrap();
    let m = index["manifests"].as_array().unwrap().iter().find(|m| {
        m["annotations"]["io.containerd.image.name"] == name
            && m["annotations"]["org.opencontainers.image.ref.name"] == "v1"
    });
    m.unwrap_or_else(|| panic!("{name} with ref.name v1 in {index}"))["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

/// `ctr export` (and `docker save` on Docker's containerd store) of two images: both entries say
/// `ref.name=v1`, so only the full name (`io.containerd.image.name`) can tell them apart, and it
/// decides before the tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containerd_archive_of_two_images_is_narrowed_by_the_full_name() {
    let reg = Registry::start();
    let path = fixture("containerd-two.tar");
    println!(
        "containerd-two.tar made by: {}",
        std::fs::read_to_string(fixture("containerd-two.how")).unwrap()
    );
    let alpha = containerd_digest(&path, "docker.io/corpus/alpha:v1");
    let beta = containerd_digest(&path, "docker.io/corpus/beta:v1");
    assert_ne!(alpha, beta);
    for (name, want, tag) in [
        ("corpus/beta:v1", &beta, "beta"),
        ("corpus/alpha:v1", &alpha, "alpha"),
        ("docker.io/corpus/beta:v1", &beta, "beta-full"),
    ] {
        let c = case(&reg, "runr-uploads/platform/ctr", tag);
        let info = process(&path, &options(&c, &path, Some(name), Compress::Gzip))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(&info.digest, want, "{name}");
        assert_eq!(info.source_format, SourceFormat::Oci);
        assert_tag_is(&reg, &c, &info);
        assert_eq!(verify_pulled(&reg, &c, false), 1, "{name}");
    }
    // A full name that is neither: the shared tag does not pick one of them.
    for name in ["corpus/gamma:v1", "beta:v1"] {
        let c = case(&reg, "runr-uploads/platform/ctr", "none");
        let err = process(&path, &options(&c, &path, Some(name), Compress::Gzip))
            .await
            .unwrap_err()
            .to_string();
        assert!(err.contains("holds 2 images"), "{name}: {err}");
        assert!(err.contains("none of them named like"), "{name}: {err}");
        assert!(err.contains("docker.io/corpus/alpha:v1"), "{name}: {err}");
        assert_no_tag(&reg, &c);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_module_is_pushed_and_fetched_back() {
    let reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/q", "1.0");
    let path = fixture("module.wasm");
    let info = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap();
    assert_eq!(info.kind, Kind::Wasm);
    assert_eq!(info.source_format, SourceFormat::Wasm);
    assert_eq!(info.platforms, ["wasip1/wasm"]);
    let manifest: Value = serde_json::from_str(&skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{}", c.target),
    ]))
    .unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    assert_eq!(manifest["layers"][0]["mediaType"], "application/wasm");
    assert_eq!(manifest["layers"][0]["digest"], sha256_file(&path));

    let dest = c.work.path().join("fetched.wasm");
    let cfg = RegistryConfig {
        plain_http: true,
        ..RegistryConfig::default()
    };
    runr_image_upload::image::fetch::fetch(&info.image_ref, &dest, &cfg)
        .await
        .unwrap();
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&path).unwrap());
    // Through the real binary too, by tag.
    let dest2 = c.work.path().join("by-tag.wasm");
    let out = Command::new(env!("CARGO_BIN_EXE_runr-image-upload"))
        .args(["fetch", &info.tag_ref])
        .arg(&dest2)
        .env("RUNR_REGISTRY_PLAIN_HTTP", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&dest2).unwrap(),
        std::fs::read(&path).unwrap()
    );
    // An image is not a module.
    let c2 = case(&reg, "runr-uploads/platform/img", "1");
    let img = fixture("oci-archive.tar");
    let pushed = process(&img, &options(&c2, &img, None, Compress::Gzip))
        .await
        .unwrap();
    let err = runr_image_upload::image::fetch::fetch(&pushed.tag_ref, &dest, &cfg)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not a WebAssembly module"),
        "{err}"
    );
}

/// A module starts `\0asm 01 00 00 00` (wasip1), a component `\0asm 0d 00 01 00` (wasip2);
/// other version bytes after the magic are neither, and the upload fails naming them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wasm_version_bytes_decide_module_component_or_refusal() {
    let reg = Registry::start();
    let scratch = tempfile::tempdir().unwrap();
    let module = std::fs::read(fixture("module.wasm")).unwrap();
    let body = &module[8..];
    let cases: [(&str, &[u8], Result<&str, &str>); 6] = [
        ("core", &[1, 0, 0, 0], Ok("wasip1/wasm")),
        ("component", &[0x0d, 0, 1, 0], Ok("wasip2/wasm")),
        ("v2", &[2, 0, 0, 0], Err("version bytes 02 00 00 00")),
        ("draft", &[0x0a, 0, 1, 0], Err("version bytes 0a 00 01 00")),
        ("layer2", &[0x0d, 0, 2, 0], Err("version bytes 0d 00 02 00")),
        (
            "short",
            &[1, 0],
            Err("version bytes 01 00 (the file ends there)"),
        ),
    ];
    for (name, version, want) in cases {
        let mut data = b"\0asm".to_vec();
        data.extend_from_slice(version);
        if name != "short" {
            data.extend_from_slice(body);
        }
        let path = scratch.path().join(format!("{name}.wasm"));
        std::fs::write(&path, &data).unwrap();
        let c = case(&reg, "runr-uploads/platform/wasmv", name);
        let got = process(&path, &options(&c, &path, None, Compress::Gzip)).await;
        match want {
            Ok(platform) => {
                let info = got.unwrap_or_else(|e| panic!("{name}: {e}"));
                assert_eq!(info.platforms, [platform], "{name}");
                assert_eq!(info.kind, Kind::Wasm, "{name}");
                assert_tag_is(&reg, &c, &info);
            }
            Err(needle) => {
                let msg = got.expect_err(name).to_string();
                assert!(msg.contains(needle), "{name}: {msg}");
                assert!(msg.contains("neither a WebAssembly core module (01 00 00 00, wasip1) nor a component (0d 00 01 00, wasip2)"), "{name}: {msg}");
                assert!(msg.starts_with(&format!("{name}.wasm: ")), "{name}: {msg}");
                assert_no_tag(&reg, &c);
            }
        }
    }
}

/// The 4 MiB bound on JSON documents holds for an OCI layout's config as for a classic
/// archive's, with the same message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_config_over_4_mib_is_refused_like_a_classic_one() {
    let reg = Registry::start();
    let path = fixture("big-config.tar");
    let index: Value = serde_json::from_slice(&tar_entry(&path, "index.json").1).unwrap();
    let m = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: Value =
        serde_json::from_slice(&tar_entry(&path, &format!("blobs/sha256/{}", &m[7..])).1).unwrap();
    let config = manifest["config"]["digest"].as_str().unwrap();
    let size = manifest["config"]["size"].as_u64().unwrap();
    assert!(size > 5 << 20, "{size}");
    let c = case(&reg, "runr-uploads/platform/bigcfg", "1");
    let err = process(&path, &options(&c, &path, None, Compress::Gzip))
        .await
        .unwrap_err()
        .to_string();
    let want = format!(
        "big-config.tar: the archive entry \"blobs/sha256/{}\" is {size} bytes, more than the 4194304 bytes allowed",
        &config[7..]
    );
    assert_eq!(err, want);
    assert_no_tag(&reg, &c);
    // The same bound on a classic archive's config, for the same message.
    let scratch = tempfile::tempdir().unwrap();
    let classic = scratch.path().join("big-config.tar");
    let big = vec![b' '; 5 << 20];
    std::fs::write(
        &classic,
        tar_with(&[
            (
                b"manifest.json",
                br#"[{"Config":"c.json","RepoTags":["a:1"],"Layers":[]}]"#,
            ),
            (b"c.json", &big),
        ]),
    )
    .unwrap();
    let err = process(&classic, &options(&c, &classic, None, Compress::Gzip))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        err,
        "big-config.tar: the archive entry \"c.json\" is 5242880 bytes, more than the 4194304 bytes allowed"
    );
}

// === bad inputs ===

fn tar_with(entries: &[(&[u8], &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in entries {
        let mut h = tar::Header::new_old();
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0; 1024]);
    out
}

fn tar_dir(dir: &Path) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", dir).unwrap();
    b.into_inner().unwrap()
}

/// Where the regular file `name` sits in the tar `archive` (read with the `tar` crate, not the
/// receiver's own index), and its bytes.
fn tar_entry(archive: &Path, name: &str) -> (u64, Vec<u8>) {
    let mut a = tar::Archive::new(std::fs::File::open(archive).unwrap());
    for entry in a.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if path.trim_start_matches("./") == name {
            let offset = entry.raw_file_position();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            return (offset, data);
        }
    }
    panic!("{name} is not in {}", archive.display());
}

/// A copy of `file` with one byte changed in the middle of archive entry `entry`.
fn corrupt(file: &Path, entry: &str) -> Vec<u8> {
    let (offset, bytes) = tar_entry(file, entry);
    let mut data = std::fs::read(file).unwrap();
    data[(offset + bytes.len() as u64 / 2) as usize] ^= 0x55;
    data
}

fn first_layer(archive: &Path) -> String {
    let index: Value = serde_json::from_slice(&tar_entry(archive, "index.json").1).unwrap();
    let m = index["manifests"][0]["digest"].as_str().unwrap();
    let manifest: Value =
        serde_json::from_slice(&tar_entry(archive, &format!("blobs/sha256/{}", &m[7..])).1)
            .unwrap();
    manifest["layers"][0]["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

fn docker_raw_layer(archive: &Path) -> String {
    let m: Value = serde_json::from_slice(&tar_entry(archive, "manifest.json").1).unwrap();
    m[0]["Layers"][0].as_str().unwrap().to_string()
}

/// `data`, named `<name>.tar`, must fail with a message that names the file and contains
/// `want`, leaving no tag in the registry and nothing in the work dir.
async fn refused(name: &str, data: &[u8], compress: Compress, want: &str) {
    let reg = Registry::start();
    let scratch = tempfile::tempdir().unwrap();
    let c = case(&reg, "runr-uploads/platform/bad", name);
    let path = scratch.path().join(format!("{name}.tar"));
    std::fs::write(&path, data).unwrap();
    let opts = options(&c, &path, None, compress);
    let err = process(&path, &opts)
        .await
        .expect_err(&format!("{name} must fail"));
    let msg = err.to_string();
    assert!(msg.contains(want), "{name}: {msg:?} lacks {want:?}");
    assert!(msg.starts_with(&format!("{name}.tar: ")), "{name}: {msg}");
    assert_no_tag(&reg, &c);
    assert_eq!(
        std::fs::read_dir(c.work.path()).unwrap().count(),
        0,
        "{name} left files in the work dir"
    );
}

/// A gzip bomb: 1000 members of 1 MiB of zeros each, ~1 MiB on disk.
fn gzip_bomb() -> Vec<u8> {
    let member = {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        e.write_all(&vec![0u8; 1 << 20]).unwrap();
        e.finish().unwrap()
    };
    std::iter::repeat_n(member.as_slice(), 1000)
        .flatten()
        .copied()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_archive_is_refused() {
    let oci_bytes = std::fs::read(fixture("oci-archive.tar")).unwrap();
    let data = &oci_bytes[..oci_bytes.len() * 2 / 3];
    refused("truncated", data, Compress::None, "truncated").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_layer_that_does_not_match_its_digest_is_refused() {
    let oci = fixture("oci-archive.tar");
    let layer = first_layer(&oci);
    let data = corrupt(&oci, &format!("blobs/sha256/{}", &layer[7..]));
    let want = format!("{layer} in the file does not match its digest");
    refused("corrupt-oci-layer", &data, Compress::None, &want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_layer_that_does_not_match_its_digest_is_refused() {
    let raw = fixture("docker-raw.tar");
    let data = corrupt(&raw, &docker_raw_layer(&raw));
    let want = "in the file does not match its";
    refused("corrupt-docker-layer", &data, Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_docker_layer_that_does_not_match_its_diff_id_is_refused_when_gzipped() {
    let raw = fixture("docker-raw.tar");
    let data = corrupt(&raw, &docker_raw_layer(&raw));
    let want = "does not match its diff_id";
    refused("corrupt-docker-layer-gzip", &data, Compress::Gzip, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layout_missing_a_layer_blob_is_refused() {
    let scratch = tempfile::tempdir().unwrap();
    let missing_dir = scratch.path().join("missing");
    Command::new("cp")
        .args(["-r"])
        .arg(fixture("oci"))
        .arg(&missing_dir)
        .status()
        .unwrap();
    let index: Value =
        serde_json::from_slice(&std::fs::read(missing_dir.join("index.json")).unwrap()).unwrap();
    let v2 = layout_digest("v2");
    let keep: Vec<&Value> = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["digest"] == v2.as_str())
        .collect();
    std::fs::write(
        missing_dir.join("index.json"),
        serde_json::to_vec(&serde_json::json!({"schemaVersion": 2, "manifests": keep})).unwrap(),
    )
    .unwrap();
    let m: Value = serde_json::from_slice(
        &std::fs::read(missing_dir.join(format!("blobs/sha256/{}", &v2[7..]))).unwrap(),
    )
    .unwrap();
    let gone = m["layers"][0]["digest"].as_str().unwrap().to_string();
    std::fs::remove_file(missing_dir.join(format!("blobs/sha256/{}", &gone[7..]))).unwrap();
    let want = format!("layer {gone} is not in the file");
    refused(
        "missing-blob",
        &tar_dir(&missing_dir),
        Compress::None,
        &want,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_that_points_outside_the_archive_is_refused() {
    let data = tar_with(&[(b"manifest.json", b"[]"), (b"../../etc/x", b"boom")]);
    let want = "\"../../etc/x\" points outside the archive";
    refused("traversal", &data, Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gzip_bomb_is_refused_before_it_expands() {
    // 1000 MiB of zeros stop at 64 × their size + 512 MiB, well before.
    let want = "expands to more than";
    refused("gzip-bomb", &gzip_bomb(), Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tar_bomb_behind_gzip_is_refused_inside_its_entry() {
    // An image archive whose second entry says 1 GiB and is zeros, as gzip members after the
    // headers' own; the walk through the decoder stops inside that entry.
    let mut head = tar_with(&[(b"manifest.json", b"[]")]);
    head.truncate(head.len() - 1024);
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..5].copy_from_slice(b"zeros");
    h.set_size(1 << 30);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    head.extend_from_slice(h.as_bytes());
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(&head).unwrap();
    let mut data = e.finish().unwrap();
    data.extend(gzip_bomb());
    let want = "the gzip-compressed file could not be decompressed: it expands to more than";
    refused("tar-bomb", &data, Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_json_document_over_4_mib_is_refused() {
    let data = tar_with(&[(b"manifest.json", &vec![b' '; 5 << 20])]);
    let want = "manifest.json\" is 5242880 bytes, more than the 4194304";
    refused("json-bomb", &data, Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_nested_past_the_parsers_depth_is_refused() {
    let nested = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    let data = tar_with(&[(b"manifest.json", nested.as_bytes())]);
    let want = "manifest.json in the archive is not valid";
    refused("json-nesting", &data, Compress::None, want).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_of_no_known_format_are_refused() {
    let random: Vec<u8> = (0..64 * 1024u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let want = "neither a docker save archive";
    refused("random", &random, Compress::None, want).await;
}

// === registry trouble ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_fails_with_the_connection_error() {
    let mut reg = Registry::start();
    let c = case(&reg, "runr-uploads/platform/down", "1");
    reg.stop();
    let path = fixture("oci-archive.tar");
    let err = process_with(&path, &options(&c, &path, None, Compress::Gzip), fast())
        .await
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("the registry {}", reg.host())),
        "{msg}"
    );
    assert!(msg.to_lowercase().contains("connect"), "{msg}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_answering_500_twice_then_recovering() {
    let reg = Registry::start();
    let (proxy, failed) = flaky_proxy(reg.addr(), 2);
    let mut c = case(&reg, "runr-uploads/platform/flaky", "1");
    c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
    let path = fixture("docker-raw.tar");
    let info = process_with(&path, &options(&c, &path, None, Compress::Gzip), fast())
        .await
        .unwrap();
    assert_eq!(failed.load(Ordering::SeqCst), 2);
    assert_eq!(info.tag_ref, c.target);
    c.target = format!("{}/{}:{}", reg.host(), c.repo, c.tag);
    assert_eq!(verify_pulled(&reg, &c, false), 1);

    // A registry that keeps failing: the upload fails with the registry's own message.
    let (proxy, _) = flaky_proxy(reg.addr(), usize::MAX);
    let mut c = case(&reg, "runr-uploads/platform/flaky", "2");
    c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
    let err = process_with(&path, &options(&c, &path, None, Compress::Gzip), fast())
        .await
        .unwrap_err();
    // A HEAD answer has no body: the status line is all the registry said.
    assert!(
        err.to_string().contains("500 Internal Server Error"),
        "{err}"
    );
}

/// Answers the first `fail` requests (other than the `GET /v2/` probe) with 500 and forwards
/// the rest; `failed` counts the failures.
struct Flaky {
    fail: usize,
    failed: Arc<AtomicUsize>,
}

impl Hook for Flaky {
    fn request(&self, head: &RequestHead) -> Verdict {
        let probe = head.method() == "GET" && head.target() == "/v2/";
        let fails = !probe
            && self
                .failed
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                    (n < self.fail).then_some(n + 1)
                })
                .is_ok();
        match fails {
            true => Verdict::Answer {
                status: 500,
                body: r#"{"errors":[{"code":"UNKNOWN","message":"injected failure"}]}"#.into(),
            },
            false => Verdict::FORWARD,
        }
    }
}

/// A loopback proxy in front of `upstream` that answers the first `fail` requests (other than
/// the `GET /v2/` probe) with 500 and forwards the rest.
fn flaky_proxy(upstream: SocketAddr, fail: usize) -> (SocketAddr, Arc<AtomicUsize>) {
    let failed = Arc::new(AtomicUsize::new(0));
    let hook = Flaky {
        fail,
        failed: failed.clone(),
    };
    (Proxy::start(upstream, Arc::new(hook)).addr(), failed)
}

// === docker save ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_save_of_a_scratch_image() {
    if !docker_available() {
        println!("skipped: docker info does not answer");
        return;
    }
    let reg = Registry::start();
    let ctx = tempfile::tempdir().unwrap();
    std::fs::write(ctx.path().join("hello.txt"), "hello\n").unwrap();
    std::fs::write(ctx.path().join("bye.txt"), "bye\n").unwrap();
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY hello.txt /\nCOPY bye.txt /\n",
    )
    .unwrap();
    let tag_a = format!("runr-test/app-{}:v1", std::process::id());
    let tag_b = format!("runr-test/other-{}:v2", std::process::id());
    let docker = |args: &[&str]| {
        let out = Command::new("docker").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "docker {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ctx_path = ctx.path().to_str().unwrap();
    docker(&["build", "-q", "-t", &tag_a, ctx_path]);
    std::fs::write(
        ctx.path().join("Dockerfile"),
        "FROM scratch\nCOPY bye.txt /\n",
    )
    .unwrap();
    docker(&["build", "-q", "-t", &tag_b, ctx_path]);
    let one = ctx.path().join("one.tar");
    let two = ctx.path().join("two.tar");
    docker(&["save", "-o", one.to_str().unwrap(), &tag_a]);
    docker(&["save", "-o", two.to_str().unwrap(), &tag_a, &tag_b]);
    let cleanup = || {
        let _ = Command::new("docker")
            .args(["rmi", "-f", &tag_a, &tag_b])
            .output();
    };

    let c = case(&reg, "runr-uploads/platform/saved", "v1");
    let info = process(&one, &options(&c, &one, None, Compress::Gzip)).await;
    let c2 = case(&reg, "runr-uploads/platform/saved", "v2");
    let picked = process(
        &two,
        &options(
            &c2,
            &two,
            Some(&format!("docker.io/{tag_b}")),
            Compress::None,
        ),
    )
    .await;
    cleanup();
    let info = info.unwrap();
    assert_eq!(info.source_format, SourceFormat::Docker);
    assert_eq!(info.layers, 2);
    assert_eq!(verify_pulled(&reg, &c, false), 1);
    let picked = picked.unwrap();
    assert_eq!(picked.layers, 1);
    assert_eq!(verify_pulled(&reg, &c2, false), 1);
}

// === end to end through the real binary ===

/// A `.tar.zst` and a `.tar.xz` through the chunk API: completed, pulled back blob by blob.
#[test]
fn compressed_archives_uploaded_through_the_chunk_api() {
    let reg = Registry::start();
    for (file, tag) in [("docker-raw.tar.zst", "zst"), ("oci-archive.tar.xz", "xz")] {
        let data = std::fs::read(fixture(file)).unwrap();
        let c = case(&reg, "runr-uploads/platform/e2e-compressed", tag);
        let dir = c.work.path().join("work");
        std::fs::create_dir(&dir).unwrap();
        let r = crate::support::Receiver::for_data(
            &dir,
            &data,
            &[
                ("RUNR_UPLOAD_TARGET", c.target.as_str()),
                ("RUNR_UPLOAD_FILENAME", file),
            ],
        );
        assert_eq!(r.put(0, &data).0, 200);
        r.completed();
        assert_eq!(verify_pulled(&reg, &c, false), 1, "{file}");
        // Only the upload and its state: nothing decompressed is written.
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("upload."))
            .collect();
        left.sort();
        assert_eq!(left, Vec::<String>::new(), "{file}");
    }
}

#[test]
fn docker_archive_uploaded_through_the_chunk_api() {
    let reg = Registry::start();
    let data = std::fs::read(fixture("docker-raw.tar")).unwrap();
    let c = case(&reg, "runr-uploads/platform/e2e", "v1");
    let dir = c.work.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let r = crate::support::Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", c.target.as_str()),
            ("RUNR_UPLOAD_FILENAME", "app.tar"),
            ("RUNR_UPLOAD_NAME", "corpus/app:v1"),
        ],
    );
    // Chunks of 4 KiB, last first.
    let chunks: Vec<(usize, &[u8])> = data.chunks(4096).enumerate().collect();
    for (i, chunk) in chunks.iter().rev() {
        assert_eq!(r.put((i * 4096) as u64, chunk).0, 200);
    }
    let s = r.completed();
    let image = &s["image"];
    assert_eq!(image["source_format"], "docker", "{s}");
    assert_eq!(image["kind"], "image", "{s}");
    assert_eq!(image["layers"], 2, "{s}");
    assert_eq!(
        image["platforms"],
        serde_json::json!(["linux/amd64"]),
        "{s}"
    );
    assert_eq!(image["tag_ref"], c.target.as_str(), "{s}");
    assert!(image["note"].is_null(), "{s}");
    assert_eq!(verify_pulled(&reg, &c, false), 1);

    // A damaged archive that still matches its declared SHA-256 fails in the file's own terms.
    let bad = corrupt(
        &fixture("docker-raw.tar"),
        &docker_raw_layer(&fixture("docker-raw.tar")),
    );
    let c = case(&reg, "runr-uploads/platform/e2e", "bad");
    let dir = c.work.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let r = crate::support::Receiver::for_data(
        &dir,
        &bad,
        &[
            ("RUNR_UPLOAD_TARGET", c.target.as_str()),
            ("RUNR_UPLOAD_FILENAME", "app.tar"),
        ],
    );
    assert_eq!(r.put(0, &bad).0, 200);
    assert_eq!(r.complete().0, 202);
    let s = r.finished();
    assert_eq!(s["status"], "failed", "{s}");
    let msg = s["message"].as_str().unwrap_or_default();
    assert!(msg.starts_with("app.tar: layer "), "{s}");
    assert!(msg.contains("the file is damaged"), "{s}");
    assert_no_tag(&reg, &c);
}
