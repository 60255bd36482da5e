//! The schedule trigger (`RUNR_TRIGGER=schedule`, what a CronJob runs): one tick, its answer on
//! stdout, exit 0 for a status below 400 and 1 otherwise.
//!
//! - http mode, the invoke sequence: start the program with `PORT`, wait until it listens (up to
//!   60 s), POST the schedule CloudEvent, stop the server (SIGTERM, SIGKILL after 5 s);
//! - exec, persistent and lambda mode: one invocation with the same request through the
//!   [`Invoker`] (lambda mode makes it an EventBridge Scheduled Event).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use runr_tick::{ScheduleEvent, Target, TickResponse};
use tokio::time::Instant;

use crate::config::{Config, Mode, Trigger};
use crate::http::direct;
use crate::invoke::{Ended, Invocation, Invoker, Outcome};
use crate::observe::trace;
use crate::request::Request;
use crate::response::{display_timeout, Reply};

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
        Some(stream) => tick_once(stream, &target, config.timeout).await,
    };
    let exit = direct::stop(&mut server).await;
    tracing::debug!(status = exit.code(), "server stopped");
    code
}

/// Sends the schedule CloudEvent on `stream` and prints the answer, observed like any other
/// invocation; the exit status.
async fn tick_once(stream: tokio::net::TcpStream, target: &Target, timeout: Duration) -> u8 {
    let event = ScheduleEvent::new();
    let inv = Invocation::new(schedule_request(&event), Instant::now(), timeout, None);
    // With tracing on, the tick is the wrapper span's child, as in the observed proxy.
    let traceparent = match inv.traced() {
        true => inv.request().headers.get(trace::TRACEPARENT).cloned(),
        false => None,
    };
    let extra: Vec<(&str, &str)> = traceparent
        .as_ref()
        .and_then(|tp| tp.to_str().ok())
        .map(|tp| (trace::TRACEPARENT, tp))
        .into_iter()
        .collect();
    let sent = runr_tick::send_with(stream, target, &event, &extra);
    let (outcome, code) = match tokio::time::timeout(timeout, sent).await {
        Ok(Ok(response)) => {
            let code = runr_tick::print_response(&response);
            let reply = Reply {
                status: StatusCode::from_u16(response.status).unwrap_or(StatusCode::BAD_GATEWAY),
                headers: Vec::new(),
                body: Bytes::new(),
            };
            (Outcome::answered(reply), code)
        }
        Ok(Err(e)) => {
            let message = runr_base::fmt::error_chain(&e);
            tracing::error!("{message}");
            let crashed = Outcome::failed(Ended::WorkerExited, StatusCode::BAD_GATEWAY, &message);
            (crashed, 1)
        }
        Err(_) => {
            tracing::error!(timeout = %display_timeout(timeout), "the server did not answer the schedule event in time");
            (inv.timed_out(), 1)
        }
    };
    inv.finish(&outcome);
    code
}

/// exec, persistent and lambda mode: one invocation with the schedule request.
async fn one_shot(config: &Config) -> u8 {
    let Some(invoker) = Invoker::new(config) else {
        return 1;
    };
    let event = ScheduleEvent::new();
    let inv = Invocation::new(
        schedule_request(&event),
        Instant::now(),
        config.timeout,
        None,
    );
    let outcome = invoker.invoke(inv).await;
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
