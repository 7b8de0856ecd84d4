//! The library's layers (CONTRIBUTING.md, "Layout"): every `crate::` path between top-level
//! modules of `src/` points down the list in [`LAYERS`], so the modules form no import circle
//! and the order a newcomer reads them in is the order they are built on.
//!
//! The check reads the sources: each file belongs to the top-level module whose directory or
//! file holds it; a `crate::a::…` path or a `crate::{a::…, b}` group in code (comments and
//! string literals skipped) is an arrow from that module to `a`. A failure lists every arrow
//! that points up, with the file it is in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The top-level modules of `src/lib.rs`, bottom first: a module may name only modules listed
/// before it. Also the order of src/lib.rs's "Layout".
const LAYERS: &[&str] = &[
    // HTTP/1.1 requests and responses; the RFC 6455 handshake check and frame codec; the
    // pub/sub wire protocol and close contract: sans-IO, no config.
    "http",
    "ws",
    "protocol",
    "log_limit",
    "logging",
    // The configuration, and what reads it without serving.
    "config",
    "auth",
    "limits",
    // The reference client and the Redis link, both below the server that uses them.
    "client",
    "redis",
    // Upstream feeds (a service the server hosts), then the engine.
    "feeds",
    "server",
    // Tools built on the engine.
    "load",
    "fuzz",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let path = entry.expect("directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push(path);
        }
    }
}

/// The text of `src` with comments and string/char literals blanked out (kept as spaces so
/// nothing joins across them).
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if b[i] == b'"' || (b[i] == b'r' && matches!(b.get(i + 1), Some(b'"' | b'#'))) {
            i = skip_string(b, i);
            out.push(' ');
        } else if b[i] == b'\'' && b.get(i + 2) == Some(&b'\'') {
            i += 3;
            out.push(' ');
        } else if b[i] == b'\'' && b.get(i + 1) == Some(&b'\\') {
            i += 2;
            while i < b.len() && b[i] != b'\'' {
                i += 1;
            }
            i += 1;
            out.push(' ');
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// The index just past the string literal starting at `i` (plain, or raw with any `#`s).
fn skip_string(b: &[u8], mut i: usize) -> usize {
    if b[i] == b'r' {
        i += 1;
        let mut hashes = 0;
        while b.get(i) == Some(&b'#') {
            hashes += 1;
            i += 1;
        }
        if b.get(i) != Some(&b'"') {
            return i; // `r#ident`, not a string
        }
        i += 1;
        while i < b.len() {
            if b[i] == b'"' && b[i + 1..].iter().take(hashes).filter(|&&c| c == b'#').count() == hashes {
                return i + 1 + hashes;
            }
            i += 1;
        }
        return i;
    }
    i += 1;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'"' => return i + 1,
            _ => i += 1,
        }
    }
    i
}

/// Every top-level module a `crate::` path in `code` names.
fn named_modules(code: &str) -> Vec<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect() };
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::` or an identifier ending in `crate`
        }
        let tail = rest.trim_start();
        if let Some(group) = tail.strip_prefix('{') {
            // `crate::{a::x, b, c::{y, z}}`: the first identifier of each top-level item.
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        out.push(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name = ident(tail);
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

#[test]
fn every_import_between_top_level_modules_points_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut up: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut unlisted = Vec::new();
    let mut arrows = 0;
    for file in &files {
        let rel = file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let top = rel.split('/').next().expect("a path").trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue; // the crate root declares the modules; the binary sits above them all
        }
        let Some(from) = rank(&top) else {
            unlisted.push(rel.clone());
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).expect("read a source file"));
        for to in named_modules(&code) {
            if to == top {
                continue;
            }
            let Some(r) = rank(&to) else {
                if !matches!(to.as_str(), "self" | "super") {
                    unlisted.push(format!("{rel} names crate::{to}"));
                }
                continue;
            };
            arrows += 1;
            if r > from {
                up.entry((top.clone(), to)).or_default().push(rel.clone());
            }
        }
    }
    assert!(unlisted.is_empty(), "modules missing from LAYERS (add them where they belong): {unlisted:#?}");
    assert!(arrows > 20, "found only {arrows} arrows between modules: the scan is broken");
    let report: Vec<String> = up
        .iter()
        .map(|((a, b), files)| {
            let mut f = files.clone();
            f.dedup();
            format!("{a} -> {b} (up) in {}", f.join(", "))
        })
        .collect();
    assert!(report.is_empty(), "imports that point up LAYERS:\n{}", report.join("\n"));
}

#[test]
fn the_scan_sees_groups_and_skips_comments_and_strings() {
    let code = code_only(
        "use crate::{config::X, server::{a, b}, ws};\n// crate::load::x\nlet s = \"crate::fuzz\";\n\
         /* crate::limits */ let r = r#\"crate::auth\"#; crate::http::f(); $crate::client::g();",
    );
    assert_eq!(named_modules(&code), ["config", "server", "ws", "http"]);
}
