//! The cache that ignores `Range`, in front of a real upstream registry: probes get the whole
//! blob, what it served it stores, HEAD tells from the store, and every byte is counted.

use std::sync::Arc;

use runr_testkit::http::{self, Body, Conn};
use runr_testkit::oci::TestImage;
use runr_testkit::range_cache::{BlobStats, HeadMode};
use runr_testkit::tools::skopeo_output;
use runr_testkit::{RangeIgnoringCache, Registry};

/// An upstream registry holding `image` as `lib/app:1`.
fn upstream_with(image: &TestImage) -> Registry {
    let reg = Registry::start();
    let out = skopeo_output(&[
        "copy",
        "--preserve-digests",
        "--dest-tls-verify=false",
        &image.oci_ref(),
        &format!("docker://{}/lib/app:1", reg.host()),
    ]);
    assert!(out.success(), "{out:?}");
    reg
}

fn blob_path(digest: &str) -> String {
    format!("/v2/lib/app/blobs/{digest}")
}

fn expect_blob_headers(r: &http::Resp, digest: &str, len: usize) {
    assert_eq!(
        r.headers,
        vec![
            (
                "Content-Type".to_string(),
                "application/octet-stream".to_string()
            ),
            ("Docker-Content-Digest".to_string(), digest.to_string()),
            (
                "Docker-Distribution-Api-Version".to_string(),
                "registry/2.0".to_string()
            ),
            ("Content-Length".to_string(), len.to_string()),
        ]
    );
}

/// Many clients probe every blob at once: each gets 200 and the whole blob, byte for byte; the
/// cache stores what it served, HEAD confirms it, and the counters add up exactly.
#[test]
fn concurrent_probes_get_whole_blobs_and_the_cache_stores_them() {
    let image = Arc::new(TestImage::random("1", &[700_000, 150_000, 3_000]));
    let upstream = upstream_with(&image);
    let cache = Arc::new(RangeIgnoringCache::start(upstream.addr()));

    for blob in image.blobs() {
        let r = http::request(
            cache.addr(),
            "HEAD",
            &blob_path(&blob.digest),
            &[],
            Body::None,
        );
        assert_eq!(r.status, 404, "not stored yet");
        assert!(!cache.is_stored(&blob.digest));
    }

    const CLIENTS: usize = 16;
    let workers: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let (image, cache) = (Arc::clone(&image), Arc::clone(&cache));
            std::thread::spawn(move || {
                let mut conn = Conn::open(cache.addr());
                let mut blobs = image.blobs();
                blobs.rotate_left(i % 3);
                for blob in blobs {
                    let r = conn.send(
                        "GET",
                        &blob_path(&blob.digest),
                        &[("Range", "bytes=0-0")],
                        Body::None,
                    );
                    assert_eq!(r.status, 200);
                    expect_blob_headers(&r, &blob.digest, blob.data.len());
                    assert!(r.body == blob.data, "whole blob {}", blob.digest);
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    for blob in image.blobs() {
        let len = blob.data.len() as u64;
        // Stored before the last piece went out: every client read it whole.
        assert!(cache.is_stored(&blob.digest));
        assert_eq!(
            cache.stored_bytes(&blob.digest).as_deref(),
            Some(&blob.data[..])
        );
        let r = http::request(
            cache.addr(),
            "HEAD",
            &blob_path(&blob.digest),
            &[],
            Body::None,
        );
        assert_eq!(r.status, 200);
        expect_blob_headers(&r, &blob.digest, blob.data.len());
        assert!(r.body.is_empty());
        let s = cache.stats(&blob.digest);
        // Clients that missed at the same moment each went upstream; every fetch read it whole.
        assert!(
            s.upstream_fetches >= 1 && s.upstream_fetches <= CLIENTS as u64,
            "{s:?}"
        );
        assert_eq!(
            s,
            BlobStats {
                gets: CLIENTS as u64,
                range_gets: CLIENTS as u64,
                heads: 2,
                served_bytes: CLIENTS as u64 * len,
                upstream_fetches: s.upstream_fetches,
                upstream_bytes: s.upstream_fetches * len,
            }
        );
    }
    assert_eq!(cache.served_bytes(), CLIENTS as u64 * image.blob_bytes());
    let mut want: Vec<String> = image.blobs().iter().map(|b| b.digest.clone()).collect();
    want.sort();
    assert_eq!(cache.stored(), want);

    // Once stored, nothing more goes upstream.
    let before: Vec<u64> = image
        .blobs()
        .iter()
        .map(|b| cache.stats(&b.digest).upstream_fetches)
        .collect();
    for blob in image.blobs() {
        let r = http::request(
            cache.addr(),
            "GET",
            &blob_path(&blob.digest),
            &[],
            Body::None,
        );
        assert!(r.status == 200 && r.body == blob.data);
    }
    let after: Vec<u64> = image
        .blobs()
        .iter()
        .map(|b| cache.stats(&b.digest).upstream_fetches)
        .collect();
    assert_eq!(before, after);
}

/// A real client pulls through it (manifests passed through, blobs whole), and then the
/// cache serves the image with the upstream gone.
#[test]
fn skopeo_pulls_through_it() {
    let image = TestImage::random("1", &[40_000, 2_000]);
    let mut upstream = upstream_with(&image);
    let cache = RangeIgnoringCache::start(upstream.addr());
    let pull = || {
        let dir = tempfile::tempdir().unwrap();
        let out = skopeo_output(&[
            "copy",
            "--retry-times",
            "0",
            "--src-tls-verify=false",
            &format!("docker://{}/lib/app:1", cache.host()),
            &format!("dir:{}", dir.path().display()),
        ]);
        let layer = std::fs::read(
            dir.path()
                .join(image.layers[0].digest.strip_prefix("sha256:").unwrap()),
        )
        .ok();
        (out, layer)
    };
    let (out, layer) = pull();
    assert!(out.success(), "{out:?}");
    assert_eq!(layer.as_deref(), Some(&image.layers[0].data[..]));
    assert!(cache.manifest_requests() >= 1);
    for blob in image.blobs() {
        let s = cache.stats(&blob.digest);
        assert_eq!(
            (s.gets, s.range_gets, s.upstream_fetches),
            (1, 0, 1),
            "{s:?}"
        );
        assert_eq!(s.served_bytes, blob.data.len() as u64);
    }
    // Blobs come from the store now; manifests still need the upstream.
    upstream.stop();
    for blob in image.blobs() {
        let r = http::get(cache.addr(), &blob_path(&blob.digest));
        assert!(r.status == 200 && r.body == blob.data);
    }
    let r = http::get(cache.addr(), "/v2/lib/app/manifests/1");
    assert_eq!(r.status, 502);
    assert!(
        r.text().contains("\"code\":\"UNAVAILABLE\""),
        "{}",
        r.text()
    );
}

#[test]
fn head_modes_and_held_stores() {
    let image = TestImage::random("1", &[5_000]);
    let upstream = upstream_with(&image);
    let layer = &image.layers[0];
    let path = blob_path(&layer.digest);

    let forwarding = RangeIgnoringCache::builder(upstream.addr())
        .head(HeadMode::Upstream)
        .start();
    let r = http::request(forwarding.addr(), "HEAD", &path, &[], Body::None);
    assert_eq!(r.status, 200, "the upstream has it, the cache does not");
    assert_eq!(
        r.header("content-length"),
        Some(layer.data.len().to_string().as_str())
    );
    assert!(!forwarding.is_stored(&layer.digest));

    let refusing = RangeIgnoringCache::builder(upstream.addr())
        .head(HeadMode::NotAllowed)
        .start();
    let r = http::request(refusing.addr(), "HEAD", &path, &[], Body::None);
    assert_eq!((r.status, r.header("allow")), (405, Some("GET")));

    let slow = RangeIgnoringCache::builder(upstream.addr())
        .hold_stores()
        .start();
    let r = http::request(
        slow.addr(),
        "GET",
        &path,
        &[("Range", "bytes=0-0")],
        Body::None,
    );
    assert!(r.status == 200 && r.body == layer.data);
    // Served, not stored yet: HEAD says so until the copy lands.
    let head = || http::request(slow.addr(), "HEAD", &path, &[], Body::None).status;
    assert_eq!(head(), 404);
    assert_eq!(slow.held(), 1);
    assert!(!slow.is_stored(&layer.digest));
    slow.release_stores();
    assert_eq!(head(), 200);
    slow.evict(&layer.digest);
    assert_eq!(head(), 404);
    let r = http::request(slow.addr(), "GET", &path, &[], Body::None);
    assert!(r.status == 200 && r.body == layer.data);
    assert_eq!(slow.stats(&layer.digest).upstream_fetches, 2);
}

/// Blobs the upstream does not have, bytes that do not match their digest, and requests that
/// are not for a cache.
#[test]
fn what_it_does_not_store_and_does_not_serve() {
    let image = TestImage::random("1", &[5_000]);
    let upstream = upstream_with(&image);
    let cache = RangeIgnoringCache::start(upstream.addr());

    let missing = format!("sha256:{}", "0".repeat(64));
    let r = http::get(cache.addr(), &blob_path(&missing));
    assert_eq!(r.status, 404);
    assert!(
        r.text().contains("BLOB_UNKNOWN"),
        "upstream's answer: {}",
        r.text()
    );
    assert!(!cache.is_stored(&missing));

    // The upstream's copy overwritten with other bytes of the same size.
    let layer = &image.layers[0];
    let file = runr_testkit::stored_blob(&upstream.storage(), &layer.digest);
    std::fs::write(&file, vec![b'x'; layer.data.len()]).unwrap();
    let r = http::get(cache.addr(), &blob_path(&layer.digest));
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        vec![b'x'; layer.data.len()],
        "served as the upstream sent it"
    );
    assert!(!cache.is_stored(&layer.digest), "a mismatch is not stored");

    for (method, path, status, code) in [
        (
            "GET",
            "/v2/lib/app/blobs/sha256:xyz".to_string(),
            400,
            "DIGEST_INVALID",
        ),
        ("PUT", blob_path(&layer.digest), 405, "UNSUPPORTED"),
        (
            "POST",
            "/v2/lib/app/blobs/uploads/".to_string(),
            405,
            "UNSUPPORTED",
        ),
        ("GET", "/other".to_string(), 404, "NOT_FOUND"),
    ] {
        let r = http::request(cache.addr(), method, &path, &[], Body::None);
        assert_eq!(r.status, status, "{method} {path}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(v["errors"][0]["code"], code, "{method} {path}");
    }
    let r = http::get(cache.addr(), "/v2/");
    assert_eq!((r.status, r.text().as_str()), (200, "{}"));
}

#[test]
fn stop_and_restart_keep_the_store() {
    let image = TestImage::random("1", &[5_000]);
    let mut upstream = upstream_with(&image);
    let mut cache = RangeIgnoringCache::start(upstream.addr());
    let layer = &image.layers[0];
    assert_eq!(
        http::get(cache.addr(), &blob_path(&layer.digest)).status,
        200
    );
    assert!(cache.is_stored(&layer.digest));
    cache.stop();
    // Refused; unless another process bound the freed port in between (tests run in parallel),
    // and then what answers is not this cache.
    if let Ok(mut s) = std::net::TcpStream::connect(cache.addr()) {
        use std::io::{Read, Write};
        s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
            .unwrap();
        let head = http::request_head("GET", &blob_path(&layer.digest), &[], &Body::None);
        let _ = s.write_all(head.as_bytes());
        let mut answer = Vec::new();
        let _ = s.read_to_end(&mut answer);
        assert!(
            !answer
                .windows(layer.data.len())
                .any(|w| w == &layer.data[..]),
            "the stopped cache answered"
        );
    }
    upstream.stop();
    cache.restart();
    let r = http::get(cache.addr(), &blob_path(&layer.digest));
    assert!(r.status == 200 && r.body == layer.data);
    assert_eq!(cache.stats(&layer.digest).upstream_fetches, 1);
}

/// Manifests (and error bodies) pass through up to 4 MiB; a larger answer from the upstream,
/// announced or not, is a 502 rather than a cut body.
#[test]
fn passthrough_answers_are_bounded() {
    use std::io::{BufRead, BufReader, Write};
    const MAX: usize = 4 << 20;
    // A raw upstream: with a Content-Length, or without one (the body runs to the close).
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let upstream = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut first = String::new();
            reader.read_line(&mut first).unwrap();
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line).unwrap() == 0 || line == "\r\n" {
                    break;
                }
            }
            let path = first.split_whitespace().nth(1).unwrap_or("").to_string();
            let n = if path.ends_with("/fits") {
                MAX
            } else {
                MAX + 1
            };
            let length = if path.ends_with("/unannounced") {
                String::new()
            } else {
                format!("Content-Length: {n}\r\n")
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{length}Connection: close\r\n\r\n"
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&vec![b'{'; n]);
        }
    });
    let cache = RangeIgnoringCache::start(upstream);
    let at_bound = http::get(cache.addr(), "/v2/big/manifests/fits");
    assert_eq!(at_bound.status, 200);
    assert_eq!(at_bound.body.len(), MAX);
    assert_eq!(at_bound.header("content-type"), Some("application/json"));
    for name in ["announced", "unannounced"] {
        let r = http::get(cache.addr(), &format!("/v2/big/manifests/{name}"));
        assert_eq!(r.status, 502, "{name}");
        let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
        assert_eq!(
            v["errors"][0]["message"],
            format!("upstream: an answer larger than {MAX} bytes"),
            "{name}"
        );
    }
    assert_eq!(cache.manifest_requests(), 3);
}
