//! Chunks in any order, sent again, overlapping, concurrent; and every refusal.

use crate::support::*;

/// The bytes from 0 without a gap and the distinct bytes, of a bitmap of what was sent.
fn model(held: &[bool]) -> (u64, u64) {
    let prefix = held.iter().take_while(|&&b| b).count() as u64;
    let total = held.iter().filter(|&&b| b).count() as u64;
    (prefix, total)
}

#[test]
fn random_order_duplicates_and_overlaps_merge() {
    let data = random_bytes(5 * MIB + 12_345, 1);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[]);
    let s = r.status();
    assert_eq!(s["status"], "ready");
    assert_eq!(s["size"], data.len() as u64);

    // 300 KiB chunks in a scrambled order, with a repeat of every third one and chunks that
    // straddle their neighbours.
    let step = 300 * 1024;
    let mut chunks: Vec<(usize, usize)> = (0..data.len())
        .step_by(step)
        .map(|s| (s, (s + step).min(data.len())))
        .collect();
    let n = chunks.len();
    let order: Vec<usize> = (0..n).map(|i| (i * 7 + 3) % n).collect();
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..n).collect::<Vec<_>>(),
        "the scramble must be a permutation"
    );
    let mut sends: Vec<(usize, usize)> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        sends.push(chunks[i]);
        if k % 3 == 0 {
            sends.push(chunks[i]);
        }
        if k % 4 == 1 {
            let (s, e) = chunks[i];
            sends.push((s.saturating_sub(1000), (e + 5000).min(data.len())));
        }
    }
    chunks.clear();

    let mut held = vec![false; data.len()];
    for (s, e) in sends {
        let (code, body) = r.put(s as u64, &data[s..e]);
        assert_eq!(code, 200, "{body}");
        held[s..e].iter_mut().for_each(|b| *b = true);
        let (prefix, total) = model(&held);
        assert_eq!(body["uploaded_bytes"], prefix, "{body}");
        assert_eq!(body["received_bytes"], total, "{body}");
        assert_eq!(body["status"], "receiving");
    }
    assert_eq!(r.status()["uploaded_bytes"], data.len() as u64);
    assert!(
        r.data_file() == data,
        "the data file differs from what was sent"
    );

    // Verified (the digest matches), then refused by format detection: random bytes are no image.
    let (code, body) = r.complete();
    assert_eq!(code, 202, "{body}");
    let s = r.wait_status("the upload to fail format detection", |s| {
        s["status"] == "failed"
    });
    let message = s["message"].as_str().unwrap();
    assert!(!message.contains("SHA-256"), "{message}");
    assert_eq!(s["uploaded_bytes"], data.len() as u64);
}

#[test]
fn concurrent_overlapping_puts() {
    let data = random_bytes(6 * MIB, 2);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[]);
    let step = 256 * 1024;
    // Every 256 KiB piece is sent twice by different threads, and each thread's pieces overlap
    // the next one by 4 KiB.
    let pieces: Vec<(usize, usize)> = (0..data.len())
        .step_by(step)
        .map(|s| (s, (s + step + 4096).min(data.len())))
        .collect();
    std::thread::scope(|scope| {
        for t in 0..6 {
            let pieces = &pieces;
            let data = &data;
            let r = &r;
            scope.spawn(move || {
                for (i, &(s, e)) in pieces.iter().enumerate() {
                    if i % 3 == t % 3 {
                        let (code, body) = r.put(s as u64, &data[s..e]);
                        assert_eq!(code, 200, "{body}");
                    }
                }
            });
        }
    });
    let s = r.status();
    assert_eq!(s["uploaded_bytes"], data.len() as u64, "{s}");
    assert_eq!(s["received_bytes"], data.len() as u64, "{s}");
    assert!(
        r.data_file() == data,
        "the data file differs from what was sent"
    );
    let (code, _) = r.complete();
    assert_eq!(code, 202);
    let s = r.wait_status("verification to pass", |s| s["status"] == "failed");
    assert!(!s["message"].as_str().unwrap().contains("SHA-256"), "{s}");
}

#[test]
fn chunked_transfer_encoding_is_accepted() {
    let data = random_bytes(3 * MIB + 7, 3);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[]);
    let (code, body) = r.put_chunked(0, &data[..2 * MIB]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["uploaded_bytes"], 2 * MIB as u64);
    let (code, body) = r.put_chunked(2 * MIB as u64, &data[2 * MIB..]);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["uploaded_bytes"], data.len() as u64);
    assert!(r.data_file() == data);
}

#[test]
fn refusals() {
    let size = 20 * MIB;
    let data = random_bytes(size, 4);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[]);
    let expect = |(code, body): (u16, serde_json::Value), want: u16, want_code: &str| {
        assert_eq!(code, want, "{body}");
        assert_eq!(body["code"], want_code, "{body}");
        assert!(!body["error"].as_str().unwrap().is_empty(), "{body}");
    };

    // No offset, a bad one.
    for path in [
        "/chunk",
        "/chunk?offset=",
        "/chunk?offset=-1",
        "/chunk?offset=abc",
        "/chunk?offset=1.5",
    ] {
        expect(
            request(r.addr, "PUT", path, &[], Body::Sized(b"abc")),
            400,
            "bad_offset",
        );
    }

    // Over 16 MiB, decided from Content-Length before any byte of the body is sent.
    let head = format!(
        "PUT /chunk?offset=0 HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        16 * MIB + 1
    );
    expect(request_head_only(r.addr, &head), 413, "chunk_too_large");
    // The same without Content-Length: bounded while it streams.
    expect(
        r.put_chunked(0, &data[..16 * MIB + 1]),
        413,
        "chunk_too_large",
    );

    // Past the declared size: from Content-Length, and while streaming.
    let head = format!(
        "PUT /chunk?offset={} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n",
        size - 1
    );
    expect(request_head_only(r.addr, &head), 416, "chunk_out_of_range");
    expect(r.put(size as u64 + 10, b"x"), 416, "chunk_out_of_range");
    expect(
        r.put_chunked(size as u64 - 3, b"abcd"),
        416,
        "chunk_out_of_range",
    );

    // None of the refused chunks left a byte behind.
    let s = r.status();
    assert_eq!(s["received_bytes"], 0, "{s}");
    assert_eq!(s["status"], "ready");

    // Exactly 16 MiB, and an empty chunk at the end, are fine.
    let (code, body) = r.put(0, &data[..16 * MIB]);
    assert_eq!(code, 200, "{body}");
    let (code, body) = r.put(size as u64, b"");
    assert_eq!(code, 200, "{body}");

    // Not found, wrong method.
    expect(
        request(r.addr, "GET", "/nope", &[], Body::None),
        404,
        "not_found",
    );
    expect(
        request(r.addr, "DELETE", "/chunk", &[], Body::None),
        405,
        "method_not_allowed",
    );

    // Complete before every byte is there.
    let (code, body) = r.complete();
    assert_eq!(code, 409, "{body}");
    assert_eq!(body["code"], "upload_incomplete");
    assert_eq!(body["uploaded_bytes"], 16 * MIB as u64);

    // Once complete was accepted, chunks are refused whatever they hold.
    let (code, body) = r.put(16 * MIB as u64, &data[16 * MIB..]);
    assert_eq!(code, 200, "{body}");
    let (code, body) = r.complete();
    assert_eq!(code, 202, "{body}");
    expect(r.put(0, &data[..10]), 409, "upload_closed");
    r.wait_status("the upload to finish", |s| s["status"] == "failed");
    expect(r.put(0, &data[..10]), 409, "upload_closed");
    // Complete again answers the state, the work is not started twice.
    let (code, body) = r.complete();
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["status"], "failed");
}
