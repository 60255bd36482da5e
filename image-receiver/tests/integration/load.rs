//! The receiver under load, checked answer by answer and blob by blob: memory while many 8 MiB
//! chunks arrive at once and during the push that follows (the VmHWM of /proc), and pushes of
//! many blobs at once, of several images concurrently, pulled back and compared.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use runr_testkit::http::Conn;
use runr_testkit::proxy::{Hook, Proxy, RequestHead, Verdict};
use runr_testkit::{skopeo, Registry};
use serde_json::Value;

use crate::support::*;

/// A classic `docker save` archive of `layers` layers, each a tar of one file of `size` random
/// bytes, written with real tools (openssl rand, tar, sha256sum) into `dir`; RepoTags
/// `load/big:1`.
fn big_classic_archive(dir: &Path, layers: usize, size: u64) -> PathBuf {
    let script = r#"
set -euo pipefail
cd "$1"; layers=$2; size=$3
mkdir -p a; names=""; diffs=""
for i in $(seq 1 "$layers"); do
  mkdir -p "l$i"
  openssl rand -out "l$i/blob$i.bin" "$size"
  tar -C "l$i" -cf "l$i.tar" "blob$i.bin"
  rm -rf "l$i"
  hex=$(sha256sum "l$i.tar" | cut -d' ' -f1)
  mkdir -p "a/$hex"; mv "l$i.tar" "a/$hex/layer.tar"
  names+="${names:+,}\"$hex/layer.tar\""; diffs+="${diffs:+,}\"sha256:$hex\""
done
printf '{"architecture":"amd64","os":"linux","config":{},"rootfs":{"type":"layers","diff_ids":[%s]}}' "$diffs" >a/config.json
cfg=$(sha256sum a/config.json | cut -d' ' -f1); mv a/config.json "a/$cfg.json"
printf '[{"Config":"%s.json","RepoTags":["load/big:1"],"Layers":[%s]}]' "$cfg" "$names" >a/manifest.json
(cd a && tar -cf ../archive.tar manifest.json "$cfg.json" */layer.tar)
rm -rf a
"#;
    let out = Command::new("bash")
        .args(["-c", script, "big"])
        .arg(dir)
        .arg(layers.to_string())
        .arg(size.to_string())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir.join("archive.tar")
}

/// 64 concurrent `PUT`s of 8 MiB chunks (a 512 MiB archive), then complete with the gzip push:
/// the receiver's peak RSS stays within 64 MiB through ingest and push.
#[test]
fn sixty_four_concurrent_8_mib_chunks_then_the_push_within_64_mib() {
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let archive = big_classic_archive(tmp.path(), 4, 128 * MIB as u64 - 64 * 1024);
    let size = std::fs::metadata(&archive).unwrap().len();
    let chunk = 8 * MIB as u64;
    assert!(size <= 64 * chunk && size > 63 * chunk, "{size}");
    let dir = tmp.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/runr-uploads/load/big:1", reg.host());
    let sum = std::process::Command::new("sha256sum")
        .arg(&archive)
        .output()
        .unwrap();
    let sum = String::from_utf8(sum.stdout).unwrap()[..64].to_string();
    let env = [
        ("RUNR_UPLOAD_SIZE", size.to_string()),
        ("RUNR_UPLOAD_SHA256", sum),
        ("RUNR_UPLOAD_TARGET", target.clone()),
        ("RUNR_REGISTRY_PLAIN_HTTP", "1".into()),
        (
            "MALLOC_ARENA_MAX",
            std::env::var("T_ARENA").unwrap_or("8".into()),
        ),
        (
            "RUNR_UPLOAD_COMPRESS",
            std::env::var("T_COMPRESS").unwrap_or("gzip".into()),
        ),
    ];
    let r = Receiver::start(
        &dir,
        env.iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
    );
    let file = std::fs::File::open(&archive).unwrap();
    let offsets: Vec<u64> = (0..size).step_by(chunk as usize).collect();
    assert_eq!(offsets.len(), 64);
    // Every chunk read first, then sent at once from 64 threads.
    let chunks: Vec<Vec<u8>> = offsets
        .iter()
        .map(|&o| {
            use std::os::unix::fs::FileExt;
            let mut buf = vec![0u8; chunk.min(size - o) as usize];
            file.read_exact_at(&mut buf, o).unwrap();
            buf
        })
        .collect();
    let barrier = std::sync::Barrier::new(offsets.len());
    std::thread::scope(|s| {
        for (&offset, data) in offsets.iter().zip(&chunks) {
            let (r, barrier) = (&r, &barrier);
            s.spawn(move || {
                let mut conn = Conn::open(r.addr);
                barrier.wait();
                let resp = conn.send(
                    "PUT",
                    &format!("/chunk?offset={offset}"),
                    &[],
                    Body::Sized(data),
                );
                let (code, v) = json(&resp);
                assert_eq!(code, 200, "{v}");
                assert_eq!(v["size"], size, "{v}");
                assert_eq!(v["status"], "receiving", "{v}");
                assert!(v["message"].is_null() && v["image"].is_null(), "{v}");
                let received = v["received_bytes"].as_u64().unwrap();
                assert!(received >= data.len() as u64 && received <= size, "{v}");
            });
        }
    });
    drop(chunks);
    let ingest = r.peak_rss_kib();
    let s = r.status();
    assert_eq!(s["uploaded_bytes"], size, "{s}");
    r.completed();
    let push = r.peak_rss_kib();
    println!("peak RSS: {ingest} KiB after ingest, {push} KiB after the push");
    assert!(
        ingest <= 64 * 1024,
        "{ingest} KiB after 64 concurrent 8 MiB chunks"
    );
    assert!(push <= 64 * 1024, "{push} KiB after the push");
    // What the tag names is what was sent: four gzip'ed layers of the archive's layers.
    let manifest: Value = serde_json::from_str(&skopeo(&[
        "inspect",
        "--raw",
        "--tls-verify=false",
        &format!("docker://{target}"),
    ]))
    .unwrap();
    assert_eq!(
        manifest["layers"].as_array().unwrap().len(),
        4,
        "{manifest}"
    );
}

// === parallel push ===

/// Blob uploads in flight through a [`holding_proxy`]: now and the most seen at once.
#[derive(Default)]
struct InFlight {
    now: AtomicUsize,
    most: AtomicUsize,
    puts: AtomicUsize,
}

/// Holds every blob `PUT` for `hold` before it is forwarded, counting it in flight until the
/// registry answered.
struct Holding {
    hold: Duration,
    gauge: Arc<InFlight>,
}

fn is_blob_put(head: &RequestHead) -> bool {
    head.method() == "PUT" && head.target().contains("/blobs/uploads/")
}

impl Hook for Holding {
    fn request(&self, head: &RequestHead) -> Verdict {
        if !is_blob_put(head) {
            return Verdict::FORWARD;
        }
        self.gauge.puts.fetch_add(1, Ordering::SeqCst);
        let now = self.gauge.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.gauge.most.fetch_max(now, Ordering::SeqCst);
        Verdict::Forward { hold_at: Some(0) }
    }

    fn held(&self, _head: &RequestHead) {
        std::thread::sleep(self.hold);
    }

    fn answered(&self, head: &RequestHead) {
        if is_blob_put(head) {
            self.gauge.now.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// A loopback proxy in front of `upstream` that holds every blob `PUT` for `hold` before
/// forwarding it, so uploads the client runs at once overlap here and are counted.
fn holding_proxy(upstream: SocketAddr, hold: Duration) -> (SocketAddr, Arc<InFlight>) {
    let gauge = Arc::new(InFlight::default());
    let hook = Holding {
        hold,
        gauge: gauge.clone(),
    };
    (Proxy::start(upstream, Arc::new(hook)).addr(), gauge)
}

/// An OCI layout tar: `platforms` images of `layers` random layers each (the first layer shared
/// by all of them), under one index; `label` goes into every manifest's annotations (layouts
/// of the same `seed` then share every blob but the manifests). Returns the tar and every
/// blob's bytes by digest.
fn multi_platform_layout(
    dir: &Path,
    platforms: &[&str],
    layers: usize,
    layer_size: usize,
    seed: u64,
    label: &str,
) -> (PathBuf, std::collections::BTreeMap<String, Vec<u8>>) {
    use runr_testkit::oci::sha256_digest;
    let mut blobs = std::collections::BTreeMap::new();
    let mut put = |data: Vec<u8>| -> (String, usize) {
        let digest = sha256_digest(&data);
        let len = data.len();
        blobs.insert(digest.clone(), data);
        (digest, len)
    };
    let layer_tar = |content: Vec<u8>, name: &str| -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, &content[..]).unwrap();
        b.into_inner().unwrap()
    };
    let shared = put(layer_tar(random_bytes(layer_size, seed), "shared.bin"));
    let mut descriptors = Vec::new();
    for (p, platform) in platforms.iter().enumerate() {
        let (os, arch) = platform.split_once('/').unwrap();
        let mut layer_descs = vec![shared.clone()];
        for l in 1..layers {
            let data = random_bytes(layer_size + l * 4099, seed + 1 + (p * 100 + l) as u64);
            layer_descs.push(put(layer_tar(data, &format!("l{l}.bin"))));
        }
        let diff_ids: Vec<&String> = layer_descs.iter().map(|(d, _)| d).collect();
        let config = serde_json::to_vec(&serde_json::json!({
            "architecture": arch, "os": os,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        }))
        .unwrap();
        let (config_digest, config_size) = put(config);
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "annotations": {"test.label": label},
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": layer_descs.iter().map(|(d, s)| serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": d, "size": s
            })).collect::<Vec<_>>(),
        }))
        .unwrap();
        let (md, ms) = put(manifest);
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": md, "size": ms,
            "platform": {"os": os, "architecture": arch},
        }));
    }
    let index = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": descriptors,
    }))
    .unwrap();
    let (id, is) = put(index);
    let top = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.index.v1+json", "digest": id, "size": is,
        "annotations": {"org.opencontainers.image.ref.name": "1"}}]});
    let path = dir.join(format!("layout-{seed}-{label}.tar"));
    let mut b = tar::Builder::new(std::fs::File::create(&path).unwrap());
    let mut add = |name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    add("oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#);
    add("index.json", &serde_json::to_vec(&top).unwrap());
    for (digest, data) in &blobs {
        add(&format!("blobs/sha256/{}", &digest[7..]), data);
    }
    b.finish().unwrap();
    (path, blobs)
}

/// Pulls `target` back (every platform) with skopeo into a dir: and requires each blob it names
/// to be byte for byte the one in `blobs`; returns how many blobs were compared.
fn pulled_back_identical(
    target: &str,
    blobs: &std::collections::BTreeMap<String, Vec<u8>>,
) -> usize {
    let out = tempfile::tempdir().unwrap();
    let dest = format!("dir:{}", out.path().display());
    skopeo(&[
        "copy",
        "-q",
        "--all",
        "--src-tls-verify=false",
        &format!("docker://{target}"),
        &dest,
    ]);
    let mut compared = 0;
    for entry in std::fs::read_dir(out.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.len() == 64 && name.bytes().all(|b| b.is_ascii_hexdigit()) {
            let want = blobs.get(&format!("sha256:{name}")).unwrap_or_else(|| {
                panic!("{target}: sha256:{name} is not one of the image's blobs")
            });
            assert!(
                std::fs::read(&path).unwrap() == *want,
                "{target}: sha256:{name} differs"
            );
            compared += 1;
        }
    }
    compared
}

/// Blobs go up several at once, across the layers of one image and across platforms, bounded
/// by the receiver's push concurrency; with several images pushed concurrently through the same
/// proxy, every blob arrives and every image pulls back byte for byte.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_are_pushed_concurrently_and_arrive_whole() {
    use runr_image_upload::image::pipeline::{process, Compress};
    let reg = Registry::start();
    let hold = Duration::from_millis(400);
    let tmp = tempfile::tempdir().unwrap();

    // One image of two platforms, 4 layers each (one shared): 9 blobs.
    let (layout, blobs) = multi_platform_layout(
        tmp.path(),
        &["linux/amd64", "linux/arm64"],
        4,
        300_000,
        90,
        "one",
    );
    let (proxy, gauge) = holding_proxy(reg.addr(), hold);
    let mut c = crate::image::case(&reg, "runr-uploads/load/multi", "1");
    c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
    let info = process(
        &layout,
        &crate::image::options(&c, &layout, None, Compress::Gzip),
    )
    .await
    .unwrap();
    assert_eq!(info.platforms, ["linux/amd64", "linux/arm64"]);
    let most = gauge.most.load(Ordering::SeqCst);
    assert_eq!(gauge.puts.load(Ordering::SeqCst), 9, "every blob once");
    assert_eq!(
        most, PUSH_CONCURRENCY,
        "blob PUTs at once (across both platforms)"
    );
    let direct = format!("{}/{}:{}", reg.host(), c.repo, c.tag);
    assert_eq!(pulled_back_identical(&direct, &blobs), blobs.len() - 3);

    // A classic archive of 6 layers, with none and with gzip.
    for (compress, tag) in [(Compress::None, "none"), (Compress::Gzip, "gzip")] {
        let dir = tmp.path().join(tag);
        std::fs::create_dir(&dir).unwrap();
        let archive = big_classic_archive(&dir, 6, 200_000);
        let (proxy, gauge) = holding_proxy(reg.addr(), hold);
        let mut c = crate::image::case(&reg, "runr-uploads/load/classic", tag);
        c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
        let info = process(
            &archive,
            &crate::image::options(&c, &archive, None, compress),
        )
        .await
        .unwrap();
        assert_eq!(info.layers, 6);
        assert_eq!(
            gauge.puts.load(Ordering::SeqCst),
            7,
            "{tag}: config and 6 layers"
        );
        assert_eq!(
            gauge.most.load(Ordering::SeqCst),
            PUSH_CONCURRENCY,
            "{tag}: layer PUTs at once"
        );
        c.target = format!("{}/{}:{}", reg.host(), c.repo, c.tag);
        assert_eq!(crate::image::verify_pulled(&reg, &c, false), 1, "{tag}");
    }

    // Eight images at once, all sharing their layers and configs (the registry stores each blob
    // once for all repositories), each in a repository of its own: distribution writes a
    // repository's links to a blob and its manifests in place, so the same blob linked into
    // the same repository by two uploads at the same moment can fail one of them (the
    // registry's race, seen here with two repositories of four images). All through one proxy,
    // all complete, each pulled back byte for byte.
    let layouts: Vec<_> = (0..8)
        .map(|k| {
            let label = format!("image{k}");
            let platforms = ["linux/amd64", "linux/s390x"];
            multi_platform_layout(tmp.path(), &platforms, 3, 200_000, 200, &label)
        })
        .collect();
    let (proxy, gauge) = holding_proxy(reg.addr(), Duration::from_millis(50));
    let cases: Vec<_> = (0..8)
        .map(|i| {
            let mut c = crate::image::case(
                &reg,
                &format!("runr-uploads/load/many{i}"),
                &format!("t{i}"),
            );
            c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
            c
        })
        .collect();
    let runs = cases.iter().enumerate().map(|(i, c)| {
        let (path, _) = &layouts[i];
        async move { process(path, &crate::image::options(c, path, None, Compress::Gzip)).await }
    });
    let results = futures_util::future::join_all(runs).await;
    for (i, r) in results.into_iter().enumerate() {
        let info = r.unwrap_or_else(|e| panic!("image {i}: {e}"));
        assert_eq!(info.platforms, ["linux/amd64", "linux/s390x"], "image {i}");
    }
    assert!(
        gauge.most.load(Ordering::SeqCst) > PUSH_CONCURRENCY,
        "pushes of different images overlap"
    );
    for (i, c) in cases.iter().enumerate() {
        let direct = format!("{}/{}:{}", reg.host(), c.repo, c.tag);
        let (_, blobs) = &layouts[i];
        assert_eq!(
            pulled_back_identical(&direct, blobs),
            blobs.len() - 3,
            "image {i}"
        );
    }
}

/// The receiver's bound on blob pushes at once (image::pipeline's).
const PUSH_CONCURRENCY: usize = runr_image_upload::image::pipeline::PUSH_CONCURRENCY;

/// SIGKILL while several layers are being pushed at once: the restarted receiver pushes again
/// what is missing (skipping what the registry has), the tag names exactly the image, and every
/// layer pulls back matching its digest and diff_id.
#[test]
fn a_parallel_push_cut_by_sigkill_completes_after_restart() {
    let reg = Registry::start();
    let tmp = tempfile::tempdir().unwrap();
    let archive = big_classic_archive(tmp.path(), 6, 300_000);
    let data = std::fs::read(&archive).unwrap();
    let (proxy, gauge) = holding_proxy(reg.addr(), Duration::from_millis(1500));
    let mut c = crate::image::case(&reg, "runr-uploads/load/cut", "1");
    c.target = format!("{proxy}/{}:{}", c.repo, c.tag);
    let dir = c.work.path().join("work");
    std::fs::create_dir(&dir).unwrap();
    let mut r = Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", c.target.as_str()),
            ("RUNR_UPLOAD_COMPRESS", "none"),
        ],
    );
    assert_eq!(r.put(0, &data).0, 200);
    assert_eq!(r.complete().0, 202);
    runr_testkit::wait_for("layers in flight", Duration::from_secs(60), || {
        (gauge.now.load(Ordering::SeqCst) >= 2).then_some(())
    });
    r.kill9();
    r.restart();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(s["image"]["layers"], 6, "{s}");
    c.target = format!("{}/{}:{}", reg.host(), c.repo, c.tag);
    assert_eq!(crate::image::verify_pulled(&reg, &c, false), 1);
}
