//! The receiver under load, checked answer by answer and blob by blob: memory while many 8 MiB
//! chunks arrive at once and during the push that follows (the VmHWM of /proc), and pushes of
//! many blobs at once, of several images concurrently, pulled back and compared.

use std::path::{Path, PathBuf};
use std::process::Command;

use runr_testkit::http::Conn;
use runr_testkit::{skopeo, Registry};
use serde_json::Value;

use crate::harness::*;

const MIB: u64 = 1024 * 1024;

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
    let archive = big_classic_archive(tmp.path(), 4, 128 * MIB - 64 * 1024);
    let size = std::fs::metadata(&archive).unwrap().len();
    let chunk = 8 * MIB;
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
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("the push", |s| {
        s["status"] == "completed" || s["status"] == "failed"
    });
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
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
