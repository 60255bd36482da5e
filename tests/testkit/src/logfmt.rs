//! A reference logfmt reader, to check that a log line parses back into exactly the fields its
//! binary wrote.
//!
//! It reads as Go's `go-logfmt` decoder (the format's reference implementation) does: tokens
//! `key`, `key=value` or `key="quoted value"` with JSON's escapes; a `"` in a key or a bare
//! value, an `=` in a bare value, an unterminated quote are errors. It is stricter where our
//! writer must be: tokens are separated by single spaces only (go-logfmt takes any byte up to
//! the space), a control or white-space character other than the space is an error anywhere,
//! even inside quotes (ours are always escaped), a quoted value must be followed by a space or
//! the end, and `key=` with nothing after it is an error (we write an empty value as `""`).
//!
//! No maintained Rust crate reads logfmt (`logfmt` 0.0.2 is a 2015 sketch), so this is ours;
//! it lives here, in the test harness, and never in a binary.

/// One token: a key, and its value unless it was a bare word.
pub type Pair = (String, Option<String>);

/// The tokens of `line` (without its newline), or what is wrong with it.
pub fn parse(line: &str) -> Result<Vec<Pair>, String> {
    if let Some(c) = line
        .chars()
        .find(|&c| c != ' ' && (c.is_control() || c.is_whitespace()))
    {
        return Err(format!("raw {c:?} in {line:?}"));
    }
    let mut pairs = Vec::new();
    let mut rest = line;
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix(' ') {
            if pairs.is_empty() || after.starts_with(' ') || after.is_empty() {
                return Err(format!("stray space in {line:?}"));
            }
            rest = after;
        } else if !pairs.is_empty() {
            return Err(format!("no space before {rest:?} in {line:?}"));
        }
        let key_end = rest.find([' ', '=']).unwrap_or(rest.len());
        let key = &rest[..key_end];
        if key.is_empty() {
            return Err(format!("empty key at {rest:?} in {line:?}"));
        }
        if key.contains('"') {
            return Err(format!("quote in key {key:?} of {line:?}"));
        }
        rest = &rest[key_end..];
        let Some(after_eq) = rest.strip_prefix('=') else {
            pairs.push((key.to_string(), None));
            continue;
        };
        let (value, after) = if let Some(quoted) = after_eq.strip_prefix('"') {
            unquote(quoted).ok_or_else(|| format!("bad quoted value of {key} in {line:?}"))?
        } else {
            let end = after_eq.find(' ').unwrap_or(after_eq.len());
            let bare = &after_eq[..end];
            if bare.is_empty() {
                return Err(format!("{key}= without a value in {line:?}"));
            }
            if bare.contains(['=', '"']) {
                return Err(format!("bare value {bare:?} of {key} in {line:?}"));
            }
            (bare.to_string(), &after_eq[end..])
        };
        pairs.push((key.to_string(), Some(value)));
        rest = after;
    }
    Ok(pairs)
}

/// The value of the quoted string that `s` starts (after its opening quote) and what follows
/// the closing quote; `None` when it is not closed or has an escape JSON does not have.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                '"' => out.push('"'),
                '\\' => out.push('\\'),
                '/' => out.push('/'),
                'b' => out.push('\u{8}'),
                'f' => out.push('\u{c}'),
                'n' => out.push('\n'),
                'r' => out.push('\r'),
                't' => out.push('\t'),
                'u' => {
                    let first = hex4(&mut chars)?;
                    let c = match first {
                        0xd800..=0xdbff => {
                            if chars.next()?.1 != '\\' || chars.next()?.1 != 'u' {
                                return None;
                            }
                            let second = hex4(&mut chars)?;
                            char::decode_utf16([first, second]).next()?.ok()?
                        }
                        _ => char::decode_utf16([first]).next()?.ok()?,
                    };
                    out.push(c);
                }
                _ => return None,
            },
            c => out.push(c),
        }
    }
    None
}

/// The four hex digits of a `\\uXXXX` escape.
fn hex4(chars: &mut std::str::CharIndices<'_>) -> Option<u16> {
    let hex: String = (0..4)
        .map(|_| chars.next().map(|(_, c)| c))
        .collect::<Option<_>>()?;
    if !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u16::from_str_radix(&hex, 16).ok()
}

/// `line` as a person reads it: its tokens again, each value decoded and unquoted
/// (`msg="a \"b\""` → `msg=a "b"`), for tests that look for text in a line; a line that does
/// not parse panics.
pub fn plain(line: &str) -> String {
    let pairs = parse(line).unwrap_or_else(|e| panic!("{e}"));
    let tokens: Vec<String> = pairs
        .into_iter()
        .map(|(k, v)| match v {
            Some(v) => format!("{k}={v}"),
            None => k,
        })
        .collect();
    tokens.join(" ")
}

/// The values of every `key=` token of `pairs` (a bare `key` gives none).
pub fn values<'a>(pairs: &'a [Pair], key: &str) -> Vec<&'a str> {
    pairs
        .iter()
        .filter(|(k, _)| k == key)
        .filter_map(|(_, v)| v.as_deref())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(k: &str, v: Option<&str>) -> Pair {
        (k.to_string(), v.map(str::to_string))
    }

    #[test]
    fn reads_words_pairs_and_quoted_values() {
        assert_eq!(
            parse(r#"[runr-wrapper] WARN accept failed error="a \"b\"\n\u00e9\ud83d\ude00" n=1"#)
                .unwrap(),
            [
                p("[runr-wrapper]", None),
                p("WARN", None),
                p("accept", None),
                p("failed", None),
                p("error", Some("a \"b\"\né😀")),
                p("n", Some("1")),
            ]
        );
        assert_eq!(parse(r#"a="""#).unwrap(), [p("a", Some(""))]);
        assert_eq!(
            plain(r#"[x] ERROR msg="bad: PORT=\"eighty\"" n=1"#),
            r#"[x] ERROR msg=bad: PORT="eighty" n=1"#
        );
        assert_eq!(parse("").unwrap(), []);
    }

    #[test]
    fn refuses_what_a_writer_must_never_write() {
        for bad in [
            "a=b=c",
            r#"a=b"c"#,
            r#""a"=b"#,
            r#"a="b"#,
            r#"a="b"c"#,
            "a= b",
            "a  b",
            " a",
            "a ",
            "a\tb",
            "a=\"\u{85}\"",
            "a=\u{a0}",
            r#"a="\x""#,
            r#"a="\ud800""#,
            "=b",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
    }
}
