//! The Redis side: the stream, its consumer group and the dead-letter stream, through two
//! multiplexed connections: one that only blocks in `XREADGROUP … BLOCK` (a blocked connection
//! answers nothing else), one for everything else (acks, claims, dead letters, pipelined by
//! redis-rs across the concurrent deliveries).
//!
//! Every command is sent with `redis::cmd` and its reply read by the small parsers at the end,
//! which keep field names and values as the bytes Redis stores.
//!
//! Losing Redis is normal (a restart, a failover, the network): an operation fails with
//! [`StoreError::Unavailable`], the connection is dropped and made again on the next use, and
//! [`Store::retry`] waits it out with backoff. [`Health`] logs the outage once when it starts and
//! once when it ends.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Value};
use tokio::time::Instant;

use crate::config::Config;

/// A TCP (+TLS) connect to Redis may take this long.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// A command's answer may take this long before the connection counts as broken.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// `XREADGROUP … BLOCK` waits this long for new entries before asking again; SIGTERM cuts it
/// short with `CLIENT UNBLOCK`.
pub(crate) const READ_BLOCK: Duration = Duration::from_secs(5);
/// Pause after the first failure while Redis is unavailable; it doubles up to the maximum.
const RETRY_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between two tries while Redis is unavailable: short, so that the consumer is
/// back within a second or two of Redis.
const RETRY_MAX: Duration = Duration::from_secs(1);

/// One stream entry: its id and its fields, `None` when the entry was deleted from the stream
/// while it was pending.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub id: String,
    pub fields: Option<Vec<(Vec<u8>, Vec<u8>)>>,
}

/// A command as the line about its refusal names it: `XADD orders-dlq`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Op<'a> {
    /// The command (`XREADGROUP`, `XGROUP CREATE`, `AUTH` while connecting…).
    pub command: &'static str,
    /// The key it works on; empty for commands on no key.
    pub key: &'a str,
}

/// Redis refused a command for good: which one, on which key, and what Redis said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub command: String,
    pub key: String,
    pub error: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.command, self.error)
        } else {
            write!(f, "{} {}: {}", self.command, self.key, self.error)
        }
    }
}

/// How an operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum StoreError {
    /// Redis cannot be reached or answered with a transient error: wait and try again.
    #[error("{0}")]
    Unavailable(String),
    /// The stream or its consumer group is gone (Redis restarted without its data, or someone
    /// deleted them): create the group again.
    #[error("the stream or its consumer group does not exist")]
    NoGroup,
    /// Waiting cannot help: wrong credentials, no permission, the key is not a stream.
    #[error("{0}")]
    Fatal(Refusal),
}

/// Error codes that waiting cannot change: credentials (`WRONGPASS`, `NOAUTH`), an ACL that
/// forbids the command or the key (`NOPERM`), a key of another type (`WRONGTYPE`).
fn fatal_code(code: &str) -> bool {
    matches!(code, "WRONGTYPE" | "NOPERM" | "WRONGPASS" | "NOAUTH")
}

impl StoreError {
    /// What `e`, the answer to `op`, means for us.
    fn from_redis(e: &redis::RedisError, op: Op<'_>) -> StoreError {
        Self::classify(e.code(), e, op)
    }

    fn classify(code: Option<&str>, e: &redis::RedisError, op: Op<'_>) -> StoreError {
        let text = error_text(e);
        match code {
            // UNBLOCKED: a read blocked on a stream that was deleted meanwhile.
            Some("NOGROUP" | "UNBLOCKED") => StoreError::NoGroup,
            Some(c) if fatal_code(c) => StoreError::fatal(op, text),
            _ if e.kind() == redis::ErrorKind::AuthenticationFailed => StoreError::fatal(op, text),
            _ => StoreError::Unavailable(text),
        }
    }

    /// What `e`, the answer to `MULTI; ops…; EXEC`, means: Redis refuses a transaction as a
    /// whole (`EXECABORT`) when it refused one of its commands as it was queued; that command's
    /// own error decides, and the refusal names it.
    fn from_transaction(e: &redis::RedisError, ops: &[Op<'_>]) -> StoreError {
        let first = e
            .clone()
            .into_server_errors()
            .and_then(|errors| errors.first().cloned());
        let Some((index, error)) = first else {
            let op = ops.first().copied().unwrap_or(Op {
                command: "EXEC",
                key: "",
            });
            return Self::from_redis(e, op);
        };
        let op = ops.get(index).copied().unwrap_or(Op {
            command: "EXEC",
            key: "",
        });
        let code = error.code().to_string();
        match code.as_str() {
            "NOGROUP" => StoreError::NoGroup,
            c if fatal_code(c) => StoreError::fatal(
                Op {
                    command: op.command,
                    key: op.key,
                },
                format!("{} (in MULTI/EXEC)", server_error_text(&error)),
            ),
            _ => StoreError::Unavailable(format!(
                "{} {} in MULTI/EXEC: {}",
                op.command,
                op.key,
                server_error_text(&error)
            )),
        }
    }

    fn fatal(op: Op<'_>, error: String) -> StoreError {
        StoreError::Fatal(Refusal {
            command: op.command.to_string(),
            key: op.key.to_string(),
            error,
        })
    }

    fn reply(command: &str, why: &str) -> StoreError {
        StoreError::Unavailable(format!("unexpected reply to {command}: {why}"))
    }
}

/// An error as Redis wrote it (`NOPERM this user has no permissions…`), not as redis-rs names
/// its kinds; a refused `AUTH`, which redis-rs reports without Redis's code, as `WRONGPASS`
/// (what Redis 6 and later answer for a user name or password it does not accept).
fn error_text(e: &redis::RedisError) -> String {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        return "WRONGPASS the user name or password is not accepted".to_string();
    }
    // A server error, alone or the first of a pipeline's.
    match e.clone().into_server_errors() {
        Some(errors) if !errors.is_empty() => server_error_text(&errors[0].1),
        _ => runr_base::fmt::error_chain(e),
    }
}

/// `NOPERM this user has no permissions…`: the code and the server's words, as Redis sent them.
fn server_error_text(e: &redis::ServerError) -> String {
    match e.details() {
        Some(d) => format!("{} {d}", e.code()),
        None => e.code().to_string(),
    }
}

/// A broken connection is replaced; a server error (LOADING, OOM…) keeps it, but for READONLY
/// and MOVED: the connection's server is a replica now (a master demoted by a failover) or no
/// longer serves the stream's cluster slot (a resharding), and a new connection (asked of the
/// sentinels or the cluster again) finds the right master.
fn breaks_connection(e: &redis::RedisError) -> bool {
    e.is_io_error()
        || e.is_timeout()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
        || redirected(e)
}

/// READONLY or MOVED, as the answer or as the reason a transaction was refused.
fn redirected(e: &redis::RedisError) -> bool {
    let elsewhere = |code: &str| matches!(code, "READONLY" | "MOVED");
    e.code().is_some_and(elsewhere)
        || e.clone()
            .into_server_errors()
            .is_some_and(|errors| errors.iter().any(|(_, s)| elsewhere(s.code())))
}

/// Where connections go: one Redis, the master the sentinels name at the time, or the cluster
/// master that serves the stream's hash slot at the time.
enum Source {
    Direct(redis::Client),
    /// Asked again for every new connection, so that a failover is followed.
    Sentinel(tokio::sync::Mutex<redis::sentinel::SentinelClient>),
    /// Asked again for every new connection, so that a failover or a resharding is followed.
    Cluster(Cluster),
}

impl Source {
    async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<MultiplexedConnection> {
        match self {
            Source::Direct(client) => {
                client
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Source::Sentinel(sentinels) => {
                // redis-rs asks the sentinels without a timeout of its own.
                let ask = async { sentinels.lock().await.async_get_client().await };
                let master = tokio::time::timeout(CONNECT_TIMEOUT, ask)
                    .await
                    .map_err(|_| {
                        redis::RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "no sentinel named the master in time",
                        ))
                    })??;
                master
                    .get_multiplexed_async_connection_with_config(config)
                    .await
            }
            Source::Cluster(cluster) => cluster.connect(config).await,
        }
    }
}

/// A Redis Cluster, reached through the master of one hash slot: the stream and its dead-letter
/// stream share that slot (checked at start), so every command, `MULTI` and blocking read of
/// this consumer goes to one node and no command needs routing. A failover or a resharding
/// answers `MOVED` (or `READONLY` from a demoted master): the connection is dropped and the next
/// one asks the cluster again. redis-rs's cluster client is not used: it multiplexes every
/// caller onto one connection per node, where the blocking `XREADGROUP` needs a connection of
/// its own and its client id (for `CLIENT UNBLOCK` at shutdown).
struct Cluster {
    url: crate::config::ClusterUrl,
    tls: Option<redis::TlsCertificates>,
    slot: u16,
    /// The masters the cluster named last time, asked before the URL's nodes (which may be
    /// gone by now).
    known: Mutex<Vec<Node>>,
}

impl Cluster {
    fn client(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        let url = self.url.node_url(host, port);
        match &self.tls {
            Some(certs) => redis::Client::build_with_tls(url, certs.clone()),
            None => redis::Client::open(url),
        }
    }

    /// Asks the nodes in turn which master serves the slot (`CLUSTER SLOTS`), and connects to
    /// it. A refused login ends the search (every node has the same users).
    async fn connect(
        &self,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let mut nodes = self.known.lock().unwrap_or_else(|e| e.into_inner()).clone();
        for node in &self.url.nodes {
            if !nodes.contains(node) {
                nodes.push(node.clone());
            }
        }
        let mut last = None;
        for (host, port) in &nodes {
            match self.ask(host, *port, config).await {
                Ok(found) => return Ok(found),
                Err(e)
                    if e.kind() == redis::ErrorKind::AuthenticationFailed
                        || e.code().is_some_and(fatal_code) =>
                {
                    return Err(e)
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| no_master(self.slot)))
    }

    async fn ask(
        &self,
        host: &str,
        port: u16,
        config: &AsyncConnectionConfig,
    ) -> redis::RedisResult<MultiplexedConnection> {
        let mut conn = self
            .client(host, port)?
            .get_multiplexed_async_connection_with_config(config)
            .await?;
        let reply: Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut conn)
            .await?;
        let (master, masters) =
            cluster_master(&reply, self.slot, host).ok_or_else(|| no_master(self.slot))?;
        *self.known.lock().unwrap_or_else(|e| e.into_inner()) = masters;
        if master == (host.to_string(), port) {
            return Ok(conn);
        }
        self.client(&master.0, master.1)?
            .get_multiplexed_async_connection_with_config(config)
            .await
    }
}

/// A cluster node's `host` and port.
type Node = (String, u16);

fn no_master(slot: u16) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::other(format!(
        "no cluster node serves hash slot {slot} of the stream (the cluster is down or the slot unassigned)"
    )))
}

/// From a `CLUSTER SLOTS` reply (`[start, end, [host, port, id…], replicas…]…`): the master of
/// `slot`, and every master. A node whose host is empty or `?` (the preferred endpoint type is
/// unknown to it) is the one asked, `asked`.
fn cluster_master(reply: &Value, slot: u16, asked: &str) -> Option<(Node, Vec<Node>)> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut found = None;
    let mut masters: Vec<Node> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(node))) =
            (parts.first(), parts.get(1), parts.get(2))
        else {
            return None;
        };
        let host = match node.first().and_then(as_text) {
            Some(h) if !h.is_empty() && h != "?" => h,
            _ => asked.to_string(),
        };
        let Some(Value::Int(port)) = node.get(1) else {
            return None;
        };
        let master = (host, u16::try_from(*port).ok()?);
        if (*start..=*end).contains(&i64::from(slot)) {
            found = Some(master.clone());
        }
        if !masters.contains(&master) {
            masters.push(master);
        }
    }
    Some((found?, masters))
}

/// `rediss://`: the built-in roots and a private CA's certificates when configured, and the
/// client certificate for mutual TLS.
fn tls_certificates(config: &Config) -> redis::TlsCertificates {
    let mut roots = crate::roots::pem_bundle().into_bytes();
    if let Some(ca) = &config.redis_ca {
        roots.push(b'\n');
        roots.extend_from_slice(ca);
    }
    redis::TlsCertificates {
        client_tls: config
            .redis_client
            .as_ref()
            .map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.clone(),
                client_key: key.clone(),
            }),
        root_cert: Some(roots),
    }
}

/// A client that asks the sentinels of `url` for the master of its service.
fn sentinel_client(
    url: &crate::config::SentinelUrl,
) -> redis::RedisResult<redis::sentinel::SentinelClient> {
    use redis::IntoConnectionInfo;
    let login = url.master_login().into_connection_info()?;
    let login = login.redis_settings();
    let nodes = url
        .nodes
        .iter()
        .map(|(host, port)| redis::ConnectionAddr::Tcp(host.clone(), *port));
    let mut builder = redis::sentinel::SentinelClientBuilder::new(
        nodes,
        &url.service,
        redis::sentinel::SentinelServerType::Master,
    )?
    .set_client_to_redis_db(login.db());
    if let Some(user) = login.username() {
        builder = builder.set_client_to_redis_username(user);
    }
    if let Some(password) = login.password() {
        builder = builder.set_client_to_redis_password(password);
    }
    builder.build()
}

// === impl Health ===

/// Whether Redis answers, so that an outage is logged once when it starts and once when it ends,
/// however many operations fail in between. A Redis that is going down may still answer for a
/// moment (between SIGTERM and closing its port): the outage ends only once Redis has answered
/// for [`SETTLE`] without a failure in between, so a flap is not two outages.
#[derive(Default)]
pub(crate) struct Health {
    down: AtomicBool,
    state: Mutex<Outage>,
    outages: AtomicU64,
}

#[derive(Default)]
struct Outage {
    /// When the current outage began.
    since: Option<Instant>,
    /// When Redis first answered again, with no failure since.
    answering_since: Option<Instant>,
}

/// How long Redis must answer without failing before an outage counts as over.
const SETTLE: Duration = Duration::from_secs(1);

impl Health {
    fn state(&self) -> std::sync::MutexGuard<'_, Outage> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failed(&self, error: &StoreError) {
        let mut st = self.state();
        if st.since.is_none() {
            st.since = Some(Instant::now());
            self.down.store(true, Ordering::Release);
            self.outages.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(error = %error, "redis is unavailable: waiting for it");
        }
        st.answering_since = None;
    }

    fn answered(&self) {
        if !self.down.load(Ordering::Acquire) {
            return;
        }
        let mut st = self.state();
        let Some(since) = st.since else {
            return;
        };
        let now = Instant::now();
        let first = *st.answering_since.get_or_insert(now);
        if now.duration_since(first) >= SETTLE {
            *st = Outage::default();
            self.down.store(false, Ordering::Release);
            tracing::info!(
                after = %format!("{:.1}s", first.duration_since(since).as_secs_f64()),
                "redis is available again"
            );
        }
    }

    /// Outages seen so far.
    pub(crate) fn outages(&self) -> u64 {
        self.outages.load(Ordering::Relaxed)
    }
}

// === impl Store ===

/// The stream, group and consumer this process works for, and its connections.
pub(crate) struct Store {
    source: Source,
    commands_config: AsyncConnectionConfig,
    /// The command connection and its generation (so that a failure on an old connection does
    /// not drop a newer one).
    link: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    /// Held while connecting, so that a hundred failing deliveries make one new connection.
    connecting: tokio::sync::Mutex<()>,
    pub stream: String,
    pub group: String,
    pub consumer: String,
    pub dead_letters: String,
    /// `MAXLEN ~ n` of every dead letter's `XADD`.
    dead_letter_maxlen: Option<u64>,
    /// Where a group created at start begins ([`Config::start`]).
    start: String,
    /// The newest entry id this consumer read or claimed: where a lost group is created again.
    last_seen: Mutex<Option<(u64, u64)>>,
    pub health: Health,
    /// Set once by the first fatal error; the consumer stops on it.
    fatal: tokio::sync::watch::Sender<Option<Refusal>>,
}

/// Connecting: the `AUTH` (and `SELECT`) redis-rs sends on a new connection.
const CONNECT: Op<'static> = Op {
    command: "AUTH",
    key: "",
};

impl Store {
    /// A store for `config`; nothing is connected yet.
    pub(crate) fn new(config: &Config) -> Result<Store, StoreError> {
        let tls = config.redis.tls.then(|| tls_certificates(config));
        let source = if let Some(sentinel) = &config.redis.sentinel {
            sentinel_client(sentinel).map(|c| Source::Sentinel(tokio::sync::Mutex::new(c)))
        } else if let Some(url) = &config.redis.cluster {
            Ok(Source::Cluster(Cluster {
                url: url.clone(),
                tls,
                slot: crate::config::key_slot(&config.stream),
                known: Mutex::new(Vec::new()),
            }))
        } else if let Some(certs) = tls {
            redis::Client::build_with_tls(config.redis.secret(), certs).map(Source::Direct)
        } else {
            redis::Client::open(config.redis.secret()).map(Source::Direct)
        }
        .map_err(|e| {
            StoreError::fatal(
                Op {
                    command: "connect",
                    key: "",
                },
                format!("cannot use the Redis URL: {}", e.category()),
            )
        })?;
        let (fatal, _) = tokio::sync::watch::channel(None);
        Ok(Store {
            source,
            commands_config: AsyncConnectionConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT)),
            link: Mutex::new(None),
            generation: AtomicU64::new(0),
            connecting: tokio::sync::Mutex::new(()),
            stream: config.stream.clone(),
            group: config.group.clone(),
            consumer: config.consumer.clone(),
            dead_letters: config.dead_letter_stream(),
            dead_letter_maxlen: config.dead_letter_maxlen,
            start: config.start.clone(),
            last_seen: Mutex::new(None),
            health: Health::default(),
            fatal,
        })
    }

    /// Resolves with the first fatal error.
    pub(crate) fn fatal(&self) -> impl Future<Output = Refusal> + Send + 'static {
        let mut rx = self.fatal.subscribe();
        async move {
            loop {
                if let Some(m) = rx.borrow_and_update().clone() {
                    return m;
                }
                if rx.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    fn link(&self) -> std::sync::MutexGuard<'_, Option<(u64, MultiplexedConnection)>> {
        self.link.lock().unwrap_or_else(|e| e.into_inner())
    }

    async fn connection(&self) -> Result<(u64, MultiplexedConnection), StoreError> {
        if let Some(c) = self.link().clone() {
            return Ok(c);
        }
        let _connecting = self.connecting.lock().await;
        if let Some(c) = self.link().clone() {
            return Ok(c);
        }
        match self.source.connect(&self.commands_config).await {
            Ok(conn) => {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed) + 1;
                *self.link() = Some((generation, conn.clone()));
                Ok((generation, conn))
            }
            Err(e) => {
                let err = StoreError::from_redis(&e, CONNECT);
                self.note(&err);
                Err(err)
            }
        }
    }

    fn note(&self, err: &StoreError) {
        match err {
            StoreError::Unavailable(_) => self.health.failed(err),
            StoreError::Fatal(m) => {
                self.fatal.send_if_modified(|f| {
                    if f.is_none() {
                        *f = Some(m.clone());
                        true
                    } else {
                        false
                    }
                });
            }
            StoreError::NoGroup => self.health.answered(),
        }
    }

    /// Runs one command (or pipeline) on the command connection; `classify` reads its errors.
    async fn run<T>(
        &self,
        classify: impl FnOnce(&redis::RedisError) -> StoreError,
        send: impl for<'c> FnOnce(
            &'c mut MultiplexedConnection,
        ) -> std::pin::Pin<
            Box<dyn Future<Output = redis::RedisResult<T>> + Send + 'c>,
        >,
    ) -> Result<T, StoreError> {
        let (generation, mut conn) = self.connection().await?;
        match send(&mut conn).await {
            Ok(v) => {
                self.health.answered();
                Ok(v)
            }
            Err(e) => {
                if breaks_connection(&e) {
                    let mut link = self.link();
                    if link.as_ref().map(|(g, _)| *g) == Some(generation) {
                        *link = None;
                    }
                }
                let err = classify(&e);
                self.note(&err);
                Err(err)
            }
        }
    }

    async fn query(&self, op: Op<'_>, cmd: redis::Cmd) -> Result<Value, StoreError> {
        self.run(
            |e| StoreError::from_redis(e, op),
            move |c| Box::pin(async move { cmd.query_async::<Value>(c).await }),
        )
        .await
    }

    /// Runs `op` until it succeeds, waiting out unavailability with backoff and creating the
    /// group again when it is gone. `Err` only for a fatal error (the consumer then stops).
    pub(crate) async fn retry<T, F, Fut>(&self, mut op: F) -> Result<T, Refusal>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StoreError>>,
    {
        let mut pause = RETRY_FIRST;
        loop {
            match op().await {
                Ok(v) => return Ok(v),
                Err(StoreError::Fatal(m)) => return Err(m),
                Err(StoreError::NoGroup) => match self.create_group_again().await {
                    Ok(created) => {
                        self.log_recreated(created.as_deref());
                        continue;
                    }
                    Err(StoreError::Fatal(m)) => return Err(m),
                    Err(_) => {}
                },
                Err(StoreError::Unavailable(_)) => {}
            }
            tokio::time::sleep(runr_base::backoff::equal_jitter(pause)).await;
            pause = (pause * 2).min(RETRY_MAX);
        }
    }

    /// The group again, after an operation found it gone.
    pub(crate) async fn recreate_group(&self) -> Result<(), Refusal> {
        let created = self.retry(|| self.create_group_again()).await?;
        self.log_recreated(created.as_deref());
        Ok(())
    }

    /// `at`: where the group was created again; `None`: it was there after all (an answer
    /// from a node that no longer held the stream, in a cluster's resharding).
    fn log_recreated(&self, at: Option<&str>) {
        let Some(at) = at else {
            return;
        };
        tracing::warn!(
            stream = %self.stream,
            group = %self.group,
            at,
            "the stream or its consumer group was gone: created it again after the last entry this consumer saw"
        );
    }

    /// Notes the entries just read or claimed: the newest id is where a lost group starts again.
    fn saw(&self, entries: &[Entry]) {
        let newest = entries.iter().filter_map(|e| parse_id(&e.id)).max();
        if let Some(id) = newest {
            let mut last = self.last_seen.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|l| id > l) {
                *last = Some(id);
            }
        }
    }

    /// Where a lost group is created again: after the newest entry this consumer saw (what a
    /// Redis that lost its data gets from producers afterwards has newer ids), or `0` when it saw
    /// none (everything in the stream is new to it); never `$`, which would skip what producers
    /// wrote between the loss and now.
    pub(crate) fn recreate_at(&self) -> String {
        match *self.last_seen.lock().unwrap_or_else(|e| e.into_inner()) {
            Some((ms, seq)) => format!("{ms}-{seq}"),
            None => "0".to_string(),
        }
    }

    /// `command` on the stream.
    fn op(&self, command: &'static str) -> Op<'_> {
        Op {
            command,
            key: &self.stream,
        }
    }

    // === commands ===

    /// The group at `RUNR_QUEUE_START` when it is missing; `true` when it was created now.
    pub(crate) async fn create_group(&self) -> Result<bool, StoreError> {
        self.create_group_at(&self.start).await
    }

    /// The group again where this consumer left off ([`Store::recreate_at`]); that id, or `None`
    /// when the group exists.
    async fn create_group_again(&self) -> Result<Option<String>, StoreError> {
        let at = self.recreate_at();
        Ok(self.create_group_at(&at).await?.then_some(at))
    }

    /// `XGROUP CREATE <stream> <group> <at> MKSTREAM`; an existing group is fine (`false`).
    async fn create_group_at(&self, at: &str) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("CREATE")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(at)
            .arg("MKSTREAM");
        let op = Op {
            command: "XGROUP CREATE",
            key: &self.stream,
        };
        self.run(
            |e| StoreError::from_redis(e, op),
            move |c| {
                Box::pin(async move {
                    match cmd.query_async::<Value>(c).await {
                        Err(e) if e.code() == Some("BUSYGROUP") => Ok(false),
                        Err(e) => Err(e),
                        Ok(_) => Ok(true),
                    }
                })
            },
        )
        .await
    }

    /// Whether any entry is pending on this consumer (`XPENDING … - + 1 <consumer>`).
    pub(crate) async fn holds_pending(&self) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("XPENDING");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg("-")
            .arg("+")
            .arg(1)
            .arg(&self.consumer);
        let reply = self.query(self.op("XPENDING"), cmd).await?;
        match reply {
            Value::Array(rows) => Ok(!rows.is_empty()),
            _ => Err(StoreError::reply("XPENDING", "not an array")),
        }
    }

    /// `XGROUP DELCONSUMER`: this consumer leaves the group (it must hold nothing pending: the
    /// command drops the consumer's pending entries with it).
    pub(crate) async fn delete_consumer(&self) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("XGROUP");
        cmd.arg("DELCONSUMER")
            .arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer);
        self.query(self.op("XGROUP DELCONSUMER"), cmd)
            .await
            .map(drop)
    }

    /// The pending entries' delivery counts (`None`: not pending any more), one round trip.
    pub(crate) async fn delivery_counts(
        &self,
        ids: &[&str],
    ) -> Result<Vec<Option<u32>>, StoreError> {
        let mut pipe = redis::pipe();
        for id in ids {
            pipe.cmd("XPENDING")
                .arg(&self.stream)
                .arg(&self.group)
                .arg(*id)
                .arg(*id)
                .arg(1);
        }
        let n = ids.len();
        let op = Op {
            command: "XPENDING",
            key: &self.stream,
        };
        let replies: Vec<Value> = self
            .run(
                |e| StoreError::from_redis(e, op),
                move |c| Box::pin(async move { pipe.query_async::<Vec<Value>>(c).await }),
            )
            .await?;
        if replies.len() != n {
            return Err(StoreError::reply("XPENDING", "wrong number of replies"));
        }
        replies.iter().map(pending_count).collect()
    }

    /// `XAUTOCLAIM`: up to `count` entries idle for `min_idle` on any consumer become ours; the
    /// cursor to continue from (`0-0`: the scan is complete).
    pub(crate) async fn autoclaim(
        &self,
        min_idle: Duration,
        cursor: &str,
        count: usize,
    ) -> Result<(String, Vec<Entry>), StoreError> {
        let mut cmd = redis::cmd("XAUTOCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(millis(min_idle))
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        let reply = self.query(self.op("XAUTOCLAIM"), cmd).await?;
        let claimed = parse_autoclaim(reply)?;
        self.saw(&claimed.1);
        Ok(claimed)
    }

    /// Sets an entry's delivery count to `attempt` before that attempt, and makes it ours and
    /// not idle. `false`: it is not pending any more (acknowledged or deleted elsewhere).
    pub(crate) async fn set_attempt(&self, id: &str, attempt: u32) -> Result<bool, StoreError> {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(id)
            .arg("RETRYCOUNT")
            .arg(attempt)
            .arg("JUSTID");
        let reply = self.query(self.op("XCLAIM"), cmd).await?;
        Ok(!parse_ids(&reply, "XCLAIM")?.is_empty())
    }

    /// Resets the idle time of entries we still work on (without counting a delivery), so no
    /// other consumer claims them; returns the ids still pending.
    pub(crate) async fn touch(&self, ids: &[String]) -> Result<Vec<String>, StoreError> {
        let mut cmd = redis::cmd("XCLAIM");
        cmd.arg(&self.stream)
            .arg(&self.group)
            .arg(&self.consumer)
            .arg(0)
            .arg(ids)
            .arg("JUSTID");
        let reply = self.query(self.op("XCLAIM"), cmd).await?;
        parse_ids(&reply, "XCLAIM")
    }

    /// `XACK`.
    pub(crate) async fn ack(&self, id: &str) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("XACK");
        cmd.arg(&self.stream).arg(&self.group).arg(id);
        self.query(self.op("XACK"), cmd).await.map(drop)
    }

    /// `MULTI; XADD <stream>-dlq * <fields> <extra>; XACK; EXEC`: moved and acknowledged as one,
    /// so a crash in between neither loses the entry nor dead-letters it twice.
    pub(crate) async fn dead_letter(
        &self,
        id: &str,
        fields: &[(Vec<u8>, Vec<u8>)],
        extra: &[(&str, String)],
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        let add = pipe.cmd("XADD").arg(&self.dead_letters);
        if let Some(n) = self.dead_letter_maxlen {
            // `~`: Redis trims whole macro nodes, cheaply, when it can (at least n stay).
            add.arg("MAXLEN").arg("~").arg(n);
        }
        add.arg("*");
        for (name, value) in fields {
            add.arg(name).arg(value);
        }
        for (name, value) in extra {
            add.arg(*name).arg(value);
        }
        pipe.cmd("XACK").arg(&self.stream).arg(&self.group).arg(id);
        let ops = [
            Op {
                command: "XADD",
                key: &self.dead_letters,
            },
            self.op("XACK"),
        ];
        self.run(
            |e| StoreError::from_transaction(e, &ops),
            move |c| Box::pin(async move { pipe.query_async::<Value>(c).await }),
        )
        .await
        .map(drop)
    }

    // === what the metrics read ===

    /// `PING` on the command connection, for `/healthz`. Its failure is not noted as an outage
    /// (a probe is not the consumer's work), but connecting is.
    pub(crate) async fn ping(&self) -> Result<(), String> {
        let (_, mut conn) = self.connection().await.map_err(|e| e.to_string())?;
        redis::cmd("PING")
            .query_async::<Value>(&mut conn)
            .await
            .map(drop)
            .map_err(|e| error_text(&e))
    }

    /// The group's lag and pending count (`XINFO GROUPS`) and its oldest pending entry
    /// (`XPENDING` summary), one round trip. Errors are only returned, never noted: an ACL
    /// without `XINFO` must not stop the consumer.
    pub(crate) async fn group_figures(&self) -> Result<crate::metrics::GroupFigures, String> {
        let (_, mut conn) = self.connection().await.map_err(|e| e.to_string())?;
        let mut pipe = redis::pipe();
        pipe.cmd("XINFO").arg("GROUPS").arg(&self.stream);
        pipe.cmd("XPENDING").arg(&self.stream).arg(&self.group);
        let replies: Vec<Value> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| error_text(&e))?;
        let [groups, pending] = <[Value; 2]>::try_from(replies)
            .map_err(|_| "unexpected reply: wrong number of replies".to_string())?;
        parse_figures(&groups, &pending, &self.group)
    }

    // === dead letters back to the stream (`runr-queue redrive`) ===

    /// `XRANGE <key> <start> <end> COUNT <count>`.
    pub(crate) async fn range(
        &self,
        key: &str,
        start: &str,
        end: &str,
        count: usize,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut cmd = redis::cmd("XRANGE");
        cmd.arg(key).arg(start).arg(end).arg("COUNT").arg(count);
        let op = Op {
            command: "XRANGE",
            key,
        };
        parse_entries(self.query(op, cmd).await?)
    }

    /// The newest entry id of `key` (`XREVRANGE <key> + - COUNT 1`), `None` when it is empty.
    pub(crate) async fn newest(&self, key: &str) -> Result<Option<String>, StoreError> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(key).arg("+").arg("-").arg("COUNT").arg(1);
        let op = Op {
            command: "XREVRANGE",
            key,
        };
        Ok(parse_entries(self.query(op, cmd).await?)?
            .into_iter()
            .next()
            .map(|e| e.id))
    }

    /// `MULTI; XDEL <dead letters> <id>; XADD <stream> * <fields>; EXEC`: the dead letter moves
    /// back as a new entry, both or neither (a crash in between leaves it where it was).
    pub(crate) async fn redrive(
        &self,
        id: &str,
        fields: &[(Vec<u8>, Vec<u8>)],
    ) -> Result<(), StoreError> {
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.cmd("XDEL").arg(&self.dead_letters).arg(id);
        let add = pipe.cmd("XADD").arg(&self.stream).arg("*");
        for (name, value) in fields {
            add.arg(name).arg(value);
        }
        let ops = [
            Op {
                command: "XDEL",
                key: &self.dead_letters,
            },
            self.op("XADD"),
        ];
        self.run(
            |e| StoreError::from_transaction(e, &ops),
            move |c| Box::pin(async move { pipe.query_async::<Value>(c).await }),
        )
        .await
        .map(drop)
    }

    /// `CLIENT UNBLOCK <id>`: ends the reader's blocking read now (at shutdown).
    pub(crate) async fn unblock(&self, client_id: i64) -> Result<(), StoreError> {
        let mut cmd = redis::cmd("CLIENT");
        cmd.arg("UNBLOCK").arg(client_id);
        let op = Op {
            command: "CLIENT UNBLOCK",
            key: "",
        };
        self.query(op, cmd).await.map(drop)
    }

    // === the reader's own connection ===

    /// A new connection for blocking reads, and its client id (for `CLIENT UNBLOCK`).
    pub(crate) async fn reader(&self) -> Result<Reader, StoreError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(READ_BLOCK + RESPONSE_TIMEOUT));
        let id_op = Op {
            command: "CLIENT ID",
            key: "",
        };
        let result = async {
            let mut conn = self
                .source
                .connect(&config)
                .await
                .map_err(|e| (e, CONNECT))?;
            let id: i64 = redis::cmd("CLIENT")
                .arg("ID")
                .query_async(&mut conn)
                .await
                .map_err(|e| (e, id_op))?;
            Ok::<_, (redis::RedisError, Op<'_>)>(Reader {
                conn,
                client_id: id,
                broken: false,
            })
        }
        .await;
        result.map_err(|(e, op)| {
            let err = StoreError::from_redis(&e, op);
            self.note(&err);
            err
        })
    }

    /// `XREADGROUP GROUP <group> <consumer> COUNT <count> [BLOCK <ms>] STREAMS <stream> <from>`:
    /// `from` is `>` for new entries, or an id to page through our own pending ones after it.
    pub(crate) async fn read(
        &self,
        reader: &mut Reader,
        from: &str,
        count: usize,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, StoreError> {
        let mut cmd = redis::cmd("XREADGROUP");
        cmd.arg("GROUP")
            .arg(&self.group)
            .arg(&self.consumer)
            .arg("COUNT")
            .arg(count);
        if let Some(b) = block {
            cmd.arg("BLOCK").arg(millis(b));
        }
        cmd.arg("STREAMS").arg(&self.stream).arg(from);
        match cmd.query_async::<Value>(&mut reader.conn).await {
            Ok(v) => {
                self.health.answered();
                let entries = parse_read(v)?;
                self.saw(&entries);
                Ok(entries)
            }
            Err(e) => {
                if breaks_connection(&e) {
                    reader.broken = true;
                }
                let err = StoreError::from_redis(&e, self.op("XREADGROUP"));
                self.note(&err);
                Err(err)
            }
        }
    }
}

/// The connection that blocks in `XREADGROUP`.
pub(crate) struct Reader {
    conn: MultiplexedConnection,
    /// Redis's id of this connection.
    pub client_id: i64,
    broken: bool,
}

impl Reader {
    /// Whether the connection failed and must be replaced.
    pub(crate) fn broken(&self) -> bool {
        self.broken
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

// === reply parsing ===

fn as_bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        Value::VerbatimString { text, .. } => Some(text.as_bytes()),
        _ => None,
    }
}

fn as_text(v: &Value) -> Option<String> {
    as_bytes(v).and_then(|b| String::from_utf8(b.to_vec()).ok())
}

/// `[id, [name, value, …] | nil]`.
fn parse_entry(v: Value) -> Result<Entry, StoreError> {
    let Value::Array(mut parts) = v else {
        return Err(StoreError::reply("XREADGROUP", "an entry is not an array"));
    };
    if parts.len() != 2 {
        return Err(StoreError::reply(
            "XREADGROUP",
            "an entry is not [id, fields]",
        ));
    }
    let fields = parts.pop().unwrap_or(Value::Nil);
    let id = as_text(&parts[0]).ok_or_else(|| StoreError::reply("XREADGROUP", "bad id"))?;
    let fields = match fields {
        Value::Nil => None,
        Value::Array(flat) => {
            if flat.len() % 2 != 0 {
                return Err(StoreError::reply("XREADGROUP", "odd number of field items"));
            }
            let mut pairs = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let (Some(n), Some(v)) = (it.next(), it.next()) {
                let (Value::BulkString(n), Value::BulkString(v)) = (n, v) else {
                    return Err(StoreError::reply("XREADGROUP", "a field is not a string"));
                };
                pairs.push((n, v));
            }
            Some(pairs)
        }
        // RESP3 (`?protocol=resp3` in the URL) answers fields as a map.
        Value::Map(map) => {
            let mut pairs = Vec::with_capacity(map.len());
            for (n, v) in map {
                let (Value::BulkString(n), Value::BulkString(v)) = (n, v) else {
                    return Err(StoreError::reply("XREADGROUP", "a field is not a string"));
                };
                pairs.push((n, v));
            }
            Some(pairs)
        }
        _ => return Err(StoreError::reply("XREADGROUP", "fields are not an array")),
    };
    Ok(Entry { id, fields })
}

fn parse_entries(v: Value) -> Result<Vec<Entry>, StoreError> {
    match v {
        Value::Array(items) => items.into_iter().map(parse_entry).collect(),
        Value::Nil => Ok(Vec::new()),
        _ => Err(StoreError::reply("XREADGROUP", "entries are not an array")),
    }
}

/// `nil` (nothing within BLOCK) or `[[stream, entries]]` (RESP2) or `{stream: entries}` (RESP3).
fn parse_read(v: Value) -> Result<Vec<Entry>, StoreError> {
    match v {
        Value::Nil => Ok(Vec::new()),
        Value::Array(streams) => {
            let mut out = Vec::new();
            for s in streams {
                let Value::Array(mut pair) = s else {
                    return Err(StoreError::reply(
                        "XREADGROUP",
                        "a stream is not [name, entries]",
                    ));
                };
                if pair.len() != 2 {
                    return Err(StoreError::reply(
                        "XREADGROUP",
                        "a stream is not [name, entries]",
                    ));
                }
                out.extend(parse_entries(pair.pop().unwrap_or(Value::Nil))?);
            }
            Ok(out)
        }
        Value::Map(streams) => {
            let mut out = Vec::new();
            for (_, entries) in streams {
                out.extend(parse_entries(entries)?);
            }
            Ok(out)
        }
        _ => Err(StoreError::reply("XREADGROUP", "not an array")),
    }
}

/// `[cursor, entries, deleted ids]` (Redis 7; 6.2 leaves out the third).
fn parse_autoclaim(v: Value) -> Result<(String, Vec<Entry>), StoreError> {
    let Value::Array(parts) = v else {
        return Err(StoreError::reply("XAUTOCLAIM", "not an array"));
    };
    let mut parts = parts.into_iter();
    let cursor = parts
        .next()
        .as_ref()
        .and_then(as_text)
        .ok_or_else(|| StoreError::reply("XAUTOCLAIM", "no cursor"))?;
    let entries = match parts.next() {
        Some(Value::Array(items)) => items
            .into_iter()
            // Redis 6.2 lists a deleted entry as nil here.
            .filter(|e| !matches!(e, Value::Nil))
            .map(parse_entry)
            .collect::<Result<Vec<_>, _>>()?,
        _ => return Err(StoreError::reply("XAUTOCLAIM", "no entries")),
    };
    Ok((cursor, entries))
}

/// `XPENDING key group id id 1`: `[[id, consumer, idle, count]]` or `[]`.
fn pending_count(v: &Value) -> Result<Option<u32>, StoreError> {
    let Value::Array(rows) = v else {
        return Err(StoreError::reply("XPENDING", "not an array"));
    };
    let Some(Value::Array(row)) = rows.first() else {
        return Ok(None);
    };
    match row.get(3) {
        Some(Value::Int(n)) => Ok(Some(u32::try_from(*n).unwrap_or(u32::MAX))),
        _ => Err(StoreError::reply("XPENDING", "no delivery count")),
    }
}

/// A map reply (RESP3) or a flat `[name, value, …]` array (RESP2) as pairs.
fn pairs(v: &Value) -> Option<Vec<(&[u8], &Value)>> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| Some((as_bytes(k)?, v))).collect(),
        Value::Array(flat) if flat.len() % 2 == 0 => flat
            .chunks(2)
            .map(|kv| Some((as_bytes(&kv[0])?, &kv[1])))
            .collect(),
        _ => None,
    }
}

/// `XINFO GROUPS` (one map per group) and the `XPENDING` summary (`[count, smallest id, greatest
/// id, consumers]`) as the metrics' figures for `group`.
fn parse_figures(
    groups: &Value,
    pending: &Value,
    group: &str,
) -> Result<crate::metrics::GroupFigures, String> {
    let bad = |why: &str| format!("unexpected reply: {why}");
    let Value::Array(groups) = groups else {
        return Err(bad("XINFO GROUPS is not an array"));
    };
    let info = groups
        .iter()
        .filter_map(pairs)
        .find(|p| {
            p.iter()
                .any(|(k, v)| *k == b"name" && as_bytes(v) == Some(group.as_bytes()))
        })
        .ok_or_else(|| format!("the group {group} does not exist"))?;
    let int = |name: &[u8]| {
        info.iter()
            .find(|(k, _)| *k == name)
            .and_then(|(_, v)| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
    };
    let count = int(b"pending").ok_or_else(|| bad("no pending count"))?;
    let oldest = match pending {
        Value::Array(parts) => parts
            .get(1)
            .and_then(as_text)
            .and_then(|id| parse_id(&id))
            .map(|(ms, _)| ms),
        _ => return Err(bad("XPENDING is not an array")),
    };
    Ok(crate::metrics::GroupFigures {
        lag: int(b"lag"),
        pending: count,
        oldest_pending_ms: oldest,
    })
}

/// `<ms>-<seq>` as numbers, to compare ids.
pub(crate) fn parse_id(id: &str) -> Option<(u64, u64)> {
    let (ms, seq) = id.split_once('-')?;
    Some((ms.parse().ok()?, seq.parse().ok()?))
}

fn parse_ids(v: &Value, command: &str) -> Result<Vec<String>, StoreError> {
    let Value::Array(items) = v else {
        return Err(StoreError::reply(command, "not an array"));
    };
    items
        .iter()
        .map(|i| as_text(i).ok_or_else(|| StoreError::reply(command, "an id is not a string")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn cluster_slots_replies() {
        let node = |host: &str, port: i64| Value::Array(vec![b(host), Value::Int(port), b("id")]);
        let range = |start: i64, end: i64, master: Value, replica: Value| {
            Value::Array(vec![Value::Int(start), Value::Int(end), master, replica])
        };
        let reply = Value::Array(vec![
            range(0, 5460, node("10.0.0.1", 7000), node("10.0.0.4", 7003)),
            range(5461, 10922, node("", 7001), node("10.0.0.5", 7004)),
            range(10923, 16383, node("?", 7002), node("10.0.0.6", 7005)),
            // A second range of the first master (after a resharding).
            range(16000, 16000, node("10.0.0.1", 7000), node("10.0.0.4", 7003)),
        ]);
        let (master, masters) = cluster_master(&reply, 5461, "seed").unwrap();
        assert_eq!(master, ("seed".to_string(), 7001));
        assert_eq!(
            masters,
            [
                ("10.0.0.1".to_string(), 7000),
                ("seed".to_string(), 7001),
                ("seed".to_string(), 7002)
            ]
        );
        assert_eq!(
            cluster_master(&reply, 0, "seed").unwrap().0,
            ("10.0.0.1".to_string(), 7000)
        );
        // No master for the slot (unassigned), or a reply of another shape.
        let partial = Value::Array(vec![range(0, 100, node("h", 1), Value::Nil)]);
        assert!(cluster_master(&partial, 101, "seed").is_none());
        assert!(cluster_master(&Value::Nil, 0, "seed").is_none());
        let bad_port = Value::Array(vec![range(0, 1, node("h", 70000), Value::Nil)]);
        assert!(cluster_master(&bad_port, 0, "seed").is_none());
    }

    #[test]
    fn read_replies() {
        assert_eq!(parse_read(Value::Nil).unwrap(), vec![]);
        let reply = Value::Array(vec![Value::Array(vec![
            b("s"),
            Value::Array(vec![
                Value::Array(vec![
                    b("1-0"),
                    Value::Array(vec![b("a"), b("1"), b("a"), b("2")]),
                ]),
                Value::Array(vec![b("2-0"), Value::Nil]),
            ]),
        ])]);
        assert_eq!(
            parse_read(reply).unwrap(),
            vec![
                Entry {
                    id: "1-0".into(),
                    fields: Some(vec![
                        (b"a".to_vec(), b"1".to_vec()),
                        (b"a".to_vec(), b"2".to_vec())
                    ])
                },
                Entry {
                    id: "2-0".into(),
                    fields: None
                },
            ]
        );
        let resp3 = Value::Map(vec![(
            b("s"),
            Value::Array(vec![Value::Array(vec![
                b("3-1"),
                Value::Map(vec![(b("k"), b("v"))]),
            ])]),
        )]);
        assert_eq!(parse_read(resp3).unwrap()[0].id, "3-1");
        for bad in [
            Value::Int(1),
            Value::Array(vec![Value::Int(1)]),
            Value::Array(vec![Value::Array(vec![b("s")])]),
            Value::Array(vec![Value::Array(vec![
                b("s"),
                Value::Array(vec![Value::Array(vec![
                    b("1-0"),
                    Value::Array(vec![b("odd")]),
                ])]),
            ])]),
        ] {
            assert!(parse_read(bad).is_err());
        }
    }

    #[test]
    fn group_figures() {
        let group = |name: &str, lag: Value| {
            Value::Array(vec![
                b("name"),
                b(name),
                b("consumers"),
                Value::Int(1),
                b("pending"),
                Value::Int(3),
                b("last-delivered-id"),
                b("9-0"),
                b("lag"),
                lag,
            ])
        };
        let groups = Value::Array(vec![
            group("other", Value::Int(99)),
            group("g", Value::Int(4)),
        ]);
        let pending = Value::Array(vec![Value::Int(3), b("1500-0"), b("1600-2"), Value::Nil]);
        let f = parse_figures(&groups, &pending, "g").unwrap();
        assert_eq!(
            (f.lag, f.pending, f.oldest_pending_ms),
            (Some(4), 3, Some(1500))
        );
        let none = Value::Array(vec![Value::Int(0), Value::Nil, Value::Nil, Value::Nil]);
        let groups = Value::Array(vec![group("g", Value::Nil)]);
        let f = parse_figures(&groups, &none, "g").unwrap();
        assert_eq!((f.lag, f.oldest_pending_ms), (None, None));
        assert!(parse_figures(&groups, &none, "missing")
            .unwrap_err()
            .contains("does not exist"));
        let resp3 = Value::Array(vec![Value::Map(vec![
            (b("name"), b("g")),
            (b("pending"), Value::Int(0)),
            (b("lag"), Value::Int(0)),
        ])]);
        assert_eq!(parse_figures(&resp3, &none, "g").unwrap().lag, Some(0));
    }

    #[test]
    fn autoclaim_and_pending_replies() {
        let reply = Value::Array(vec![
            b("0-0"),
            Value::Array(vec![Value::Array(vec![
                b("5-0"),
                Value::Array(vec![b("k"), b("v")]),
            ])]),
            Value::Array(vec![b("4-0")]),
        ]);
        let (cursor, entries) = parse_autoclaim(reply).unwrap();
        assert_eq!(cursor, "0-0");
        assert_eq!(entries.len(), 1);
        let row = Value::Array(vec![Value::Array(vec![
            b("5-0"),
            b("c1"),
            Value::Int(10),
            Value::Int(3),
        ])]);
        assert_eq!(pending_count(&row).unwrap(), Some(3));
        assert_eq!(pending_count(&Value::Array(vec![])).unwrap(), None);
        assert!(pending_count(&Value::Nil).is_err());
        assert_eq!(
            parse_ids(&Value::Array(vec![b("1-0")]), "XCLAIM").unwrap(),
            vec!["1-0".to_string()]
        );
    }
}
