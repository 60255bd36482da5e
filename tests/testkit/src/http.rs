//! A raw, blocking HTTP/1.1 client for tests: exact bytes on the wire (bad headers, stalled
//! bodies, half-sent requests are all possible), and answers read back whole (status, every
//! header in order, body framed by Content-Length or chunked encoding).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// How long a test waits for an answer before the read fails.
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// An HTTP answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resp {
    /// The status code.
    pub status: u16,
    /// Every header, in the order received, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Resp {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// All values of header `name`.
    pub fn headers_named(&self, name: &str) -> Vec<&str> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A request body.
#[derive(Debug, Clone, Copy)]
pub enum Body<'a> {
    /// No body; `Content-Length: 0` is sent for methods other than GET and HEAD.
    None,
    /// With `Content-Length`.
    Sized(&'a [u8]),
    /// `Transfer-Encoding: chunked`, in 64 KiB pieces.
    Chunked(&'a [u8]),
}

/// One keep-alive HTTP/1.1 connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// Connects to `addr` (panics when nothing listens).
    pub fn open(addr: SocketAddr) -> Conn {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect to {addr}: {e}"));
        s.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            reader: BufReader::new(s),
        }
    }

    /// Sends a request and reads its answer. The body goes from its own thread while this one
    /// reads: a server that refuses early answers and may close while we still send, and the
    /// answer must not be lost to a reset.
    pub fn send(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Body<'_>,
    ) -> Resp {
        let head = request_head(method, path, headers, &body);
        let s = self.reader.get_mut();
        s.write_all(head.as_bytes()).expect("send the request head");
        let owned = match body {
            Body::None => None,
            Body::Sized(b) => Some((false, b.to_vec())),
            Body::Chunked(b) => Some((true, b.to_vec())),
        };
        let writer = owned.map(|(chunked, data)| {
            let mut w = s.try_clone().unwrap();
            std::thread::spawn(move || {
                let _ = if chunked {
                    write_chunked(&mut w, &data)
                } else {
                    w.write_all(&data)
                };
            })
        });
        // An answer to HEAD announces a body it does not send.
        let answer = self
            .read_answer(method.eq_ignore_ascii_case("HEAD"))
            .unwrap_or_else(|e| panic!("reading the answer: {e}"));
        if let Some(w) = writer {
            let _ = w.join();
        }
        answer
    }

    /// Reads one answer (status line, headers, body). Panics on a closed connection or a
    /// malformed answer, with what was read.
    pub fn read_response(&mut self) -> Resp {
        self.try_read_response()
            .unwrap_or_else(|e| panic!("reading the answer: {e}"))
    }

    /// Like [`Conn::read_response`], but a closed connection or a bad answer is an `Err`.
    pub fn try_read_response(&mut self) -> Result<Resp, String> {
        self.read_answer(false)
    }

    fn read_answer(&mut self, head: bool) -> Result<Resp, String> {
        let Head { status, headers } = read_head(&mut self.reader)?;
        let find = |name: &str| {
            headers
                .iter()
                .find(|(k, _): &&(String, String)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v.clone())
        };
        let body = if head || (100..200).contains(&status) || status == 204 || status == 304 {
            Vec::new()
        } else if find("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            self.read_chunked()?
        } else {
            let len: usize = find("content-length")
                .map(|v| v.parse().map_err(|_| format!("bad Content-Length {v:?}")))
                .transpose()?
                .unwrap_or(0);
            let mut body = vec![0; len];
            self.reader
                .read_exact(&mut body)
                .map_err(|e| format!("body of {len} bytes: {e}"))?;
            body
        };
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    fn read_chunked(&mut self) -> Result<Vec<u8>, String> {
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            self.reader
                .read_line(&mut size)
                .map_err(|e| format!("chunk size: {e}"))?;
            let hex = size.trim().split(';').next().unwrap_or("");
            let n = usize::from_str_radix(hex, 16)
                .map_err(|_| format!("bad chunk size line {size:?}"))?;
            if n == 0 {
                // Trailers, then the empty line.
                loop {
                    let mut t = String::new();
                    self.reader
                        .read_line(&mut t)
                        .map_err(|e| format!("trailer: {e}"))?;
                    if t.trim().is_empty() {
                        return Ok(body);
                    }
                }
            }
            let start = body.len();
            body.resize(start + n, 0);
            self.reader
                .read_exact(&mut body[start..])
                .map_err(|e| format!("chunk of {n} bytes: {e}"))?;
            let mut crlf = [0u8; 2];
            self.reader
                .read_exact(&mut crlf)
                .map_err(|e| format!("chunk end: {e}"))?;
        }
    }

    /// The raw socket, for tests that write by hand.
    pub fn stream(&mut self) -> &mut TcpStream {
        self.reader.get_mut()
    }
}

/// A response head: the status and every header, in the order received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The status code.
    pub status: u16,
    /// Every header, names as sent.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `Content-Length`, when there is one.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }
}

/// Reads a response's status line and headers from `r`, leaving the body in it: the one head
/// parser of the tests that stream bodies themselves.
pub fn read_head(r: &mut impl BufRead) -> Result<Head, String> {
    let mut line = String::new();
    let n = r
        .read_line(&mut line)
        .map_err(|e| format!("status line: {e}"))?;
    if n == 0 {
        return Err("the connection closed before an answer".into());
    }
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {line:?}"))?;
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        r.read_line(&mut h).map_err(|e| format!("header: {e}"))?;
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            return Ok(Head { status, headers });
        }
        let (k, v) = h
            .split_once(':')
            .ok_or_else(|| format!("bad header line {h:?}"))?;
        headers.push((k.trim().to_string(), v.trim().to_string()));
    }
}

/// The request head `send` writes: `Host`, the caller's headers, and `Content-Length` or
/// `Transfer-Encoding` for the body unless the caller set one.
pub fn request_head(method: &str, path: &str, headers: &[(&str, &str)], body: &Body<'_>) -> String {
    let mut head = format!("{method} {path} HTTP/1.1\r\n");
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    if !has("host") {
        head.push_str("Host: test\r\n");
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has("content-length") && !has("transfer-encoding") {
        match body {
            Body::Sized(b) => head.push_str(&format!("Content-Length: {}\r\n", b.len())),
            Body::Chunked(_) => head.push_str("Transfer-Encoding: chunked\r\n"),
            Body::None if method != "GET" && method != "HEAD" => {
                head.push_str("Content-Length: 0\r\n")
            }
            Body::None => {}
        }
    }
    head.push_str("\r\n");
    head
}

/// Writes `data` as chunked encoding, 64 KiB a chunk, then the last chunk.
pub fn write_chunked(s: &mut impl Write, data: &[u8]) -> std::io::Result<()> {
    for piece in data.chunks(64 * 1024) {
        write!(s, "{:x}\r\n", piece.len())?;
        s.write_all(piece)?;
        s.write_all(b"\r\n")?;
    }
    s.write_all(b"0\r\n\r\n")
}

/// One request on a new connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Body<'_>,
) -> Resp {
    Conn::open(addr).send(method, path, headers, body)
}

/// `GET path` on a new connection.
pub fn get(addr: SocketAddr, path: &str) -> Resp {
    request(addr, "GET", path, &[], Body::None)
}

/// Sends `raw` as it is (a request head, maybe a partial body) and reads the answer: proves
/// the server decided from what it had.
pub fn send_raw(addr: SocketAddr, raw: &[u8]) -> Resp {
    let mut c = Conn::open(addr);
    c.stream().write_all(raw).expect("send");
    c.read_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// A one-shot server that writes `answer` after reading a request head.
    fn serve_once(answer: &'static [u8]) -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line == "\r\n" || line.is_empty() {
                    break;
                }
            }
            s.write_all(answer).unwrap();
        });
        addr
    }

    #[test]
    fn content_length_and_chunked_answers() {
        let addr =
            serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\nX-A: 2\r\n\r\nhello");
        let r = get(addr, "/");
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello");
        assert_eq!(r.headers_named("x-a"), ["1", "2"]);
        let addr = serve_once(
            b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2;x=y\r\nde\r\n0\r\nT: 1\r\n\r\n",
        );
        let r = get(addr, "/");
        assert_eq!((r.status, r.body.as_slice()), (201, &b"abcde"[..]));
    }

    #[test]
    fn an_answer_to_head_has_no_body() {
        // Only the head is sent, then the connection closes: reading a body would fail.
        let addr = serve_once(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
        let r = request(addr, "HEAD", "/", &[], Body::None);
        assert_eq!((r.status, r.header("content-length")), (200, Some("5")));
        assert!(r.body.is_empty());
    }

    #[test]
    fn a_closed_connection_is_an_error() {
        let addr = serve_once(b"");
        let mut c = Conn::open(addr);
        c.stream().write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
        assert!(c.try_read_response().is_err());
    }

    #[test]
    fn heads_frame_the_body() {
        assert_eq!(
            request_head("POST", "/x", &[("A", "b")], &Body::Sized(b"abc")),
            "POST /x HTTP/1.1\r\nHost: test\r\nA: b\r\nContent-Length: 3\r\n\r\n"
        );
        assert_eq!(
            request_head("GET", "/", &[], &Body::None),
            "GET / HTTP/1.1\r\nHost: test\r\n\r\n"
        );
        assert!(request_head("PUT", "/", &[], &Body::Chunked(b"x"))
            .contains("Transfer-Encoding: chunked"));
    }
}
