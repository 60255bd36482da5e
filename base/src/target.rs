//! A plain-HTTP endpoint parsed from a URL: where runr-tick sends its event and where spans are
//! exported.

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

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}

#[cfg(test)]
mod tests {
    use super::Target;

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
}
