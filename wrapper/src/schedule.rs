//! The schedule trigger (`RUNR_TRIGGER=schedule`, what a CronJob runs): one tick, its answer on
//! stdout, exit 0 for a status below 400 and 1 otherwise.
//!
//! - http mode, the invoke sequence: start the program with `PORT`, wait until it listens (up to
//!   60 s), POST the schedule CloudEvent, stop the server (SIGTERM, SIGKILL after 5 s);
//! - exec, persistent and lambda mode: one invocation with the same request through the
//!   [`Invoker`] (lambda mode makes it an EventBridge Scheduled Event).

use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use runr_tick::{ScheduleEvent, Target, TickResponse};

use crate::config::{Config, Mode, Trigger};
use crate::http::direct;
use crate::invoke::{self, display_timeout, Invoker};
use crate::observe::trace::{self, Span};
use crate::observe::{self, Failure, Finished};
use crate::request::Request;

/// Runs the configured mode's schedule one-shot; returns the exit status. The observer and the
/// reaper are the caller's ([`crate::commands`]).
pub async fn run(config: &Config) -> u8 {
    match config.mode {
        Mode::Http => invoke_sequence(config).await,
        Mode::Exec | Mode::Persistent | Mode::Lambda => one_shot(config).await,
    }
}

/// http mode: start the server, tick it once, stop it.
async fn invoke_sequence(config: &Config) -> u8 {
    let mut server = match direct::spawn_server(&config.command, config.port, true) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(command = ?config.command, error = %e, "cannot start RUNR_COMMAND");
            return 1;
        }
    };
    let target = Target::local(config.port);
    // Only the wait races the server's exit: once connected, a server that answers and then
    // exits must still have its answer read.
    let stream = tokio::select! {
        waited = runr_tick::wait_for_listener(&target, config.observe.listen_wait) => match waited {
            Ok(stream) => Some(stream),
            Err(e) => {
                tracing::error!(command = ?config.command, "the server never listened: {e}");
                None
            }
        },
        exit = server.wait() => {
            tracing::error!(command = ?config.command, status = exit.code(), port = config.port, "the server exited before listening");
            None
        }
    };
    let code = match stream {
        None => 1,
        Some(stream) => {
            let event = ScheduleEvent::new();
            let started = Instant::now();
            // With tracing on, the tick is the wrapper span's child, as in the observed proxy.
            let span =
                observe::global().and_then(|o| o.start_span(&HeaderMap::new(), SystemTime::now()));
            let traceparent = span.as_ref().map(Span::traceparent);
            let extra: Vec<(&str, &str)> = traceparent
                .as_deref()
                .map(|tp| (trace::TRACEPARENT, tp))
                .into_iter()
                .collect();
            let sent = runr_tick::send_with(stream, &target, &event, &extra);
            match tokio::time::timeout(config.timeout, sent).await {
                Ok(Ok(response)) => {
                    let failure = (response.status >= 500).then_some(Failure::Status);
                    observe_tick(&event, span, response.status, failure, started.elapsed());
                    runr_tick::print_response(&response)
                }
                Ok(Err(e)) => {
                    tracing::error!("{}", runr_base::fmt::error_chain(&e));
                    observe_tick(&event, span, 502, Some(Failure::Crash), started.elapsed());
                    1
                }
                Err(_) => {
                    tracing::error!(timeout = %display_timeout(config.timeout), "the server did not answer the schedule event in time");
                    observe_tick(&event, span, 504, Some(Failure::Timeout), started.elapsed());
                    1
                }
            }
        }
    };
    let exit = direct::stop(&mut server).await;
    tracing::debug!(status = exit.code(), "server stopped");
    code
}

/// Access line / span / capture of the http-mode tick, like any other invocation.
fn observe_tick(
    event: &ScheduleEvent,
    span: Option<Span>,
    status: u16,
    failure: Option<Failure>,
    took: Duration,
) {
    let Some(observer) = observe::global() else {
        return;
    };
    let req = schedule_request(event);
    observer.finish(Finished {
        span,
        trigger: req.trigger.as_str(),
        method: &req.method,
        path: &req.path,
        query: &req.raw_query,
        headers: &req.headers,
        body: &req.body,
        body_size: req.body.len() as u64,
        status,
        took,
        failure,
        cold_start: trace::take_cold_start(),
        replaced_id: None,
    });
}

/// exec and persistent mode: one invocation with the schedule request.
async fn one_shot(config: &Config) -> u8 {
    let Some(invoker) = Invoker::new(config) else {
        return 1;
    };
    let event = ScheduleEvent::new();
    let mut req = schedule_request(&event);
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + config.timeout;
    req.deadline_ms = Some(invoke::deadline_ms(deadline));
    let mut span = invoke::start(&mut req);
    span.begin();
    let tag = span.tag(&req);
    let req = std::sync::Arc::new(req);
    let mut held = crate::http::admission::Held::unlimited();
    let outcome = invoker.invoke(&req, None, deadline, tag, &mut held).await;
    let body = (&req.body[..], req.body.len() as u64);
    invoke::finish(&req, body, &outcome, started.elapsed(), span);
    let response = TickResponse {
        status: outcome.reply.status.as_u16(),
        body: outcome.reply.body.clone(),
    };
    let code = runr_tick::print_response(&response);
    invoker.shutdown().await;
    code
}

/// The request an http-mode server receives for a tick: `POST /`, the CloudEvent headers, the
/// schedule body.
pub fn schedule_request(event: &ScheduleEvent) -> Request {
    let mut headers = HeaderMap::new();
    for (name, value) in event.headers() {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(HeaderName::from_static(name), v);
        }
    }
    headers.insert(http::header::HOST, HeaderValue::from_static("localhost"));
    headers.insert(
        http::header::CONTENT_LENGTH,
        HeaderValue::from(runr_tick::event::BODY.len()),
    );
    Request::new(
        Trigger::Schedule,
        "POST",
        "/",
        headers,
        Bytes::from_static(runr_tick::event::BODY),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_request_carries_the_event() {
        let ev = ScheduleEvent::new();
        let req = schedule_request(&ev);
        assert_eq!(req.method, "POST");
        assert_eq!(req.path, "/");
        assert_eq!(req.id, ev.id);
        let event = req.event.as_ref().unwrap();
        assert_eq!(event["type"], "dev.runr.schedule.tick");
        assert_eq!(event["source"], "/runr/schedule");
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(
            req.event_with_data().unwrap()["data"],
            serde_json::json!({"trigger": "schedule"})
        );
        assert_eq!(&req.body[..], br#"{"trigger":"schedule"}"#);
    }
}
