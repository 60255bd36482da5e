//! The follower: pushes blobs while the upload arrives, reading the data file behind the
//! contiguous prefix the upload half publishes ([`Prefix`]).
//!
//! One walker thread reads the file as a stream ([`FollowReader`]: at the end of the prefix it
//! waits for the prefix to grow), detects a plain tar from the first bytes and walks its headers
//! in order. What it can push before `complete` it hands to the async side, which pushes
//! [`PUSH_CONCURRENCY`] at a time through the same `Pusher` code as the after-complete pass
//! (the retry policy, the progress, a HEAD first where the digest is known before the body):
//! - an OCI blob (`blobs/sha256/<hex>`) of at least [`STREAM_MIN`] bytes: its digest is its name,
//!   so its push starts at its tar header and each block is sent once the prefix holds it; the
//!   stream hashes what it sends and fails before the commit when the bytes do not match;
//! - a classic layer (`<id>/layer.tar`, or skopeo's `<hex>.tar`) of at least [`STREAM_MIN`]
//!   bytes, uncompressed in the archive: its digest is known only at its end, so it goes in a
//!   chunked upload whose one `PATCH` follows the prefix from the layer's tar header on, as it
//!   is with `RUNR_UPLOAD_COMPRESS=none` or gzip'ed as it arrives with `gzip`
//!   ([`compress::gzip_blocks`], the pass's own compressor), and whose `PUT ?digest=` at the
//!   layer's end names the digest the stream worked out (see `push::chunked`). With `none`, a
//!   layer the prefix already holds whole when the walk reaches it (a restarted receiver) is
//!   hashed first and pushed under that digest, after a `HEAD`. The follower cannot know a
//!   layer's diff_id (the config, and `manifest.json`, come after the layers in Docker's
//!   order): it records what the layer made ([`Streamed::made`], under [`layer_key`]), and the
//!   pass checks that diff_id against the config before any manifest names the blob. Layers
//!   are gzip'ed one at a time (each compression takes both cores); one whose turn comes after
//!   `complete` began is still the follower's, which streams it with no copy on disk.
//!
//! A whole archive compressed with gzip, xz or zstd is walked through a decoder that reads
//! behind the prefix ([`Packed::following`]): the walk is the pass's own index pass
//! ([`Archive::index_packed`]), whose [`Tee`] hands each blob's bytes (a classic layer's gzip
//! members, with `gzip`) to a push as they are decoded (`push::teed`: one attempt each, the
//! decoder moving forward only); documents stay in the index's memory for the pass. The walk
//! goes on after `complete` to the end of the stream, and the index it made is left for the
//! pass ([`Streamed::followed_index`]), which then decodes nothing again.
//!
//! Everything else is left to the after-complete pass: small blobs of a plain tar (configs,
//! manifests, small layers: one request each), a wasm module,
//! classic layers that are gzip'ed already (checked against their diff_id first), and every
//! blob whose header the walk reaches only once the whole file is there (chunks sent out of
//! order, a last chunk first): then `complete` is next, and hashing or pushing beside the pass
//! would only compete with it. Nothing the follower does is visible: it pushes blobs only,
//! never a manifest or a tag; those come after `complete` verified the file, and a file that
//! fails verification leaves only unreferenced blobs, which the registry's garbage collection
//! removes.
//!
//! [`Streamed`] is where the follower and the pass meet: each blob is claimed once, by whichever
//! comes first; the pass waits for a blob the follower is pushing and pushes it itself when the
//! follower's push failed. A kill -9 loses nothing: the restarted receiver follows the prefix
//! again from byte 0; what the registry has costs a HEAD, except a classic layer gzip'ed as it
//! arrives (its digest is known only at its end), which is sent again.

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

use tar::EntryType;
use tokio::sync::{oneshot, watch};

use crate::image::archive::{Archive, Reading, Sink, Tee};
use crate::image::compress::{self, Compress, Compression, Packed};
use crate::image::pipeline::{ProcessOptions, PUSH_CONCURRENCY};
use crate::image::push::{Fed, Feed, Pusher};
use crate::image::span::{Source, Span, SpanReader};
use crate::prefix::{FollowReader, Gone, Prefix};
use crate::progress::Progress;

/// Blobs below this size are left to the after-complete pass: their push is one short request,
/// and the JSON documents of an archive (configs, manifests, indexes) are all below it.
pub const STREAM_MIN: u64 = 1 << 20;

/// Classic layers gzip'ed at once (the follower's and the pass's together): the process has
/// one compressor ([`compress::gzip_blocks`]), and a layer waits for its turn here rather than
/// on a blocking thread.
const GZIP_CONCURRENCY: usize = 1;

/// What one claim of a blob by the pass found.
#[derive(Debug)]
pub enum Claim {
    /// The pass pushes it (and counts it in the progress).
    Mine,
    /// The follower has it (counted already): `Some(true)` once it is in the registry,
    /// `Some(false)` when its push failed and the pass must push it after all.
    Follower(watch::Receiver<Option<bool>>),
}

impl Claim {
    /// True when the follower counted the blob already.
    pub fn counted(&self) -> bool {
        matches!(self, Claim::Follower(_))
    }

    /// Waits for the follower's push: true when the blob is in the registry (the pass then
    /// skips it).
    pub async fn pushed(self) -> bool {
        match self {
            Claim::Mine => false,
            Claim::Follower(mut rx) => {
                let _ = rx.wait_for(Option::is_some).await;
                let done = *rx.borrow();
                done == Some(true)
            }
        }
    }
}

#[derive(Debug, Default)]
struct Claims {
    generation: u64,
    /// The push's progress was started (by the follower or the pass) in this generation.
    started: bool,
    follower: HashMap<String, watch::Receiver<Option<bool>>>,
    pass: HashSet<String>,
    /// What the classic layers the follower pushed made, by [`layer_key`].
    made: HashMap<String, compress::Made>,
    /// The index of a whole compressed archive the follower of this generation walks.
    index: Option<Arc<IndexSlot>>,
}

/// Where the follower leaves the index of a whole compressed archive it walked while it
/// arrived: the pass after `complete` waits for it and takes it instead of decoding the
/// archive again.
#[derive(Debug)]
struct IndexSlot {
    /// True once the walk ended (with an index or without).
    ended: watch::Sender<bool>,
    archive: Mutex<Option<Archive>>,
}

/// The follower's hold on its [`IndexSlot`]: however the walk ends (a panic included), the
/// pass stops waiting.
struct Indexing(Arc<IndexSlot>);

impl Indexing {
    fn finish(self, archive: Archive) {
        *self.0.archive.lock().unwrap_or_else(|e| e.into_inner()) = Some(archive);
    }
}

impl Drop for Indexing {
    fn drop(&mut self) {
        self.0.ended.send_replace(true);
    }
}

impl Claims {
    /// False for a stale generation; a newer one starts over.
    fn sync(&mut self, generation: u64) -> bool {
        if generation > self.generation {
            *self = Claims {
                generation,
                ..Claims::default()
            };
        }
        generation == self.generation
    }
}

/// Which blobs of this generation of the upload the follower took, shared with the pass.
#[derive(Debug)]
pub struct Streamed {
    prefix: Arc<Prefix>,
    claims: Mutex<Claims>,
    /// Classic layers gzip'ed at once, by the follower and the pass together: a compression
    /// takes both cores, and the one compressor serves one layer at a time.
    gzip: Arc<tokio::sync::Semaphore>,
}

impl Default for Streamed {
    fn default() -> Streamed {
        Streamed::new(Arc::default())
    }
}

impl Streamed {
    /// Claims behind `prefix` (the upload's).
    pub fn new(prefix: Arc<Prefix>) -> Streamed {
        Streamed {
            prefix,
            claims: Mutex::default(),
            gzip: Arc::new(tokio::sync::Semaphore::new(GZIP_CONCURRENCY)),
        }
    }

    /// Waits for a turn to gzip a classic layer (see [`Streamed::gzip`]).
    pub async fn gzip_turn(&self) -> tokio::sync::OwnedSemaphorePermit {
        self.gzip
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pass of the current generation begins: the follower starts nothing new.
    pub fn begin_pass(&self) -> u64 {
        let (generation, _) = self.prefix.current();
        // Closed under the claims' lock: a walk of a compressed archive either began before
        // (and the pass waits for its index) or does not begin.
        let mut claims = self.lock();
        self.prefix.close(generation);
        claims.sync(generation);
        generation
    }

    /// The follower of `generation` begins to index a whole compressed archive, unless the
    /// pass began.
    fn begin_index(&self, generation: u64) -> Option<Indexing> {
        let mut claims = self.lock();
        if !claims.sync(generation) || self.prefix.is_closed(generation) {
            return None;
        }
        let slot = Arc::new(IndexSlot {
            ended: watch::channel(false).0,
            archive: Mutex::new(None),
        });
        claims.index = Some(slot.clone());
        Some(Indexing(slot))
    }

    /// The index of the whole compressed archive the follower of `generation` walked while it
    /// arrived, once its walk ended (its pushes are claimed: the pass waits for those by their
    /// claims); `None` when it did not walk one, or could not finish (the pass indexes the
    /// archive itself then).
    pub async fn followed_index(&self, generation: u64) -> Option<Archive> {
        let slot = {
            let mut claims = self.lock();
            if !claims.sync(generation) {
                return None;
            }
            claims.index.clone()?
        };
        let mut ended = slot.ended.subscribe();
        let _ = ended.wait_for(|e| *e).await;
        let archive = slot
            .archive
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        archive
    }

    /// The pass starts pushing: the progress starts from zero unless the follower already
    /// counts into it.
    pub fn start_progress(&self, generation: u64, progress: &Progress) {
        let mut claims = self.lock();
        if claims.sync(generation) && !claims.started {
            progress.start();
            claims.started = true;
        }
    }

    /// The pass takes `digest`, unless the follower has it.
    pub fn claim(&self, generation: u64, digest: &str) -> Claim {
        let mut claims = self.lock();
        if !claims.sync(generation) {
            return Claim::Mine;
        }
        if let Some(rx) = claims.follower.get(digest) {
            return Claim::Follower(rx.clone());
        }
        claims.pass.insert(digest.to_string());
        Claim::Mine
    }

    /// What the classic layer under `key` ([`layer_key`]) made, when the follower of
    /// `generation` pushed it (its claim said so).
    pub fn made(&self, generation: u64, key: &str) -> Option<compress::Made> {
        let mut claims = self.lock();
        if !claims.sync(generation) {
            return None;
        }
        claims.made.get(key).cloned()
    }

    fn record(&self, generation: u64, key: &str, made: compress::Made) {
        let mut claims = self.lock();
        if claims.sync(generation) {
            claims.made.insert(key.to_string(), made);
        }
    }

    /// The follower of `generation` takes `digest` of `size` bytes and counts it, unless it is
    /// taken (or the generation is over, or `complete` began and it is not `after_complete`);
    /// the sender says how its push ended.
    fn take(
        &self,
        generation: u64,
        digest: &str,
        size: u64,
        progress: &Progress,
        after_complete: bool,
    ) -> Option<watch::Sender<Option<bool>>> {
        let mut claims = self.lock();
        if !claims.sync(generation)
            || (self.prefix.is_closed(generation) && !after_complete)
            || claims.pass.contains(digest)
            || claims.follower.contains_key(digest)
        {
            return None;
        }
        if !claims.started {
            progress.start();
            claims.started = true;
        }
        progress.add_blob(size);
        let (tx, rx) = watch::channel(None);
        claims.follower.insert(digest.to_string(), rx);
        Some(tx)
    }
}

/// The claim of the uncompressed classic layer at `span`: its digest (as it is or gzip'ed) is
/// known only at its end, its place in the archive from its header on.
pub fn layer_key(span: Span) -> String {
    format!("layer:{}+{}", span.offset, span.len)
}

/// A blob the walker found.
struct Job {
    /// Its digest, or a classic layer's [`layer_key`].
    digest: String,
    span: Span,
    kind: JobKind,
    /// Its name in the archive, for messages.
    name: String,
}

enum JobKind {
    /// Its digest is its name: pushed as the prefix grows.
    Named,
    /// A classic layer whole in the file and hashed (`none`): pushed under that digest.
    Hashed(String),
    /// A classic layer whose diff_id the documents before it name (`none`): pushed as the
    /// prefix grows under that digest, after a HEAD, checked before the commit.
    Expected(String),
    /// A classic layer, uncompressed: pushed as the prefix grows, gzip'ed with `gzip`.
    Arriving,
    /// A blob of a whole compressed archive, fed by the walk from its decoder: the sender gets
    /// the walker's end of its body (none when it is not pushed).
    Teed(Fed, oneshot::Sender<Option<Feed>>),
}

/// Follows the upload in `file` (of `size` bytes) for as long as the receiver runs: one walk
/// per generation (a digest mismatch reopens the upload and starts the next).
pub async fn follow(file: Arc<File>, size: u64, opts: Arc<ProcessOptions>) {
    let prefix = opts.streamed.prefix.clone();
    loop {
        let (generation, _) = prefix.current();
        follow_generation(&file, size, &opts, generation).await;
        if !prefix.next_generation(generation).await {
            return;
        }
    }
}

async fn follow_generation(
    file: &Arc<File>,
    size: u64,
    opts: &Arc<ProcessOptions>,
    generation: u64,
) {
    let prefix = opts.streamed.prefix.clone();
    let (tx, mut jobs) = tokio::sync::mpsc::channel::<Job>(1);
    let walker = {
        let file = file.clone();
        let streamed = opts.streamed.clone();
        let compress = opts.compress;
        std::thread::Builder::new()
            .name("follower".into())
            .spawn(move || walk(&file, &streamed, generation, size, compress, &tx))
    };
    // Not joined: it ends at its next wait or send once this side is gone.
    if let Err(e) = walker {
        tracing::warn!(error = %e, "cannot start the follower: everything is pushed after complete");
        return;
    }
    let permits = Arc::new(tokio::sync::Semaphore::new(PUSH_CONCURRENCY));
    let mut pushes = tokio::task::JoinSet::new();
    let mut pusher: Option<Arc<Pusher>> = None;
    while let Some(job) = jobs.recv().await {
        let gzip = matches!(job.kind, JobKind::Arriving) && opts.compress == Compress::Gzip;
        // A layer to gzip counts its bytes once they are known (compressed).
        let counted = match job.kind {
            JobKind::Teed(Fed::Gzipping, _) => 0,
            _ if gzip => 0,
            _ => job.span.len,
        };
        // A walk of a compressed archive goes on after `complete`: the pass waits for it.
        let teed = matches!(job.kind, JobKind::Teed(..));
        let Some(done) = opts
            .streamed
            .take(generation, &job.digest, counted, &opts.progress, teed)
        else {
            // Dropped with the job, a fed blob's sender tells the walker to go on without it.
            continue;
        };
        let p = match &pusher {
            Some(p) => p.clone(),
            None => {
                match Pusher::new(
                    &opts.target,
                    &opts.registry,
                    runr_registry::Backoff::default(),
                    opts.progress.clone(),
                )
                .await
                {
                    Ok(p) => pusher.insert(Arc::new(p)).clone(),
                    Err(e) => {
                        // The pass reports it.
                        tracing::warn!(error = %e, "the follower cannot push");
                        done.send_replace(Some(false));
                        break;
                    }
                }
            }
        };
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let file = file.clone();
        let prefix = prefix.clone();
        let streamed = opts.streamed.clone();
        let compress = opts.compress;
        pushes.spawn(async move {
            // Taken even when the turn comes after `complete` began: the layer was claimed
            // before, the pass waits for it, and the follower streams it with no copy on disk.
            let _gzip = match gzip {
                true => Some(streamed.gzip_turn().await),
                false => None,
            };
            let pushed = match job.kind {
                JobKind::Teed(fed, ready) => {
                    let layer = fed != Fed::Named(job.digest.clone());
                    let gzip = fed == Fed::Gzipping;
                    p.push_fed(fed, job.span.len, &job.name, ready)
                        .await
                        .map(|made| match made {
                            Some(made) if layer => {
                                tracing::info!(layer = %job.name, diff_id = %made.0, digest = %made.1, size = made.2, gzip, "layer pushed while the upload arrives");
                                streamed.record(generation, &job.digest, made);
                            }
                            _ => {}
                        })
                }
                JobKind::Named => p
                    .push_following(
                        &Source::File(file),
                        job.span,
                        &job.digest,
                        "blob",
                        (prefix, generation),
                    )
                    .await
                    .map(|_| ()),
                JobKind::Expected(diff_id) => p
                    .push_following(
                        &Source::File(file),
                        job.span,
                        &diff_id,
                        "layer",
                        (prefix, generation),
                    )
                    .await
                    .map(|_| {
                        let made = (diff_id.clone(), diff_id.clone(), job.span.len);
                        streamed.record(generation, &job.digest, made);
                    }),
                // Hashed by the walker from bytes that never change: no second hash.
                JobKind::Hashed(digest) => p
                    .push_own_file(&Source::File(file), job.span, &digest, "layer")
                    .await
                    .map(|_| {
                        let made = (digest.clone(), digest.clone(), job.span.len);
                        streamed.record(generation, &job.digest, made);
                    }),
                JobKind::Arriving => p
                    .push_arriving(&file, job.span, &job.name, compress, (prefix, generation))
                    .await
                    .map(|made| {
                        tracing::info!(layer = %job.name, diff_id = %made.0, digest = %made.1, size = made.2, gzip, "layer pushed while the upload arrives");
                        streamed.record(generation, &job.digest, made);
                    }),
            };
            match &pushed {
                Ok(_) => tracing::info!(digest = %job.digest, "blob pushed while the upload arrives"),
                Err(e) => tracing::info!(digest = %job.digest, error = %e, "the follower's push failed: the pass after complete pushes this blob"),
            }
            done.send_replace(Some(pushed.is_ok()));
            drop(permit);
        });
    }
    while pushes.join_next().await.is_some() {}
}

/// Walks the tar behind the prefix, sending what the follower can push; returns at the end of
/// the archive, at the first thing it cannot follow, or when the generation closes.
fn walk(
    file: &Arc<File>,
    streamed: &Arc<Streamed>,
    generation: u64,
    size: u64,
    compress: Compress,
    jobs: &tokio::sync::mpsc::Sender<Job>,
) {
    match walk_tar(file, streamed, generation, size, compress, jobs) {
        Ok(()) => tracing::debug!("the follower reached the end of the archive"),
        Err(why) => {
            tracing::debug!(%why, "the follower stops: the pass after complete does the rest")
        }
    }
}

fn walk_tar(
    file: &Arc<File>,
    streamed: &Arc<Streamed>,
    generation: u64,
    size: u64,
    compress: Compress,
    jobs: &tokio::sync::mpsc::Sender<Job>,
) -> Result<(), String> {
    let prefix = &streamed.prefix;
    let gone = |e: Gone| e.to_string();
    let n = size.min(512);
    prefix.wait(generation, n).map_err(gone)?;
    let mut head = vec![0u8; n as usize];
    file.read_exact_at(&mut head, 0)
        .map_err(|e| e.to_string())?;
    match compress::recognise(&head) {
        Some(kind @ (Compression::Gzip | Compression::Xz | Compression::Zstd)) => {
            return walk_packed(file, streamed, generation, size, kind, compress, jobs);
        }
        Some(other) => return Err(format!("{}: not followed", other.name())),
        None => {}
    }
    if n < 512 || &head[257..262] != b"ustar" {
        return Err("not a plain tar: not followed".into());
    }
    let reader = FollowReader::new(file.clone(), prefix.clone(), generation, size);
    let mut documents = Documents::default();
    let mut tar = tar::Archive::new(reader);
    for entry in tar.entries_with_seek().map_err(|e| e.to_string())? {
        let entry = entry.map_err(|e| e.to_string())?;
        if prefix.is_closed(generation) {
            return Err("complete began".into());
        }
        if !matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        ) {
            continue;
        }
        let span = Span {
            offset: entry.raw_file_position(),
            len: entry.size(),
        };
        if span.offset.saturating_add(span.len) > size {
            continue;
        }
        let raw = entry.path_bytes();
        let name = String::from_utf8_lossy(&raw).into_owned();
        let name = name.trim_start_matches("./");
        if span.len < STREAM_MIN {
            if name.ends_with(".json") && !name.contains('/') {
                documents.keep(file, prefix, generation, name, span)?;
            }
            continue;
        }
        if prefix.current().1 >= size {
            // Everything arrived before the walk got here (the chunks came out of order, or
            // faster than it walks): `complete` is next, and the pass does the rest at once.
            return Err("the whole file is there: the pass after complete pushes the rest".into());
        }
        let job = if let Some(hex) = name.strip_prefix("blobs/sha256/").filter(|h| is_hex64(h)) {
            Job {
                digest: format!("sha256:{hex}"),
                span,
                kind: JobKind::Named,
                name: name.to_string(),
            }
        } else if name.ends_with(".tar") && !name.starts_with("blobs/") {
            let mut magic = [0u8; 6];
            prefix
                .wait(generation, span.offset + magic.len() as u64)
                .map_err(gone)?;
            file.read_exact_at(&mut magic, span.offset)
                .map_err(|e| e.to_string())?;
            if compress::recognise(&magic).is_some() {
                // Compressed already: the pass checks it against its diff_id first.
                continue;
            }
            let kind = if compress == Compress::Gzip {
                JobKind::Arriving
            } else if let Some(diff_id) = documents.diff_id(name) {
                // The config came first and names it: pushed under that digest, after a HEAD.
                JobKind::Expected(diff_id)
            } else if prefix.current().1 >= span.offset + span.len {
                // Here already (a restarted receiver): its digest first, so that a layer the
                // registry has costs a HEAD.
                let mut reader = SpanReader::hashing(file.clone(), span);
                reader.consume().map_err(|e| e.to_string())?;
                JobKind::Hashed(reader.digest().expect("a hashing reader"))
            } else {
                JobKind::Arriving
            };
            Job {
                digest: layer_key(span),
                span,
                kind,
                name: name.to_string(),
            }
        } else {
            continue;
        };
        if jobs.blocking_send(job).is_err() {
            return Err("the follower stopped".into());
        }
    }
    Ok(())
}

/// The small JSON documents of a classic archive the walk passed (`manifest.json`, the
/// configs), so that a layer that comes after them is known by its diff_id from its first byte
/// (`docker save` of Docker ≤ 24 writes `manifest.json` last, other tools first).
#[derive(Default)]
struct Documents {
    held: HashMap<String, Vec<u8>>,
    bytes: u64,
}

/// Documents held by the walk, at most: those of one image.
const MAX_DOCUMENTS: u64 = 16 << 20;

impl Documents {
    /// Holds the document `name` at `span` once the prefix holds it (it is small).
    fn keep(
        &mut self,
        file: &File,
        prefix: &Prefix,
        generation: u64,
        name: &str,
        span: Span,
    ) -> Result<(), String> {
        if self.bytes + span.len > MAX_DOCUMENTS {
            return Ok(());
        }
        prefix
            .wait(generation, span.offset + span.len)
            .map_err(|e| e.to_string())?;
        let mut doc = vec![0u8; span.len as usize];
        file.read_exact_at(&mut doc, span.offset)
            .map_err(|e| e.to_string())?;
        self.bytes += span.len;
        self.held.insert(name.to_string(), doc);
        Ok(())
    }

    /// The diff_id the config of the image listing `layer` in `manifest.json` gives it.
    fn diff_id(&self, layer: &str) -> Option<String> {
        let manifest: serde_json::Value =
            serde_json::from_slice(self.held.get("manifest.json")?).ok()?;
        manifest.as_array()?.iter().find_map(|image| {
            let at = image["Layers"]
                .as_array()?
                .iter()
                .position(|l| l.as_str().map(|l| l.trim_start_matches("./")) == Some(layer))?;
            let config = image["Config"].as_str()?.trim_start_matches("./");
            let config: serde_json::Value = serde_json::from_slice(self.held.get(config)?).ok()?;
            let diff_id = config["rootfs"]["diff_ids"].get(at)?.as_str()?;
            runr_registry::is_sha256(diff_id).then(|| diff_id.to_string())
        })
    }
}

/// Walks a whole compressed archive behind the prefix: the index pass of the pass after
/// `complete` ([`Archive::index_packed`]) run on a decoder that waits for the prefix, its tee
/// pushing the blobs from that one decode. The index it makes is left for the pass.
fn walk_packed(
    file: &Arc<File>,
    streamed: &Arc<Streamed>,
    generation: u64,
    size: u64,
    kind: Compression,
    compress: Compress,
    jobs: &tokio::sync::mpsc::Sender<Job>,
) -> Result<(), String> {
    let prefix = &streamed.prefix;
    let follow = (prefix.clone(), generation);
    let limit = compress::expansion_limit(size);
    let packed =
        Packed::following(file.clone(), size, kind, limit, follow).map_err(|e| e.to_string())?;
    let packed = Arc::new(packed);
    // The first decompressed bytes: what the pass's detection reads first.
    let mut first = vec![0u8; 512];
    let mut n = 0;
    while n < first.len() {
        match packed.read_at(&mut first[n..], n as u64) {
            Ok(0) => break,
            Ok(got) => n += got,
            Err(e) => return Err(e.to_string()),
        }
    }
    first.truncate(n);
    if n < 512 || &first[257..262] != b"ustar" || compress::recognise(&first[..16]).is_some() {
        return Err(format!(
            "{}: not a compressed tar: not followed",
            kind.name()
        ));
    }
    if prefix.current().1 >= size {
        return Err("the whole file is there: the pass after complete does it all".into());
    }
    let Some(indexing) = streamed.begin_index(generation) else {
        return Err("complete began".into());
    };
    let mut tee = Teeing { jobs, compress };
    match Archive::index_packed(packed, first, compress == Compress::Gzip, &mut tee) {
        Ok(archive) => {
            indexing.finish(archive);
            Ok(())
        }
        // The pass indexes it again, and says what is wrong in its own terms.
        Err(Ok(e)) => Err(e.to_string()),
        Err(Err(e)) => Err(e.to_string()),
    }
}

/// The follower's [`Tee`]: each blob the index pass of a compressed archive reads is offered
/// to the push, which takes its bytes unless it is taken (or, named by its digest, in the
/// registry already). Documents are left to the pass (held in memory by the index), and so are
/// classic layers gzip'ed in the archive (their diff_id is checked first).
struct Teeing<'a> {
    jobs: &'a tokio::sync::mpsc::Sender<Job>,
    compress: Compress,
}

impl Tee for Teeing<'_> {
    fn entry(
        &mut self,
        name: &str,
        span: Span,
        head: &[u8],
        reading: Reading,
    ) -> Option<Box<dyn Sink>> {
        if reading == Reading::Held {
            return None;
        }
        let (digest, fed) =
            if let Some(hex) = name.strip_prefix("blobs/sha256/").filter(|h| is_hex64(h)) {
                let digest = format!("sha256:{hex}");
                (digest.clone(), Fed::Named(digest))
            } else if name.ends_with(".tar") && !name.starts_with("blobs/") {
                match (reading, self.compress) {
                    (Reading::Gzipping, _) => (layer_key(span), Fed::Gzipping),
                    (_, Compress::None) if compress::recognise(head).is_none() => {
                        (layer_key(span), Fed::Layer)
                    }
                    _ => return None,
                }
            } else {
                return None;
            };
        let (ready, feed) = oneshot::channel();
        let job = Job {
            digest,
            span,
            kind: JobKind::Teed(fed, ready),
            name: name.to_string(),
        };
        self.jobs.blocking_send(job).ok()?;
        let feed = feed.blocking_recv().ok()??;
        Some(Box::new(feed))
    }
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
