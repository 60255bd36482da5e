//! The push seen while it runs and when it is cut, through the real binary against the real
//! `docker-registry`: a loopback proxy in front of the registry holds one large blob's upload
//! part way, so the test acts at a known point (the other blobs pushed, that one in flight)
//! instead of guessing one with sleeps.
//!
//! - `GET /status` shows `push` (blobs and bytes the registry has of those known) during the
//!   push, and the fields the control plane reads unchanged;
//! - a registry killed and restarted (same port, same storage) in the middle of a blob: that
//!   blob's upload starts again from its first byte, the others are not sent again;
//!   from a whole `.tar.gz`, whose blobs the follower pushes from its decoder while it arrives,
//!   the pass sends the cut one again from its first byte through a decoder of its own;
//! - a receiver killed with SIGKILL in the middle of a blob: the restarted one resumes the push,
//!   and what the registry has already costs a HEAD;
//! - a registry restarted while the follower streams a blob before `complete`: that blob again
//!   from its first byte, in the registry before `complete`; so too for a classic layer the
//!   follower streams as it arrives, gzip'ed or as it is (a chunked upload: the proxy holds its
//!   one `PATCH`, whose body has chunked transfer encoding), gzip'ed again into the same
//!   digest.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use runr_testkit::oci::TestImage;
use runr_testkit::proxy::{Hook, Proxy, RequestHead, Verdict};
use runr_testkit::{have_tool, Registry};

use crate::support::{oci_archive, pulled_from, Receiver};

const REPO: &str = "runr-uploads/platform/held";
/// The blob whose upload the proxy holds: large enough that the socket buffers between the
/// receiver and the proxy cannot take all of it while it is held.
const BIG: usize = 32 << 20;
/// Bytes of the big blob's body that pass before the proxy holds it.
const HOLD_AT: u64 = 1 << 20;

fn tools() -> bool {
    runr_testkit::tools_present(&["docker-registry", "skopeo"])
}

// === the holding proxy ===

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    /// The next large PUT will be held.
    Armed,
    /// One is held now.
    Holding,
    /// Let go; no other is held.
    Released,
}

/// Holds the body of the first large blob upload once [`HOLD_AT`] bytes of it went through,
/// until [`HoldingProxy::release`], and keeps every request line.
struct ProxyState {
    hold: Mutex<Hold>,
    changed: Condvar,
    /// Request lines, in the order they arrived.
    requests: Mutex<Vec<String>>,
}

impl Hook for ProxyState {
    fn request(&self, head: &RequestHead) -> Verdict {
        self.requests.lock().unwrap().push(head.line.clone());
        // A PATCH is the body of a chunked upload (a classic layer streamed as it arrives, its
        // length unknown: chunked transfer encoding): the middle of a blob once more than what
        // passes before the hold went through.
        let length = head.content_length();
        let large = (head.method() == "PUT" && length >= BIG as u64)
            || (head.method() == "PATCH" && (head.chunked() || length > HOLD_AT));
        let mut hold = self.hold.lock().unwrap();
        if large && *hold == Hold::Armed {
            *hold = Hold::Holding;
            return Verdict::Forward {
                hold_at: Some(HOLD_AT),
            };
        }
        Verdict::FORWARD
    }

    fn held(&self, _head: &RequestHead) {
        self.changed.notify_all();
        let hold = self.hold.lock().unwrap();
        drop(
            self.changed
                .wait_while(hold, |h| *h == Hold::Holding)
                .unwrap(),
        );
    }
}

/// A loopback proxy in front of the registry that holds the body of the first `PUT` of at
/// least [`BIG`] bytes (or the first streamed `PATCH`) once [`HOLD_AT`] bytes of it went
/// through, until [`HoldingProxy::release`].
struct HoldingProxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
}

impl HoldingProxy {
    fn start(upstream: SocketAddr) -> HoldingProxy {
        let state = Arc::new(ProxyState {
            hold: Mutex::new(Hold::Armed),
            changed: Condvar::new(),
            requests: Mutex::new(Vec::new()),
        });
        let proxy = Proxy::start(upstream, state.clone());
        HoldingProxy {
            addr: proxy.addr(),
            state,
        }
    }

    /// Waits until the big blob's upload is held.
    fn wait_held(&self) {
        let hold = self.state.hold.lock().unwrap();
        let (hold, timeout) = self
            .state
            .changed
            .wait_timeout_while(hold, Duration::from_secs(120), |h| *h == Hold::Armed)
            .unwrap();
        assert!(!timeout.timed_out(), "no large PUT came: {:?}", *hold);
    }

    /// Lets the held upload go on.
    fn release(&self) {
        *self.state.hold.lock().unwrap() = Hold::Released;
        self.state.changed.notify_all();
    }

    /// Request lines of `method` whose target holds `digest`'s hex.
    fn count(&self, method: &str, digest: &str) -> usize {
        let hex = digest.strip_prefix("sha256:").unwrap();
        let prefix = format!("{method} ");
        self.state
            .requests
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with(&prefix) && l.contains(hex))
            .count()
    }
}

// === helpers ===

/// The image: one big layer, three small ones, and its config.
fn image() -> TestImage {
    TestImage::random("1", &[BIG, 100_000, 100_001, 100_002])
}

/// A receiver pushing through `proxy`, the whole file sent and complete accepted.
fn started(work: &Path, data: &[u8], proxy: &HoldingProxy) -> Receiver {
    let dir = work.join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", proxy.addr);
    let r = Receiver::for_data(
        &dir,
        data,
        &[
            ("RUNR_UPLOAD_TARGET", target.as_str()),
            ("RUNR_UPLOAD_FILENAME", "held.tar"),
        ],
    );
    for (i, chunk) in data.chunks(8 << 20).enumerate() {
        assert_eq!(r.put((i * (8 << 20)) as u64, chunk).0, 200);
    }
    assert_eq!(r.complete().0, 202);
    r
}

fn big_digest(image: &TestImage) -> String {
    image
        .blobs()
        .into_iter()
        .find(|b| b.data.len() >= BIG)
        .expect("the big layer")
        .digest
        .clone()
}

fn total_bytes(image: &TestImage) -> u64 {
    image.blobs().iter().map(|b| b.data.len() as u64).sum()
}

// === tests ===

#[test]
fn status_shows_the_push_progress_while_it_runs() {
    if !tools() {
        return;
    }
    let reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let blobs = image.blobs().len() as u64;
    let total = total_bytes(&image);
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let r = started(work.path(), &data, &proxy);
    proxy.wait_held();
    let s = r.wait_status("every other blob to be pushed", |s| {
        s["push"]["blobs_pushed"] == blobs - 1
    });
    assert_eq!(s["status"], "pushing", "{s}");
    let push = &s["push"];
    assert_eq!(push["blobs"], blobs, "{s}");
    assert_eq!(push["bytes"], total, "{s}");
    // The others whole, the held one part way (what the proxy let through, and no more than
    // the socket buffers on the way can take).
    let big = image.layers[0].data.len() as u64;
    let pushed = push["bytes_pushed"].as_u64().unwrap();
    assert!(pushed >= total - big + HOLD_AT && pushed < total, "{s}");
    // The fields the control plane reads are all there, as before.
    let keys: Vec<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
    for k in [
        "status",
        "size",
        "uploaded_bytes",
        "received_bytes",
        "message",
        "image",
    ] {
        assert!(keys.contains(&k), "{k} missing: {s}");
    }
    assert_eq!(s["uploaded_bytes"], data.len() as u64);
    proxy.release();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert_eq!(
        s["push"],
        serde_json::json!({"blobs": blobs, "blobs_pushed": blobs, "bytes": total, "bytes_pushed": total}),
        "{s}"
    );
    pulled_from(&reg, REPO, &image);
}

#[test]
fn a_registry_restarted_mid_blob_gets_that_blob_again_from_its_start() {
    if !tools() {
        return;
    }
    let mut reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let blobs = image.blobs().len() as u64;
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let r = started(work.path(), &data, &proxy);
    proxy.wait_held();
    r.wait_status("every other blob to be pushed", |s| {
        s["push"]["blobs_pushed"] == blobs - 1
    });
    // SIGKILL in the middle of the big blob's upload, then the same port and storage.
    reg.stop();
    reg.restart();
    proxy.release();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    let big = big_digest(&image);
    let log = r.log();
    let retried: Vec<&str> = log.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert!(retried[0].contains(&big), "{retried:?}");
    // The big blob was sent twice, from its start, in a new upload session; the others once.
    for blob in image.blobs() {
        let want = if blob.digest == big { 2 } else { 1 };
        assert_eq!(proxy.count("PUT", &blob.digest), want, "{}", blob.digest);
    }
    assert_eq!(s["push"]["bytes_pushed"], total_bytes(&image), "{s}");
    pulled_from(&reg, REPO, &image);
}

/// The same with the archive gzip'ed whole, whose blobs the follower pushes from its decoder
/// while the archive arrives (one attempt: the decoder moves forward only): the registry cut in
/// the middle of the big blob fails that push, the follower goes on with the others, and after
/// `complete` the pass sends the big blob again from its first byte through a decoder of its own
/// (the follower's index serves it: no other decode); the others are not sent again.
#[test]
fn a_registry_restarted_mid_blob_of_a_gzip_archive_gets_that_blob_again_from_its_start() {
    if !tools() || !have_tool("gzip") {
        return;
    }
    let mut reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let work = tempfile::tempdir().unwrap();
    // Written to image.tar in the work dir, which gzip reads.
    oci_archive(&image, work.path());
    let gz = std::process::Command::new("gzip")
        .arg("-c")
        .arg(work.path().join("image.tar"))
        .output()
        .unwrap();
    assert!(gz.status.success());
    let data = gz.stdout;
    let dir = work.path().join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", proxy.addr);
    let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_TARGET", target.as_str())]);
    // All but the last piece: the follower decodes the big blob and pushes it (held).
    let last = data.len() - 4096;
    for start in (0..last).step_by(8 << 20) {
        let end = (start + (8 << 20)).min(last);
        assert_eq!(r.put(start as u64, &data[start..end]).0, 200);
    }
    proxy.wait_held();
    reg.stop();
    reg.restart();
    proxy.release();
    let big = big_digest(&image);
    runr_testkit::wait_for(
        "the follower's push of the big blob to fail",
        Duration::from_secs(120),
        || {
            r.log()
                .lines()
                .any(|l| l.contains("the follower's push failed") && l.contains(&big))
                .then_some(())
        },
    );
    assert_eq!(r.put(last as u64, &data[last..]).0, 200);
    let s = r.completed();
    let log = r.log();
    assert!(log.contains("indexed while it arrived"), "{log}");
    // The follower's, and one for the blob sent again.
    assert!(
        log.contains("compressed archive read through its decoder decoders=2"),
        "{log}"
    );
    for blob in image.blobs() {
        let want = if blob.digest == big { 2 } else { 1 };
        assert_eq!(proxy.count("PUT", &blob.digest), want, "{}", blob.digest);
    }
    assert_eq!(s["push"]["bytes_pushed"], total_bytes(&image), "{s}");
    assert_eq!(s["push"]["blobs_pushed"], s["push"]["blobs"], "{s}");
    pulled_from(&reg, REPO, &image);
}

#[test]
fn a_receiver_killed_mid_blob_resumes_and_what_is_there_costs_a_head() {
    if !tools() {
        return;
    }
    let reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let blobs = image.blobs().len() as u64;
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let mut r = started(work.path(), &data, &proxy);
    proxy.wait_held();
    r.wait_status("every other blob to be pushed", |s| {
        s["push"]["blobs_pushed"] == blobs - 1
    });
    r.kill9();
    proxy.release();
    r.restart();
    let s = r.finished();
    assert_eq!(s["status"], "completed", "{s}\n{}", r.log());
    assert!(r.log().contains("starting that again"), "{}", r.log());
    let big = big_digest(&image);
    for blob in image.blobs() {
        if blob.digest == big {
            assert_eq!(proxy.count("PUT", &blob.digest), 2, "{}", blob.digest);
        } else {
            // Pushed by the first run; the second found it with a HEAD.
            assert_eq!(proxy.count("PUT", &blob.digest), 1, "{}", blob.digest);
            assert_eq!(proxy.count("HEAD", &blob.digest), 2, "{}", blob.digest);
        }
    }
    pulled_from(&reg, REPO, &image);
}

/// The overlap rule on an upload that is then pushed: a chunk sent again with other bytes over
/// a range already held changes nothing of it (it is answered, and only bytes nobody held are
/// written), so what is verified and pushed is what was received first.
#[test]
fn a_chunk_rewritten_with_other_bytes_changes_nothing_that_was_held() {
    if !tools() {
        return;
    }
    let reg = Registry::start();
    let image = TestImage::random("1", &[200_000, 50_000]);
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let dir = work.path().join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", reg.host());
    let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_TARGET", target.as_str())]);
    let half = data.len() / 2;
    assert_eq!(r.put(0, &data[..half]).0, 200);
    // The first half again, every byte flipped, and reaching 1000 bytes past what is held.
    let mut other: Vec<u8> = data[..half + 1000].iter().map(|b| !b).collect();
    other[half..].copy_from_slice(&data[half..half + 1000]);
    let (code, body) = r.put(0, &other);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["uploaded_bytes"], (half + 1000) as u64, "{body}");
    assert_eq!(r.put(half as u64, &data[half..]).0, 200);
    assert!(r.data_file() == data, "held bytes changed");
    r.completed();
    pulled_from(&reg, REPO, &image);
}

/// The same cut while the follower streams the big blob, before `complete`: the upload goes on,
/// that blob's upload starts again from its first byte, and it is in the registry before
/// `complete` is sent.
#[test]
fn a_registry_restarted_while_a_blob_streams_before_complete_gets_it_again() {
    if !tools() {
        return;
    }
    let mut reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let work = tempfile::tempdir().unwrap();
    let data = oci_archive(&image, work.path());
    let dir = work.path().join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", proxy.addr);
    let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_TARGET", target.as_str())]);
    // Up to the end of the big blob: the follower streams it; the rest comes after.
    let end = {
        let mut tar = tar::Archive::new(&data[..]);
        let big = tar
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.size() >= BIG as u64)
            .expect("the big blob");
        (big.raw_file_position() + big.size()) as usize
    };
    for start in (0..end).step_by(8 << 20) {
        let stop = (start + (8 << 20)).min(end);
        assert_eq!(r.put(start as u64, &data[start..stop]).0, 200);
    }
    proxy.wait_held();
    reg.stop();
    reg.restart();
    proxy.release();
    let big = big_digest(&image);
    let s = r.wait_status("the big blob to be pushed again", |s| {
        s["push"]["blobs_pushed"] == 1
    });
    assert_eq!(s["status"], "receiving", "{s}");
    assert_eq!(proxy.count("PUT", &big), 2);
    let log = r.log();
    let retried: Vec<&str> = log.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert!(retried[0].contains(&big), "{retried:?}");
    assert_eq!(r.put(end as u64, &data[end..]).0, 200);
    r.completed();
    // Pushed once more, it would have been a second PUT after the retry's.
    assert_eq!(proxy.count("PUT", &big), 2);
    pulled_from(&reg, REPO, &image);
}

/// The same cut while the follower streams a classic layer as it arrives (`compress`: gzip'ed,
/// the default, or as it is), in the middle of its `PATCH`: that layer's upload starts again
/// from its first byte (gzip'ed again into the same bytes); it is in the registry before
/// `complete`, and nothing is compressed after it.
fn a_registry_restarted_while_a_classic_layer_streams_gets_it_again(compress: &str) {
    if !tools() {
        return;
    }
    let mut reg = Registry::start();
    let proxy = HoldingProxy::start(reg.addr());
    let image = image();
    let data = crate::stream::classic_archive(&image);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("upload");
    std::fs::create_dir(&dir).unwrap();
    let target = format!("{}/{REPO}:1", proxy.addr);
    let r = Receiver::for_data(
        &dir,
        &data,
        &[
            ("RUNR_UPLOAD_TARGET", target.as_str()),
            ("RUNR_UPLOAD_COMPRESS", compress),
        ],
    );
    let (name, end) = {
        let mut tar = tar::Archive::new(&data[..]);
        let big = tar
            .entries()
            .unwrap()
            .map(Result::unwrap)
            .find(|e| e.size() >= BIG as u64)
            .expect("the big layer");
        let name = String::from_utf8(big.path_bytes().into_owned()).unwrap();
        (name, (big.raw_file_position() + big.size()) as usize)
    };
    for start in (0..end).step_by(8 << 20) {
        let stop = (start + (8 << 20)).min(end);
        assert_eq!(r.put(start as u64, &data[start..stop]).0, 200);
    }
    proxy.wait_held();
    reg.stop();
    reg.restart();
    proxy.release();
    let s = r.wait_status("the big layer to be pushed again", |s| {
        s["push"]["blobs_pushed"] == 1
    });
    assert_eq!(s["status"], "receiving", "{s}");
    let log = r.log();
    let retried: Vec<&str> = log.lines().filter(|l| l.contains("retrying")).collect();
    assert_eq!(retried.len(), 1, "{retried:?}");
    assert!(retried[0].contains(&name), "{retried:?}");
    let pushed = crate::stream::layers_pushed_while_arriving(&log);
    assert_eq!(pushed.len(), 1, "{log}");
    let (_, digest) = &pushed[0];
    if compress == "none" {
        assert_eq!(digest, &image.layers[0].digest);
    }
    // Two sessions, one PATCH each; the first upload was never committed: one PUT ?digest=,
    // the retry's.
    let hex = |d: &str| d.strip_prefix("sha256:").unwrap().to_string();
    let requests = proxy.state.requests.lock().unwrap().clone();
    let patches = requests.iter().filter(|l| l.starts_with("PATCH ")).count();
    assert_eq!(patches, 2, "{requests:?}");
    assert_eq!(proxy.count("PUT", digest), 1, "{requests:?}");
    assert!(
        requests
            .iter()
            .any(|l| l.starts_with("PUT ") && l.contains(&hex(digest))),
        "{requests:?}"
    );
    assert_eq!(r.put(end as u64, &data[end..]).0, 200);
    let s = r.completed();
    let log = r.log();
    if compress == "gzip" {
        // The three small layers only.
        assert_eq!(
            log.matches("gzip'ing layer after complete").count(),
            3,
            "{log}"
        );
    }
    assert_eq!(proxy.count("PUT", digest), 1);
    assert_eq!(s["push"]["bytes_pushed"], s["push"]["bytes"], "{s}");
    match compress {
        "gzip" => crate::stream::pulled_gzipped(&reg, REPO, &image),
        _ => pulled_from(&reg, REPO, &image),
    }
}

#[test]
fn a_registry_restarted_while_a_layer_is_gzipped_before_complete_gets_it_again() {
    a_registry_restarted_while_a_classic_layer_streams_gets_it_again("gzip");
}

#[test]
fn a_registry_restarted_while_a_layer_streams_as_it_is_before_complete_gets_it_again() {
    a_registry_restarted_while_a_classic_layer_streams_gets_it_again("none");
}
