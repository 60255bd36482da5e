//! An HTTP/1.1 proxy for tests, in front of a real server: one request per connection
//! (`Connection: close` both ways), whose [`Hook`] sees each request's head and may answer it
//! instead of the server, hold its body part way until the test lets it go, or count it.
//! Bodies pass through as they come, with a `Content-Length` or chunked.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;

/// A request's head as the client sent it.
#[derive(Debug, Clone)]
pub struct RequestHead {
    /// The request line, `PUT /v2/... HTTP/1.1`.
    pub line: String,
    /// Every header, in order, names as sent.
    pub headers: Vec<(String, String)>,
}

impl RequestHead {
    /// `GET`, `PUT`, ...
    pub fn method(&self) -> &str {
        self.line.split(' ').next().unwrap_or_default()
    }

    /// The request target.
    pub fn target(&self) -> &str {
        self.line.split(' ').nth(1).unwrap_or_default()
    }

    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `Content-Length`, 0 without one.
    pub fn content_length(&self) -> u64 {
        self.header("content-length")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    }

    /// Whether the body comes in chunked transfer encoding.
    pub fn chunked(&self) -> bool {
        self.header("transfer-encoding")
            .is_some_and(|v| v.to_ascii_lowercase().contains("chunked"))
    }
}

/// What the proxy does with one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward it.
    Forward {
        /// With `Some(n)`, [`Hook::held`] is called once `n` body bytes went through (0:
        /// before any), and the rest follows when it returns.
        hold_at: Option<u64>,
    },
    /// Answer it without forwarding it (its own body is read and dropped).
    Answer {
        /// The status.
        status: u16,
        /// The JSON body.
        body: String,
    },
}

impl Verdict {
    /// Forward, holding nothing.
    pub const FORWARD: Verdict = Verdict::Forward { hold_at: None };
}

/// What a test's proxy does with the requests going through.
pub trait Hook: Send + Sync + 'static {
    /// Decides for a request, from its head.
    fn request(&self, head: &RequestHead) -> Verdict;

    /// The request is held here (see [`Verdict::Forward`]) until this returns.
    fn held(&self, _head: &RequestHead) {}

    /// The server's answer to the request went back to the client.
    fn answered(&self, _head: &RequestHead) {}
}

/// A running proxy; its threads end with the test process.
pub struct Proxy {
    addr: SocketAddr,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream` as `hook` decides.
    pub fn start(upstream: SocketAddr, hook: Arc<dyn Hook>) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { return };
                let hook = hook.clone();
                std::thread::spawn(move || {
                    let _ = exchange(conn, upstream, &*hook);
                });
            }
        });
        Proxy { addr }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// One request from `client`, through `hook`, to `upstream` and back.
fn exchange(client: TcpStream, upstream: SocketAddr, hook: &dyn Hook) -> std::io::Result<()> {
    let mut from = BufReader::new(client.try_clone()?);
    let mut client = client;
    let Some(head) = read_request_head(&mut from)? else {
        return Ok(());
    };
    let hold_at = match hook.request(&head) {
        Verdict::Answer { status, body } => {
            copy_body(&mut from, &mut std::io::sink(), &head, None, &|| {})?;
            write!(
                client,
                "HTTP/1.1 {status} {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                crate::httpd::reason(status),
                body.len()
            )?;
            return Ok(());
        }
        Verdict::Forward { hold_at } => hold_at,
    };
    let mut up = TcpStream::connect(upstream)?;
    let mut forwarded = format!("{}\r\n", head.line);
    for (k, v) in &head.headers {
        if !k.eq_ignore_ascii_case("connection") {
            forwarded.push_str(&format!("{k}: {v}\r\n"));
        }
    }
    forwarded.push_str("Connection: close\r\n\r\n");
    up.write_all(forwarded.as_bytes())?;
    copy_body(&mut from, &mut up, &head, hold_at, &|| hook.held(&head))?;
    // The server closes after its answer (the request asked it to): the answer ends at EOF.
    std::io::copy(&mut up, &mut client)?;
    hook.answered(&head);
    let _ = client.shutdown(Shutdown::Both);
    Ok(())
}

/// The head of the next request, `None` when the client closed first.
fn read_request_head(from: &mut impl BufRead) -> std::io::Result<Option<RequestHead>> {
    let mut line = String::new();
    if from.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    loop {
        let mut h = String::new();
        if from.read_line(&mut h)? == 0 {
            return Ok(None);
        }
        let h = h.trim_end_matches(['\r', '\n']);
        if h.is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.push((k.trim().to_string(), v.trim().to_string()));
        }
    }
    Ok(Some(RequestHead {
        line: line.trim_end().to_string(),
        headers,
    }))
}

/// Copies the body `head` announces, as it is framed, calling `held` once `hold_at` body
/// bytes went through.
fn copy_body(
    from: &mut impl BufRead,
    to: &mut impl Write,
    head: &RequestHead,
    hold_at: Option<u64>,
    held: &dyn Fn(),
) -> std::io::Result<()> {
    if !head.chunked() {
        return copy_held(from, to, head.content_length(), hold_at, held);
    }
    let mut hold_at = hold_at;
    let mut line = Vec::new();
    let mut line_of = |from: &mut dyn BufRead, to: &mut dyn Write| {
        line.clear();
        from.read_until(b'\n', &mut line)?;
        to.write_all(&line)?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&line).trim().to_string())
    };
    loop {
        let size = line_of(from, to)?;
        let size = size.split(';').next().unwrap_or_default();
        let size = u64::from_str_radix(size, 16)
            .map_err(|e| std::io::Error::other(format!("chunk size {size:?}: {e}")))?;
        if size == 0 {
            // The trailer, up to its empty line.
            while !line_of(from, to)?.is_empty() {}
            return Ok(());
        }
        copy_held(from, to, size, hold_at, held)?;
        hold_at = hold_at.filter(|at| *at > size).map(|at| at - size);
        line_of(from, to)?;
    }
}

/// Copies `length` bytes, calling `held` once `hold_at` of them went through (when it is
/// within them).
fn copy_held(
    from: &mut impl Read,
    to: &mut impl Write,
    length: u64,
    hold_at: Option<u64>,
    held: &dyn Fn(),
) -> std::io::Result<()> {
    match hold_at.filter(|at| *at <= length) {
        Some(at) => {
            std::io::copy(&mut from.by_ref().take(at), to)?;
            held();
            std::io::copy(&mut from.by_ref().take(length - at), to)?;
        }
        None => {
            std::io::copy(&mut from.by_ref().take(length), to)?;
        }
    }
    Ok(())
}
