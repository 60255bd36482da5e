//! A pull-through cache that ignores `Range`, for prewarm's tests: in front of a real upstream
//! registry (a [`crate::Registry`]), it answers every blob GET, `Range: bytes=0-0` included, with
//! 200 and the whole blob, fetching it from upstream and storing it (digest checked) while it
//! serves; HEAD on a blob is answered from what it has stored (or, as configured, forwarded or
//! refused). Manifests are passed through to the upstream. Bytes are counted per blob, so a
//! test can compare them with what prewarm reports as fetched.
//!
//! prewarm's requests (docs/prewarm.md): `GET /v2/`, manifests by tag and digest, then per blob
//! a `Range: bytes=0-0` probe, a whole GET when the probe says "not held", and probes again
//! until the cache says it holds the blob. A cache like this one answers the probe with the
//! whole blob, every time.

use std::collections::BTreeMap;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::httpd::{self, HttpServer, Request, Response};

/// Connect timeout to the upstream.
const UPSTREAM_CONNECT: Duration = Duration::from_secs(10);
/// Read timeout on the upstream (a stalled upstream fails the request after this).
const UPSTREAM_READ: Duration = Duration::from_secs(60);
/// Largest manifest or error body passed through from the upstream.
const MAX_PASSTHROUGH: u64 = 4 << 20;
/// Pieces a blob is copied in.
const PIECE: usize = 64 * 1024;

/// How the cache answers `HEAD /v2/<name>/blobs/<digest>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadMode {
    /// From its store: 200 with the size when it holds the blob, 404 when not.
    FromStore,
    /// Passed to the upstream: 200 whenever the upstream has it, stored or not (a HEAD that
    /// cannot confirm anything).
    Upstream,
    /// 405 Method Not Allowed.
    NotAllowed,
}

/// What happened to one blob, counted since the cache started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobStats {
    /// GET requests for it.
    pub gets: u64,
    /// Of those, how many carried a `Range` header.
    pub range_gets: u64,
    /// HEAD requests for it.
    pub heads: u64,
    /// Body bytes written to clients (a client that drops the body early may not have read
    /// all of them).
    pub served_bytes: u64,
    /// GETs it sent to the upstream for it.
    pub upstream_fetches: u64,
    /// Body bytes read from the upstream for it.
    pub upstream_bytes: u64,
}

struct State {
    upstream: SocketAddr,
    head: HeadMode,
    /// Fetched blobs waiting for [`RangeIgnoringCache::release_stores`] (`None`: stored at once).
    held: Mutex<Option<Vec<(PathBuf, PathBuf)>>>,
    store: PathBuf,
    stats: Mutex<BTreeMap<String, BlobStats>>,
    manifest_requests: AtomicU64,
    next_tmp: AtomicU64,
}

impl State {
    fn count(&self, digest: &str, f: impl FnOnce(&mut BlobStats)) {
        let mut stats = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        f(stats.entry(digest.to_string()).or_default());
    }

    fn blob_path(&self, digest: &str) -> PathBuf {
        self.store.join(digest.replace(':', "-"))
    }
}

/// How to start a [`RangeIgnoringCache`].
#[derive(Debug, Clone)]
pub struct RangeIgnoringCacheBuilder {
    upstream: SocketAddr,
    head: HeadMode,
    hold_stores: bool,
}

impl RangeIgnoringCacheBuilder {
    /// How HEAD on a blob is answered (default [`HeadMode::FromStore`]).
    pub fn head(mut self, mode: HeadMode) -> Self {
        self.head = mode;
        self
    }

    /// Stores the blobs it serves only when [`RangeIgnoringCache::release_stores`] is called
    /// (default: at once), like a cache whose copy finishes after its answer did; the test says
    /// when, so no race with the client's timing decides what the client sees.
    pub fn hold_stores(mut self) -> Self {
        self.hold_stores = true;
        self
    }

    /// Starts the cache on a free loopback port.
    pub fn start(self) -> RangeIgnoringCache {
        let dir = tempfile::Builder::new()
            .prefix("runr-range-cache-")
            .tempdir()
            .expect("tempdir");
        let store = dir.path().join("blobs");
        std::fs::create_dir(&store).expect("mkdir blobs");
        let state = Arc::new(State {
            upstream: self.upstream,
            head: self.head,
            held: Mutex::new(self.hold_stores.then(Vec::new)),
            store,
            stats: Mutex::new(BTreeMap::new()),
            manifest_requests: AtomicU64::new(0),
            next_tmp: AtomicU64::new(0),
        });
        let handler_state = Arc::clone(&state);
        let server = HttpServer::start(move |req| handle(&handler_state, req));
        RangeIgnoringCache {
            server,
            state,
            _dir: dir,
        }
    }
}

/// The cache; stopped on drop, its store removed.
pub struct RangeIgnoringCache {
    server: HttpServer,
    state: Arc<State>,
    _dir: tempfile::TempDir,
}

impl RangeIgnoringCache {
    /// A cache of the registry at `upstream` (plain HTTP, no auth) answering HEAD from its
    /// store and storing each blob as soon as it was served.
    pub fn start(upstream: SocketAddr) -> RangeIgnoringCache {
        Self::builder(upstream).start()
    }

    /// A builder for the HEAD behaviour and held stores.
    pub fn builder(upstream: SocketAddr) -> RangeIgnoringCacheBuilder {
        RangeIgnoringCacheBuilder {
            upstream,
            head: HeadMode::FromStore,
            hold_stores: false,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `127.0.0.1:<port>` as a string, the form image references and skopeo use.
    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr())
    }

    /// The counters of blob `digest` (all zero for one never asked for).
    pub fn stats(&self, digest: &str) -> BlobStats {
        self.state
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(digest)
            .copied()
            .unwrap_or_default()
    }

    /// The counters of every blob asked for, by digest.
    pub fn all_stats(&self) -> BTreeMap<String, BlobStats> {
        self.state
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Blob body bytes written to clients, all blobs together.
    pub fn served_bytes(&self) -> u64 {
        self.all_stats().values().map(|s| s.served_bytes).sum()
    }

    /// Manifest requests (GET and HEAD) passed to the upstream.
    pub fn manifest_requests(&self) -> u64 {
        self.state.manifest_requests.load(Ordering::SeqCst)
    }

    /// True when the cache holds blob `digest`.
    pub fn is_stored(&self, digest: &str) -> bool {
        self.state.blob_path(digest).is_file()
    }

    /// The digests it holds, sorted.
    pub fn stored(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(&self.state.store)
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .filter_map(|e| e.file_name().into_string().ok())
                    .filter(|n| !n.starts_with('.'))
                    .map(|n| n.replacen('-', ":", 1))
                    .collect()
            })
            .unwrap_or_default();
        out.sort();
        out
    }

    /// The stored copy of blob `digest`, if it holds one.
    pub fn stored_bytes(&self, digest: &str) -> Option<Vec<u8>> {
        std::fs::read(self.state.blob_path(digest)).ok()
    }

    /// Blobs served and waiting for [`RangeIgnoringCache::release_stores`].
    pub fn held(&self) -> usize {
        let held = self.state.held.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().map_or(0, Vec::len)
    }

    /// Stores every blob held so far, and from now on each one as soon as it was served.
    pub fn release_stores(&self) {
        let held = self
            .state
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        for (tmp, dest) in held.into_iter().flatten() {
            let _ = std::fs::rename(&tmp, &dest);
        }
    }

    /// Forgets blob `digest` (an eviction): the next GET fetches it from upstream again.
    pub fn evict(&self, digest: &str) {
        let _ = std::fs::remove_file(self.state.blob_path(digest));
    }

    /// Stops answering (open connections closed); store and counters stay.
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Answers again on the same port.
    pub fn restart(&mut self) {
        self.server.restart();
    }
}

fn registry_error(status: u16, code: &str, message: &str) -> Response {
    Response::json(status, httpd::error_body(code, message))
        .with_header("Docker-Distribution-Api-Version", "registry/2.0")
}

fn handle(state: &Arc<State>, req: &Request) -> Response {
    let path = req.path();
    if path == "/v2/" || path == "/v2" {
        return match req.method.as_str() {
            "GET" | "HEAD" => Response::json(200, "{}")
                .with_header("Docker-Distribution-Api-Version", "registry/2.0"),
            _ => unsupported(),
        };
    }
    let Some(rest) = path.strip_prefix("/v2/") else {
        return registry_error(404, "NOT_FOUND", "not a registry API path");
    };
    if let Some((name, digest)) = rest.rsplit_once("/blobs/") {
        if name.is_empty() {
            return registry_error(404, "NAME_UNKNOWN", "repository name not known to registry");
        }
        // Uploads: a cache takes no pushes.
        if digest.starts_with("uploads") {
            return unsupported();
        }
        if !valid_digest(digest) {
            return registry_error(
                400,
                "DIGEST_INVALID",
                "provided digest did not match uploaded content",
            );
        }
        return match req.method.as_str() {
            "GET" => get_blob(state, req, name, digest),
            "HEAD" => head_blob(state, name, digest),
            _ => unsupported(),
        };
    }
    if let Some((name, reference)) = rest.rsplit_once("/manifests/") {
        if name.is_empty() || reference.is_empty() {
            return registry_error(404, "NAME_UNKNOWN", "repository name not known to registry");
        }
        return match req.method.as_str() {
            "GET" | "HEAD" => {
                state.manifest_requests.fetch_add(1, Ordering::SeqCst);
                passthrough(state, req, &req.method)
            }
            _ => unsupported(),
        };
    }
    registry_error(404, "NOT_FOUND", "not a registry API path")
}

fn unsupported() -> Response {
    registry_error(405, "UNSUPPORTED", "The operation is unsupported.")
        .with_header("Allow", "GET, HEAD")
}

fn valid_digest(d: &str) -> bool {
    d.strip_prefix("sha256:").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

fn blob_headers(resp: Response, digest: &str) -> Response {
    resp.with_header("Content-Type", "application/octet-stream")
        .with_header("Docker-Content-Digest", digest)
        .with_header("Docker-Distribution-Api-Version", "registry/2.0")
}

fn get_blob(state: &Arc<State>, req: &Request, name: &str, digest: &str) -> Response {
    let ranged = req.header("range").is_some();
    state.count(digest, |s| {
        s.gets += 1;
        s.range_gets += u64::from(ranged);
    });
    let path = state.blob_path(digest);
    if let Ok(file) = std::fs::File::open(&path) {
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        let st = Arc::clone(state);
        let digest_owned = digest.to_string();
        return blob_headers(
            Response::stream(
                200,
                len,
                Box::new(move |w| {
                    let mut file = file;
                    let mut buf = vec![0u8; PIECE];
                    loop {
                        let n = file.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                        // Counted before the write, so a test that has read the whole body sees
                        // it counted; a failed write takes it back.
                        st.count(&digest_owned, |s| s.served_bytes += n as u64);
                        if let Err(e) = w.write_all(&buf[..n]) {
                            st.count(&digest_owned, |s| s.served_bytes -= n as u64);
                            return Err(e);
                        }
                    }
                }),
            ),
            digest,
        );
    }
    // Not held: fetch from upstream (the client's Range is not passed on), serve and store.
    let upstream = match Upstream::get(
        state.upstream,
        &format!("/v2/{name}/blobs/{digest}"),
        &[],
        "GET",
    ) {
        Ok(u) => u,
        Err(e) => return registry_error(502, "UNAVAILABLE", &format!("upstream: {e}")),
    };
    state.count(digest, |s| s.upstream_fetches += 1);
    if upstream.status != 200 {
        return upstream.into_response();
    }
    let Some(len) = upstream.content_length() else {
        return registry_error(
            502,
            "UNAVAILABLE",
            "upstream: a blob without Content-Length",
        );
    };
    let st = Arc::clone(state);
    let digest_owned = digest.to_string();
    blob_headers(
        Response::stream(
            200,
            len,
            Box::new(move |w| fetch_and_store(&st, upstream, len, &digest_owned, w)),
        ),
        digest,
    )
}

/// Copies the upstream body to the client and to a temporary file; when the whole blob arrived
/// with the right digest it becomes the stored copy (when stores are released, if held) before
/// the client gets the last piece, so a client that read the whole blob finds it stored. A
/// client that goes away does not stop the copy, as in a real cache.
fn fetch_and_store(
    state: &Arc<State>,
    mut upstream: Upstream,
    len: u64,
    digest: &str,
    w: &mut dyn Write,
) -> io::Result<()> {
    let n = state.next_tmp.fetch_add(1, Ordering::SeqCst);
    let tmp = state.store.join(format!(".tmp-{n}"));
    let mut file = std::fs::File::create(&tmp)?;
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut buf = vec![0u8; PIECE];
    let mut got = 0u64;
    let mut client_error: Option<io::Error> = None;
    let mut body = (&mut upstream.reader).take(len);
    let mut to_client = |bytes: &[u8], client_error: &mut Option<io::Error>| {
        if client_error.is_none() {
            // Counted before the write, as above.
            state.count(digest, |s| s.served_bytes += bytes.len() as u64);
            if let Err(e) = w.write_all(bytes) {
                state.count(digest, |s| s.served_bytes -= bytes.len() as u64);
                *client_error = Some(e);
            }
        }
    };
    let mut last = 0;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        got += n as u64;
        state.count(digest, |s| s.upstream_bytes += n as u64);
        hash.update(&buf[..n]);
        file.write_all(&buf[..n])?;
        if got == len {
            last = n;
            break;
        }
        to_client(&buf[..n], &mut client_error);
    }
    drop(file);
    let actual: String = hash
        .finish()
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    if got == len && digest == format!("sha256:{actual}") {
        commit(state, tmp, state.blob_path(digest));
    } else {
        let _ = std::fs::remove_file(&tmp);
    }
    to_client(&buf[..last], &mut client_error);
    match client_error {
        Some(e) => Err(e),
        None if got < len => Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "upstream body ended early",
        )),
        None => Ok(()),
    }
}

fn commit(state: &Arc<State>, tmp: PathBuf, dest: PathBuf) {
    let mut held = state.held.lock().unwrap_or_else(|e| e.into_inner());
    match held.as_mut() {
        Some(held) => held.push((tmp, dest)),
        None => {
            let _ = std::fs::rename(&tmp, &dest);
        }
    }
}

fn head_blob(state: &Arc<State>, name: &str, digest: &str) -> Response {
    state.count(digest, |s| s.heads += 1);
    match state.head {
        HeadMode::NotAllowed => registry_error(405, "UNSUPPORTED", "The operation is unsupported.")
            .with_header("Allow", "GET"),
        HeadMode::Upstream => match Upstream::get(
            state.upstream,
            &format!("/v2/{name}/blobs/{digest}"),
            &[],
            "HEAD",
        ) {
            Ok(u) => u.into_response(),
            Err(e) => registry_error(502, "UNAVAILABLE", &format!("upstream: {e}")),
        },
        HeadMode::FromStore => match std::fs::metadata(state.blob_path(digest)) {
            Ok(m) => blob_headers(Response::new(200), digest)
                .with_header("Content-Length", m.len().to_string()),
            Err(_) => registry_error(404, "BLOB_UNKNOWN", "blob unknown to registry"),
        },
    }
}

/// A manifest GET or HEAD, sent on to the upstream with the client's `Accept`.
fn passthrough(state: &State, req: &Request, method: &str) -> Response {
    let accept: Vec<(&str, &str)> = req
        .headers
        .iter()
        .filter(|(n, _)| n.eq_ignore_ascii_case("accept"))
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    match Upstream::get(state.upstream, req.path(), &accept, method) {
        Ok(u) => u.into_response(),
        Err(e) => registry_error(502, "UNAVAILABLE", &format!("upstream: {e}")),
    }
}

/// One answer from the upstream, its body not read yet.
struct Upstream {
    status: u16,
    headers: Vec<(String, String)>,
    reader: BufReader<TcpStream>,
    head_only: bool,
}

impl Upstream {
    fn get(
        addr: SocketAddr,
        path: &str,
        headers: &[(&str, &str)],
        method: &str,
    ) -> io::Result<Upstream> {
        let stream = TcpStream::connect_timeout(&addr, UPSTREAM_CONNECT)?;
        stream.set_read_timeout(Some(UPSTREAM_READ))?;
        stream.set_write_timeout(Some(UPSTREAM_READ))?;
        let mut head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: runr-testkit-range-cache\r\nConnection: close\r\n"
        );
        for (k, v) in headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        head.push_str("\r\n");
        (&stream).write_all(head.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let status = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("bad status line {line:?}"),
                )
            })?;
        let mut hs = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "upstream closed in its head",
                ));
            }
            let h = h.trim_end_matches(['\r', '\n']);
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                hs.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        Ok(Upstream {
            status,
            headers: hs,
            reader,
            head_only: method == "HEAD",
        })
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn content_length(&self) -> Option<u64> {
        self.header("content-length").and_then(|v| v.parse().ok())
    }

    /// The answer as the cache passes it on: status, the registry headers, the body (bounded).
    fn into_response(mut self) -> Response {
        let mut resp = Response::new(self.status);
        for name in [
            "Content-Type",
            "Docker-Content-Digest",
            "Docker-Distribution-Api-Version",
            "Etag",
        ] {
            if let Some(v) = self.header(name) {
                resp = resp.with_header(name, v.to_string());
            }
        }
        if self.head_only {
            if let Some(len) = self.content_length() {
                resp = resp.with_header("Content-Length", len.to_string());
            }
            return resp;
        }
        let too_large = || {
            registry_error(
                502,
                "UNAVAILABLE",
                &format!("upstream: an answer larger than {MAX_PASSTHROUGH} bytes"),
            )
        };
        let declared = self.content_length();
        if declared.is_some_and(|n| n > MAX_PASSTHROUGH) {
            return too_large();
        }
        let mut body = Vec::new();
        // Without a length the body runs to the close: one byte more than allowed tells.
        let limit = declared.unwrap_or(MAX_PASSTHROUGH + 1);
        match (&mut self.reader).take(limit).read_to_end(&mut body) {
            Err(_) => registry_error(502, "UNAVAILABLE", "upstream: the body broke off"),
            Ok(n) if declared.is_some_and(|d| n as u64 != d) => {
                registry_error(502, "UNAVAILABLE", "upstream: the body broke off")
            }
            Ok(n) if n as u64 > MAX_PASSTHROUGH => too_large(),
            Ok(_) => resp.with_body(body),
        }
    }
}
