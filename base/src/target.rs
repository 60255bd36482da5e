//! A plain-HTTP endpoint parsed from a URL: where runr-tick sends its event, where runr-queue
//! delivers and where spans are exported; and [`redact`], which takes the credentials out of
//! any URL before it is printed.

use crate::env::Env;

/// A plain HTTP endpoint: a host and port to connect to, the `Host` header and the request path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Host name or IP address (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The `Host` header value.
    pub authority: String,
    /// Path and query of the request line.
    pub path: String,
}

impl Target {
    /// `http://127.0.0.1:<port>/`.
    pub fn local(port: u16) -> Target {
        Target {
            host: "127.0.0.1".to_string(),
            port,
            authority: format!("127.0.0.1:{port}"),
            path: "/".to_string(),
        }
    }

    /// Parses an `http://host[:port][/path][?query]` URL. TLS is not spoken: runr-tick's event,
    /// runr-queue's deliveries and the span export all go to in-cluster plain-HTTP addresses.
    /// Credentials in the URL are refused rather than sent in the clear or dropped silently.
    pub fn parse_url(url: &str) -> Result<Target, String> {
        const FORMS: &str = "expected http://host[:port][/path]";
        let uri: http::Uri = url.parse().map_err(|_| FORMS.to_string())?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return Err(format!(
                    "https is not supported (in-cluster endpoints speak plain HTTP): {FORMS}"
                ))
            }
            _ => return Err(FORMS.to_string()),
        }
        let authority = uri.authority().ok_or_else(|| FORMS.to_string())?;
        if authority.as_str().contains('@') {
            return Err(format!("credentials in the URL are not supported: {FORMS}"));
        }
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err(FORMS.to_string());
        }
        let port = match authority.port() {
            Some(p) => crate::env::parse_port(p.as_str())?,
            None => 80,
        };
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        // `http://fn?q=1` has the query but no path: the request line needs the `/`.
        let path = if path.starts_with('/') {
            path.to_string()
        } else {
            format!("/{path}")
        };
        Ok(Target {
            host: host.to_string(),
            port,
            authority: authority.as_str().to_string(),
            path,
        })
    }
}

impl Target {
    /// The variable `name` as a target, `None` when unset. A refused URL is named with its
    /// credentials cut off ([`redact`]): it may hold a password that must not reach the logs.
    pub fn optional(env: &mut Env<'_>, name: &'static str) -> Option<Target> {
        let url = env.value(name)?;
        match Target::parse_url(&url) {
            Ok(t) => Some(t),
            Err(reason) => {
                env.reject(name, Some(&redact(&url)), reason);
                None
            }
        }
    }

    /// [`Target::optional`], and "required" when unset.
    pub fn required(env: &mut Env<'_>, name: &'static str) -> Option<Target> {
        if env.value(name).is_none() {
            env.reject(name, None, "required");
            return None;
        }
        Target::optional(env, name)
    }
}

/// The URL with everything between `://` and its last `@` replaced by `***@`: the credentials
/// of any URL a parser accepts (redis-rs's, http's), and whatever an operator meant as
/// credentials in one it does not (a raw `/`, `?` or `#` in a password). Host, port and what
/// follows stay; an `@` in a path takes the part before it too (more hidden, never less).
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<not a URL>".to_string();
    };
    let scheme_ok = !scheme.is_empty()
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return "<not a URL>".to_string();
    }
    match rest.rfind('@') {
        Some(at) => format!("{scheme}://***@{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::{redact, Target};
    use crate::env::Env;

    #[test]
    fn targets() {
        assert_eq!(
            Target::parse_url("http://[::1]:9000/p").unwrap(),
            Target {
                host: "::1".into(),
                port: 9000,
                authority: "[::1]:9000".into(),
                path: "/p".into()
            }
        );
        assert_eq!(Target::parse_url("http://fn?q=1").unwrap().path, "/?q=1");
        for bad in [
            "fn.example",
            "ftp://fn",
            "http://",
            "http://u:p@fn",
            "http://fn:0",
            "https://fn",
        ] {
            assert!(
                Target::parse_url(bad).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }

    #[test]
    fn a_refused_url_is_named_without_its_password() {
        let vars = [
            ("A", "http://user:s3cr3t@fn:8080/x"),
            ("B", "https://:hunter2@collector/v1"),
            ("C", "http://fn:8080/ok"),
        ];
        let get = |name: &str| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let mut env = Env::new(&get);
        assert!(Target::optional(&mut env, "A").is_none());
        assert!(Target::required(&mut env, "B").is_none());
        assert_eq!(Target::optional(&mut env, "C").unwrap().port, 8080);
        assert!(Target::optional(&mut env, "UNSET").is_none());
        assert!(Target::required(&mut env, "MISSING").is_none());
        let text = env.finish().unwrap_err().to_string();
        for secret in ["s3cr3t", "hunter2", "user:"] {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
        assert!(text.contains("A=\"http://***@fn:8080/x\""), "{text}");
        assert!(text.contains("B=\"https://***@collector/v1\""), "{text}");
        assert!(
            text.contains("MISSING") && text.contains("required"),
            "{text}"
        );
        assert!(!text.contains("UNSET"), "{text}");
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("http://a:b@h:1/2"), "http://***@h:1/2");
        assert_eq!(redact("http://h:1/p"), "http://h:1/p");
        // A raw `/` in a password: the whole userinfo still goes.
        assert_eq!(redact("http://u:se/cr@h/p"), "http://***@h/p");
        assert_eq!(redact("u:pw@http://h"), "<not a URL>");
    }
}
