//! A real `redis-server` (Debian's `redis-server` package) on a free loopback port with its data
//! in a temporary directory, and a small blocking RESP2 client to drive it from tests.
//!
//! The server writes an append-only file with `appendfsync always`, so [`Redis::stop`] followed
//! by [`Redis::start_again`] (or a [`Redis::kill`]) keeps every acknowledged write: what a
//! restart of a production Redis with persistence looks like to its clients.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::pki::{Ca, ServerCert, Validity};
use crate::{free_port, have_tool, wait_for, Child};

/// How long the server gets to answer PING after it was started.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A redis-server process and its data directory (removed on drop).
pub struct Redis {
    child: Option<Child>,
    dir: tempfile::TempDir,
    port: u16,
    /// A TLS port next to the plain one, and the certificate it serves.
    tls: Option<(u16, ServerCert)>,
}

impl Redis {
    /// Starts a server on a free port and waits until it answers PING.
    pub fn start() -> Redis {
        let mut r = Self::new_stopped(None);
        r.start_again();
        r
    }

    /// Starts a server that also speaks TLS on a second port ([`Redis::tls_url`]), with a
    /// certificate for `localhost` and `127.0.0.1` issued by `ca` (clients are not asked for
    /// one); the plain port stays, for the test's own [`Conn`].
    pub fn start_tls(ca: &Ca) -> Redis {
        let cert = ca.issue(&["localhost", "127.0.0.1"], Validity::Current);
        let mut r = Self::new_stopped(Some((free_port(), cert)));
        r.start_again();
        r
    }

    fn new_stopped(tls: Option<(u16, ServerCert)>) -> Redis {
        assert!(
            have_tool("redis-server"),
            "redis-server is not installed (apt-get install redis-server; .ci/run does this)"
        );
        let dir = tempfile::Builder::new()
            .prefix("runr-redis-")
            .tempdir()
            .expect("tempdir");
        Redis {
            child: None,
            dir,
            port: free_port(),
            tls,
        }
    }

    /// Starts the server again on the same port and data (after [`Redis::stop`] or
    /// [`Redis::kill`]); a running server is stopped first.
    pub fn start_again(&mut self) {
        self.stop();
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new("redis-server");
        if let Some((port, cert)) = &self.tls {
            cmd.args(["--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(&cert.cert)
                .arg("--tls-key-file")
                .arg(&cert.key)
                .args(["--tls-auth-clients", "no"]);
        }
        let child = Child::spawn(
            cmd.args(["--port", &self.port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--protected-mode", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .args(["--appendonly", "yes", "--appendfsync", "always"])
                .args(["--save", ""])
                .args(["--daemonize", "no"])
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        )
        .expect("spawn redis-server");
        self.child = Some(child);
        wait_for(
            &format!("redis-server to answer PING on {}", self.addr()),
            START_TIMEOUT,
            || {
                if let Some(c) = self.child.as_mut() {
                    if let Ok(Some(status)) = c.inner().try_wait() {
                        panic!("redis-server exited with {status}:\n{}", self.log());
                    }
                }
                let mut conn = Conn::try_connect(self.addr())?;
                match conn.try_cmd(&[b"PING"]) {
                    Some(Reply::Simple(s)) if s == "PONG" => Some(()),
                    _ => None,
                }
            },
        );
    }

    /// Stops the server with SIGTERM (it finishes its writes and exits) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.signal(Signal::SIGTERM);
            c.wait_timeout(Duration::from_secs(20));
        }
    }

    /// Kills the server with SIGKILL (no chance to finish anything).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill();
        }
    }

    /// Whether the server process is running.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.inner().try_wait(), Ok(None)))
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr())
    }

    /// `rediss://127.0.0.1:<tls port>` of a server from [`Redis::start_tls`].
    pub fn tls_url(&self) -> String {
        let (port, _) = self.tls.as_ref().expect("started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// A new client connection.
    pub fn conn(&self) -> Conn {
        Conn::try_connect(self.addr())
            .unwrap_or_else(|| panic!("cannot connect to redis-server on {}", self.addr()))
    }

    /// The server's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

// === a cluster ===

/// Three `redis-server --cluster-enabled yes` masters on free ports (no replicas), joined by
/// `redis-cli --cluster create`, each with its data in a temporary directory; killed (each
/// [`Child`]) on drop.
pub struct Cluster {
    nodes: Vec<(u16, Child)>,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts the three nodes, creates the cluster and waits until every node says
    /// `cluster_state:ok`.
    pub fn start() -> Cluster {
        assert!(
            have_tool("redis-server") && have_tool("redis-cli"),
            "redis-server and redis-cli are not installed (apt-get install redis-server)"
        );
        let dir = tempfile::Builder::new()
            .prefix("runr-redis-cluster-")
            .tempdir()
            .expect("tempdir");
        let mut nodes = Vec::new();
        for _ in 0..3 {
            let port = free_port();
            let data = dir.path().join(port.to_string());
            std::fs::create_dir(&data).unwrap();
            let child = Child::spawn(
                Command::new("redis-server")
                    .args(["--port", &port.to_string()])
                    .args(["--bind", "127.0.0.1"])
                    .args(["--protected-mode", "no"])
                    .args(["--cluster-enabled", "yes"])
                    .arg("--cluster-config-file")
                    .arg(data.join("nodes.conf"))
                    .arg("--dir")
                    .arg(&data)
                    .args(["--appendonly", "no", "--save", ""])
                    .arg("--logfile")
                    .arg(data.join("redis.log"))
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            )
            .expect("spawn redis-server");
            nodes.push((port, child));
        }
        let c = Cluster { nodes, _dir: dir };
        for addr in c.addrs() {
            wait_for(
                &format!("cluster node {addr} to answer PING"),
                START_TIMEOUT,
                || {
                    let reply = Conn::try_connect(addr)?.try_cmd(&[b"PING"])?;
                    (reply == Reply::Simple("PONG".into())).then_some(())
                },
            );
        }
        let out = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(c.addrs().iter().map(|a| a.to_string()))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        for addr in c.addrs() {
            wait_for(
                &format!("cluster node {addr} to say cluster_state:ok"),
                START_TIMEOUT,
                || {
                    let info = Conn::try_connect(addr)?.try_cmd(&[b"CLUSTER", b"INFO"])?;
                    info.text().contains("cluster_state:ok").then_some(())
                },
            );
        }
        c
    }

    /// The nodes' addresses.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes
            .iter()
            .map(|(port, _)| SocketAddr::from(([127, 0, 0, 1], *port)))
            .collect()
    }

    /// A plain connection to node `i` (0–2); commands on keys of other nodes' slots get `MOVED`.
    pub fn conn(&self, i: usize) -> Conn {
        Conn::try_connect(self.addrs()[i]).expect("connect to the cluster node")
    }
}

/// The cluster hash slot of `key`: CRC16 (XMODEM) of the key, or of what its first `{…}` holds
/// when that is not empty, modulo 16384 (the Redis Cluster specification's rule).
pub fn key_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    let mut crc: u16 = 0;
    for &b in hashed {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

// === the client ===

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `$-1` or `*-1`.
    Nil,
    /// `:n`.
    Int(i64),
    /// `$n` bulk string.
    Bulk(Vec<u8>),
    /// `+text`.
    Simple(String),
    /// `-ERR …`.
    Error(String),
    /// `*n`.
    Array(Vec<Reply>),
}

impl Reply {
    /// A bulk or simple string as text (lossy); panics on anything else.
    pub fn text(&self) -> String {
        match self {
            Reply::Bulk(b) => String::from_utf8_lossy(b).into_owned(),
            Reply::Simple(s) => s.clone(),
            other => panic!("not a string reply: {other:?}"),
        }
    }

    /// An integer reply; panics on anything else.
    pub fn int(&self) -> i64 {
        match self {
            Reply::Int(n) => *n,
            other => panic!("not an integer reply: {other:?}"),
        }
    }

    /// The items of an array reply (nil: none); panics on anything else.
    pub fn items(&self) -> &[Reply] {
        match self {
            Reply::Array(v) => v,
            Reply::Nil => &[],
            other => panic!("not an array reply: {other:?}"),
        }
    }
}

/// A stream entry as `XRANGE` returns it: id and field/value pairs.
pub type StreamEntry = (String, Vec<(String, String)>);

/// A blocking client connection.
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    /// A connection to any Redis (or Sentinel) at `addr`; `None` when it does not answer.
    pub fn try_connect(addr: SocketAddr) -> Option<Conn> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
        let _ = s.set_nodelay(true);
        Some(Conn {
            reader: BufReader::new(s),
        })
    }

    /// Sends one command and reads its reply; `None` on a broken connection.
    pub fn try_cmd(&mut self, args: &[&[u8]]) -> Option<Reply> {
        self.reader.get_mut().write_all(&encode(args)).ok()?;
        read_reply(&mut self.reader).ok()
    }

    /// Sends one command and reads its reply; panics on a broken connection (not on `-ERR`,
    /// which comes back as [`Reply::Error`]).
    pub fn cmd(&mut self, args: &[&[u8]]) -> Reply {
        self.try_cmd(args).unwrap_or_else(|| {
            panic!(
                "redis connection failed during {:?}",
                String::from_utf8_lossy(args[0])
            )
        })
    }

    /// [`Conn::cmd`] with text arguments.
    pub fn cmd_str(&mut self, args: &[&str]) -> Reply {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.cmd(&args)
    }

    /// Sends every command, then reads every reply (one round trip).
    pub fn pipeline(&mut self, commands: &[Vec<Vec<u8>>]) -> Vec<Reply> {
        let mut out = Vec::new();
        for c in commands {
            let args: Vec<&[u8]> = c.iter().map(Vec::as_slice).collect();
            out.extend_from_slice(&encode(&args));
        }
        self.reader
            .get_mut()
            .write_all(&out)
            .expect("write pipeline");
        (0..commands.len())
            .map(|_| read_reply(&mut self.reader).expect("read pipeline reply"))
            .collect()
    }

    /// `XADD stream * fields…`: the new entry's id.
    pub fn xadd(&mut self, stream: &str, fields: &[(&str, &str)]) -> String {
        let mut args: Vec<&[u8]> = vec![b"XADD", stream.as_bytes(), b"*"];
        for (k, v) in fields {
            args.push(k.as_bytes());
            args.push(v.as_bytes());
        }
        match self.cmd(&args) {
            Reply::Bulk(id) => String::from_utf8(id).expect("id"),
            other => panic!("XADD answered {other:?}"),
        }
    }

    /// Every entry of `stream`, oldest first, fields as text.
    pub fn xrange(&mut self, stream: &str) -> Vec<StreamEntry> {
        let reply = self.cmd_str(&["XRANGE", stream, "-", "+"]);
        reply
            .items()
            .iter()
            .map(|e| {
                let parts = e.items();
                let id = parts[0].text();
                let flat = parts[1].items();
                let fields = flat
                    .chunks(2)
                    .map(|kv| (kv[0].text(), kv[1].text()))
                    .collect();
                (id, fields)
            })
            .collect()
    }

    /// The number of entries pending in `group` of `stream` (`XPENDING` summary).
    pub fn pending(&mut self, stream: &str, group: &str) -> i64 {
        match self.cmd_str(&["XPENDING", stream, group]) {
            Reply::Array(v) => v[0].int(),
            other => panic!("XPENDING answered {other:?}"),
        }
    }

    /// `XPENDING stream group - + 10000`: (id, consumer, idle ms, delivery count) per entry.
    pub fn pending_entries(
        &mut self,
        stream: &str,
        group: &str,
    ) -> Vec<(String, String, i64, i64)> {
        self.cmd_str(&["XPENDING", stream, group, "-", "+", "10000"])
            .items()
            .iter()
            .map(|r| {
                let p = r.items();
                (p[0].text(), p[1].text(), p[2].int(), p[3].int())
            })
            .collect()
    }
}

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn read_line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end_matches(['\r', '\n']).to_string())
}

fn read_reply(r: &mut impl BufRead) -> std::io::Result<Reply> {
    let line = read_line(r)?;
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, "bad RESP");
    let (kind, rest) = line.split_at_checked(1).ok_or_else(bad)?;
    Ok(match kind {
        "+" => Reply::Simple(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(rest.parse().map_err(|_| bad())?),
        "$" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Reply::Nil
            } else {
                let mut buf = vec![0u8; n as usize + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(n as usize);
                Reply::Bulk(buf)
            }
        }
        "*" => {
            let n: i64 = rest.parse().map_err(|_| bad())?;
            if n < 0 {
                Reply::Nil
            } else {
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(read_reply(r)?);
                }
                Reply::Array(items)
            }
        }
        _ => return Err(bad()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_server_survives_stop_and_kill() {
        let mut r = Redis::start();
        let mut c = r.conn();
        let id = c.xadd("s", &[("k", "v"), ("k", "w")]);
        assert_eq!(
            c.cmd_str(&["XGROUP", "CREATE", "s", "g", "0"]),
            Reply::Simple("OK".into())
        );
        assert!(matches!(c.cmd_str(&["NOPE"]), Reply::Error(e) if e.starts_with("ERR")));
        r.stop();
        assert!(!r.running());
        r.start_again();
        let mut c = r.conn();
        assert_eq!(
            c.xrange("s"),
            vec![(
                id.clone(),
                vec![("k".into(), "v".into()), ("k".into(), "w".into())]
            )]
        );
        let replies = c.pipeline(&[
            vec![
                b"XREADGROUP".to_vec(),
                b"GROUP".to_vec(),
                b"g".to_vec(),
                b"c".to_vec(),
                b"STREAMS".to_vec(),
                b"s".to_vec(),
                b">".to_vec(),
            ],
            vec![b"PING".to_vec()],
        ]);
        assert_eq!(replies[1], Reply::Simple("PONG".into()));
        assert_eq!(c.pending("s", "g"), 1);
        r.kill();
        r.start_again();
        assert_eq!(r.conn().pending_entries("s", "g")[0].0, id);
    }
}
