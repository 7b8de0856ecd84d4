//! Turns a `toml` error into a [`ConfigError`] naming the key.
//!
//! `toml::de::Error` keeps its key path private but exposes the byte span of the offending
//! key or value. We recover the dotted path by scanning the source up to that span for table
//! headers (`[limits]`, `[[channels]]`, counting array-of-tables entries) and reading the key
//! on the offending line, including dotted keys (`limits.queue_max_bytes = 0`) and one level
//! of inline table (`limits = { queue_max_bytes = 0 }`).

use super::ConfigError;

/// Longest value text quoted back in an error.
const MAX_VALUE_CHARS: usize = 80;

pub(super) fn to_config_error(src: &str, e: &toml::de::Error) -> ConfigError {
    let reason = e.message().trim().replace('\n', "; ");
    let Some(span) = e.span() else {
        return ConfigError { key: missing_field_key("", &reason), message: reason, value: None };
    };
    let at = span.start.min(src.len());
    let (line_no, col) = line_col(src, at);
    let mut key = key_path_at(src, at).unwrap_or_default();
    let missing = missing_field_key(&key, &reason);
    if !missing.is_empty() {
        key = missing;
    }
    let value = value_text(src, span.start, span.end);
    ConfigError { key, message: format!("line {line_no}, column {col}: {reason}"), value }
}

/// For "missing field `x`", the path of the missing key under `prefix`; empty otherwise.
fn missing_field_key(prefix: &str, reason: &str) -> String {
    let Some(rest) = reason.strip_prefix("missing field `") else {
        return String::new();
    };
    let Some(field) = rest.split('`').next() else {
        return String::new();
    };
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// 1-based line and column (in characters) of byte offset `at`.
fn line_col(src: &str, at: usize) -> (usize, usize) {
    let before = &src[..floor_char_boundary(src, at)];
    let line = before.matches('\n').count() + 1;
    let col = before.rsplit('\n').next().map(|l| l.chars().count()).unwrap_or(0) + 1;
    (line, col)
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The span's text when it is a value (after an `=` on its line), for `key = value` display.
fn value_text(src: &str, start: usize, end: usize) -> Option<String> {
    let start = floor_char_boundary(src, start.min(src.len()));
    let end = floor_char_boundary(src, end.min(src.len())).max(start);
    let line_start = src[..start].rfind('\n').map_or(0, |i| i + 1);
    if !src[line_start..start].contains('=') {
        return None;
    }
    let text = src[start..end].trim();
    if text.is_empty() {
        return None;
    }
    let mut out: String = text.chars().take(MAX_VALUE_CHARS).collect();
    if text.chars().count() > MAX_VALUE_CHARS {
        out.push('…');
    }
    Some(out)
}

/// Strips TOML quotes and whitespace from one key segment, and joins dotted segments so
/// `a . "b"` reads `a.b`.
fn clean_key(raw: &str) -> String {
    raw.split('.').map(|seg| seg.trim().trim_matches(|c| c == '"' || c == '\'')).collect::<Vec<_>>().join(".")
}

/// The line of `src` containing byte `at`, as (line start offset, line text).
fn line_at(src: &str, at: usize) -> (usize, &str) {
    let start = src[..at].rfind('\n').map_or(0, |i| i + 1);
    let end = src[at..].find('\n').map_or(src.len(), |i| at + i);
    (start, &src[start..end])
}

/// Dotted key path of the key or value at byte `at`, or `None` when it cannot be located
/// (e.g. a syntax error in a header).
fn key_path_at(src: &str, at: usize) -> Option<String> {
    let at = floor_char_boundary(src, at.min(src.len()));
    let (line_start, line) = line_at(src, at);

    // The table in force on the offending line: the last header before it.
    let mut table = String::new();
    let mut array_counts: Vec<(String, usize)> = Vec::new();
    let mut header_path = |trimmed: &str, table: &mut String| {
        if let Some(inner) = trimmed.strip_prefix("[[").and_then(|t| t.split("]]").next()) {
            let name = clean_key(inner);
            let n = match array_counts.iter_mut().find(|(k, _)| *k == name) {
                Some((_, n)) => {
                    *n += 1;
                    *n
                }
                None => {
                    array_counts.push((name.clone(), 0));
                    0
                }
            };
            *table = format!("{name}[{n}]");
            true
        } else if let Some(inner) = trimmed.strip_prefix('[').and_then(|t| t.split(']').next()) {
            *table = clean_key(inner);
            true
        } else {
            false
        }
    };
    for l in src[..line_start].lines() {
        header_path(l.trim_start(), &mut table);
    }
    let trimmed = line.trim_start();
    if trimmed.starts_with('[') {
        // The error is about a header itself (an unknown table, a duplicate one).
        header_path(trimmed, &mut table);
        return Some(table);
    }

    // Find the line holding the key: the offending line, or for a value spanning several
    // lines (a multi-line array) the nearest earlier line with `key =`.
    let key_line = if trimmed.contains('=') {
        line
    } else {
        src[..line_start].lines().rev().find(|l| {
            let t = l.trim_start();
            t.contains('=') && !t.starts_with('#') && !t.starts_with('[')
        })?
    };
    let eq = key_line.find('=')?;
    let mut key = clean_key(&key_line[..eq]);
    // One level of inline table: `outer = { inner = value }` with the span inside the braces.
    let in_line = at.saturating_sub(line_start);
    if std::ptr::eq(key_line, line) && line[eq..].contains('{') && in_line > eq {
        let upto = &line[..in_line.min(line.len())];
        let brace = upto.rfind('{').unwrap_or(eq);
        let seg_start = upto[brace..].rfind(',').map_or(brace, |c| brace + c) + 1;
        let seg = &line[seg_start..];
        if let Some(inner_eq) = seg.find('=') {
            let inner = clean_key(&seg[..inner_eq]);
            if !inner.is_empty() {
                key = format!("{key}.{inner}");
            }
        }
    }
    if key.is_empty() {
        return None;
    }
    Some(if table.is_empty() { key } else { format!("{table}.{key}") })
}
