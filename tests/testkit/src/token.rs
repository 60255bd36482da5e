//! Bearer-token auth as real registries do it (<https://distribution.github.io/distribution/spec/auth/token/>):
//! a [`TokenService`] that checks Basic credentials and issues JWTs, and a [`TokenRegistry`],
//! the real `docker-registry` with `auth: token` trusting that service's signing certificate.
//!
//! The token service mimics distribution's own reference token server (`contrib/token-server`
//! of distribution 2.8, with its htpasswd access controller) in every refusal, byte for byte
//! (see [`refusal_body`]); its successful answer carries both `token` and `access_token` with
//! `expires_in` and `issued_at`, as the token specification documents it (and Docker Hub answers).
//!
//! Tokens are ES256 JWTs whose header names the signing key by `kid`, its libtrust fingerprint,
//! the way Harbor, GitLab and docker_auth sign them: distribution 2.8 looks a `kid` up among the
//! public keys of the certificates in `rootcertbundle` (it would also take an `x5c` chain or a
//! `jwk`). Its checks, all of which these tokens pass: `iss` equal to the configured issuer,
//! `aud` a single string equal to the configured service (2.8 does not accept an array), `exp`
//! and `nbf` with 60 s of leeway, and a signature by a trusted key over the first two parts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use ring::rand::SecureRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};

use crate::distribution::Distribution;
use crate::httpd::{self, HttpServer, Request, Response};
use crate::pki::{self, Ca, ServerCert, Validity};

/// The `service` the registry names in its challenge and the token's audience.
pub const SERVICE: &str = "runr-test-registry";
/// The token issuer (`iss`) the registry trusts.
pub const ISSUER: &str = "runr-test-token-issuer";
/// The realm of the token service's own Basic challenge (it appears in its refusals).
pub const BASIC_REALM: &str = "runr-test-token";
/// The token service's path; the realm is `http://127.0.0.1:<port>/token`.
pub const TOKEN_PATH: &str = "/token";
/// How long an issued token is valid (`expires_in`), as distribution's token server: 15 min.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15 * 60);
/// Token requests remembered in the log (the counters count every one).
pub const DEFAULT_LOG_LIMIT: usize = 10_000;

/// The body of the token service's 401 for `detail`, byte for byte what distribution 2.8's
/// token server answers (its errcode envelope, Go's JSON encoder's trailing newline):
/// `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required","detail":…}]}`.
///
/// Details: [`DETAIL_NO_CREDENTIALS`], [`DETAIL_BAD_CREDENTIALS`] (GET), or
/// `"invalid credentials"` (a refused OAuth2 password grant, POST).
pub fn refusal_body(detail: &str) -> String {
    format!(
        "{{\"errors\":[{{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication required\",\"detail\":{}}}]}}\n",
        serde_json::Value::from(detail)
    )
}

/// The detail of a GET without Basic credentials.
pub const DETAIL_NO_CREDENTIALS: &str =
    "basic authentication challenge for realm \"runr-test-token\": invalid authorization credential";
/// The detail of a GET with a wrong user or password.
pub const DETAIL_BAD_CREDENTIALS: &str =
    "basic authentication challenge for realm \"runr-test-token\": authentication failure";
/// The detail of a POST password grant with a wrong user or password.
pub const DETAIL_BAD_GRANT: &str = "invalid credentials";

/// A user of the token service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// The password.
    pub password: String,
    /// The actions this user may be granted (`pull`, `push`, `delete`, `*`); `None`: every
    /// action requested.
    pub actions: Option<Vec<String>>,
}

impl User {
    /// A user granted whatever it asks for.
    pub fn new(name: &str, password: &str) -> User {
        User {
            name: name.to_string(),
            password: password.to_string(),
            actions: None,
        }
    }

    /// A user granted only `actions` of what it asks for (e.g. `["pull"]`: pushes then fail
    /// at the registry with `insufficient_scope`).
    pub fn with_actions(name: &str, password: &str, actions: &[&str]) -> User {
        User {
            actions: Some(actions.iter().map(|a| a.to_string()).collect()),
            ..User::new(name, password)
        }
    }
}

/// One request the token service answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRequest {
    /// `GET` or `POST`.
    pub method: String,
    /// The Basic (GET) or form (POST) user name, if any was sent.
    pub user: Option<String>,
    /// The `service` asked for.
    pub service: Option<String>,
    /// The scopes asked for, each as sent (`repository:name:pull,push`).
    pub scopes: Vec<String>,
    /// The status answered.
    pub status: u16,
    /// What the token grants, one `type:name:actions` per resource (empty when refused).
    pub granted: Vec<String>,
}

/// The signing key: an EC P-256 key made by openssl, its self-signed certificate (the
/// registry's `rootcertbundle`) and its libtrust key id.
struct Signer {
    key: EcdsaKeyPair,
    kid: String,
    cert: PathBuf,
    rng: ring::rand::SystemRandom,
}

impl Signer {
    fn generate(dir: &Path) -> Signer {
        std::fs::write(dir.join("req.cnf"), pki::req_config()).expect("write req.cnf");
        let run = |args: &[&str]| pki::openssl(dir, args);
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "signer.key",
        ]);
        let pkcs8 = run(&[
            "pkcs8",
            "-topk8",
            "-nocrypt",
            "-in",
            "signer.key",
            "-outform",
            "DER",
        ]);
        let spki = run(&["pkey", "-in", "signer.key", "-pubout", "-outform", "DER"]);
        run(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "signer.key",
            "-out",
            "signer.crt",
            "-days",
            "3650",
            "-subj",
            "/CN=runr test token signer",
            "-config",
            "req.cnf",
        ]);
        let rng = ring::rand::SystemRandom::new();
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &pkcs8, &rng)
            .expect("ring reads openssl's PKCS#8 EC key");
        Signer {
            key,
            kid: libtrust_key_id(&spki),
            cert: dir.join("signer.crt"),
            rng,
        }
    }

    /// An ES256 JWT over `claims`.
    fn sign(&self, claims: &serde_json::Value) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = serde_json::json!({"typ": "JWT", "alg": "ES256", "kid": self.kid});
        let input = format!(
            "{}.{}",
            b64.encode(header.to_string()),
            b64.encode(claims.to_string())
        );
        let sig = self
            .key
            .sign(&self.rng, input.as_bytes())
            .expect("ECDSA signing");
        format!("{input}.{}", b64.encode(sig.as_ref()))
    }

    fn random_id(&self) -> String {
        let mut bytes = [0u8; 15];
        self.rng.fill(&mut bytes).expect("system randomness");
        base64::engine::general_purpose::URL_SAFE.encode(bytes)
    }
}

/// libtrust's key id, which distribution matches a JWT's `kid` against: the SHA-256 of the
/// DER SubjectPublicKeyInfo, truncated to 240 bits, base32 in twelve groups of four joined by
/// `:`.
pub fn libtrust_key_id(spki_der: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, spki_der);
    let b32 = base32(&digest.as_ref()[..30]);
    b32.as_bytes()
        .chunks(4)
        .map(|c| std::str::from_utf8(c).expect("base32 is ASCII"))
        .collect::<Vec<_>>()
        .join(":")
}

/// RFC 4648 base32 without padding.
fn base32(data: &[u8]) -> String {
    const ALPHABET: &[u8; 32] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";
    let mut out = String::new();
    let (mut buf, mut bits) = (0u32, 0u32);
    for &b in data {
        buf = (buf << 8) | u32::from(b);
        bits += 8;
        while bits >= 5 {
            bits -= 5;
            out.push(ALPHABET[((buf >> bits) & 31) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((buf << (5 - bits)) & 31) as usize] as char);
    }
    out
}

/// What the token service is configured with.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// The users it knows.
    pub users: Vec<User>,
    /// Actions granted to requests without credentials (`None`: they are refused with 401, as
    /// distribution's token server does; `Some(["pull"])`: anonymous pulls, as Docker Hub and
    /// Harbor grant for public repositories).
    pub anonymous: Option<Vec<String>>,
    /// `expires_in` of each token.
    pub ttl: Duration,
    /// The issuer (`iss`).
    pub issuer: String,
    /// Token requests remembered by [`TokenService::log`].
    pub log_limit: usize,
}

impl TokenConfig {
    /// One user granted everything it asks for, no anonymous access, the default lifetime.
    pub fn single(user: &str, password: &str) -> TokenConfig {
        TokenConfig {
            users: vec![User::new(user, password)],
            anonymous: None,
            ttl: DEFAULT_TTL,
            issuer: ISSUER.to_string(),
            log_limit: DEFAULT_LOG_LIMIT,
        }
    }
}

struct State {
    config: TokenConfig,
    signer: Signer,
    issued: AtomicU64,
    refused: AtomicU64,
    log: Mutex<Vec<TokenRequest>>,
}

impl State {
    fn record(&self, entry: TokenRequest) {
        if entry.status == 200 {
            self.issued.fetch_add(1, Ordering::SeqCst);
        } else {
            self.refused.fetch_add(1, Ordering::SeqCst);
        }
        let mut log = self.log.lock().unwrap_or_else(|e| e.into_inner());
        if log.len() < self.config.log_limit {
            log.push(entry);
        }
    }
}

/// A token service on a free loopback port, in this process (a thread per connection).
pub struct TokenService {
    server: HttpServer,
    state: Arc<State>,
    _dir: tempfile::TempDir,
}

impl TokenService {
    /// Starts a token service with `config`, its signing key and certificate made by openssl in
    /// a temporary directory.
    pub fn start(config: TokenConfig) -> TokenService {
        assert!(
            crate::have_tool("openssl"),
            "openssl is not installed (apt-get install openssl; .ci/run does this)"
        );
        let dir = tempfile::Builder::new()
            .prefix("runr-token-")
            .tempdir()
            .expect("tempdir");
        let state = Arc::new(State {
            signer: Signer::generate(dir.path()),
            config,
            issued: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            log: Mutex::new(Vec::new()),
        });
        let handler_state = Arc::clone(&state);
        let server = HttpServer::start(move |req| handle(&handler_state, req));
        TokenService {
            server,
            state,
            _dir: dir,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// The realm: `http://127.0.0.1:<port>/token`.
    pub fn url(&self) -> String {
        format!("http://{}{TOKEN_PATH}", self.addr())
    }

    /// The signing certificate (PEM), the registry's `rootcertbundle`.
    pub fn signer_cert(&self) -> &Path {
        &self.state.signer.cert
    }

    /// The signing key's libtrust id, the `kid` of every token.
    pub fn key_id(&self) -> &str {
        &self.state.signer.kid
    }

    /// The issuer (`iss`) of its tokens.
    pub fn issuer(&self) -> &str {
        &self.state.config.issuer
    }

    /// Token requests answered so far (issued and refused; malformed HTTP is not counted).
    pub fn requests(&self) -> u64 {
        self.issued() + self.refused()
    }

    /// Tokens issued so far.
    pub fn issued(&self) -> u64 {
        self.state.issued.load(Ordering::SeqCst)
    }

    /// Token requests refused so far (401 and 400).
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// The first [`TokenConfig::log_limit`] requests, in the order they were answered.
    pub fn log(&self) -> Vec<TokenRequest> {
        self.state
            .log
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Stops answering (connections refused, open ones closed), keeping key and counters.
    pub fn stop(&mut self) {
        self.server.stop();
    }

    /// Answers again on the same port.
    pub fn restart(&mut self) {
        self.server.restart();
    }

    /// True while it answers.
    pub fn is_running(&self) -> bool {
        self.server.is_running()
    }
}

/// Scopes of a token request, parsed as distribution's token server does (`type:name:actions`,
/// an optional `(class)` after the type); malformed ones are ignored, as there.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scope {
    kind: String,
    class: Option<String>,
    name: String,
    actions: Vec<String>,
}

fn parse_scope(s: &str) -> Option<Scope> {
    let mut parts = s.splitn(3, ':');
    let (kind, name, actions) = (parts.next()?, parts.next()?, parts.next()?);
    let (kind, class) = match kind.split_once('(') {
        Some((k, rest)) => (k, Some(rest.strip_suffix(')')?.to_string())),
        None => (kind, None),
    };
    let ok = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    };
    if !ok(kind) || class.as_deref().is_some_and(|c| !ok(c)) {
        return None;
    }
    Some(Scope {
        kind: kind.to_string(),
        class,
        name: name.to_string(),
        actions: actions
            .split(',')
            .filter(|a| !a.is_empty())
            .map(str::to_string)
            .collect(),
    })
}

/// Who is asking, once the credentials were checked.
enum Caller<'a> {
    User(&'a User),
    Anonymous(&'a [String]),
}

fn handle(state: &State, req: &Request) -> Response {
    if req.path() != TOKEN_PATH && req.path() != "/token/" {
        return Response::json(
            404,
            httpd::error_body("NOT_FOUND", "the token service answers at /token"),
        );
    }
    match req.method.as_str() {
        "GET" => get_token(state, req),
        "POST" => post_token(state, req),
        _ => Response::json(
            405,
            httpd::error_body("UNSUPPORTED", "The operation is unsupported."),
        )
        .with_header("Allow", "GET, POST"),
    }
}

/// The Docker token flow: credentials by Basic auth, `service` and `scope` in the query.
fn get_token(state: &State, req: &Request) -> Response {
    let query = req.query();
    let service = query
        .iter()
        .find(|(k, _)| k == "service")
        .map(|(_, v)| v.clone());
    // A scope parameter may hold several scopes separated by spaces.
    let scopes: Vec<String> = query
        .iter()
        .filter(|(k, _)| k == "scope")
        .flat_map(|(_, v)| v.split(' ').map(str::to_string).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect();
    let credentials = req.basic_auth();
    let mut entry = TokenRequest {
        method: "GET".into(),
        user: credentials.as_ref().map(|(u, _)| u.clone()),
        service: service.clone(),
        scopes: scopes.clone(),
        status: 401,
        granted: Vec::new(),
    };
    let caller = match &credentials {
        None => match &state.config.anonymous {
            Some(actions) => Caller::Anonymous(actions),
            None => {
                state.record(entry);
                return basic_challenge(DETAIL_NO_CREDENTIALS);
            }
        },
        Some((user, password)) => match find_user(state, user, password) {
            Some(u) => Caller::User(u),
            None => {
                state.record(entry);
                return basic_challenge(DETAIL_BAD_CREDENTIALS);
            }
        },
    };
    let (token, granted, now) = issue(state, &caller, service.as_deref().unwrap_or(""), &scopes);
    let ttl = state.config.ttl.as_secs();
    let body = format!(
        "{{\"token\":\"{token}\",\"access_token\":\"{token}\",\"expires_in\":{ttl},\"issued_at\":\"{}\"}}\n",
        pki::rfc3339(now)
    );
    entry.status = 200;
    entry.granted = granted;
    state.record(entry);
    // Without the charset, as distribution's token server sets it for a token.
    Response::new(200)
        .with_header("Content-Type", "application/json")
        .with_body(body)
}

/// The OAuth2 flow (`grant_type=password`), as distribution's token server implements it.
fn post_token(state: &State, req: &Request) -> Response {
    let form = req.form();
    let field = |k: &str| {
        form.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty())
    };
    let scopes: Vec<String> = field("scope")
        .unwrap_or_default()
        .split(' ')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    let mut entry = TokenRequest {
        method: "POST".into(),
        user: field("username"),
        service: field("service"),
        scopes: scopes.clone(),
        status: 400,
        granted: Vec::new(),
    };
    let bad = |entry: TokenRequest, code: &str, message: &str, detail: &str| {
        state.record(entry);
        Response::json(
            400,
            format!(
                "{{\"errors\":[{{\"code\":\"{code}\",\"message\":\"{message}\",\"detail\":{}}}]}}\n",
                serde_json::Value::from(detail)
            ),
        )
    };
    let Some(grant_type) = field("grant_type") else {
        return bad(
            entry,
            "MISSING_REQUIRED_FIELD",
            "missing required field",
            "missing grant_type value",
        );
    };
    let Some(service) = field("service") else {
        return bad(
            entry,
            "MISSING_REQUIRED_FIELD",
            "missing required field",
            "missing service value",
        );
    };
    if field("client_id").is_none() {
        return bad(
            entry,
            "MISSING_REQUIRED_FIELD",
            "missing required field",
            "missing client_id value",
        );
    }
    let user = match grant_type.as_str() {
        // No refresh token is ever issued, so none is valid.
        "refresh_token" => {
            entry.status = 401;
            state.record(entry);
            return Response::json(401, refusal_body("invalid refresh token"));
        }
        "password" => {
            let Some(name) = field("username") else {
                return bad(
                    entry,
                    "UNSUPPORTED_VALUE",
                    "unsupported value",
                    "missing username value",
                );
            };
            let Some(password) = field("password") else {
                return bad(
                    entry,
                    "UNSUPPORTED_VALUE",
                    "unsupported value",
                    "missing password value",
                );
            };
            match find_user(state, &name, &password) {
                Some(u) => u,
                None => {
                    entry.status = 401;
                    state.record(entry);
                    return Response::json(401, refusal_body(DETAIL_BAD_GRANT));
                }
            }
        }
        _ => {
            return bad(
                entry,
                "UNSUPPORTED_VALUE",
                "unsupported value",
                "unknown grant_type value",
            )
        }
    };
    let (token, granted, now) = issue(state, &Caller::User(user), &service, &scopes);
    let body = format!(
        "{{\"access_token\":\"{token}\",\"scope\":{},\"expires_in\":{},\"issued_at\":\"{}\"}}\n",
        serde_json::Value::from(granted.join(" ")),
        state.config.ttl.as_secs(),
        pki::rfc3339(now)
    );
    entry.status = 200;
    entry.granted = granted;
    state.record(entry);
    Response::new(200)
        .with_header("Content-Type", "application/json")
        .with_body(body)
}

fn find_user<'a>(state: &'a State, name: &str, password: &str) -> Option<&'a User> {
    state
        .config
        .users
        .iter()
        .find(|u| u.name == name && u.password == password)
}

fn basic_challenge(detail: &str) -> Response {
    Response::json(401, refusal_body(detail))
        .with_header("Www-Authenticate", format!("Basic realm=\"{BASIC_REALM}\""))
}

/// Signs a token for `caller` granting what it may of `scopes`; returns it, the grants
/// (`type:name:actions`) and the issue time.
fn issue(
    state: &State,
    caller: &Caller<'_>,
    service: &str,
    scopes: &[String],
) -> (String, Vec<String>, i64) {
    let allowed: Option<&[String]> = match caller {
        Caller::User(u) => u.actions.as_deref(),
        Caller::Anonymous(actions) => Some(actions),
    };
    let mut access: Vec<Scope> = Vec::new();
    for scope in scopes.iter().filter_map(|s| parse_scope(s)) {
        let actions: Vec<String> = scope
            .actions
            .iter()
            .filter(|a| allowed.is_none_or(|ok| ok.contains(a)))
            .cloned()
            .collect();
        // Scopes for the same resource are merged, as distribution's token server does.
        match access
            .iter_mut()
            .find(|a| a.kind == scope.kind && a.name == scope.name && a.class == scope.class)
        {
            Some(a) => {
                for action in actions {
                    if !a.actions.contains(&action) {
                        a.actions.push(action);
                    }
                }
            }
            None => access.push(Scope { actions, ..scope }),
        }
    }
    access.retain(|a| !a.actions.is_empty());
    let now = pki::unix_now();
    let subject = match caller {
        Caller::User(u) => u.name.as_str(),
        Caller::Anonymous(_) => "",
    };
    let claims = serde_json::json!({
        "iss": state.config.issuer,
        "sub": subject,
        "aud": service,
        "exp": now + state.config.ttl.as_secs() as i64,
        "nbf": now,
        "iat": now,
        "jti": state.signer.random_id(),
        "access": access.iter().map(|a| {
            let mut v = serde_json::json!({"type": a.kind, "name": a.name, "actions": a.actions});
            if let Some(class) = &a.class {
                v["class"] = class.clone().into();
            }
            v
        }).collect::<Vec<_>>(),
    });
    let granted = access
        .iter()
        .map(|a| format!("{}:{}:{}", a.kind, a.name, a.actions.join(",")))
        .collect();
    (state.signer.sign(&claims), granted, now)
}

// === TokenRegistry ===

/// How to start a [`TokenRegistry`].
#[derive(Debug, Clone)]
pub struct TokenRegistryBuilder {
    token: TokenConfig,
    proxy: Option<String>,
    tls: bool,
}

impl TokenRegistryBuilder {
    /// Adds a user.
    pub fn user(mut self, user: User) -> Self {
        self.token.users.push(user);
        self
    }

    /// Grants `actions` to token requests without credentials (see [`TokenConfig::anonymous`]).
    pub fn anonymous(mut self, actions: &[&str]) -> Self {
        self.token.anonymous = Some(actions.iter().map(|a| a.to_string()).collect());
        self
    }

    /// Makes the registry a pull-through cache of `upstream` (`http://127.0.0.1:port`): the
    /// cache's own clients need tokens, the upstream is read anonymously.
    pub fn proxy(mut self, upstream: &str) -> Self {
        self.proxy = Some(upstream.to_string());
        self
    }

    /// Serves the registry over HTTPS with a certificate for `127.0.0.1` and `localhost` from
    /// a CA made for it ([`TokenRegistry::ca`]); the token service stays plain HTTP.
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Sets `expires_in` of the tokens (distribution 2.8 accepts a token up to 60 s past its
    /// `exp`, so an expiry test must wait that much longer).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.token.ttl = ttl;
        self
    }

    /// Starts the token service, then the registry, and waits until the registry answers.
    pub fn start(self) -> TokenRegistry {
        let tokens = TokenService::start(self.token);
        let mut dist = Distribution::new("runr-token-registry-");
        let (ca, cert) = if self.tls {
            let ca = Ca::new("runr test registry CA");
            let cert = ca.issue(&["127.0.0.1", "localhost"], Validity::Current);
            (Some(ca), Some(cert))
        } else {
            (None, None)
        };
        let mut extra = format!(
            "auth:\n  token:\n    realm: {}\n    service: {SERVICE}\n    issuer: {}\n    \
             rootcertbundle: {}\n",
            tokens.url(),
            tokens.issuer(),
            tokens.signer_cert().display()
        );
        if let Some(url) = &self.proxy {
            extra.push_str(&format!("proxy:\n  remoteurl: {url}\n"));
        }
        dist.configure(
            extra,
            cert.as_ref()
                .map(|c: &ServerCert| (c.cert.clone(), c.key.clone())),
        );
        dist.start();
        TokenRegistry {
            dist,
            tokens,
            ca,
            _cert: cert,
        }
    }
}

/// The real `docker-registry` with `auth: token` (realm, service, issuer, rootcertbundle)
/// and the [`TokenService`] it sends its clients to. Both are stopped on drop, the storage and
/// keys removed.
pub struct TokenRegistry {
    dist: Distribution,
    tokens: TokenService,
    ca: Option<Ca>,
    _cert: Option<ServerCert>,
}

impl TokenRegistry {
    /// A registry whose token service knows one user, `user`/`password`, granted every scope
    /// it asks for; requests without credentials are refused.
    pub fn start(user: &str, password: &str) -> TokenRegistry {
        Self::builder(user, password).start()
    }

    /// A pull-through cache of `upstream` (`http://127.0.0.1:port`) whose own clients need a
    /// token for `user`/`password` (distribution 2.8 applies `auth` to a proxy's clients just
    /// as to a plain registry's; pushes to a cache are refused whatever the token says).
    pub fn start_proxy(upstream: &str, user: &str, password: &str) -> TokenRegistry {
        Self::builder(user, password).proxy(upstream).start()
    }

    /// A builder starting from one user, `user`/`password`, for more users, anonymous access,
    /// proxy mode or TLS.
    pub fn builder(user: &str, password: &str) -> TokenRegistryBuilder {
        TokenRegistryBuilder {
            token: TokenConfig::single(user, password),
            proxy: None,
            tls: false,
        }
    }

    /// The registry's `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.dist.addr()
    }

    /// The registry's `127.0.0.1:<port>` as a string, the form image references and skopeo use.
    pub fn host(&self) -> String {
        self.addr().to_string()
    }

    /// `http://127.0.0.1:<port>` (`https://` with [`TokenRegistryBuilder::tls`]).
    pub fn url(&self) -> String {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr())
    }

    /// The realm the registry sends clients to: `http://127.0.0.1:<port>/token`.
    pub fn token_url(&self) -> String {
        self.tokens.url()
    }

    /// The token service's `127.0.0.1:<port>`.
    pub fn token_addr(&self) -> SocketAddr {
        self.tokens.addr()
    }

    /// The token service, for its counters and log.
    pub fn tokens(&self) -> &TokenService {
        &self.tokens
    }

    /// Token requests answered so far, issued and refused.
    pub fn token_requests(&self) -> u64 {
        self.tokens.requests()
    }

    /// The CA of the registry's certificate, with [`TokenRegistryBuilder::tls`].
    pub fn ca(&self) -> Option<&Ca> {
        self.ca.as_ref()
    }

    /// Stops the registry and the token service; storage, keys and counters stay.
    pub fn stop(&mut self) {
        self.dist.stop();
        self.tokens.stop();
    }

    /// Starts both again on the same ports.
    pub fn restart(&mut self) {
        self.stop();
        self.tokens.restart();
        self.dist.restart();
    }

    /// Stops only the registry (its clients get connection refused).
    pub fn stop_registry(&mut self) {
        self.dist.stop();
    }

    /// Starts only the registry again, on the same port and storage.
    pub fn restart_registry(&mut self) {
        self.dist.restart();
    }

    /// Stops only the token service: the registry still answers 401 with its challenge, but
    /// no token can be had (connection refused at the realm).
    pub fn stop_token_service(&mut self) {
        self.tokens.stop();
    }

    /// Starts the token service again on the same port, same key.
    pub fn restart_token_service(&mut self) {
        self.tokens.restart();
    }

    /// The registry's storage root on disk (blobs under `docker/registry/v2/blobs`).
    pub fn storage(&self) -> PathBuf {
        self.dist.storage()
    }

    /// The registry's own log (info level: it says why it rejected a token).
    pub fn log(&self) -> String {
        self.dist.log()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base32_matches_rfc4648() {
        // RFC 4648 section 10, without padding.
        for (input, want) in [
            ("", ""),
            ("f", "MY"),
            ("fo", "MZXQ"),
            ("foo", "MZXW6"),
            ("foob", "MZXW6YQ"),
            ("fooba", "MZXW6YTB"),
            ("foobar", "MZXW6YTBOI"),
        ] {
            assert_eq!(base32(input.as_bytes()), want, "{input:?}");
        }
    }

    #[test]
    fn key_ids_have_libtrusts_shape() {
        let id = libtrust_key_id(b"any DER");
        let groups: Vec<&str> = id.split(':').collect();
        assert_eq!(groups.len(), 12, "{id}");
        assert!(groups.iter().all(|g| g.len() == 4));
        let digest = ring::digest::digest(&ring::digest::SHA256, b"any DER");
        assert_eq!(id.replace(':', ""), base32(&digest.as_ref()[..30]));
    }

    #[test]
    fn scopes_parse_like_distributions_token_server() {
        assert_eq!(
            parse_scope("repository:a/b:pull,push"),
            Some(Scope {
                kind: "repository".into(),
                class: None,
                name: "a/b".into(),
                actions: vec!["pull".into(), "push".into()],
            })
        );
        assert_eq!(
            parse_scope("repository(plugin):p:pull").map(|s| (s.kind, s.class)),
            Some(("repository".into(), Some("plugin".into())))
        );
        assert_eq!(
            parse_scope("registry:catalog:*").map(|s| s.actions),
            Some(vec!["*".to_string()])
        );
        // Only two parts, a bad type, a bad class: ignored.
        for bad in [
            "repository:a",
            "Repo:a:pull",
            "repository(X):a:pull",
            "(x):a:b",
        ] {
            assert_eq!(parse_scope(bad), None, "{bad}");
        }
        // The third part keeps any further colons (splitN 3).
        assert_eq!(
            parse_scope("repository:a:pull:x").map(|s| s.actions),
            Some(vec!["pull:x".to_string()])
        );
    }

    #[test]
    fn refusals_are_distributions_bytes() {
        assert_eq!(
            refusal_body(DETAIL_BAD_CREDENTIALS),
            "{\"errors\":[{\"code\":\"UNAUTHORIZED\",\"message\":\"authentication required\",\
             \"detail\":\"basic authentication challenge for realm \\\"runr-test-token\\\": \
             authentication failure\"}]}\n"
        );
    }
}
