//! Chunks whose body stops arriving (a half-open connection: the proxy leg died without a FIN)
//! are abandoned after `RUNR_UPLOAD_CHUNK_IDLE`: the connection is closed after a `408`, the
//! bytes the chunk had reserved are released and nothing of it is recorded, while other clients
//! go on and finish the upload. Accepted connections have TCP keepalive on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use runr_testkit::http::{Conn, Resp};

use super::without_date;
use crate::support::*;

/// What the test's stalled chunks declare and what they send before they stop: the chunk of the
/// issue, 1.2 MiB of which 1 MiB + 1000 bytes arrive.
const DECLARED: usize = MIB + MIB / 5;
const SENT: usize = MIB + 1000;

/// A client that sends the head and the first `SENT` bytes of a chunk at `offset`, then stops,
/// keeping the connection open.
fn stall(addr: SocketAddr, data: &[u8], offset: usize) -> Conn {
    let mut conn = Conn::open(addr);
    let s = conn.stream();
    write!(
        s,
        "PUT /chunk?offset={offset} HTTP/1.1\r\nHost: x\r\nContent-Length: {DECLARED}\r\n\r\n"
    )
    .unwrap();
    s.write_all(&data[offset..offset + SENT]).unwrap();
    conn
}

/// The answer a stalled chunk gets, then the end of its connection.
fn abandoned(mut conn: Conn) -> Resp {
    let resp = conn.read_response();
    let mut rest = Vec::new();
    let n = conn
        .stream()
        .read_to_end(&mut rest)
        .expect("the connection ends");
    assert_eq!(
        n,
        0,
        "nothing follows the answer: {:?}",
        String::from_utf8_lossy(&rest)
    );
    resp
}

fn expected_idle_answer(idle: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let body = format!(
        "{{\"code\":\"chunk_idle\",\"error\":\"no byte of the chunk arrived for {idle}: the chunk was dropped (nothing of it is kept) and the connection closed; send it again\"}}"
    );
    (
        408,
        vec![
            ("content-type".into(), "application/json".into()),
            ("connection".into(), "close".into()),
            ("content-length".into(), body.len().to_string()),
        ],
        body.into_bytes(),
    )
}

/// Sends every chunk of `data` (`step` bytes each) until the upload holds all of it, as a client
/// that resumes from `uploaded_bytes` does; every answer must be a 200 with the status.
fn finish(r: &Receiver, data: &[u8], step: usize, deadline: Duration) -> u32 {
    let start = Instant::now();
    let mut rounds = 0;
    let mut conn = Conn::open(r.addr);
    loop {
        rounds += 1;
        for offset in (0..data.len()).step_by(step) {
            let end = (offset + step).min(data.len());
            let resp = conn.send(
                "PUT",
                &format!("/chunk?offset={offset}"),
                &[],
                Body::Sized(&data[offset..end]),
            );
            let (code, v) = json(&resp);
            assert_eq!(code, 200, "{v}");
            assert_eq!(v["size"], data.len() as u64, "{v}");
            assert!(
                v["received_bytes"].as_u64().unwrap() <= data.len() as u64,
                "{v}"
            );
        }
        if r.status()["uploaded_bytes"] == data.len() as u64 {
            return rounds;
        }
        assert!(
            start.elapsed() < deadline,
            "the upload is still incomplete after {deadline:?}: {}",
            r.status()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_stalled_chunk_is_abandoned_and_another_client_finishes_the_upload() {
    let data = random_bytes(3 * MIB, 70);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_CHUNK_IDLE", "1s")]);
    let stalled = stall(r.addr, &data, 0);
    // Its first batch (most of the first MiB) reached the data file: those bytes are
    // reserved for it now.
    let file = dir.join("upload.data");
    runr_testkit::wait_for(
        "the stalled chunk's first batch",
        Duration::from_secs(20),
        || (std::fs::metadata(&file).ok()?.len() >= (MIB / 2) as u64).then_some(()),
    );
    let answer = std::thread::scope(|s| {
        let waiter = s.spawn(|| abandoned(stalled));
        let rounds = finish(&r, &data, 512 * KIB, Duration::from_secs(60));
        println!("finished after {rounds} rounds");
        waiter.join().unwrap()
    });
    assert_eq!(without_date(&answer), expected_idle_answer("1s"));
    let s = r.status();
    assert_eq!(s["received_bytes"], data.len() as u64, "{s}");
    assert!(
        r.data_file() == data,
        "the data file differs from what was sent"
    );
    assert_eq!(r.complete().0, 202);
    let s = r.wait_status("verification", |s| s["status"] == "failed");
    assert!(!s["message"].as_str().unwrap().contains("SHA-256"), "{s}");
}

/// Many stalled chunks at once, at offsets all over the file, and many clients sending it: every
/// stalled chunk gets the same 408 and its connection closed, and the others finish.
#[test]
fn many_stalled_chunks_and_many_clients() {
    for (stallers, senders) in [(1usize, 1usize), (2, 2), (8, 8), (32, 8)] {
        let data = random_bytes(stallers * 2 * MIB, 71 + stallers as u64);
        let (_tmp, dir) = work_dir();
        let r = Receiver::for_data(&dir, &data, &[("RUNR_UPLOAD_CHUNK_IDLE", "1500ms")]);
        let conns: Vec<Conn> = (0..stallers)
            .map(|i| stall(r.addr, &data, i * 2 * MIB))
            .collect();
        let answers: Vec<Resp> = std::thread::scope(|s| {
            let waiters: Vec<_> = conns
                .into_iter()
                .map(|c| s.spawn(move || abandoned(c)))
                .collect();
            let senders: Vec<_> = (0..senders)
                .map(|k| {
                    let (r, data) = (&r, &data);
                    // Different chunk sizes per sender: their pieces straddle the stalled ones.
                    s.spawn(move || finish(r, data, 256 * KIB + k * 4099, Duration::from_secs(120)))
                })
                .collect();
            for t in senders {
                t.join().unwrap();
            }
            waiters.into_iter().map(|w| w.join().unwrap()).collect()
        });
        for a in &answers {
            assert_eq!(
                without_date(a),
                expected_idle_answer("1.5s"),
                "{stallers} stallers"
            );
        }
        assert!(
            r.data_file() == data,
            "{stallers} stallers: the data file differs"
        );
        let s = r.status();
        assert_eq!(s["uploaded_bytes"], data.len() as u64, "{s}");
    }
}

/// `/proc/net/tcp`'s `tr` column for the server side of the connection from local port
/// `client_port` to `server_port`: 2 while the keepalive timer runs.
fn server_timer(server_port: u16, client_port: u16) -> Option<u32> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let port = |a: &str| u16::from_str_radix(a.rsplit(':').next()?, 16).ok();
        (port(f[1]) == Some(server_port) && port(f[2]) == Some(client_port))
            .then(|| u32::from_str_radix(f[5].split(':').next()?, 16).ok())
            .flatten()
    })
}

#[test]
fn accepted_connections_have_tcp_keepalive() {
    let data = random_bytes(1000, 72);
    let (_tmp, dir) = work_dir();
    let r = Receiver::for_data(&dir, &data, &[]);
    let mut conns: Vec<Conn> = (0..8).map(|_| Conn::open(r.addr)).collect();
    for conn in &mut conns {
        let resp = conn.send("GET", "/healthz", &[], Body::None);
        assert_eq!(
            (resp.status, resp.text()),
            (200, "{\"ok\":true}".to_string())
        );
        let client = conn.stream().local_addr().unwrap().port();
        // Idle on a kept-alive connection: the server's keepalive timer is what runs.
        let timer = runr_testkit::wait_for("the server socket", Duration::from_secs(10), || {
            server_timer(r.addr.port(), client)
        });
        assert_eq!(
            timer, 2,
            "the server side of :{client} has no keepalive timer"
        );
    }
    let _: &TcpStream = conns[0].stream();
}
