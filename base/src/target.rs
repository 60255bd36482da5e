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

    /// Parses an `http://host[:port][/path]` URL; TLS is not spoken (the tick and the
    /// span export stay in the cluster).
    pub fn parse_url(url: &str) -> Result<Target, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
        if uri.scheme_str() != Some("http") {
            return Err("only http:// URLs are supported".to_string());
        }
        let authority = uri.authority().ok_or("the URL has no host")?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        if host.is_empty() {
            return Err("the URL has no host".to_string());
        }
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .filter(|p| !p.is_empty())
            .unwrap_or("/");
        Ok(Target {
            host: host.to_string(),
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().to_string(),
            path: path.to_string(),
        })
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "http://{}{}", self.authority, self.path)
    }
}
