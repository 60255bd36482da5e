//! logfmt's quoting, which every text log line follows, so that a line parses back into exactly
//! the fields its binary wrote, whatever text a client or a user program put into them.
//!
//! A logfmt line is a run of tokens separated by single spaces: `key=value`, or a bare `word`
//! (a key without a value: the `[prefix]`, the level, the words of a message). A reader (Go's
//! `go-logfmt`, Loki's `| logfmt`, Grafana's) splits a bare token at every byte up to the space
//! and at `=`, and takes a `"` outside a quoted value for an error. So:
//!
//! - a **value** ([`push_value`]) is written as it is when it is plain (not empty, and no
//!   space, `=`, `"`, `\` or [invisible](is_invisible) character), else quoted: `"…"` with `\"`,
//!   `\\`, `\n`, `\r`, `\t` and `\uXXXX` (UTF-16, as JSON) for every other invisible character;
//! - a **message** ([`push_message`]) is written as its words when it is [plain
//!   words](is_plain_words), else as the field `msg="…"`;
//! - a **bare token** whose shape a spec fixes (the access line's method and path:
//!   [`push_percent_encoded`]) has every byte a reader would split at or misread
//!   percent-encoded, the URL's own escape.
//!
//! Hand-written: the rules are a few lines, and the crates that write logfmt come with a
//! formatter of their own for `tracing` that does not write our line shape.

use std::fmt::Write as _;

/// Whether `c` shows as nothing, as blank space, or as something other than itself: control
/// characters (C0, DEL, C1), Unicode white space (the space included), the format characters
/// that reorder or hide text (bidi controls, zero-width characters, the BOM, the tag
/// characters that smuggle text past a reader) and U+FFFD (what undecodable bytes became).
/// Such a character is escaped wherever it appears in a quoted value, and makes a value quoted.
pub fn is_invisible(c: char) -> bool {
    c.is_control()
        || c.is_whitespace()
        || matches!(
            c,
            '\u{ad}'
                | '\u{34f}'
                | '\u{61c}'
                | '\u{115f}'
                | '\u{1160}'
                | '\u{17b4}'
                | '\u{17b5}'
                | '\u{180b}'..='\u{180f}'
                | '\u{200b}'..='\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2060}'..='\u{206f}'
                | '\u{3164}'
                | '\u{fe00}'..='\u{fe0f}'
                | '\u{feff}'
                | '\u{ffa0}'
                | '\u{fff0}'..='\u{fffd}'
                | '\u{1d173}'..='\u{1d17a}'
                | '\u{e0000}'..='\u{e0fff}'
        )
}

/// Whether `c` makes a value quoted: everything a reader splits at or takes for syntax, and the
/// backslash (so a bare value never holds one: every `\n` a reader sees is an escape).
fn needs_quote(c: char) -> bool {
    matches!(c, '=' | '"' | '\\') || is_invisible(c)
}

/// Whether `value` is written as it is (else quoted): not empty, nothing [`needs_quote`].
pub fn is_plain_value(value: &str) -> bool {
    !value.is_empty() && !value.chars().any(needs_quote)
}

/// Appends `value` as a logfmt value: as it is when [plain](is_plain_value), else quoted and
/// escaped.
pub fn push_value(out: &mut String, value: &str) {
    if is_plain_value(value) {
        out.push_str(value);
    } else {
        push_quoted(out, value);
    }
}

/// Appends `value` in double quotes, escaped as JSON escapes a string (`\"`, `\\`, `\n`, `\r`,
/// `\t`, `\uXXXX`), except that only [invisible](is_invisible) characters become `\uXXXX`
/// (the space stays a space, other text stays as it is, non-ASCII included).
pub fn push_quoted(out: &mut String, value: &str) {
    out.reserve(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            ' ' => out.push(' '),
            c if is_invisible(c) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Whether `message` is written as its words: words of plain characters (see
/// [`is_plain_value`]) joined by single spaces, no space at either end, and not starting with
/// `[` (so no message, a handler's line among them, can pass for a `[prefix]` of ours).
pub fn is_plain_words(message: &str) -> bool {
    !message.is_empty() && !message.starts_with('[') && message.split(' ').all(is_plain_value)
}

/// Appends `message`: as it is when it is [plain words](is_plain_words) (a reader sees its
/// words as bare tokens), else as the field `msg="…"`; nothing for an empty message.
pub fn push_message(out: &mut String, message: &str) {
    if message.is_empty() {
        return;
    }
    if is_plain_words(message) {
        out.push_str(message);
    } else {
        out.push_str("msg=");
        push_quoted(out, message);
    }
}

/// Appends `token` as one bare token: every byte of a character that would make a value
/// quoted ([`is_plain_value`]) percent-encoded (`%3D`, `%22`, `%C2%85`), the rest as it is;
/// `-` for an empty token. For the tokens whose place in a line a spec fixes without a key (the
/// access line's method and path), where a quoted value would not parse. A `%` already in the
/// token stays as it is: a path arrives percent-encoded, and a reader decodes both alike.
pub fn push_percent_encoded(out: &mut String, token: &str) {
    if token.is_empty() {
        out.push('-');
        return;
    }
    for c in token.chars() {
        if needs_quote(c) {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(v: &str) -> String {
        let mut s = String::new();
        push_value(&mut s, v);
        s
    }

    fn message(m: &str) -> String {
        let mut s = String::new();
        push_message(&mut s, m);
        s
    }

    fn percent(t: &str) -> String {
        let mut s = String::new();
        push_percent_encoded(&mut s, t);
        s
    }

    #[test]
    fn values_are_quoted_when_a_reader_would_split_or_misread_them() {
        assert_eq!(value("boom"), "boom");
        assert_eq!(value("café"), "café");
        assert_eq!(value("0.0.0.0:8080"), "0.0.0.0:8080");
        assert_eq!(value(""), r#""""#);
        assert_eq!(value("x status=200"), r#""x status=200""#);
        assert_eq!(value("a=b"), r#""a=b""#);
        assert_eq!(value(r#"say "hi""#), r#""say \"hi\"""#);
        assert_eq!(value(r"C:\x"), r#""C:\\x""#);
        assert_eq!(value("a\r\nb\tc"), r#""a\r\nb\tc""#);
        assert_eq!(
            value("\u{1b}[2J\u{0}\u{7f}\u{85}"),
            r#""\u001b[2J\u0000\u007f\u0085""#
        );
        // Invisible characters that reorder or hide text, and a non-BMP one as a surrogate pair.
        assert_eq!(value("a\u{202e}b\u{200b}"), r#""a\u202eb\u200b""#);
        assert_eq!(value("\u{e0041}"), r#""\udb40\udc41""#);
        assert_eq!(value("no\u{a0}break"), r#""no\u00a0break""#);
    }

    #[test]
    fn messages_are_words_or_one_msg_field() {
        assert_eq!(message("listening"), "listening");
        assert_eq!(message("accept failed"), "accept failed");
        assert_eq!(
            message("the invocation's lines: dropped"),
            "the invocation's lines: dropped"
        );
        assert_eq!(message(""), "");
        assert_eq!(message("bad x=1"), r#"msg="bad x=1""#);
        assert_eq!(message("two  spaces"), r#"msg="two  spaces""#);
        assert_eq!(message(" lead"), r#"msg=" lead""#);
        assert_eq!(
            message("[runr-wrapper] forged"),
            r#"msg="[runr-wrapper] forged""#
        );
        assert_eq!(message("a\nb"), r#"msg="a\nb""#);
    }

    #[test]
    fn bare_tokens_percent_encode_what_would_be_quoted() {
        assert_eq!(percent("/orders"), "/orders");
        assert_eq!(percent("/a=b"), "/a%3Db");
        assert_eq!(percent("/\"x\""), "/%22x%22");
        assert_eq!(percent("/a\u{85}b c"), "/a%C2%85b%20c");
        assert_eq!(percent("/caf\u{e9}/%41"), "/caf\u{e9}/%41");
        assert_eq!(percent(""), "-");
    }
}
