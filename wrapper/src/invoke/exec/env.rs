//! Exec mode's per-invocation variables (`RUNR_TRIGGER`, `RUNR_HEADER_<NAME>`, ...), the
//! request as the handler's environment sees it.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;

use serde_json::Value;

use crate::request::{header_str, Request};

/// [`exec_env`] of `req`, built on the first call and kept with the request: exec mode checks
/// the variables against what execve takes before admission and passes the same to the
/// handler. Everything they are made of (the headers, `deadline_ms`, the event) must be set
/// before the first call.
pub fn vars(req: &Request) -> &[(OsString, OsString)] {
    req.exec_vars.get_or_init(|| exec_env(req))
}

/// The per-invocation variables of exec mode (`RUNR_TRIGGER`, `RUNR_HEADER_<NAME>`, ...),
/// each name once: header names that map to the same variable (`X-User`, `X_User`) have
/// their values joined with `, ` in the order they arrived, as a repeated header's are.
pub fn exec_env(req: &Request) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = Vec::with_capacity(9 + req.headers.keys_len());
    let mut put = |k: &str, v: &str| env.push((k.into(), v.into()));
    put("RUNR_TRIGGER", req.trigger.as_str());
    put("RUNR_REQUEST_ID", &req.id);
    put("RUNR_METHOD", &req.method);
    put("RUNR_PATH", &req.path);
    put("RUNR_QUERY", &req.raw_query);
    put(
        "RUNR_CONTENT_TYPE",
        header_str(&req.headers, "content-type").unwrap_or(""),
    );
    if let Some(ms) = req.deadline_ms {
        put("RUNR_DEADLINE_MS", &ms.to_string());
    }
    if let Some(event) = &req.event {
        for (attr, var) in [
            ("id", "RUNR_EVENT_ID"),
            ("type", "RUNR_EVENT_TYPE"),
            ("source", "RUNR_EVENT_SOURCE"),
        ] {
            if let Some(v) = event.get(attr).and_then(Value::as_str) {
                put(var, v);
            }
        }
    }
    let headers_start = env.len();
    // HeaderMap yields every value of a name, in arrival order, before the next name.
    let mut last: Option<(&http::HeaderName, usize)> = None;
    for (name, value) in &req.headers {
        let (slot, first) = match last {
            Some((n, slot)) if n == name => (slot, false),
            _ => {
                let var = header_var(name.as_str());
                let known = env[headers_start..]
                    .iter()
                    .position(|(k, _)| k.as_encoded_bytes() == var.as_bytes());
                match known {
                    Some(i) => (headers_start + i, false),
                    None => {
                        env.push((var.into(), OsString::new()));
                        (env.len() - 1, true)
                    }
                }
            }
        };
        last = Some((name, slot));
        let joined = &mut env[slot].1;
        if !first {
            joined.push(", ");
        }
        joined.push(OsStr::from_bytes(value.as_bytes()));
    }
    env
}

/// `X-Api-Key` → `RUNR_HEADER_X_API_KEY`: upper-cased, everything but A–Z and 0–9 becomes `_`.
pub fn header_var(name: &str) -> String {
    let mut var = String::with_capacity(12 + name.len());
    var.push_str("RUNR_HEADER_");
    var.extend(name.chars().map(|c| match c.to_ascii_uppercase() {
        c @ ('A'..='Z' | '0'..='9') => c,
        _ => '_',
    }));
    var
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope::tests::envelope;
    use crate::request::test_headers as headers;
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue};

    use crate::config::Trigger;
    use crate::envelope::{encoded, whole_envelope};

    #[test]
    fn the_deadline_goes_into_the_envelope_and_the_variables_when_known() {
        let mut req = Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&[("ce-id", "1"), ("content-type", "application/json")]),
            Bytes::from_static(b"{\"a\":1}"),
        );
        assert!(envelope(&req).get("deadlineMs").is_none());
        let has_var = |req: &Request| {
            exec_env(req)
                .into_iter()
                .find(|(k, _)| k == "RUNR_DEADLINE_MS")
                .map(|(_, v)| v.into_string().unwrap())
        };
        assert_eq!(has_var(&req), None);
        req.deadline_ms = Some(1_728_561_600_123);
        let e = envelope(&req);
        assert_eq!(e["deadlineMs"], 1_728_561_600_123u64);
        assert_eq!(e["event"]["data"]["a"], 1);
        assert_eq!(encoded(&req), whole_envelope(&req), "streamed = whole");
        assert_eq!(has_var(&req).as_deref(), Some("1728561600123"));
    }

    #[test]
    fn queue_event_from_ce_headers() {
        let req = Request::new(
            Trigger::Queue,
            "POST",
            "/",
            headers(&[
                ("ce-specversion", "1.0"),
                ("ce-id", "1728561234567-0"),
                ("ce-type", "dev.runr.queue.message"),
                ("ce-source", "/redisstream/orders/orders-api"),
                ("ce-time", "2026-10-10T12:00:00Z"),
                ("content-type", "application/json"),
            ]),
            Bytes::from(r#"{"item":42}"#),
        );
        let e = envelope(&req);
        assert_eq!(e["id"], "1728561234567-0");
        assert_eq!(e["trigger"], "queue");
        let ev = &e["event"];
        assert_eq!(ev["specversion"], "1.0");
        assert_eq!(ev["type"], "dev.runr.queue.message");
        assert_eq!(ev["source"], "/redisstream/orders/orders-api");
        assert_eq!(ev["time"], "2026-10-10T12:00:00Z");
        assert_eq!(ev["datacontenttype"], "application/json");
        assert_eq!(ev["data"], serde_json::json!({"item": 42}));
        assert_eq!(e["body"], r#"{"item":42}"#);

        let env: std::collections::HashMap<_, _> = exec_env(&req).into_iter().collect();
        assert_eq!(env[&OsString::from("RUNR_EVENT_ID")], "1728561234567-0");
        assert_eq!(
            env[&OsString::from("RUNR_EVENT_TYPE")],
            "dev.runr.queue.message"
        );
        assert_eq!(
            env[&OsString::from("RUNR_EVENT_SOURCE")],
            "/redisstream/orders/orders-api"
        );
        assert_eq!(env[&OsString::from("RUNR_TRIGGER")], "queue");
    }

    #[test]
    fn exec_env_variables() {
        let req = Request::new(
            Trigger::Http,
            "PUT",
            "/a/b?name=RunR&x=1",
            headers(&[
                ("x-api-key", "secret"),
                ("content-type", "text/plain"),
                ("x.dots-and_", "v"),
            ]),
            Bytes::new(),
        );
        let env: std::collections::HashMap<_, _> = exec_env(&req).into_iter().collect();
        let get = |k: &str| env[&OsString::from(k)].to_str().unwrap().to_string();
        assert_eq!(get("RUNR_METHOD"), "PUT");
        assert_eq!(get("RUNR_PATH"), "/a/b");
        assert_eq!(get("RUNR_QUERY"), "name=RunR&x=1");
        assert_eq!(get("RUNR_CONTENT_TYPE"), "text/plain");
        assert_eq!(get("RUNR_HEADER_X_API_KEY"), "secret");
        assert_eq!(get("RUNR_HEADER_X_DOTS_AND_"), "v");
        assert_eq!(get("RUNR_REQUEST_ID"), req.id);
        assert!(!env.contains_key(&OsString::from("RUNR_EVENT_ID")));
    }

    #[test]
    fn header_names_that_map_to_one_variable_are_joined_in_arrival_order() {
        let req = Request::new(
            Trigger::Http,
            "GET",
            "/",
            headers(&[
                ("x-user", "alice"),
                ("x_user", "admin"),
                ("x.user", "eve"),
                ("x-user", "bob"),
                ("accept", "a"),
            ]),
            Bytes::new(),
        );
        let env = exec_env(&req);
        let users: Vec<_> = env
            .iter()
            .filter(|(k, _)| k == "RUNR_HEADER_X_USER")
            .map(|(_, v)| v.to_str().unwrap())
            .collect();
        // One variable; each spelling's values in arrival order, spellings in the order they
        // first arrived (HeaderMap keeps no order across names).
        assert_eq!(users, ["alice, bob, admin, eve"]);
        assert_eq!(
            env.iter()
                .filter(|(k, _)| k == "RUNR_HEADER_ACCEPT")
                .count(),
            1
        );
        // The envelope keeps each name as it came.
        let e = envelope(&req);
        assert_eq!(e["headers"]["x-user"], "alice, bob");
        assert_eq!(e["headers"]["x_user"], "admin");
        assert_eq!(e["headers"]["x.user"], "eve");
    }

    #[test]
    fn non_utf8_header_values_reach_the_variables_as_bytes() {
        let mut h = HeaderMap::new();
        h.append("x-raw", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        h.append("x_raw", HeaderValue::from_bytes(b"\xff").unwrap());
        let req = Request::new(Trigger::Http, "GET", "/", h, Bytes::new());
        let env = exec_env(&req);
        let v = &env
            .iter()
            .find(|(k, _)| k == "RUNR_HEADER_X_RAW")
            .unwrap()
            .1;
        assert_eq!(v.as_encoded_bytes(), b"caf\xe9, \xff");
    }

    #[test]
    fn header_var_names() {
        assert_eq!(header_var("X-Api-Key"), "RUNR_HEADER_X_API_KEY");
        assert_eq!(header_var("accept-ÿ"), "RUNR_HEADER_ACCEPT__");
    }
}
