//! The image path of a region, end to end with the real binaries: a user's archive uploaded in
//! chunks to runr-image-upload, which pushes it into the region registry; runr-prewarm then
//! makes the region's pull-through cache fetch that same image; the cache serves it on its own
//! once the registry behind it is gone.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use runr_testkit::http::{self, Body};
use runr_testkit::oci::{sha256_digest, TestImage};
use runr_testkit::{skopeo, wait_for, workspace_bin, Child, Registry, Server};
use serde_json::Value;

fn tools_present() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo", "tar"])
}

/// An OCI layout packed as a tar archive, the `oci-archive` form skopeo and buildah write.
fn oci_archive(layout: &Path, archive: &Path) -> Vec<u8> {
    let status = Command::new("tar")
        .arg("-C")
        .arg(layout)
        .arg("-cf")
        .arg(archive)
        .arg(".")
        .status()
        .expect("run tar");
    assert!(status.success(), "tar failed");
    std::fs::read(archive).unwrap()
}

fn json(resp: &http::Resp) -> Value {
    serde_json::from_slice(&resp.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", resp.text()))
}

/// Runs runr-prewarm to its end (bounded by its own timeouts, and by ours); exit status,
/// stdout, stderr.
fn prewarm(vars: &[(&str, String)]) -> (i32, String, String) {
    let mut cmd = Command::new(workspace_bin("runr-prewarm"));
    cmd.arg("run")
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = Child::spawn(&mut cmd).expect("spawn runr-prewarm");
    let mut stdout = child.inner().stdout.take().unwrap();
    let mut stderr = child.inner().stderr.take().unwrap();
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut out = String::new();
    let _ = stdout.read_to_string(&mut out);
    let status = child.wait_timeout(Duration::from_secs(180));
    (status.code().unwrap_or(-1), out, err.join().unwrap())
}

#[test]
fn an_uploaded_image_is_warmed_into_the_cache_and_served_by_it_alone() {
    if !tools_present() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let image = TestImage::random("v1", &[300_000, 120_000]);
    let data = oci_archive(image.dir(), &work.path().join("app.tar"));
    let sha = sha256_digest(&data);
    let mut upstream = Registry::start();
    let target = format!("{}/team/app:v1", upstream.host());

    // The upload: two chunks, the second first, as the control plane may forward them.
    let upload_dir = work.path().join("upload");
    std::fs::create_dir(&upload_dir).unwrap();
    let mut cmd = Command::new(workspace_bin("runr-image-upload"));
    cmd.env_clear()
        .env("RUNR_UPLOAD_DIR", &upload_dir)
        .env("RUNR_UPLOAD_SIZE", data.len().to_string())
        .env("RUNR_UPLOAD_SHA256", sha.trim_start_matches("sha256:"))
        .env("RUNR_UPLOAD_TARGET", &target)
        .env("RUNR_REGISTRY_PLAIN_HTTP", "1");
    let receiver = Server::start(cmd, &work.path().join("receiver.log"));
    let mid = data.len() / 2;
    let second = http::request(
        receiver.addr,
        "PUT",
        &format!("/chunk?offset={mid}"),
        &[],
        Body::Sized(&data[mid..]),
    );
    assert_eq!(second.status, 200, "{}", second.text());
    let first = http::request(
        receiver.addr,
        "PUT",
        "/chunk?offset=0",
        &[],
        Body::Sized(&data[..mid]),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(json(&first)["uploaded_bytes"], data.len());
    let complete = http::request(receiver.addr, "POST", "/complete", &[], Body::None);
    assert!(matches!(complete.status, 200 | 202), "{}", complete.text());
    let status = wait_for("the upload to end", Duration::from_secs(120), || {
        let s = json(&http::get(receiver.addr, "/status"));
        matches!(s["status"].as_str(), Some("completed" | "failed")).then_some(s)
    });
    assert_eq!(
        status["status"],
        "completed",
        "{status}\n{}",
        receiver.log()
    );
    let digest = status["image"]["digest"].as_str().unwrap().to_string();
    assert!(digest.starts_with("sha256:"), "{status}");

    // The warm-up: the cache in front of the region registry fetches what was just pushed.
    let cache = Registry::start_proxy(&upstream.url());
    let (code, out, err) = prewarm(&[
        ("RUNR_PREWARM_REGISTRY", cache.host()),
        ("RUNR_PREWARM_IMAGES", "team/app:v1".to_string()),
        ("RUNR_REGISTRY_PLAIN_HTTP", "1".to_string()),
        ("RUNR_PREWARM_WAIT", "30s".to_string()),
        ("RUNR_PREWARM_TIMEOUT", "120s".to_string()),
    ]);
    assert_eq!(code, 0, "stdout:\n{out}\nstderr:\n{err}");
    let summary: Value = serde_json::from_str(out.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("summary is not JSON ({e}): {out}"));
    assert_eq!(summary["warmed"], 1, "{summary}");
    let warmed = &summary["images"][0];
    assert_eq!(warmed["status"], "warmed", "{summary}");
    assert_eq!(
        warmed["digest"],
        digest.as_str(),
        "the cache holds what the receiver pushed"
    );

    // The cache alone now serves the image, at the digest the receiver reported.
    upstream.stop();
    let dest = work.path().join("pulled");
    skopeo(&[
        "copy",
        "--src-tls-verify=false",
        &format!("docker://{}/team/app:v1", cache.host()),
        &format!("dir:{}", dest.display()),
    ]);
    let manifest = std::fs::read(dest.join("manifest.json")).unwrap();
    assert_eq!(sha256_digest(&manifest), digest);
    let manifest: Value = serde_json::from_slice(&manifest).unwrap();
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), image.layers.len(), "{manifest}");
    for layer in layers {
        let d = layer["digest"].as_str().unwrap();
        let blob = std::fs::read(dest.join(d.trim_start_matches("sha256:"))).unwrap();
        assert_eq!(sha256_digest(&blob), d, "layer {d} arrived whole");
        assert_eq!(blob.len() as u64, layer["size"].as_u64().unwrap());
    }
}
