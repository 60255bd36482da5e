//! Recording a chunk costs the same however many came before (an append-only journal, not a
//! state file rewritten whole), and what was answered survives SIGKILL, also while many clients
//! send at once.

use std::time::{Duration, Instant};

use std::io::Write;

use runr_testkit::http::{request_head, Conn, Resp};

use crate::support::*;

/// `PUT /chunk?offset=N` with a small body; `Err` when the connection is gone (the kill).
fn try_put(conn: &mut Conn, offset: usize, body: &[u8]) -> Result<Resp, String> {
    let path = format!("/chunk?offset={offset}");
    let head = request_head("PUT", &path, &[], &Body::Sized(body));
    let s = conn.stream();
    s.write_all(head.as_bytes()).map_err(|e| e.to_string())?;
    s.write_all(body).map_err(|e| e.to_string())?;
    conn.try_read_response()
}

/// One-byte chunks `from..to` in order on one keep-alive connection, each answer checked whole;
/// the wall time and the receiver's CPU time they took.
fn one_byte_chunks(r: &Receiver, data: &[u8], from: usize, to: usize) -> (Duration, Duration) {
    let mut conn = Conn::open(r.addr);
    let start = Instant::now();
    let cpu = r.cpu_time();
    for i in from..to {
        let resp = conn.send(
            "PUT",
            &format!("/chunk?offset={i}"),
            &[],
            Body::Sized(&data[i..i + 1]),
        );
        let (code, v) = json(&resp);
        assert_eq!(code, 200, "{v}");
        let want = serde_json::json!({
            "status": "receiving", "size": data.len(), "uploaded_bytes": i + 1,
            "received_bytes": i + 1, "message": null, "image": null,
        });
        assert_eq!(v, want, "chunk {i}");
    }
    (start.elapsed(), r.cpu_time() - cpu)
}

#[test]
fn twenty_thousand_one_byte_chunks_with_a_restart_in_the_middle() {
    let data = random_bytes(20_000, 80);
    let (_tmp, dir) = work_dir();
    let mut r = Receiver::for_data(&dir, &data, &[]);
    let (wall1, cpu1) = one_byte_chunks(&r, &data, 0, 10_000);
    let before = r.status();
    r.kill9_and_restart();
    assert_eq!(
        r.status(),
        before,
        "a restarted receiver reports what it answered"
    );
    let (wall2, cpu2) = one_byte_chunks(&r, &data, 10_000, 20_000);
    println!(
        "20,000 one-byte chunks: wall {:?}, receiver CPU {:?} ({cpu1:?} + {cpu2:?})",
        wall1 + wall2,
        cpu1 + cpu2
    );
    // The receiver's own time, which the load of a shared machine does not inflate the way it
    // does wall time: the 5 s for all 20,000 (a debug build, which costs more per
    // request than the release one), and linear: the second half, with 10,000 chunks behind
    // it, costs about what the first did (the state file rewritten whole grew with them).
    assert!(cpu1 + cpu2 < Duration::from_secs(5), "{cpu1:?} + {cpu2:?}");
    assert!(
        cpu2 < cpu1 * 2 + Duration::from_millis(300),
        "{cpu1:?} then {cpu2:?}"
    );
    // What is kept stays small: one range, and a journal compacted now and then.
    let state = std::fs::metadata(dir.join("upload.state.json"))
        .unwrap()
        .len();
    let journal = std::fs::metadata(dir.join("upload.journal")).unwrap().len();
    assert!(state < 1024, "state file of {state} bytes");
    assert!(journal < 4096 * 40, "journal of {journal} bytes");
    assert!(r.data_file() == data);
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("verification to pass", |s| s["status"] == "failed");
    assert!(!s["message"].as_str().unwrap().contains("SHA-256"), "{s}");
}

/// Clients at 1, 2, 8 and 32, each sending small chunks of its own part of the file, are cut by
/// SIGKILL: every chunk answered 200 before the kill is held after the restart, and the upload
/// then completes with the right digest.
#[test]
fn what_was_answered_survives_sigkill_under_concurrent_chunks() {
    for clients in [1usize, 2, 8, 32] {
        let part = 64 * 1024;
        let data = random_bytes(clients * part, 81 + clients as u64);
        let (_tmp, dir) = work_dir();
        let mut r = Receiver::for_data(&dir, &data, &[]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let answered: Vec<Vec<(usize, usize)>> = std::thread::scope(|s| {
            let senders: Vec<_> = (0..clients)
                .map(|c| {
                    let (r, data, stop) = (&r, &data, &stop);
                    s.spawn(move || {
                        let mut conn = Conn::open(r.addr);
                        let mut ok = Vec::new();
                        let mut offset = c * part;
                        // Sizes that vary so records differ in length.
                        let mut len = 1 + c % 7;
                        while offset < (c + 1) * part
                            && !stop.load(std::sync::atomic::Ordering::SeqCst)
                        {
                            let end = (offset + len).min((c + 1) * part);
                            let Ok(resp) = try_put(&mut conn, offset, &data[offset..end]) else {
                                break; // the kill
                            };
                            assert_eq!(resp.status, 200, "{}", resp.text());
                            ok.push((offset, end));
                            offset = end;
                            len = len % 97 + 3;
                        }
                        ok
                    })
                })
                .collect();
            // Let them get going, then kill mid-flight.
            runr_testkit::wait_for("chunks to arrive", Duration::from_secs(30), || {
                (r.status()["received_bytes"].as_u64()? >= (data.len() / 4) as u64).then_some(())
            });
            r.signal(nix::sys::signal::Signal::SIGKILL);
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            senders.into_iter().map(|t| t.join().unwrap()).collect()
        });
        r.kill9();
        r.restart();
        let held = r.status()["received_bytes"].as_u64().unwrap();
        let answered_bytes: usize = answered.iter().flatten().map(|(s, e)| e - s).sum();
        assert!(
            held as usize >= answered_bytes,
            "{clients} clients: {held} held < {answered_bytes} answered"
        );
        // Every byte the data file holds at an answered range is the byte sent.
        let file = r.data_file();
        for &(s, e) in answered.iter().flatten() {
            assert!(
                file.len() >= e && file[s..e] == data[s..e],
                "{clients} clients: {s}..{e}"
            );
        }
        // Sending it all again completes it with the declared digest: nothing wrong was held.
        assert_eq!(r.put(0, &data).0, 200);
        assert_eq!(r.status()["uploaded_bytes"], data.len() as u64);
        assert_eq!(r.complete().0, 202);
        let s = r.wait_status("verification to pass", |s| s["status"] == "failed");
        assert!(
            !s["message"].as_str().unwrap().contains("SHA-256"),
            "{clients} clients: {s}"
        );
    }
}
