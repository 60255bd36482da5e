//! Many clients at once, at 1, 2, 8 and 32: every answer is checked whole (status, headers,
//! body), and chunks whose sizes straddle the server's buffers (hyper's 64 KiB read buffer, the
//! 1 MiB write batch) land byte for byte, one keep-alive connection per client.

use std::net::SocketAddr;

use runr_testkit::http::{self, Conn, Resp};

use super::without_date;
use crate::support::*;

/// Chunk sizes around the buffer sizes (0 is an empty chunk at its offset).
const SIZES: &[usize] = &[
    0,
    1,
    4095,
    4096,
    4097,
    65_535,
    65_536,
    65_537,
    MIB - 1,
    MIB,
    MIB + 1,
];

/// The requests whose answers do not depend on what other clients do (the status and
/// `complete` answers do: they count the bytes held).
fn fixed_requests(size: usize) -> Vec<(&'static str, String, Vec<u8>)> {
    vec![
        ("GET", "/healthz".into(), Vec::new()),
        ("PUT", "/chunk?offset=x".into(), b"abc".to_vec()),
        ("PUT", format!("/chunk?offset={}", size + 1), b"z".to_vec()),
        ("GET", "/nope".into(), Vec::new()),
        ("DELETE", "/chunk".into(), Vec::new()),
    ]
}

fn body_of<'a>(method: &str, body: &'a [u8]) -> Body<'a> {
    if body.is_empty() && method != "PUT" {
        Body::None
    } else {
        Body::Sized(body)
    }
}

/// A request on a connection of its own: a refusal decided from the head leaves the body
/// unread, and the server closes such a connection.
fn once(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Resp {
    http::request(addr, method, path, &[], body_of(method, body))
}

#[test]
fn concurrent_clients_get_exact_answers() {
    for clients in [1usize, 2, 8, 32] {
        // The sizes once per client (the larger ones left out at 8 and 32 clients, to keep the
        // upload small), at offsets laid out one after the other.
        let sizes = match clients {
            1 | 2 => SIZES.len(),
            8 => 9,
            _ => 8,
        };
        let mut plan: Vec<(usize, usize)> = Vec::new();
        let mut offset = 0;
        for _ in 0..clients {
            for &len in &SIZES[..sizes] {
                plan.push((offset, len));
                offset += len;
            }
        }
        let data = random_bytes(offset, 40 + clients as u64);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("work");
        std::fs::create_dir(&dir).unwrap();
        let r = Receiver::for_data(&dir, &data, &[]);

        // One client alone first: its answers are what every concurrent one must get.
        let requests = fixed_requests(data.len());
        let reference: Vec<_> = requests
            .iter()
            .map(|(m, p, b)| without_date(&once(r.addr, m, p, b)))
            .collect();
        let statuses: Vec<u16> = reference.iter().map(|(s, _, _)| *s).collect();
        assert_eq!(statuses, [200, 400, 416, 404, 405]);
        for (status, headers, body) in &reference {
            let v: serde_json::Value = serde_json::from_slice(body).unwrap();
            assert!(
                *status == 200 || v["code"].is_string(),
                "a refusal names its code: {v}"
            );
            assert!(headers.contains(&("content-type".into(), "application/json".into())));
            assert!(headers.contains(&("content-length".into(), body.len().to_string())));
        }

        std::thread::scope(|scope| {
            for c in 0..clients {
                let (r, data, plan, requests, reference) =
                    (&r, &data, &plan, &requests, &reference);
                scope.spawn(move || {
                    // The fixed requests before and after this client's chunks.
                    for (i, (m, p, b)) in requests.iter().enumerate() {
                        let got = without_date(&once(r.addr, m, p, b));
                        assert_eq!(got, reference[i], "client {c}: {m} {p}");
                    }
                    let mut conn = Conn::open(r.addr);
                    for &(offset, len) in plan.iter().skip(c).step_by(clients) {
                        let path = format!("/chunk?offset={offset}");
                        let chunk = &data[offset..offset + len];
                        let resp = conn.send("PUT", &path, &[], Body::Sized(chunk));
                        let (code, v) = json(&resp);
                        assert_eq!(code, 200, "client {c}: {v}");
                        assert_eq!(v["size"], data.len() as u64, "{v}");
                        let received = v["received_bytes"].as_u64().unwrap();
                        let uploaded = v["uploaded_bytes"].as_u64().unwrap();
                        assert!(received >= len as u64, "{v}");
                        assert!(uploaded <= received && received <= data.len() as u64, "{v}");
                        assert!(v["status"] == "receiving" || len == 0, "{v}");
                    }
                    for (i, (m, p, b)) in requests.iter().enumerate() {
                        let got = without_date(&once(r.addr, m, p, b));
                        assert_eq!(got, reference[i], "client {c}: {m} {p}");
                    }
                });
            }
        });
        let s = r.status();
        assert_eq!(s["uploaded_bytes"], data.len() as u64, "{s}");
        assert_eq!(s["received_bytes"], data.len() as u64, "{s}");
        assert!(
            r.data_file() == data,
            "the data file differs from what was sent ({clients} clients)"
        );
    }
}
