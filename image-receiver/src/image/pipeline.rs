//! What happens to a verified upload: work out what the file is, push it into the registry and
//! read the tag back.
//!
//! The upload half calls [`process`] (through the processor `serve` builds) from the background
//! task of `POST /complete` once the size and SHA-256 of the file are verified; what it returns
//! becomes the `image` (or the `message`) of `GET /status`.
//!
//! This is the pass after `complete`: it reads the whole verified file and pushes every blob the
//! follower ([`crate::image::follow`]) did not push while the upload arrived (each blob claimed
//! once through [`Streamed`]), then the manifests, indexes and the tag. A whole compressed
//! archive the follower indexed while it arrived is not decoded again: the pass takes that
//! index.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt as _, StreamExt as _, TryStreamExt as _};
use runr_registry::{sha256_digest, Backoff};
use serde::Serialize;
use serde_json::Value;

use crate::image::compress;
pub use crate::image::compress::Compress;
use crate::image::follow::{layer_key, Claim, Streamed};
use crate::image::formats::docker::{DockerImage, DockerLayer};
use crate::image::formats::oci::OciImage;
use crate::image::formats::wasm::WasmModule;
use crate::image::formats::{self, media, DetectOptions, Detected, RawManifest};
use crate::image::push::{PushError, Pusher};
use crate::image::span::{Source, Span, SpanReader};
use crate::progress::Progress;

/// Blobs pushed at once (across the layers of one image and across platforms): the registry
/// takes parallel uploads faster than one at a time (the distribution registry: 1 GiB in four
/// layers 3.71 s one at a time, 2.63 s two, 2.40 s four at a time), and each blob in flight
/// holds about a read block of memory.
pub const PUSH_CONCURRENCY: usize = 4;

/// Classic layers compressed (or gzip'ed ones decompressed to check their diff_id) at once:
/// one, since each uses both cores; the others push meanwhile.
const CPU_CONCURRENCY: usize = 1;

/// Everything [`process`] needs to know besides the file.
#[derive(Debug, Clone)]
pub struct ProcessOptions {
    /// `RUNR_UPLOAD_DIR`: the only place where temporary files may be written.
    pub work_dir: PathBuf,
    /// `RUNR_UPLOAD_TARGET`: `host[:port]/path/repository:tag`, where the image goes.
    pub target: String,
    /// `RUNR_UPLOAD_NAME`: `repository[:tag]`, picks one image out of an archive of several.
    pub upload_name: Option<String>,
    /// `RUNR_UPLOAD_FILENAME`: the user's file name, only used in messages.
    pub filename: Option<String>,
    /// `RUNR_UPLOAD_COMPRESS`.
    pub compress: Compress,
    /// How to reach the registry.
    pub registry: runr_registry::RegistryConfig,
    /// Where the push counts blobs and bytes (the upload's, shown by `GET /status`).
    pub progress: Arc<Progress>,
    /// The blobs the follower pushes while the upload arrives (none when it does not run).
    pub streamed: Arc<Streamed>,
}

/// The blobs of one pass and who pushes each: the follower's claims of this generation.
struct Pass<'a> {
    streamed: &'a Streamed,
    generation: u64,
}

impl Pass<'_> {
    /// Claims `digest` for this pass and counts it (`size` bytes, 0 while unknown) unless the
    /// follower did.
    fn claim(&self, progress: &Progress, digest: &str, size: u64) -> Claim {
        let claim = self.streamed.claim(self.generation, digest);
        if !claim.counted() {
            progress.add_blob(size);
        }
        claim
    }
}

/// [`Pusher::push_span`], unless the follower pushed the blob already.
async fn push_claimed(
    pusher: &Pusher,
    claim: Claim,
    file: &Source,
    span: Span,
    digest: &str,
    what: &str,
) -> Result<bool, PushError> {
    if claim.pushed().await {
        return Ok(false);
    }
    pusher.push_span(file, span, digest, what).await
}

/// What was pushed: the `image` object of `GET /status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ImageInfo {
    /// Digest of the manifest (or index) the tag points at.
    pub digest: String,
    /// Media type of that manifest (or index).
    pub media_type: String,
    /// `os/arch[/variant]` of every platform pushed (`wasip1/wasm` or `wasip2/wasm` for a module).
    pub platforms: Vec<String>,
    /// Number of layers (summed over platforms for an index).
    pub layers: usize,
    /// Bytes of config and layer blobs the image references (each distinct blob once).
    pub size_bytes: u64,
    /// The pushed tag, `host[:port]/path/repository:tag`.
    pub tag_ref: String,
    /// The same image by digest, `host[:port]/path/repository@sha256:…`.
    pub image_ref: String,
    /// `image` or `wasm`.
    pub kind: Kind,
    /// `docker`, `oci` or `wasm`: what the file was.
    pub source_format: SourceFormat,
    /// Anything the user should know, e.g. platforms left out because the file lacks their blobs.
    pub note: Option<String>,
}

/// What kind of artifact was pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A container image (manifest or index).
    Image,
    /// A WebAssembly module as a CNCF wasm OCI artifact.
    Wasm,
}

/// The format the file was detected as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceFormat {
    /// A classic `docker save` (or podman) archive: manifest.json, no OCI layout.
    Docker,
    /// An OCI image layout (including Docker ≥ 25 archives and `ctr export`).
    Oci,
    /// A WebAssembly module.
    Wasm,
}

/// Why an upload could not be turned into an image in the registry. The message is meant for the
/// user: it names the file, entry or digest at fault and what to do.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ProcessError {
    /// The user-facing explanation.
    pub message: String,
}

impl ProcessError {
    /// An error with `message`.
    fn new(message: impl Into<String>) -> Self {
        ProcessError {
            message: message.into(),
        }
    }
}

/// Detects what `file` holds, pushes it to `opts.target` and reads the tag back, requiring the
/// digest it pushed. Nothing is tagged unless everything it references was pushed.
pub async fn process(file: &Path, opts: &ProcessOptions) -> Result<ImageInfo, ProcessError> {
    process_with(file, opts, Backoff::default()).await
}

/// [`process`] with a chosen backoff between retries.
pub async fn process_with(
    file: &Path,
    opts: &ProcessOptions,
    backoff: Backoff,
) -> Result<ImageInfo, ProcessError> {
    // The follower starts nothing new from here; what it has in flight, the pass waits for.
    let pass = Pass {
        streamed: &opts.streamed,
        generation: opts.streamed.begin_pass(),
    };
    let label = opts
        .filename
        .clone()
        .or_else(|| file.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "the upload".into());
    let in_file = |e: String| ProcessError::new(format!("{label}: {e}"));
    // A whole compressed archive the follower indexed while it arrived (the same index pass,
    // over the same bytes) is not decoded again.
    let indexed = opts.streamed.followed_index(pass.generation).await;
    if indexed.is_some() {
        tracing::info!("the compressed archive was indexed while it arrived");
    }
    let detected = {
        let path = file.to_path_buf();
        let upload_name = opts.upload_name.clone();
        let gzip_layers = opts.compress == Compress::Gzip;
        tokio::task::spawn_blocking(move || {
            let opts = DetectOptions {
                upload_name: upload_name.as_deref(),
                expansion_limit: compress::expansion_limit,
                gzip_layers,
            };
            match indexed {
                Some(archive) => formats::detect_indexed(archive, &opts),
                None => formats::detect(&path, &opts),
            }
        })
        .await
        .map_err(|e| ProcessError::new(format!("format detection stopped: {e}")))?
        .map_err(|e| in_file(e.to_string()))?
    };
    let format = match &detected {
        Detected::Oci(_) => "oci",
        Detected::Docker(_) => "docker",
        Detected::Wasm(_) => "wasm",
    };
    tracing::info!(format, target = %opts.target, "format detected, pushing");
    opts.streamed
        .start_progress(pass.generation, &opts.progress);
    let pusher = Pusher::new(&opts.target, &opts.registry, backoff, opts.progress.clone())
        .await
        .map_err(|e| ProcessError::new(e.to_string()))?;
    let source = match &detected {
        Detected::Oci(i) => Some(i.archive.file().clone()),
        Detected::Docker(i) => Some(i.archive.file().clone()),
        Detected::Wasm(_) => None,
    };
    let pushed = match detected {
        Detected::Oci(image) => push_oci(&pusher, &pass, image).await,
        Detected::Docker(image) => {
            push_docker(&pusher, &pass, image, opts.compress, &opts.work_dir).await
        }
        Detected::Wasm(module) => push_wasm(&pusher, module).await,
    };
    if let Some(Source::Packed(p)) = &source {
        // Two for an archive indexed, then pushed in order; more when something was read again.
        tracing::info!(
            decoders = p.decoders_opened(),
            "compressed archive read through its decoder"
        );
    }
    pushed.map_err(|e| match e {
        PushError::Content(m) => in_file(m),
        e => ProcessError::new(e.to_string()),
    })
}

/// Blobs ([`PUSH_CONCURRENCY`] at a time, every platform's together), then the image manifests
/// (as many at a time), then the indexes below the top in order (children before parents),
/// then the tag; then the read-back.
async fn push_oci(
    pusher: &Pusher,
    pass: &Pass<'_>,
    image: OciImage,
) -> Result<ImageInfo, PushError> {
    let file = image.archive.file().clone();
    let mut blobs = image.blobs.clone();
    let concurrency = if file.is_packed() {
        // One decoder moving forward: the blobs in the order they are in the stream.
        blobs.sort_by_key(|b| b.span.offset);
        1
    } else {
        PUSH_CONCURRENCY
    };
    let claims: Vec<Claim> = blobs
        .iter()
        .map(|b| pass.claim(pusher.progress(), &b.digest, b.span.len))
        .collect();
    // Boxed: keeps the future `Send` (rustc cannot prove it through the closure otherwise).
    let pushes: Vec<BoxFuture<'_, Result<bool, PushError>>> = blobs
        .iter()
        .zip(claims)
        .map(|(b, c)| {
            // A document the index of a compressed archive holds (a config) goes from memory,
            // not through a decoder again.
            match image
                .archive
                .held_document(b.span)
                .filter(|_| file.is_packed())
            {
                Some(doc) => async move {
                    if c.pushed().await {
                        return Ok(false);
                    }
                    // Checked as a blob read from the file is, in the same words.
                    let actual = sha256_digest(&doc);
                    if actual != b.digest {
                        return Err(PushError::Content(format!(
                            "{} {} in the file does not match its digest (its content hashes to {actual}): the file is damaged",
                            b.what, b.digest
                        )));
                    }
                    let doc = Bytes::from(doc.to_vec());
                    pusher
                        .push_bytes(doc, &b.digest, b.what)
                        .await
                        .map(|()| true)
                }
                .boxed(),
                None => push_claimed(pusher, c, &file, b.span, &b.digest, b.what).boxed(),
            }
        })
        .collect();
    futures_util::stream::iter(pushes)
        .buffer_unordered(concurrency)
        .try_collect::<Vec<bool>>()
        .await?;
    // An image manifest names blobs only, all pushed: any order. An index names manifests,
    // which must be there first: `children` lists children before parents.
    let (indexes, manifests): (Vec<&RawManifest>, Vec<&RawManifest>) = image
        .children
        .iter()
        .partition(|m| m.media_type == media::OCI_INDEX || m.media_type == media::DOCKER_LIST);
    let pushes: Vec<BoxFuture<'_, Result<(), PushError>>> = manifests
        .into_iter()
        .map(|m| pusher.push_manifest(m, false).boxed())
        .collect();
    futures_util::stream::iter(pushes)
        .buffer_unordered(PUSH_CONCURRENCY)
        .try_collect::<Vec<()>>()
        .await?;
    for m in indexes {
        pusher.push_manifest(m, false).await?;
    }
    pusher.push_manifest(&image.top, true).await?;
    pusher.read_back(&image.top.digest).await?;
    Ok(ImageInfo {
        digest: image.top.digest.clone(),
        media_type: image.top.media_type.clone(),
        platforms: image.platforms,
        layers: image.layers,
        size_bytes: blobs.iter().map(|b| b.size).sum(),
        tag_ref: pusher.tag_ref(),
        image_ref: pusher.image_ref(&image.top.digest),
        kind: Kind::Image,
        source_format: SourceFormat::Oci,
        note: image.note,
    })
}

/// A classic archive has no manifest: push config and layers (gzip'ing uncompressed ones when
/// asked), then write an OCI manifest for them.
async fn push_docker(
    pusher: &Pusher,
    pass: &Pass<'_>,
    image: DockerImage,
    compress: Compress,
    work_dir: &Path,
) -> Result<ImageInfo, PushError> {
    let file = image.archive.file().clone();
    let progress = pusher.progress();
    let config = pass.claim(progress, &image.config_digest, image.config.len() as u64);
    let mut claims: Vec<Option<Claim>> = Vec::with_capacity(image.layers.len());
    for l in &image.layers {
        if !l.gzipped {
            // The follower may have pushed it as the upload arrived, as it is or gzip'ed (a
            // layer to gzip counts its bytes once known, compressed).
            let size = match compress {
                Compress::None => l.span.len,
                Compress::Gzip => 0,
            };
            claims.push(Some(pass.claim(progress, &layer_key(l.span), size)));
        } else {
            // A layer gzip'ed here counts its bytes once they are known (compressed).
            progress.add_blob(if l.gzipped { l.span.len } else { 0 });
            claims.push(None);
        }
    }
    if !config.pushed().await {
        pusher
            .push_bytes(
                Bytes::from(image.config.clone()),
                &image.config_digest,
                "config",
            )
            .await?;
    }
    // Compressing is the slow part and its result is not known before it is done: when the tag
    // already holds this very image (same config, every layer present), reuse its layers.
    // Not when the follower took any of them: it is pushing them already, and counted them.
    let needs_gzip = compress == Compress::Gzip
        && image.layers.iter().any(|l| !l.gzipped)
        && !claims.iter().flatten().any(Claim::counted);
    let reused = if needs_gzip {
        reusable_layers(pusher, &image).await?
    } else {
        None
    };
    let layers: Vec<Value> = match reused {
        Some(layers) => {
            // In the registry already: known and pushed at once, at their compressed size.
            for (l, ours) in layers.iter().zip(&image.layers) {
                let size = l["size"].as_u64().unwrap_or(0);
                if !ours.gzipped {
                    progress.add_bytes(size);
                }
                progress.sent(size);
                progress.blob_done();
            }
            layers
        }
        None => {
            let cpu = tokio::sync::Semaphore::new(CPU_CONCURRENCY);
            let mut order: Vec<usize> = (0..image.layers.len()).collect();
            let concurrency = if file.is_packed() {
                // One decoder moving forward: the layers in the order they are in the stream.
                order.sort_by_key(|&i| image.layers[i].span.offset);
                1
            } else {
                PUSH_CONCURRENCY
            };
            let mut claims: Vec<Option<Option<Claim>>> = claims.into_iter().map(Some).collect();
            let pushes: Vec<BoxFuture<'_, Result<(usize, Value), PushError>>> = order
                .into_iter()
                .map(|i| {
                    let l = &image.layers[i];
                    let c = claims[i].take().expect("each layer once");
                    let known = Known {
                        gzip: image.archive.gzip_digests(l.span),
                        made: image.archive.gzip_made(l.span),
                    };
                    let file = &file;
                    let cpu = &cpu;
                    async move {
                        let v = push_docker_layer(
                            pusher, pass, c, file, l, known, compress, work_dir, cpu,
                        )
                        .await?;
                        Ok((i, v))
                    }
                    .boxed()
                })
                .collect();
            // Layers in order (the manifest lists them so), PUSH_CONCURRENCY at once: one
            // compresses (on both cores) while the others are pushed.
            let mut done: Vec<(usize, Value)> = futures_util::stream::iter(pushes)
                .buffered(concurrency)
                .try_collect()
                .await?;
            done.sort_by_key(|(i, _)| *i);
            done.into_iter().map(|(_, v)| v).collect()
        }
    };
    let size_bytes = image.config.len() as u64
        + layers
            .iter()
            .map(|l| l["size"].as_u64().unwrap_or(0))
            .sum::<u64>();
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {
            "mediaType": media::OCI_CONFIG,
            "digest": image.config_digest,
            "size": image.config.len(),
        },
        "layers": layers,
    });
    let raw = push_written_manifest(pusher, &manifest).await?;
    Ok(ImageInfo {
        digest: raw.digest.clone(),
        media_type: raw.media_type,
        platforms: image.platform.into_iter().collect(),
        layers: layers.len(),
        size_bytes,
        tag_ref: pusher.tag_ref(),
        image_ref: pusher.image_ref(&raw.digest),
        kind: Kind::Image,
        source_format: SourceFormat::Docker,
        note: None,
    })
}

/// What the index pass of a compressed archive worked out for a classic layer.
struct Known {
    /// It is gzip'ed: `(blob digest, diff_id)`.
    gzip: Option<(String, String)>,
    /// It is not: `(diff_id, digest, size)` of what gzip'ing it makes.
    made: Option<(String, String, u64)>,
}

/// One classic layer → its descriptor in the manifest we write.
#[allow(clippy::too_many_arguments)]
async fn push_docker_layer(
    pusher: &Pusher,
    pass: &Pass<'_>,
    claim: Option<Claim>,
    file: &Source,
    layer: &DockerLayer,
    known: Known,
    compress: Compress,
    work_dir: &Path,
    cpu: &tokio::sync::Semaphore,
) -> Result<Value, PushError> {
    let (media_type, digest, size) = if layer.gzipped {
        let permit = cpu.acquire().await.expect("the semaphore is never closed");
        // Already compressed: its digest is not in the archive's documents, and its content must
        // be checked against the diff_id, so read it once before pushing.
        let (digest, diff_id) = if let Some(known) = known.gzip {
            known
        } else {
            let file = file.clone();
            let span = layer.span;
            tokio::task::spawn_blocking(move || compress::gzip_digests(&file, span))
                .await
                .map_err(|e| PushError::Content(format!("reading layer: {e}")))?
                .map_err(|e| {
                    PushError::Content(format!(
                        "layer {} is not a valid gzip stream: {e}",
                        layer.name
                    ))
                })?
        };
        drop(permit);
        if diff_id != layer.diff_id {
            let mismatch = compress::LayerError::DiffId {
                name: layer.name.clone(),
                diff_id: layer.diff_id.clone(),
                actual: diff_id,
            };
            return Err(PushError::Content(mismatch.to_string()));
        }
        pusher.push_span(file, layer.span, &digest, "layer").await?;
        (media::OCI_LAYER_GZIP, digest, layer.span.len)
    } else if let Some(made) = pushed_by_follower(pass, claim, layer).await {
        // Pushed while the upload arrived: only its diff_id is left to check.
        let (diff_id, digest, size) = made;
        if diff_id != layer.diff_id {
            let mismatch = match compress {
                Compress::Gzip => compress::LayerError::DiffId {
                    name: layer.name.clone(),
                    diff_id: layer.diff_id.clone(),
                    actual: diff_id,
                }
                .to_string(),
                // In the words of the pass's own check of a layer pushed under its diff_id.
                Compress::None => format!(
                    "layer {} in the file does not match its digest (its content hashes to {diff_id}): the file is damaged",
                    layer.diff_id
                ),
            };
            return Err(PushError::Content(mismatch));
        }
        let media_type = match compress {
            Compress::Gzip => media::OCI_LAYER_GZIP,
            Compress::None => media::OCI_LAYER_TAR,
        };
        (media_type, digest, size)
    } else if let (Compress::Gzip, Some((diff_id, digest, size))) = (compress, known.made) {
        // From a compressed archive: gzip'ed again as it streams out of the decoder, into the
        // digest the index pass worked out (the same bytes: no copy on disk).
        if diff_id != layer.diff_id {
            let mismatch = compress::LayerError::DiffId {
                name: layer.name.clone(),
                diff_id: layer.diff_id.clone(),
                actual: diff_id,
            };
            return Err(PushError::Content(mismatch.to_string()));
        }
        pusher.progress().add_bytes(size);
        pusher
            .push_gzipping(file, layer.span, &digest, size, &layer.name)
            .await?;
        (media::OCI_LAYER_GZIP, digest, size)
    } else if compress == Compress::Gzip {
        tracing::info!(layer = %layer.name, "gzip'ing layer after complete");
        let permit = cpu.acquire().await.expect("the semaphore is never closed");
        // After a layer the follower is still gzip'ing, not beside it.
        let turn = pass.streamed.gzip_turn().await;
        let (packed, size, digest) = {
            let file = file.clone();
            let span = layer.span;
            let diff_id = layer.diff_id.clone();
            let name = layer.name.clone();
            let work_dir = work_dir.to_path_buf();
            tokio::task::spawn_blocking(move || {
                compress::compress_layer(&file, span, &diff_id, &name, &work_dir)
            })
            .await
            .map_err(|e| PushError::Content(format!("compressing layer {}: {e}", layer.name)))?
            .map_err(|e| PushError::Content(e.to_string()))?
        };
        drop(turn);
        drop(permit);
        pusher.progress().add_bytes(size);
        pusher
            .push_own_file(&Source::File(packed), Span::whole(size), &digest, "layer")
            .await?;
        (media::OCI_LAYER_GZIP, digest, size)
    } else {
        pusher
            .push_span(file, layer.span, &layer.diff_id, "layer")
            .await?;
        (media::OCI_LAYER_TAR, layer.diff_id.clone(), layer.span.len)
    };
    Ok(serde_json::json!({"mediaType": media_type, "digest": digest, "size": size}))
}

/// What the uncompressed `layer` the follower pushed before `complete` made (`(diff_id,
/// digest, size)`, as it is or gzip'ed); `None` when it did not (or its push failed): the pass
/// pushes it then.
async fn pushed_by_follower(
    pass: &Pass<'_>,
    claim: Option<Claim>,
    layer: &DockerLayer,
) -> Option<compress::Made> {
    let claim = claim.filter(Claim::counted)?;
    if !claim.pushed().await {
        return None;
    }
    pass.streamed.made(pass.generation, &layer_key(layer.span))
}

/// The layer descriptors of the manifest the tag holds, when it is this same image (same config
/// digest and layer count) and every layer is still in the repository.
async fn reusable_layers(
    pusher: &Pusher,
    image: &DockerImage,
) -> Result<Option<Vec<Value>>, PushError> {
    let Some((bytes, _)) = pusher.current_manifest().await else {
        return Ok(None);
    };
    let Ok(current) = serde_json::from_slice::<Value>(&bytes) else {
        return Ok(None);
    };
    if current["config"]["digest"].as_str() != Some(image.config_digest.as_str()) {
        return Ok(None);
    }
    let Some(layers) = current["layers"].as_array() else {
        return Ok(None);
    };
    if layers.len() != image.layers.len() {
        return Ok(None);
    }
    for l in layers {
        let Some(digest) = l["digest"].as_str() else {
            return Ok(None);
        };
        if !pusher.blob_exists(digest).await? {
            return Ok(None);
        }
    }
    Ok(Some(
        layers
            .iter()
            .map(|l| {
                serde_json::json!({"mediaType": l["mediaType"], "digest": l["digest"], "size": l["size"]})
            })
            .collect(),
    ))
}

/// Pushes an OCI image manifest the receiver wrote itself (classic docker archives, wasm) as
/// the tag, then reads the tag back requiring that digest.
async fn push_written_manifest(
    pusher: &Pusher,
    manifest: &serde_json::Value,
) -> Result<RawManifest, PushError> {
    let bytes = serde_json::to_vec(manifest).expect("a JSON value serializes");
    let raw = RawManifest {
        digest: sha256_digest(&bytes),
        media_type: media::OCI_MANIFEST.into(),
        bytes,
    };
    pusher.push_manifest(&raw, true).await?;
    pusher.read_back(&raw.digest).await?;
    Ok(raw)
}

/// A module as a CNCF wasm OCI artifact: config `application/vnd.wasm.config.v0+json`, one layer
/// `application/wasm`.
async fn push_wasm(pusher: &Pusher, module: WasmModule) -> Result<ImageInfo, PushError> {
    let digest = {
        let file = module.file.clone();
        let span = module.span;
        tokio::task::spawn_blocking(move || -> std::io::Result<String> {
            let mut reader = SpanReader::hashing(file, span);
            reader.consume()?;
            Ok(reader.digest().expect("a hashing reader"))
        })
        .await
        .map_err(|e| PushError::Content(format!("reading the module: {e}")))?
        .map_err(|e| PushError::Content(format!("reading the module: {e}")))?
    };
    let os = if module.component { "wasip2" } else { "wasip1" };
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "wasm",
        "os": os,
        "layerDigests": [digest],
    }))
    .expect("a config serializes");
    let config_digest = sha256_digest(&config);
    pusher.progress().add_blob(module.span.len);
    pusher.progress().add_blob(config.len() as u64);
    pusher
        .push_span(
            &Source::File(module.file.clone()),
            module.span,
            &digest,
            "module",
        )
        .await?;
    pusher
        .push_bytes(Bytes::from(config.clone()), &config_digest, "config")
        .await?;
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "artifactType": media::WASM_CONFIG,
        "config": {"mediaType": media::WASM_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": media::WASM_LAYER, "digest": digest, "size": module.span.len}],
    });
    let raw = push_written_manifest(pusher, &manifest).await?;
    Ok(ImageInfo {
        digest: raw.digest.clone(),
        media_type: raw.media_type,
        platforms: vec![format!("{os}/wasm")],
        layers: 1,
        size_bytes: config.len() as u64 + module.span.len,
        tag_ref: pusher.tag_ref(),
        image_ref: pusher.image_ref(&raw.digest),
        kind: Kind::Wasm,
        source_format: SourceFormat::Wasm,
        note: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The server may spawn the pipeline on any worker thread.
    #[test]
    fn process_is_send() {
        fn assert_send<T: Send>(_: &T) {}
        let opts = ProcessOptions {
            work_dir: PathBuf::from("/nonexistent"),
            target: "127.0.0.1:9/a:b".into(),
            upload_name: None,
            filename: None,
            compress: Compress::Gzip,
            registry: runr_registry::RegistryConfig::default(),
            progress: Arc::default(),
            streamed: Arc::default(),
        };
        let fut = process(Path::new("/nonexistent"), &opts);
        assert_send(&fut);
    }

    #[test]
    fn image_info_serializes_as_the_status_image() {
        let info = ImageInfo {
            digest: "sha256:00".into(),
            media_type: media::OCI_MANIFEST.into(),
            platforms: vec!["linux/amd64".into()],
            layers: 2,
            size_bytes: 10,
            tag_ref: "h/r:t".into(),
            image_ref: "h/r@sha256:00".into(),
            kind: Kind::Image,
            source_format: SourceFormat::Docker,
            note: None,
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(v["kind"], "image");
        assert_eq!(v["source_format"], "docker");
        assert!(v["note"].is_null());
        assert_eq!(v.as_object().unwrap().len(), 10);
    }
}
