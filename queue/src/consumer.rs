//! The consumer: reads entries, delivers each to the function until it is acknowledged or
//! dead-lettered, and takes over what consumers that are gone left pending.
//!
//! Tasks (one tokio thread):
//! - the reader: our own pending entries first (a restart of this consumer), then new ones with
//!   `XREADGROUP … >`, never more at once than there are free slots; every `CLAIM_IDLE / 2` it
//!   also claims (`XAUTOCLAIM`) entries idle that long on any consumer, with the same free slots
//!   (one task, so a read blocked in Redis never holds the slots a claim needs);
//! - the heartbeat: every `CLAIM_IDLE / 3`, resets the idle time of the entries in hand, so a
//!   slow delivery or a long backoff is not mistaken for a dead consumer;
//! - one task per entry in hand, holding a slot (`RUNR_QUEUE_CONCURRENCY`) from the moment it was
//!   read until it is acknowledged, dead-lettered, or left pending at shutdown.
//!
//! Attempt numbers live in Redis, as the entry's delivery count: a read or claim counts one, and
//! before every retry `XCLAIM … RETRYCOUNT n` sets it to the attempt about to be made. A consumer
//! killed mid-attempt therefore leaves the count at that attempt, and whoever delivers the entry
//! next counts one more.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::answer::Verdict;
use crate::config::Config;
use crate::deliver::{AnswerBody, Event, Http, Sent, LOG_SNIPPET};
use crate::event;
use crate::metrics::{Metrics, Outcome};
use crate::store::{Entry, Reader, Refusal, Store, StoreError, READ_BLOCK};
use crate::trace::{Attempt, Trace};
use runr_base::backoff::{equal_jitter, Backoff};
use runr_base::otlp::{Attr, Exporter, SpanData, SpanKind};

/// How the consumer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// SIGTERM or SIGINT; `drained` when every delivery in flight finished in time.
    Stopped {
        /// Every delivery in flight finished within the drain limit.
        drained: bool,
    },
    /// Redis refused us for good (credentials, permissions, a key that is not a stream).
    Fatal(String),
}

/// An entry in hand.
#[derive(Default)]
struct Held {
    /// Set by the heartbeat when the entry is no longer pending (acknowledged or deleted
    /// elsewhere): its task stops retrying it.
    lost: AtomicBool,
}

/// Counters for the last log line.
#[derive(Default)]
struct Counts {
    delivered: AtomicU64,
    dead_lettered: AtomicU64,
    left_pending: AtomicU64,
}

struct Ctx {
    config: Config,
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    http: Http,
    slots: Arc<Semaphore>,
    hand: Mutex<HashMap<String, Arc<Held>>>,
    /// `true` once SIGTERM (or a fatal error) arrived: no more reads, no more retries.
    stop: tokio::sync::watch::Sender<bool>,
    /// The reader connection's client id, for `CLIENT UNBLOCK` at shutdown (0: none yet).
    reader_id: AtomicI64,
    counts: Counts,
    /// The delivery spans' export, with an OTLP endpoint set.
    spans: Option<Exporter>,
}

/// Consumes until `shutdown` resolves (or Redis refuses us for good), then drains.
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = runr_base::signal::Stop>,
) -> Ended {
    crate::roots::install_crypto_provider();
    let store = match Store::new(&config) {
        Ok(s) => Arc::new(s),
        Err(e) => return Ended::Fatal(e.to_string()),
    };
    let metrics = Arc::new(Metrics::default());
    if let Some(port) = config.metrics_port {
        // Up before Redis is: /healthz says 503 while the consumer waits for it.
        if let Err(e) = crate::metrics::start(port, metrics.clone(), store.clone()).await {
            return Ended::Fatal(format!(
                "cannot listen on RUNR_QUEUE_METRICS_PORT {port}: {e}"
            ));
        }
    }
    let source = event::source(&config.stream, &config.group);
    let http = Http::new(config.target.clone(), source, config.concurrency);
    let (stop, _) = tokio::sync::watch::channel(false);
    let spans = config.otlp.clone().map(|otlp| {
        tracing::info!(endpoint = %otlp.endpoint, service = %otlp.service_name, "exporting delivery spans over OTLP/HTTP");
        Exporter::start(otlp)
    });
    let ctx = Arc::new(Ctx {
        slots: Arc::new(Semaphore::new(config.concurrency)),
        config,
        store,
        metrics,
        http,
        hand: Mutex::new(HashMap::new()),
        stop,
        reader_id: AtomicI64::new(0),
        counts: Counts::default(),
        spans,
    });
    tokio::pin!(shutdown);

    // The group first: XREADGROUP needs it.
    let created = tokio::select! {
        r = ctx.store.retry(|| ctx.store.create_group()) => r,
        signal = &mut shutdown => {
            tracing::info!(signal = %signal, "stopped before the consumer group was ready");
            return Ended::Stopped { drained: true };
        }
    };
    match created {
        Err(r) => {
            log_refusal(&r);
            return Ended::Fatal(r.to_string());
        }
        Ok(true) => tracing::info!(
            stream = %ctx.config.stream,
            group = %ctx.config.group,
            at = %ctx.config.start,
            "created the consumer group"
        ),
        Ok(false) => {}
    }
    let c = &ctx.config;
    tracing::info!(
        redis = %c.redis.display,
        stream = %c.stream,
        group = %c.group,
        consumer = %c.consumer,
        target = %c.target,
        concurrency = c.concurrency,
        max_attempts = c.max_attempts,
        dead_letters = %ctx.store.dead_letters,
        "consuming"
    );

    let reader = tokio::spawn(ctx.clone().read_loop());
    let heartbeat = tokio::spawn(ctx.clone().heartbeat_loop());

    let fatal = ctx.store.fatal();
    let ended_by = tokio::select! {
        signal = &mut shutdown => Err(signal),
        m = fatal => Ok(m),
    };
    let deadline = Instant::now() + ctx.config.drain;
    // send_replace: `send` would not store the value while no task happens to be subscribed.
    ctx.stop.send_replace(true);
    match &ended_by {
        Err(signal) => tracing::info!(
            signal = %signal,
            in_hand = ctx.in_hand(),
            drain = %runr_base::env::display_duration(ctx.config.drain),
            "stopping: no more reads; deliveries in flight may finish"
        ),
        Ok(r) => log_refusal(r),
    }
    // A read blocked in Redis ends now instead of after READ_BLOCK; what it returned anyway is
    // delivered like any other entry in hand.
    let id = ctx.reader_id.load(Ordering::Relaxed);
    if id != 0 {
        let r = tokio::time::timeout(Duration::from_secs(1), ctx.store.unblock(id)).await;
        tracing::debug!(result = ?r.map(|r| r.map_err(|e| e.to_string())), "unblocked the reader");
    }
    let _ = tokio::time::timeout_at(deadline, reader).await;
    // Every slot back means every entry task ended.
    let all = u32::try_from(ctx.config.concurrency).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout_at(deadline, ctx.slots.acquire_many(all))
        .await
        .is_ok();
    heartbeat.abort();
    if drained && ended_by.is_err() {
        ctx.leave_group().await;
    }
    let (delivered, dead, left) = (
        ctx.counts.delivered.load(Ordering::Relaxed),
        ctx.counts.dead_lettered.load(Ordering::Relaxed),
        ctx.counts.left_pending.load(Ordering::Relaxed) + ctx.in_hand() as u64,
    );
    if drained {
        tracing::info!(
            delivered,
            dead_lettered = dead,
            left_pending = left,
            redis_outages = ctx.store.health.outages(),
            "stopped"
        );
    } else {
        tracing::warn!(
            delivered,
            dead_lettered = dead,
            left_pending = left,
            redis_outages = ctx.store.health.outages(),
            "stopped at the drain limit: deliveries still in flight are left pending"
        );
    }
    if let Some(spans) = &ctx.spans {
        spans.flush(SPAN_FLUSH_LIMIT).await;
    }
    match ended_by {
        Err(_) => Ended::Stopped { drained },
        Ok(r) => Ended::Fatal(r.to_string()),
    }
}

/// How long the spans still queued at exit may take to export (the wrapper's limit too).
const SPAN_FLUSH_LIMIT: Duration = Duration::from_secs(2);

/// The line that says which command Redis refused, on which key, and why.
fn log_refusal(r: &Refusal) {
    tracing::error!(
        command = %r.command,
        key = %r.key,
        error = %r.error,
        "redis refused a command: stopping; entries in hand stay pending"
    );
}

impl Ctx {
    fn hand(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Held>>> {
        self.hand.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn in_hand(&self) -> usize {
        self.hand().len()
    }

    /// At a clean exit with nothing left pending on this consumer, `XGROUP DELCONSUMER`: pods
    /// of an autoscaled Deployment are each a consumer, and would otherwise pile up in the group.
    /// Nothing is read any more, so nothing can become pending on it in between.
    async fn leave_group(&self) {
        if self.in_hand() > 0 || self.counts.left_pending.load(Ordering::Relaxed) > 0 {
            return;
        }
        let limit = Duration::from_secs(2);
        let left = tokio::time::timeout(limit, async {
            match self.store.holds_pending().await {
                Ok(false) => self.store.delete_consumer().await.map(|()| true),
                Ok(true) => Ok(false),
                Err(e) => Err(e),
            }
        })
        .await;
        match left {
            Ok(Ok(true)) => tracing::info!(
                consumer = %self.config.consumer,
                "left the consumer group (nothing pending on this consumer)"
            ),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => tracing::debug!(error = %e, "could not leave the consumer group"),
            Err(_) => tracing::debug!("could not leave the consumer group in time"),
        }
    }

    /// Counts an entry let go without an outcome: it stays pending for whoever delivers it next.
    fn left_pending(&self) {
        self.counts.left_pending.fetch_add(1, Ordering::Relaxed);
        self.metrics.outcome(Outcome::Abandoned);
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    async fn until_stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Up to `max` free slots, waiting for the first one; `None` once stopped.
    async fn slots(&self, max: usize) -> Option<Vec<OwnedSemaphorePermit>> {
        let first = tokio::select! {
            p = self.slots.clone().acquire_owned() => p.ok()?,
            () = self.until_stopped() => return None,
        };
        let mut permits = vec![first];
        while permits.len() < max {
            match self.slots.clone().try_acquire_owned() {
                Ok(p) => permits.push(p),
                Err(_) => break,
            }
        }
        Some(permits)
    }

    /// Takes `entry` in hand with `permit` and starts its task, unless it is in hand already
    /// (a claim of our own slow entry, or a re-read of one).
    fn start(self: &Arc<Self>, entry: Entry, attempt: u32, permit: OwnedSemaphorePermit) {
        let held = Arc::new(Held::default());
        {
            let mut hand = self.hand();
            if hand.contains_key(&entry.id) {
                return;
            }
            hand.insert(entry.id.clone(), held.clone());
            self.metrics.set_in_hand(hand.len());
        }
        tokio::spawn(self.clone().handle(entry, attempt, held, permit));
    }

    // === the reader ===

    async fn read_loop(self: Arc<Self>) {
        let mut reader: Option<Reader> = None;
        // Our own pending entries first (this consumer restarted), paging by id; then new ones.
        let mut history = Some("0".to_string());
        let mut recovered = 0usize;
        let mut pause = Duration::from_millis(50);
        let claim_every =
            (self.config.claim_idle / 2).clamp(Duration::from_millis(50), Duration::from_secs(30));
        let mut next_claim = Instant::now() + claim_every;
        while !self.stopped() {
            let Some(mut permits) = self.slots(self.config.concurrency).await else {
                break;
            };
            if history.is_none() && Instant::now() >= next_claim {
                if !self.claim(&mut permits).await {
                    break;
                }
                next_claim = Instant::now() + claim_every;
                if permits.is_empty() {
                    continue;
                }
            }
            if reader.as_ref().is_none_or(Reader::broken) {
                match self.store.reader().await {
                    Ok(r) => {
                        self.reader_id.store(r.client_id, Ordering::Relaxed);
                        reader = Some(r);
                    }
                    Err(StoreError::Fatal(_)) => break,
                    Err(_) => {
                        drop(permits);
                        self.pause(&mut pause).await;
                        continue;
                    }
                }
            }
            let Some(conn) = reader.as_mut() else {
                continue;
            };
            // Blocked no longer than until the next claim is due (BLOCK 0 would wait forever).
            let until_claim = next_claim
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let (from, block) = match &history {
                Some(after) => (after.as_str(), None),
                None => (">", Some(READ_BLOCK.min(until_claim))),
            };
            let entries = match self.store.read(conn, from, permits.len(), block).await {
                Ok(e) => e,
                Err(StoreError::NoGroup) => {
                    drop(permits);
                    if self.store.recreate_group().await.is_err() {
                        break;
                    }
                    continue;
                }
                Err(StoreError::Fatal(_)) => break,
                Err(StoreError::Unavailable(_)) => {
                    drop(permits);
                    self.pause(&mut pause).await;
                    continue;
                }
            };
            pause = Duration::from_millis(50);
            let attempts = if history.is_some() {
                if entries.is_empty() {
                    if recovered > 0 {
                        tracing::info!(
                            entries = recovered,
                            "re-read this consumer's own pending entries"
                        );
                    }
                    history = None;
                    continue;
                }
                history = entries.last().map(|e| e.id.clone());
                recovered += entries.len();
                // The read counted one delivery more; the count is the attempt to make.
                match self.counts_of(&entries).await {
                    Some(c) => c,
                    None => break,
                }
            } else {
                vec![Some(1); entries.len()]
            };
            for (entry, attempt) in entries.into_iter().zip(attempts) {
                let (Some(permit), Some(attempt)) = (permits.pop(), attempt) else {
                    continue;
                };
                self.start(entry, attempt, permit);
            }
        }
    }

    /// The delivery counts of `entries`, waiting out Redis; `None` on a fatal error.
    async fn counts_of(&self, entries: &[Entry]) -> Option<Vec<Option<u32>>> {
        let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
        self.store
            .retry(|| self.store.delivery_counts(&ids))
            .await
            .ok()
    }

    async fn pause(&self, pause: &mut Duration) {
        let d = equal_jitter(*pause);
        tokio::select! {
            () = tokio::time::sleep(d) => {}
            () = self.until_stopped() => {}
        }
        *pause = (*pause * 2).min(Duration::from_secs(1));
    }

    // === claims ===

    /// One claim round with `permits`: `XAUTOCLAIM` through the whole pending list (or until the
    /// slots are used up). `false` on a fatal error.
    async fn claim(self: &Arc<Self>, permits: &mut Vec<OwnedSemaphorePermit>) -> bool {
        let idle = self.config.claim_idle;
        let mut cursor = "0-0".to_string();
        let mut claimed = 0usize;
        while !permits.is_empty() {
            let (next, entries) = match self.store.autoclaim(idle, &cursor, permits.len()).await {
                Ok(v) => v,
                Err(StoreError::NoGroup) => return self.store.recreate_group().await.is_ok(),
                Err(StoreError::Fatal(_)) => return false,
                // Logged as an outage; the next round tries again.
                Err(StoreError::Unavailable(_)) => break,
            };
            if !entries.is_empty() {
                let Some(counts) = self.counts_of(&entries).await else {
                    return false;
                };
                claimed += entries.len();
                for (entry, count) in entries.into_iter().zip(counts) {
                    // Not pending any more (acknowledged in between): nothing to do.
                    let Some(attempt) = count else { continue };
                    let Some(permit) = permits.pop() else { break };
                    self.start(entry, attempt, permit);
                }
            }
            if next == "0-0" {
                break;
            }
            cursor = next;
        }
        if claimed > 0 {
            tracing::info!(
                entries = claimed,
                idle = %runr_base::env::display_duration(idle),
                "claimed entries left pending by another consumer"
            );
        }
        true
    }

    // === the heartbeat ===

    async fn heartbeat_loop(self: Arc<Self>) {
        let every = (self.config.claim_idle / 3).max(Duration::from_millis(30));
        loop {
            tokio::time::sleep(every).await;
            let ids: Vec<String> = self.hand().keys().cloned().collect();
            if ids.is_empty() {
                continue;
            }
            // Unavailable: nothing to do but try again next time (the outage is logged).
            if let Ok(still) = self.store.touch(&ids).await {
                let hand = self.hand();
                for id in ids.iter().filter(|id| !still.contains(id)) {
                    if let Some(h) = hand.get(id) {
                        h.lost.store(true, Ordering::Relaxed);
                    }
                }
            }
        }
    }

    // === one entry ===

    async fn handle(
        self: Arc<Self>,
        entry: Entry,
        first_attempt: u32,
        held: Arc<Held>,
        _slot: OwnedSemaphorePermit,
    ) {
        let _in_hand = InHand {
            ctx: &self,
            id: &entry.id,
        };
        let id = entry.id.as_str();
        let Some(fields) = entry.fields.as_deref() else {
            // Deleted from the stream while pending: nothing to deliver.
            let _ = self.store.retry(|| self.store.ack(id)).await;
            return;
        };
        let trace = Trace::of_entry(fields);
        let trace_id = trace.trace_id_hex();
        let d = Delivery {
            id,
            fields,
            trace_id: &trace_id,
        };
        let body = match event::encode_body(fields, self.config.max_body) {
            Ok(b) => Bytes::from(b),
            Err(e) => {
                tracing::warn!(id, error = %e, "the entry cannot be an event");
                self.dead_letter(&d, first_attempt - 1, 0, Some(e.class()), "")
                    .await;
                return;
            }
        };
        if first_attempt > self.config.max_attempts {
            // Its last attempts ended with the consumers making them (killed, or stopped at
            // the drain limit): no answer to record.
            self.dead_letter(&d, first_attempt - 1, 0, Some("abandoned"), "")
                .await;
            return;
        }
        let time = event::time_for(id);
        let mut attempt = first_attempt;
        loop {
            if attempt > first_attempt {
                // Recorded before the attempt, so a crash during it still counts it.
                let recorded = tokio::select! {
                    r = self.store.retry(|| self.store.set_attempt(id, attempt)) => r,
                    // Redis is away and we are stopping: the entry stays pending as it is.
                    () = self.until_stopped() => {
                        self.left_pending();
                        return;
                    }
                };
                match recorded {
                    Ok(true) => {}
                    Ok(false) => held.lost.store(true, Ordering::Relaxed),
                    Err(_) => {
                        self.left_pending();
                        return;
                    }
                }
            }
            if held.lost.load(Ordering::Relaxed) {
                tracing::info!(id, "the entry is no longer pending (taken over or acknowledged elsewhere): dropped");
                self.metrics.outcome(Outcome::Abandoned);
                return;
            }
            let span = trace.attempt();
            let event = Event {
                id,
                time: &time,
                attempt,
                body: body.clone(),
                traceparent: span.traceparent.clone(),
                tracestate: trace.tracestate.as_deref(),
            };
            let began = Instant::now();
            let sent = self.http.send(&event, self.config.timeout).await;
            self.metrics.attempt(began.elapsed());
            let (verdict, status, class, body, detail) = match sent {
                Sent::Answered { answer, body } => (
                    answer.verdict(&self.config.at_once),
                    answer.status,
                    answer.error_class,
                    Some(body),
                    String::new(),
                ),
                Sent::TimedOut => (
                    Verdict::Retry { floor: None },
                    0,
                    Some("timeout".to_string()),
                    None,
                    format!(
                        "no answer within {}",
                        runr_base::env::display_duration(self.config.timeout)
                    ),
                ),
                Sent::Failed(e) => (
                    Verdict::Retry { floor: None },
                    0,
                    Some("unreachable".to_string()),
                    None,
                    e,
                ),
            };
            if verdict == Verdict::Done {
                // Acknowledged as soon as the head said 2xx: the body is read meanwhile, with a
                // bound of its own, only for the log line and the connection.
                let (acked, (answer, _)) = tokio::join!(
                    self.store.retry(|| self.store.ack(id)),
                    self.finish(body, detail)
                );
                tracing::debug!(id, attempt, status, trace_id, answer = %answer, "delivered");
                self.export_span(&trace, &span, id, attempt, status, None, "acked");
                match acked {
                    Ok(()) => {
                        self.counts.delivered.fetch_add(1, Ordering::Relaxed);
                        self.metrics.outcome(Outcome::Acked);
                    }
                    // Redis refused the ack for good: pending, for whoever may ack it.
                    Err(_) => self.left_pending(),
                }
                return;
            }
            let (detail, answer_body) = self.finish(body, detail).await;
            let outcome = match verdict {
                Verdict::Done => "acked",
                Verdict::Retry { .. } if attempt < self.config.max_attempts => {
                    if self.stopped() {
                        "left-pending"
                    } else {
                        "retried"
                    }
                }
                _ => "dead-lettered",
            };
            self.export_span(
                &trace,
                &span,
                id,
                attempt,
                status,
                class.as_deref(),
                outcome,
            );
            match verdict {
                Verdict::Done => return,
                Verdict::DeadLetter => {
                    self.dead_letter(&d, attempt, status, class.as_deref(), &answer_body)
                        .await;
                    return;
                }
                Verdict::Retry { floor } => {
                    if attempt >= self.config.max_attempts {
                        self.dead_letter(&d, attempt, status, class.as_deref(), &answer_body)
                            .await;
                        return;
                    }
                    if self.stopped() {
                        tracing::info!(
                            id,
                            attempt,
                            status,
                            error = class.as_deref().unwrap_or(""),
                            "delivery failed: left pending at shutdown"
                        );
                        self.left_pending();
                        return;
                    }
                    let c = &self.config;
                    self.metrics.outcome(Outcome::Retried);
                    let backoff = Backoff::new(c.backoff, c.backoff_max);
                    let delay = retry_wait(backoff, attempt, floor, runr_base::backoff::random());
                    tracing::warn!(
                        id,
                        attempt,
                        status,
                        error = class.as_deref().unwrap_or(""),
                        answer = %detail,
                        retry_in = %runr_base::env::display_duration(delay),
                        trace_id,
                        "delivery failed"
                    );
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        () = self.until_stopped() => {
                            tracing::info!(id, attempt, "left pending at shutdown while waiting to retry");
                            self.left_pending();
                            return;
                        }
                    }
                    attempt += 1;
                }
            }
        }
    }

    /// Exports the span of one attempt, when spans are exported and the trace is sampled: a
    /// CONSUMER span (the processing of a message, in OpenTelemetry's messaging conventions)
    /// from the request to the end of the answer, child of the producer's span when the entry
    /// carried one; the function's side (the wrapper's span) is its child.
    #[allow(clippy::too_many_arguments)]
    fn export_span(
        &self,
        trace: &Trace,
        span: &Attempt,
        id: &str,
        attempt: u32,
        status: u16,
        class: Option<&str>,
        outcome: &'static str,
    ) {
        let Some(spans) = &self.spans else {
            return;
        };
        if !trace.sampled() {
            return;
        }
        let c = &self.config;
        let mut attributes = vec![
            ("messaging.system", Attr::Str("redis".into())),
            ("messaging.operation.type", Attr::Str("process".into())),
            ("messaging.destination.name", Attr::Str(c.stream.clone())),
            ("messaging.consumer.group.name", Attr::Str(c.group.clone())),
            ("messaging.message.id", Attr::Str(id.to_string())),
            ("messaging.client.id", Attr::Str(c.consumer.clone())),
            ("runr.queue.attempt", Attr::Int(i64::from(attempt))),
            ("runr.queue.outcome", Attr::Str(outcome.into())),
        ];
        if status != 0 {
            attributes.push(("http.response.status_code", Attr::Int(i64::from(status))));
        }
        if let Some(class) = class {
            attributes.push(("error.type", Attr::Str(class.to_string())));
        }
        spans.export(SpanData {
            trace_id: trace.trace_id,
            span_id: span.span_id,
            parent_span_id: trace.parent,
            sampled: true,
            kind: SpanKind::Consumer,
            start: span.start,
            name: format!("process {}", c.stream),
            end: SystemTime::now(),
            attributes,
            error: outcome != "acked",
        });
    }

    /// What the log line shows (the start of the answer's body, why it was not read, or
    /// `detail` when there was no answer), and the answer's first KiB for a dead letter's
    /// `runr-body` (empty when there was no answer, or its body could not be read).
    async fn finish(&self, body: Option<AnswerBody>, detail: String) -> (String, String) {
        match body {
            Some(b) => match self.http.finish(b).await {
                Ok(text) => (
                    crate::deliver::shorten(&text, LOG_SNIPPET).to_string(),
                    text,
                ),
                Err(why) => (why, String::new()),
            },
            None => (detail, String::new()),
        }
    }

    /// Moves the entry to the dead-letter stream with what became of it.
    async fn dead_letter(
        &self,
        d: &Delivery<'_>,
        attempts: u32,
        status: u16,
        class: Option<&str>,
        body: &str,
    ) {
        let (id, fields) = (d.id, d.fields);
        let [s, e, a, f, i, b] = DEAD_LETTER_FIELDS;
        let extra = [
            (s, status.to_string()),
            (e, class.unwrap_or("").to_string()),
            (a, attempts.to_string()),
            (f, runr_base::fmt::rfc3339_millis(SystemTime::now())),
            (i, id.to_string()),
            (b, body.to_string()),
        ];
        let moved = self
            .store
            .retry(|| self.store.dead_letter(id, fields, &extra))
            .await;
        if moved.is_err() {
            // Refused for good (the consumer is stopping): the entry stays pending as it is.
            self.left_pending();
        } else {
            self.counts.dead_lettered.fetch_add(1, Ordering::Relaxed);
            self.metrics.outcome(Outcome::DeadLettered);
            tracing::warn!(
                id,
                attempts,
                status,
                error = class.unwrap_or(""),
                stream = %self.store.dead_letters,
                trace_id = d.trace_id,
                "dead-lettered"
            );
        }
    }
}

/// What a dead letter carries after the entry's own fields, in this order: the last status, the
/// error class, the attempts made, when it was moved, the entry's id, the start of the last
/// answer's body. `runr-queue redrive` strips them again.
pub(crate) const DEAD_LETTER_FIELDS: [&str; 6] = [
    "runr-status",
    "runr-error",
    "runr-attempts",
    "runr-failed-at",
    "runr-id",
    "runr-body",
];

/// The entry being delivered, as the dead letter and the log lines name it.
struct Delivery<'a> {
    id: &'a str,
    fields: &'a [(Vec<u8>, Vec<u8>)],
    /// The delivery's trace, 32 hex digits.
    trace_id: &'a str,
}

/// Removes an entry from the hand when its task ends, however it ends.
struct InHand<'a> {
    ctx: &'a Ctx,
    id: &'a str,
}

impl Drop for InHand<'_> {
    fn drop(&mut self) {
        let mut hand = self.ctx.hand();
        hand.remove(self.id);
        self.ctx.metrics.set_in_hand(hand.len());
    }
}

/// The wait before retry `attempt`: the configured backoff, and never less than `floor` (a
/// 429's or 503's `Retry-After`, which the cap does not shorten).
fn retry_wait(backoff: Backoff, attempt: u32, floor: Option<Duration>, random: u64) -> Duration {
    backoff
        .delay_with(attempt, random)
        .max(floor.unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn retry_after_is_a_floor_the_cap_does_not_shorten() {
        let b = Backoff::new(S(1), S(10));
        assert_eq!(retry_wait(b, 1, Some(S(30)), 0), S(30));
        assert_eq!(retry_wait(b, 1, Some(S(30)), u64::MAX), S(30));
        // A small floor does not shorten the backoff either.
        assert_eq!(retry_wait(b, 4, Some(S(1)), 0), S(4));
        assert_eq!(retry_wait(b, 4, None, 0), S(4));
    }
}
