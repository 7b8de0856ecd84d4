//! The library's layers (CONTRIBUTING.md, "Layout"): every `crate::` path between top-level
//! modules of `src/` and of `crates/tether-proto/src/` points down the list in [`LAYERS`], so
//! the modules form no import circle and the order a newcomer reads them in is the order they
//! are built on; `tether-proto`, the sans-IO core, depends on no IO crate; `tether-client`
//! and `tether-load` need no crate of the server's engine; and the server crate's own
//! `[dependencies]` list no crate of a tool (ureq is `tether feeds`'s, hdrhistogram
//! `tether load`'s).
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
    // The tether-proto crate (re-exported by src/lib.rs): HTTP/1.1 requests and responses; the
    // RFC 6455 handshake check and frame codec; the pub/sub wire protocol and close contract;
    // the time base and the session: sans-IO, no config.
    "http",
    "ws",
    "protocol",
    // Server-Sent Events: the stream's wire form (events, heartbeats, positions).
    "sse",
    "redact",
    "duration",
    "tick",
    // A published message in every encoding subscribers take (plain, permessage-deflate).
    "published",
    "session",
    "log_limit",
    "logging",
    // The configuration, and what reads it without serving.
    "config",
    "auth",
    "limits",
    // The reference client (the tether-client crate, re-exported: the compiler keeps it off
    // the server, see `tether_client_stands_on_proto_alone`) and the Redis link, both below
    // the server that uses them.
    "client",
    "redis",
    // Upstream feeds (a service the server hosts), then the engine.
    "feeds",
    "server",
    // The fuzz targets (tether-fuzz) and the load tool (tether-load) are crates of their own.
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

/// The modules of the `tether-proto` crate: its `crate::` paths may name only these (it cannot
/// see the server's modules at all; a path to one would not compile, and is reported here
/// as unlisted if it appears in a macro).
const PROTO_MODULES: &[&str] = &["http", "ws", "protocol", "sse", "redact", "duration", "tick", "published", "session"];

/// Crates that do IO (a runtime, sockets, the OS): none may be a dependency of `tether-proto`.
const IO_CRATES: &[&str] = &["monoio", "tokio", "mio", "socket2", "libc"];

#[test]
fn every_import_between_top_level_modules_points_down() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "crates/tether-proto/src"] {
        let mut found = Vec::new();
        rust_files(&root.join(dir), &mut found);
        files.extend(found.into_iter().map(|f| (dir, f)));
    }
    files.sort();
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut up: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    let mut unlisted = Vec::new();
    let mut arrows = 0;
    for (dir, file) in &files {
        let src = root.join(dir);
        let rel = file.strip_prefix(&src).expect("under src").to_string_lossy().replace('\\', "/");
        let in_proto = dir.starts_with("crates/");
        let top = rel.split('/').next().expect("a path").trim_end_matches(".rs").to_string();
        if top == "lib" || top == "main" {
            continue; // the crate root declares the modules; the binary sits above them all
        }
        let Some(from) = rank(&top).filter(|_| !in_proto || PROTO_MODULES.contains(&top.as_str())) else {
            unlisted.push(format!("{dir}/{rel}"));
            continue;
        };
        let code = code_only(&std::fs::read_to_string(file).expect("read a source file"));
        for to in named_modules(&code) {
            if to == top {
                continue;
            }
            let Some(r) = rank(&to).filter(|_| !in_proto || PROTO_MODULES.contains(&to.as_str())) else {
                if !matches!(to.as_str(), "self" | "super") {
                    unlisted.push(format!("{dir}/{rel} names crate::{to}"));
                }
                continue;
            };
            arrows += 1;
            if r > from {
                up.entry((top.clone(), to)).or_default().push(format!("{dir}/{rel}"));
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

/// What a sans-IO session must not name: sockets, file descriptors, clocks, threads, files,
/// processes, its own random source or log lines. The caller passes `now`, the random source
/// and the context, does the I/O and writes the logs (`session::Event`).
const SESSION_MUST_NOT_NAME: &[&str] = &[
    "std::net",
    "std::os",
    "RawFd",
    "Instant",
    "SystemTime",
    "std::thread",
    "std::fs",
    "std::process",
    "std::env",
    "thread_local!",
    "tracing::",
    "rand::rng()",
    "thread_rng",
];

#[test]
fn the_session_names_no_socket_clock_or_log() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/tether-proto/src");
    let mut files = vec![root.join("tick.rs")];
    rust_files(&root.join("session"), &mut files);
    assert!(files.len() > 10, "the scan is broken: {files:?}");
    let mut found = Vec::new();
    for f in &files {
        let code = code_only(&std::fs::read_to_string(f).expect("read a source file"));
        // Its tests play a socket and a clock on purpose (no real one either).
        let code = code.split("#[cfg(test)]").next().unwrap_or("");
        for name in SESSION_MUST_NOT_NAME {
            if code.contains(name) {
                found.push(format!("{} names {name}", f.display()));
            }
        }
    }
    assert!(found.is_empty(), "the session must stay sans-IO:\n{}", found.join("\n"));
}

#[test]
fn the_scan_sees_groups_and_skips_comments_and_strings() {
    let code = code_only(
        "use crate::{config::X, server::{a, b}, ws};\n// crate::load::x\nlet s = \"crate::fuzz\";\n\
         /* crate::limits */ let r = r#\"crate::auth\"#; crate::http::f(); $crate::client::g();",
    );
    assert_eq!(named_modules(&code), ["config", "server", "ws", "http"]);
}

/// The `[dependencies]` of a manifest, by name.
fn dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("read {}: {e}", manifest.display()));
    let doc: toml::Table = text.parse().unwrap_or_else(|e| panic!("parse {}: {e}", manifest.display()));
    let deps = doc.get("dependencies").and_then(|d| d.as_table()).expect("a [dependencies] table");
    deps.keys().cloned().collect()
}

/// The crates of `among` that the `[dependencies]` of `manifest` (a path from the workspace
/// root) list. Panics when they do not list `known`, a crate that manifest must have, so that
/// a scan that reads nothing cannot pass.
fn listed_among(manifest: &str, known: &str, among: &[&str]) -> Vec<String> {
    let direct = dependencies(&Path::new(env!("CARGO_MANIFEST_DIR")).join(manifest));
    assert!(direct.iter().any(|d| d == known), "the scan of {manifest} is broken (no {known}): {direct:?}");
    direct.into_iter().filter(|d| among.contains(&d.as_str())).collect()
}

#[test]
fn tether_proto_depends_on_no_io_crate() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let io = listed_among("crates/tether-proto/Cargo.toml", "httparse", IO_CRATES);
    assert!(io.is_empty(), "tether-proto must stay sans-IO, but depends on {io:?}");

    // Transitively, from Cargo.lock (every dependency any feature could enable, so a superset
    // of what is built): no runtime or socket crate. libc alone may come in under rand
    // (getrandom reads the OS's entropy), never a runtime.
    let lock: toml::Table =
        std::fs::read_to_string(root.join("Cargo.lock")).expect("Cargo.lock").parse().expect("parse Cargo.lock");
    let packages = lock.get("package").and_then(|p| p.as_array()).expect("[[package]] entries");
    let deps_of = |name: &str| -> Vec<String> {
        let p = packages.iter().find(|p| p.get("name").and_then(|n| n.as_str()) == Some(name));
        let deps = p.and_then(|p| p.get("dependencies")).and_then(|d| d.as_array());
        deps.into_iter()
            .flatten()
            .filter_map(|d| d.as_str())
            .map(|d| d.split(' ').next().unwrap_or(d).to_string())
            .collect()
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut todo = vec!["tether-proto".to_string()];
    while let Some(name) = todo.pop() {
        for d in deps_of(&name) {
            if seen.insert(d.clone()) {
                todo.push(d);
            }
        }
    }
    assert!(seen.contains("httparse") && seen.contains("serde"), "the lock walk is broken: {seen:?}");
    let runtime: Vec<&String> = seen.iter().filter(|d| IO_CRATES.contains(&d.as_str()) && *d != "libc").collect();
    assert!(runtime.is_empty(), "tether-proto reaches IO crates transitively: {runtime:?}");
}

/// Crates of the server's engine and of the load tool: the client crate must not need any of
/// them. (ureq is not one: `tether feeds`, the admin API's command line, is a client tool.)
const SERVER_CRATES: &[&str] = &["tether", "monoio", "socket2", "io-uring", "slab", "redis", "hdrhistogram"];

/// Crates that belong to one tool, never to the server library: ureq to `tether feeds`
/// (tether-client), hdrhistogram to `tether load` (tether-load).
const TOOL_CRATES: &[&str] = &["ureq", "hdrhistogram"];

#[test]
fn tether_client_stands_on_proto_alone() {
    // The client speaks the protocol crate's wire.
    let server = listed_among("crates/tether-client/Cargo.toml", "tether-proto", SERVER_CRATES);
    assert!(server.is_empty(), "tether-client must build without the server's crates, but depends on {server:?}");
    // The admin tool's HTTP client is the client crate's own.
    let ureq = listed_among("crates/tether-client/Cargo.toml", "tether-proto", &["ureq"]);
    assert_eq!(ureq, ["ureq"], "`tether feeds` (ureq) lives in tether-client");
}

#[test]
fn the_server_crate_lists_no_tool_crate() {
    let tools = listed_among("Cargo.toml", "monoio", TOOL_CRATES);
    assert!(
        tools.is_empty(),
        "tether's [dependencies] list tool crates {tools:?}: they belong to tether-client / tether-load"
    );
}

#[test]
fn tether_fuzz_stands_on_proto_alone() {
    // The targets drive the protocol crate, sans-IO code with no IO crate and no engine.
    let server = listed_among("crates/tether-fuzz/Cargo.toml", "tether-proto", SERVER_CRATES);
    assert!(server.is_empty(), "tether-fuzz must build without the server's crates, but depends on {server:?}");
    let io = listed_among("crates/tether-fuzz/Cargo.toml", "tether-proto", IO_CRATES);
    assert!(io.is_empty(), "tether-fuzz drives sans-IO code and needs no IO crate, but depends on {io:?}");
}

#[test]
fn tether_load_stands_apart_from_the_server_library() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let engine = listed_among(
        "crates/tether-load/Cargo.toml",
        "hdrhistogram",
        &["tether", "monoio", "io-uring", "slab", "redis"],
    );
    assert!(engine.is_empty(), "tether-load must build without the engine, but depends on {engine:?}");
    // Only the binary (src/main.rs, `tether load`) may name the load tool; the library's
    // modules never do (hdrhistogram, its crate, is not the server's dependency at all:
    // `the_server_crate_lists_no_tool_crate`).
    let mut files = Vec::new();
    rust_files(&root.join("src"), &mut files);
    let named: Vec<String> = files
        .iter()
        .filter(|f| !f.ends_with("src/main.rs"))
        .filter(|f| code_only(&std::fs::read_to_string(f).expect("read a source file")).contains("tether_load"))
        .map(|f| f.display().to_string())
        .collect();
    assert!(files.len() > 50 && named.is_empty(), "library files naming tether_load: {named:?}");
}
