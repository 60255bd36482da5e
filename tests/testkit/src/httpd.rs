//! A small threaded HTTP/1.1 server for the harness's own fixtures (the token service, the cache
//! that ignores `Range`): one thread per connection, keep-alive, bounded request heads, bodies
//! and connection count, JSON errors for requests it cannot read, and a [`HttpServer::stop`]
//! that closes every open connection, so a fixture can go away and come back on the same port
//! like a restarted service.

use std::collections::HashMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use base64::Engine;

/// How long writing an answer may stall before the connection is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a refused request may take to be read to its end before the close, so that its
/// client gets the answer rather than a reset.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The bounds of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest request head (request line and headers) in bytes; a longer one gets 431.
    pub max_head: usize,
    /// Longest request body in bytes; a longer one gets 413.
    pub max_body: usize,
    /// Most connections served at once; one more gets 503 and is closed.
    pub max_connections: usize,
    /// How long an idle keep-alive connection (or a half-sent request) stays open.
    pub idle_timeout: Duration,
    /// Connections over `max_connections` answered at once (each gets its 503 from a
    /// short-lived thread once its request head is in); beyond this they are closed unanswered.
    pub max_rejecting: usize,
    /// How long a connection over the limit gets to send its request head before its 503.
    pub reject_wait: Duration,
}

impl Default for Limits {
    /// 16 KiB heads, 64 KiB bodies, 256 connections, 30 s idle, 16 refusals at once after up
    /// to 2 s each.
    fn default() -> Limits {
        Limits {
            max_head: 16 * 1024,
            max_body: 64 * 1024,
            max_connections: 256,
            idle_timeout: Duration::from_secs(30),
            max_rejecting: 16,
            reject_wait: Duration::from_secs(2),
        }
    }
}

// === Request ===

/// A request as the server read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// `GET`, `HEAD`, `POST`, …
    pub method: String,
    /// The request target as sent: path and query.
    pub target: String,
    /// `HTTP/1.1` or `HTTP/1.0`.
    pub version: String,
    /// Every header in the order received, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The path, without the query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The query's `key=value` pairs, percent-decoded, in order (a key may repeat).
    pub fn query(&self) -> Vec<(String, String)> {
        self.target
            .split_once('?')
            .map(|(_, q)| decode_form(q))
            .unwrap_or_default()
    }

    /// The body as `application/x-www-form-urlencoded` pairs.
    pub fn form(&self) -> Vec<(String, String)> {
        decode_form(&String::from_utf8_lossy(&self.body))
    }

    /// The `Authorization: Basic` user and password, if the request carries readable ones.
    pub fn basic_auth(&self) -> Option<(String, String)> {
        let value = self.header("authorization")?;
        let (scheme, encoded) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return None;
        }
        let raw = base64::engine::general_purpose::STANDARD
            .decode(encoded.trim())
            .ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (user, password) = text.split_once(':')?;
        Some((user.to_string(), password.to_string()))
    }
}

/// Decodes `a=1&b=x%20y+z` into pairs (`+` is a space, bad escapes are kept as they are).
pub fn decode_form(s: &str) -> Vec<(String, String)> {
    s.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => match (
                bytes.get(i + 1).and_then(|c| (*c as char).to_digit(16)),
                bytes.get(i + 2).and_then(|c| (*c as char).to_digit(16)),
            ) {
                (Some(h), Some(l)) => {
                    out.push((h * 16 + l) as u8);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Percent-encodes everything but unreserved characters (RFC 3986), for building query strings.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

// === Response ===

/// Writes a streamed body to the connection; it must write exactly the announced length.
pub type StreamFn = Box<dyn FnOnce(&mut dyn Write) -> io::Result<()> + Send>;

/// The body of an answer.
pub enum Body {
    /// Bytes in memory; `Content-Length` is their length unless the handler set one (a HEAD
    /// answer announces the length of what a GET would send).
    Bytes(Vec<u8>),
    /// A body of `len` bytes written by `write` (not called for HEAD). A writer that fails or
    /// writes another length closes the connection, since the framing is lost.
    Stream {
        /// `Content-Length`.
        len: u64,
        /// Writes the body.
        write: StreamFn,
    },
}

/// An answer from a handler.
pub struct Response {
    /// The status code.
    pub status: u16,
    /// Headers, written in this order (the server adds `Content-Length` and `Connection` when
    /// missing).
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Body,
}

impl Response {
    /// An answer with `status`, no headers and no body.
    pub fn new(status: u16) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Bytes(Vec::new()),
        }
    }

    /// `application/json; charset=utf-8` with `text` as the body.
    pub fn json(status: u16, text: impl Into<String>) -> Response {
        Response::new(status)
            .with_header("Content-Type", "application/json; charset=utf-8")
            .with_body(text.into())
    }

    /// A streamed body of `len` bytes.
    pub fn stream(status: u16, len: u64, write: StreamFn) -> Response {
        Response {
            status,
            headers: Vec::new(),
            body: Body::Stream { len, write },
        }
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: impl Into<String>) -> Response {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    /// Sets the body.
    pub fn with_body(mut self, body: impl Into<Vec<u8>>) -> Response {
        self.body = Body::Bytes(body.into());
        self
    }

    fn has_header(&self, name: &str) -> bool {
        self.headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// A registry-style JSON error envelope, `{"errors":[{"code":…,"message":…}]}` plus a newline,
/// as the harness's fixtures answer requests they cannot read.
pub fn error_body(code: &str, message: &str) -> String {
    format!(
        "{{\"errors\":[{{\"code\":{},\"message\":{}}}]}}\n",
        serde_json::Value::from(code),
        serde_json::Value::from(message)
    )
}

/// The standard reason phrase of `status` (empty for codes it does not know).
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        307 => "Temporary Redirect",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        413 => "Payload Too Large",
        416 => "Range Not Satisfiable",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "",
    }
}

// === HttpServer ===

/// What a server calls for every request.
pub type Handler = dyn Fn(&Request) -> Response + Send + Sync;

struct Shared {
    stopping: AtomicBool,
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_id: AtomicU64,
    rejecting: AtomicUsize,
    requests: AtomicU64,
}

impl Shared {
    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, TcpStream>> {
        // A panicking connection thread cannot leave the map half-updated.
        self.conns.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running server on a loopback port; stopped (every connection closed) on drop.
pub struct HttpServer {
    addr: SocketAddr,
    handler: Arc<Handler>,
    limits: Limits,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

impl HttpServer {
    /// Serves `handler` on a free loopback port with the default [`Limits`].
    pub fn start(handler: impl Fn(&Request) -> Response + Send + Sync + 'static) -> HttpServer {
        Self::start_with(Limits::default(), handler)
    }

    /// Serves `handler` on a free loopback port with `limits`.
    pub fn start_with(
        limits: Limits,
        handler: impl Fn(&Request) -> Response + Send + Sync + 'static,
    ) -> HttpServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local_addr");
        let mut server = HttpServer {
            addr,
            handler: Arc::new(handler),
            limits,
            shared: Arc::new(Shared {
                stopping: AtomicBool::new(false),
                conns: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                rejecting: AtomicUsize::new(0),
                requests: AtomicU64::new(0),
            }),
            accept: None,
        };
        server.run(listener);
        server
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections open right now.
    pub fn connections(&self) -> usize {
        self.shared.conns().len()
    }

    /// Connections over the limit waiting for their 503 right now.
    pub fn rejecting(&self) -> usize {
        self.shared.rejecting.load(Ordering::SeqCst)
    }

    /// Requests read so far (all of them, including refused ones), over restarts.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// True while the server accepts connections.
    pub fn is_running(&self) -> bool {
        self.accept.is_some()
    }

    /// Stops accepting and closes every open connection (a client mid-request sees the
    /// connection drop, as with a killed process). The port is free afterwards.
    pub fn stop(&mut self) {
        let Some(accept) = self.accept.take() else {
            return;
        };
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes the blocking accept; if the connect fails the thread is left to exit on its own.
        if TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)).is_ok() {
            let _ = accept.join();
        }
        for (_, s) in self.shared.conns().drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Starts serving again on the same port after [`HttpServer::stop`]. Panics if the port was
    /// taken in between.
    pub fn restart(&mut self) {
        self.stop();
        let listener = crate::wait_for(
            &format!("{} to be free again", self.addr),
            Duration::from_secs(10),
            || TcpListener::bind(self.addr).ok(),
        );
        self.shared.stopping.store(false, Ordering::SeqCst);
        self.run(listener);
    }

    fn run(&mut self, listener: TcpListener) {
        let shared = Arc::clone(&self.shared);
        let handler = Arc::clone(&self.handler);
        let limits = self.limits;
        self.accept = Some(std::thread::spawn(move || {
            accept_loop(listener, shared, handler, limits)
        }));
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>, handler: Arc<Handler>, limits: Limits) {
    for stream in listener.incoming() {
        if shared.stopping.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let Ok(clone) = stream.try_clone() else {
            continue;
        };
        let id = shared.next_id.fetch_add(1, Ordering::SeqCst);
        {
            let mut conns = shared.conns();
            if conns.len() >= limits.max_connections {
                drop(conns);
                reject(stream, &shared, limits);
                continue;
            }
            conns.insert(id, clone);
        }
        let shared = Arc::clone(&shared);
        let handler = Arc::clone(&handler);
        std::thread::spawn(move || {
            serve_connection(stream, &handler, limits, &shared);
            shared.conns().remove(&id);
        });
    }
}

/// Answers a connection over the limit with 503 once its request head is in (answering before
/// reading would make the close reset the connection and lose the answer).
fn reject(stream: TcpStream, shared: &Arc<Shared>, limits: Limits) {
    if shared.rejecting.fetch_add(1, Ordering::SeqCst) >= limits.max_rejecting {
        shared.rejecting.fetch_sub(1, Ordering::SeqCst);
        return;
    }
    let shared = Arc::clone(shared);
    std::thread::spawn(move || {
        let _ = stream.set_read_timeout(Some(limits.reject_wait));
        let _ = stream.set_write_timeout(Some(limits.reject_wait));
        if let Ok(read) = stream.try_clone() {
            let mut reader = BufReader::new(read);
            let _ = read_head(&mut reader, limits.max_head);
        }
        let body = error_body(
            "UNAVAILABLE",
            &format!(
                "too many connections (at most {} at once)",
                limits.max_connections
            ),
        );
        let mut w = &stream;
        let _ = write_head(
            &mut w,
            503,
            &[
                (
                    "Content-Type".into(),
                    "application/json; charset=utf-8".into(),
                ),
                ("Content-Length".into(), body.len().to_string()),
                ("Connection".into(), "close".into()),
            ],
        );
        let _ = w.write_all(body.as_bytes());
        let _ = stream.shutdown(Shutdown::Write);
        shared.rejecting.fetch_sub(1, Ordering::SeqCst);
    });
}

/// A request the server refuses before the handler sees it.
#[derive(Debug)]
struct Refusal {
    status: u16,
    code: &'static str,
    message: String,
}

fn refusal(status: u16, code: &'static str, message: impl Into<String>) -> Refusal {
    Refusal {
        status,
        code,
        message: message.into(),
    }
}

fn serve_connection(stream: TcpStream, handler: &Arc<Handler>, limits: Limits, shared: &Shared) {
    let _ = stream.set_read_timeout(Some(limits.idle_timeout));
    let _ = stream.set_write_timeout(Some(WRITE_TIMEOUT));
    let _ = stream.set_nodelay(true);
    let Ok(read) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read);
    let mut writer = &stream;
    loop {
        let req = match read_request(&mut reader, limits) {
            Ok(Some(req)) => req,
            Ok(None) => return,
            Err(r) => {
                shared.requests.fetch_add(1, Ordering::SeqCst);
                let body = error_body(r.code, &r.message);
                let _ = write_head(
                    &mut writer,
                    r.status,
                    &[
                        (
                            "Content-Type".into(),
                            "application/json; charset=utf-8".into(),
                        ),
                        ("Content-Length".into(), body.len().to_string()),
                        ("Connection".into(), "close".into()),
                    ],
                );
                let _ = writer.write_all(body.as_bytes());
                let _ = stream.shutdown(Shutdown::Write);
                // Lets the client read the answer before the close could reset it.
                let _ = stream.set_read_timeout(Some(DRAIN_TIMEOUT));
                let _ = io::copy(&mut reader.take(1 << 20), &mut io::sink());
                return;
            }
        };
        shared.requests.fetch_add(1, Ordering::SeqCst);
        let keep_alive = keeps_alive(&req) && !shared.stopping.load(Ordering::SeqCst);
        let resp =
            std::panic::catch_unwind(AssertUnwindSafe(|| handler(&req))).unwrap_or_else(|_| {
                Response::json(500, error_body("UNKNOWN", "the test fixture panicked"))
            });
        match write_response(&mut writer, &req, resp, keep_alive) {
            Ok(true) if keep_alive => {}
            _ => {
                let _ = stream.shutdown(Shutdown::Both);
                return;
            }
        }
    }
}

fn keeps_alive(req: &Request) -> bool {
    let conn = req.header("connection").unwrap_or("").to_ascii_lowercase();
    if req.version == "HTTP/1.0" {
        conn.split(',').any(|t| t.trim() == "keep-alive")
    } else {
        !conn.split(',').any(|t| t.trim() == "close")
    }
}

/// Reads lines up to the empty line, at most `max` bytes in all. `Ok(None)`: the connection
/// closed or went idle before a request began.
fn read_head(reader: &mut impl BufRead, max: usize) -> Result<Option<Vec<String>>, Refusal> {
    let mut lines = Vec::new();
    let mut total = 0usize;
    loop {
        let mut line = Vec::new();
        let budget = (max + 1).saturating_sub(total) as u64;
        match reader.take(budget).read_until(b'\n', &mut line) {
            Ok(0) => return Ok(None),
            Ok(n) => total += n,
            // Idle keep-alive timeout, reset, or a client that stopped mid-head.
            Err(_) => return Ok(None),
        }
        if total > max {
            return Err(refusal(
                431,
                "HEADERS_TOO_LARGE",
                format!("request head larger than {max} bytes"),
            ));
        }
        if !line.ends_with(b"\n") {
            return Ok(None);
        }
        let text = String::from_utf8(line)
            .map_err(|_| refusal(400, "BAD_REQUEST", "request head is not UTF-8"))?;
        let text = text.trim_end_matches(['\r', '\n']).to_string();
        if text.is_empty() {
            // Empty lines before the request line are allowed (RFC 9112 2.2).
            if lines.is_empty() {
                continue;
            }
            return Ok(Some(lines));
        }
        lines.push(text);
    }
}

fn read_request(reader: &mut impl BufRead, limits: Limits) -> Result<Option<Request>, Refusal> {
    let Some(lines) = read_head(reader, limits.max_head)? else {
        return Ok(None);
    };
    let first = &lines[0];
    let mut parts = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(refusal(
            400,
            "BAD_REQUEST",
            format!("bad request line {first:?}"),
        ));
    };
    if method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
        || !(version == "HTTP/1.1" || version == "HTTP/1.0")
    {
        return Err(refusal(
            400,
            "BAD_REQUEST",
            format!("bad request line {first:?}"),
        ));
    }
    let mut headers = Vec::with_capacity(lines.len() - 1);
    for line in &lines[1..] {
        let Some((name, value)) = line.split_once(':') else {
            return Err(refusal(
                400,
                "BAD_REQUEST",
                format!("bad header line {line:?}"),
            ));
        };
        if name.is_empty() || name.bytes().any(|b| b.is_ascii_whitespace()) {
            return Err(refusal(
                400,
                "BAD_REQUEST",
                format!("bad header line {line:?}"),
            ));
        }
        headers.push((name.to_string(), value.trim().to_string()));
    }
    let mut req = Request {
        method: method.to_string(),
        target: target.to_string(),
        version: version.to_string(),
        headers,
        body: Vec::new(),
    };
    req.body = read_body(reader, &req, limits.max_body)?;
    Ok(Some(req))
}

fn read_body(reader: &mut impl BufRead, req: &Request, max: usize) -> Result<Vec<u8>, Refusal> {
    let too_large = || {
        refusal(
            413,
            "TOO_LARGE",
            format!("request body larger than {max} bytes"),
        )
    };
    let broken = || refusal(400, "BAD_REQUEST", "request body ended early");
    if let Some(te) = req.header("transfer-encoding") {
        if !te.eq_ignore_ascii_case("chunked") {
            return Err(refusal(
                400,
                "BAD_REQUEST",
                format!("unsupported Transfer-Encoding {te:?}"),
            ));
        }
        let mut body = Vec::new();
        loop {
            let mut size = String::new();
            reader
                .take(1024)
                .read_line(&mut size)
                .map_err(|_| broken())?;
            let hex = size.trim().split(';').next().unwrap_or("");
            let n = usize::from_str_radix(hex, 16)
                .map_err(|_| refusal(400, "BAD_REQUEST", format!("bad chunk size {size:?}")))?;
            if n == 0 {
                loop {
                    let mut trailer = String::new();
                    let read = reader
                        .take(1024)
                        .read_line(&mut trailer)
                        .map_err(|_| broken())?;
                    if read == 0 || trailer.trim().is_empty() {
                        return Ok(body);
                    }
                }
            }
            if body.len() + n > max {
                return Err(too_large());
            }
            let start = body.len();
            body.resize(start + n, 0);
            reader
                .read_exact(&mut body[start..])
                .map_err(|_| broken())?;
            let mut crlf = [0u8; 2];
            reader.read_exact(&mut crlf).map_err(|_| broken())?;
        }
    }
    let lengths: Vec<&str> = req
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.as_str())
        .collect();
    let Some(first) = lengths.first() else {
        return Ok(Vec::new());
    };
    if lengths.iter().any(|l| l != first) {
        return Err(refusal(
            400,
            "BAD_REQUEST",
            "conflicting Content-Length headers",
        ));
    }
    let len: usize = first
        .parse()
        .map_err(|_| refusal(400, "BAD_REQUEST", format!("bad Content-Length {first:?}")))?;
    if len > max {
        return Err(too_large());
    }
    let mut body = vec![0; len];
    reader.read_exact(&mut body).map_err(|_| broken())?;
    Ok(body)
}

fn write_head(w: &mut impl Write, status: u16, headers: &[(String, String)]) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    w.write_all(head.as_bytes())
}

/// Writes `resp`; `Ok(false)` when the connection must close (a streamed body that did not
/// match its length).
fn write_response(
    w: &mut impl Write,
    req: &Request,
    resp: Response,
    keep_alive: bool,
) -> io::Result<bool> {
    let mut headers = resp.headers.clone();
    let bodyless = matches!(resp.status, 100..=199 | 204 | 304);
    let len = match &resp.body {
        Body::Bytes(b) => b.len() as u64,
        Body::Stream { len, .. } => *len,
    };
    if !bodyless && !resp.has_header("content-length") {
        headers.push(("Content-Length".into(), len.to_string()));
    }
    if !keep_alive && !resp.has_header("connection") {
        headers.push(("Connection".into(), "close".into()));
    }
    write_head(w, resp.status, &headers)?;
    if req.method == "HEAD" || bodyless {
        return Ok(true);
    }
    match resp.body {
        Body::Bytes(b) => {
            w.write_all(&b)?;
            Ok(true)
        }
        Body::Stream { len, write } => {
            let mut counting = Counting { inner: w, n: 0 };
            write(&mut counting)?;
            Ok(counting.n == len)
        }
    }
}

struct Counting<W> {
    inner: W,
    n: u64,
}

impl<W: Write> Write for Counting<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forms_decode() {
        assert_eq!(
            decode_form("a=1&b=x%20y+z&&c&d=%zz&e=%41"),
            vec![
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "x y z".to_string()),
                ("c".to_string(), String::new()),
                ("d".to_string(), "%zz".to_string()),
                ("e".to_string(), "A".to_string()),
            ]
        );
        assert_eq!(decode_form("x=%4"), vec![("x".into(), "%4".into())]);
        let s = "repository:a/b:pull,push é&=";
        assert_eq!(
            decode_form(&format!("s={}", percent_encode(s))),
            vec![("s".to_string(), s.to_string())]
        );
    }

    #[test]
    fn error_bodies_are_json() {
        let body = error_body("BAD_REQUEST", "bad \"x\"");
        assert_eq!(
            body,
            "{\"errors\":[{\"code\":\"BAD_REQUEST\",\"message\":\"bad \\\"x\\\"\"}]}\n"
        );
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["errors"][0]["message"], "bad \"x\"");
    }
}
