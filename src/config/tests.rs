use super::*;

fn err(toml: &str) -> ConfigError {
    match Config::from_toml_str(toml) {
        Ok(c) => panic!("expected an error for {toml:?}, got {c:?}"),
        Err(e) => e,
    }
}

#[test]
fn empty_document_gives_design_defaults() {
    let c = Config::from_toml_str("").unwrap();
    assert_eq!(c, Config::default());
    assert_eq!(c.listen, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(c.cores, 0);
    assert_eq!(c.max_connections, 1_000_000);
    assert_eq!(c.accept_rate, 0);
    assert_eq!(c.limits.handshake_timeout_ms, 5000);
    assert_eq!(c.limits.max_header_bytes, 8192);
    assert_eq!(c.limits.max_message_bytes, 65536);
    assert_eq!(c.limits.max_publish_bytes, 1_048_576);
    assert_eq!(c.limits.queue_max_bytes, 2_097_152);
    assert_eq!(c.limits.queue_max_messages, 4096);
    assert_eq!(c.limits.close_timeout_ms, 5000);
    assert_eq!(c.heartbeat.ping_interval_ms, 25_000);
    assert_eq!(c.heartbeat.pong_timeout_ms, 10_000);
    assert_eq!(c.drain.window_ms, 10_000);
    assert_eq!(c.drain.close_code, 1012);
    assert_eq!(
        c.channels,
        vec![ChannelRule {
            pattern: "*".into(),
            overflow: Overflow::Disconnect,
            history: 1000,
            ..ChannelRule::default()
        }]
    );
    assert_eq!(c.dedup.window_ms, 300_000);
    assert_eq!(c.dedup.max_entries, 1_000_000);
    assert_eq!(c.broker.kind, BrokerKind::Memory);
    assert_eq!(c.broker.url, "redis://127.0.0.1:6379");
    assert!(c.allowed_origins.is_empty());
    Config::default().validate().unwrap();
}

#[test]
fn shipped_example_config_is_the_defaults() {
    let c = Config::from_toml_str(include_str!("../../systemd/tether.toml")).unwrap();
    assert_eq!(c, Config::default());
}

#[test]
fn full_document_parses() {
    let c = Config::from_toml_str(
        r#"
listen = "127.0.0.1:9000"
cores = 2
max_connections = 20000
accept_rate = 5000
allowed_origins = ["https://app.example.com", "null"]

[limits]
queue_max_bytes = 262144
max_publish_bytes = 131072

[heartbeat]
ping_interval_ms = 1000

[drain]
window_ms = 1000
close_code = 1001

[[channels]]
pattern = "prices.*"
overflow = "conflate"
history = 0

[[channels]]
pattern = "log.?"
overflow = "drop-oldest"

[[channels]]
pattern = "*"

[dedup]
window_ms = 60000
max_entries = 10

[broker]
kind = "memory"
url = "rediss://cache:6380/0"
"#,
    )
    .unwrap();
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.effective_cores(), 2);
    assert_eq!(c.limits.queue_max_bytes, 262144);
    assert_eq!(c.limits.max_message_bytes, 65536, "unset keys in a table keep their default");
    assert_eq!(
        c.channels[1],
        ChannelRule {
            pattern: "log.?".into(),
            overflow: Overflow::DropOldest,
            history: 1000,
            ..ChannelRule::default()
        }
    );
    assert_eq!(c.broker.url, "rediss://cache:6380/0");
    assert_eq!(c.drain.close_code, 1001);
}

#[test]
fn presence_keys_are_checked_by_name() {
    let e = err("[[channels]]\npattern = \"room.*\"\njoin_leave = true");
    assert_eq!(e.key, "channels[0].join_leave");
    assert!(e.message.contains("presence = true"), "{e}");
    for (toml, key) in [
        ("[presence]\nwindow_ms = 5", "presence.window_ms"),
        ("[presence]\nwindow_ms = 60001", "presence.window_ms"),
        ("[presence]\nmax_diff = 0", "presence.max_diff"),
        ("[presence]\ninfo_max_bytes = 1", "presence.info_max_bytes"),
        ("[presence]\npage_size = 0", "presence.page_size"),
        ("[presence]\nmember_ttl_ms = 1000", "presence.member_ttl_ms"),
        (
            "[[channels]]\npattern = \"r\"\npresence = true\npresence_max_members = 0",
            "channels[0].presence_max_members",
        ),
        ("[presence]\nwindow = 5", "presence.window"),
        ("[compression]\nlevel = 0", "compression.level"),
        ("[compression]\nlevel = 10", "compression.level"),
        ("[compression]\nmin_bytes = 2000000", "compression.min_bytes"),
        ("[compression]\nenabled = \"yes\"", "compression.enabled"),
        ("[compression]\nlevels = 6", "compression.levels"),
    ] {
        assert_eq!(err(toml).key, key, "{toml}");
    }
    let c = Config::from_toml_str("[[channels]]\npattern = \"room.*\"\npresence = true\njoin_leave = true").unwrap();
    let rule = c.channel_rule("room.1");
    assert!(rule.presence && rule.join_leave && rule.max_members() == 100_000);
    assert!(!c.channel_rule("other").presence, "presence is off by default");
}

#[test]
fn every_range_check_names_key_and_value() {
    let cases: &[(&str, &str, &str)] = &[
        ("cores = 5000", "cores", "5000"),
        ("max_connections = 0", "max_connections", "0"),
        ("[limits]\nhandshake_timeout_ms = 0", "limits.handshake_timeout_ms", "0"),
        ("[limits]\nmax_header_bytes = 100", "limits.max_header_bytes", "100"),
        ("[limits]\nmax_header_bytes = 2000000", "limits.max_header_bytes", "2000000"),
        ("[limits]\nmax_message_bytes = 124", "limits.max_message_bytes", "124"),
        ("[limits]\nmax_message_bytes = 2000000000", "limits.max_message_bytes", "2000000000"),
        ("[limits]\nmax_publish_bytes = 0", "limits.max_publish_bytes", "0"),
        ("[limits]\nmax_publish_bytes = 2000000000", "limits.max_publish_bytes", "2000000000"),
        ("[limits]\nqueue_max_bytes = 0", "limits.queue_max_bytes", "0"),
        ("[limits]\nqueue_max_messages = 0", "limits.queue_max_messages", "0"),
        ("[limits]\nclose_timeout_ms = 10", "limits.close_timeout_ms", "10"),
        ("[heartbeat]\nping_interval_ms = 99", "heartbeat.ping_interval_ms", "99"),
        ("[heartbeat]\npong_timeout_ms = 0", "heartbeat.pong_timeout_ms", "0"),
        ("[drain]\nwindow_ms = 3600001", "drain.window_ms", "3600001"),
        ("[drain]\nclose_code = 1011", "drain.close_code", "1011"),
        ("[dedup]\nwindow_ms = 999", "dedup.window_ms", "999"),
        ("[dedup]\nwindow_ms = 86400001", "dedup.window_ms", "86400001"),
        (
            "[limits]\nhandshake_timeout_ms = 18446744073709551615",
            "limits.handshake_timeout_ms",
            "18446744073709551615",
        ),
        ("[limits]\nclose_timeout_ms = 86400001", "limits.close_timeout_ms", "86400001"),
        ("[heartbeat]\nping_interval_ms = 86400001", "heartbeat.ping_interval_ms", "86400001"),
        ("[heartbeat]\npong_timeout_ms = 86400001", "heartbeat.pong_timeout_ms", "86400001"),
        ("[limits]\nqueue_max_bytes = 1048576", "limits.queue_max_bytes", "1048576"),
        ("[limits]\nmax_publish_bytes = 4096\nqueue_max_bytes = 65536", "limits.queue_max_bytes", "65536"),
        ("[broker]\nkind = \"redis\"\nkey_prefix = \"a{b\"", "broker.key_prefix", "\"a{b\""),
        ("[broker]\nkind = \"redis\"\nhistory_ttl_ms = 10", "broker.history_ttl_ms", "10"),
        ("[broker]\nkind = \"redis\"\nurls = [\"unix:///x\"]", "broker.urls[0]", "\"unix:///x\""),
        ("[dedup]\nmax_entries = 0", "dedup.max_entries", "0"),
        ("[[channels]]\npattern = \"a\"\nhistory = 10000001", "channels[0].history", "10000001"),
        ("[[channels]]\npattern = \"\"", "channels[0].pattern", "\"\""),
        ("[[channels]]\npattern = \"a b\"", "channels[0].pattern", "\"a b\""),
        ("[[channels]]\npattern = \"*\"\n[[channels]]\npattern = \"x.*\"", "channels[1].pattern", "\"x.*\""),
        ("[[channels]]\npattern = \"x\"\n[[channels]]\npattern = \"x\"", "channels[1].pattern", "\"x\""),
        ("[broker]\nkind = \"redis\"\nurl = \"http://x\"", "broker.url", "\"http://x\""),
        ("allowed_origins = [\"https://a.example/path\"]", "allowed_origins[0]", "\"https://a.example/path\""),
        ("allowed_origins = [\"a.example\"]", "allowed_origins[0]", "\"a.example\""),
        ("[tls]\ncert_file = \"\"\nkey_file = \"k.pem\"", "tls.cert_file", "\"\""),
        (
            "listen = \"127.0.0.1:8443\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"\nlisten_tls = \"127.0.0.1:8443\"",
            "tls.listen_tls",
            "127.0.0.1:8443",
        ),
    ];
    for (toml, key, value) in cases {
        let e = err(toml);
        assert_eq!(e.key, *key, "for {toml:?}: {e}");
        assert_eq!(e.value.as_deref(), Some(*value), "for {toml:?}: {e}");
        assert!(e.to_string().starts_with(&format!("config: {key} = {value}: ")), "{e}");
    }
}

#[test]
fn display_matches_documented_style() {
    let e = err("[limits]\nqueue_max_bytes = 0");
    assert_eq!(e.to_string(), "config: limits.queue_max_bytes = 0: must be at least 1024");
}

#[test]
fn every_allowed_close_code_passes() {
    for code in [1000, 1001, 1012, 1013] {
        Config::from_toml_str(&format!("[drain]\nclose_code = {code}")).unwrap();
    }
}

#[test]
fn memory_broker_ignores_url() {
    Config::from_toml_str("[broker]\nurl = \"not a url\"").unwrap();
}

#[test]
fn long_and_odd_patterns_refused() {
    let long = "a".repeat(129);
    assert_eq!(err(&format!("[[channels]]\npattern = \"{long}\"")).key, "channels[0].pattern");
    Config::from_toml_str(&format!("[[channels]]\npattern = \"{}\"", "a".repeat(128))).unwrap();
    assert_eq!(err("[[channels]]\npattern = \"a/b\"").key, "channels[0].pattern");
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    let e = err("listne = \"0.0.0.0:1\"");
    assert_eq!(e.key, "listne", "{e}");
    assert!(e.message.contains("line 1"), "{e}");
    let e = err("[limits]\nqueue_max_byte = 10");
    assert_eq!(e.key, "limits.queue_max_byte", "{e}");
    assert!(e.message.contains("line 2"), "{e}");
    let e = err("[[channels]]\npattern = \"a\"\n[[channels]]\npattern = \"b\"\nhistroy = 3");
    assert_eq!(e.key, "channels[1].histroy", "{e}");
    let e = err("[limit]\nqueue_max_bytes = 10");
    assert_eq!(e.key, "limit", "{e}");
}

#[test]
fn wrong_types_name_the_key() {
    let e = err("[limits]\nqueue_max_bytes = \"1MB\"");
    assert_eq!(e.key, "limits.queue_max_bytes", "{e}");
    assert_eq!(e.value.as_deref(), Some("\"1MB\""), "{e}");
    assert!(e.message.contains("line 2"), "{e}");
    let e = err("listen = \"localhost\"");
    assert_eq!(e.key, "listen", "{e}");
    let e = err("max_connections = -1");
    assert_eq!(e.key, "max_connections", "{e}");
    let e = err("[[channels]]\npattern = \"a\"\n[[channels]]\npattern = \"b\"\noverflow = \"block\"");
    assert_eq!(e.key, "channels[1].overflow", "{e}");
    let e = err("[broker]\nkind = \"Redis\"");
    assert_eq!(e.key, "broker.kind", "{e}");
    let e = err("limits.queue_max_bytes = true");
    assert_eq!(e.key, "limits.queue_max_bytes", "{e}");
    let e = err("limits = { max_header_bytes = 9000, queue_max_bytes = \"x\" }");
    assert_eq!(e.key, "limits.queue_max_bytes", "{e}");
}

#[test]
fn missing_pattern_names_the_key() {
    let e = err("[[channels]]\noverflow = \"conflate\"");
    assert_eq!(e.key, "channels[0].pattern", "{e}");
}

#[test]
fn syntax_error_gives_line() {
    let e = err("cores = 1\n[limits\n");
    assert!(e.message.contains("line 2"), "{e}");
}

#[test]
fn load_reads_a_file_and_names_a_missing_one() {
    let dir = std::env::temp_dir().join(format!("tether-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("t.toml");
    std::fs::write(&path, "cores = 3\n").unwrap();
    assert_eq!(Config::load(&path).unwrap().cores, 3);
    std::fs::write(&path, "cores = -3\n").unwrap();
    let e = Config::load(&path).unwrap_err();
    assert_eq!(e.key, "cores");
    assert!(e.message.contains("t.toml"), "{e}");
    let e = Config::load(&dir.join("absent.toml")).unwrap_err();
    assert!(e.key.is_empty() && e.message.contains("absent.toml"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn glob_matching() {
    assert!(glob_match("*", ""));
    assert!(glob_match("*", "anything.at:all"));
    assert!(glob_match("prices.*", "prices.btc"));
    assert!(glob_match("prices.*", "prices."));
    assert!(!glob_match("prices.*", "price.btc"));
    assert!(!glob_match("prices.*", "xprices.btc"));
    assert!(glob_match("a?c", "abc"));
    assert!(!glob_match("a?c", "ac"));
    assert!(!glob_match("a?c", "abbc"));
    assert!(glob_match("a*b*c", "aXXbYYc"));
    assert!(glob_match("a*b*c", "abc"));
    assert!(!glob_match("a*b*c", "acb"));
    assert!(glob_match("*.log", "x.y.log"));
    assert!(!glob_match("*.log", "x.log.y"));
    assert!(glob_match("**", "x"));
    assert!(glob_match("exact", "exact"));
    assert!(!glob_match("exact", "exactly"));
    assert!(!glob_match("", "x"));
    assert!(glob_match("", ""));
    assert!(glob_match("?", "é"), "? is one character, not one byte");
    assert!(glob_match("*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaab"));
    assert!(!glob_match("*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaa"));
}

#[test]
fn first_matching_rule_wins_and_fallback_applies() {
    let c = Config::from_toml_str(
        "[[channels]]\npattern = \"prices.btc\"\nhistory = 5\n\
         [[channels]]\npattern = \"prices.*\"\noverflow = \"conflate\"\n\
         [[channels]]\npattern = \"log?\"\noverflow = \"drop-oldest\"",
    )
    .unwrap();
    assert_eq!(c.channel_rule("prices.btc").history, 5);
    assert_eq!(c.channel_rule("prices.btc").overflow, Overflow::Disconnect);
    assert_eq!(c.channel_rule("prices.eth").overflow, Overflow::Conflate);
    assert_eq!(c.channel_rule("log1").overflow, Overflow::DropOldest);
    let fallback = c.channel_rule("news");
    assert_eq!(*fallback, ChannelRule::default());
    let empty = Config { channels: Vec::new(), ..Config::default() };
    assert_eq!(*empty.channel_rule("x"), ChannelRule::default());
}

#[test]
fn effective_cores_defaults_to_cpus() {
    assert!(Config::default().effective_cores() >= 1);
    assert_eq!(Config { cores: 7, ..Config::default() }.effective_cores(), 7);
}

#[test]
fn origin_allow_list() {
    let open = Config::default();
    assert!(open.origin_allowed(Some("https://evil.example")));
    let c = Config::from_toml_str("allowed_origins = [\"https://app.example.com\"]").unwrap();
    assert!(c.origin_allowed(Some("https://APP.example.com")));
    // RFC 6454: the default port is implied, scheme and host ignore case; other ports differ.
    assert!(c.origin_allowed(Some("HTTPS://app.example.com:443")));
    assert!(!c.origin_allowed(Some("https://app.example.com:8443")));
    assert!(!c.origin_allowed(Some("http://app.example.com")));
    assert!(!c.origin_allowed(Some("https://evil.example")));
    assert!(c.origin_allowed(None), "non-browser clients send no Origin");
}

#[test]
fn queue_must_hold_the_largest_accepted_message() {
    // The fault of issue 8: the default 1 MiB publish could never be delivered through a
    // 1 MiB queue (its msg frame is 1 MiB + envelope).
    let e = err("[limits]\nqueue_max_bytes = 1048576");
    assert_eq!(e.key, "limits.queue_max_bytes");
    assert!(e.message.contains("limits.max_publish_bytes = 1048576"), "{e}");
    assert!(e.message.contains("at least 1052865"), "{e}");
    assert!(e.message.contains("at most 1044287"), "{e}");
    // Both ways out of the message are accepted, exactly at the edge.
    Config::from_toml_str("[limits]\nqueue_max_bytes = 1052865").unwrap();
    Config::from_toml_str("[limits]\nqueue_max_bytes = 1048576\nmax_publish_bytes = 1044287").unwrap();
    err("[limits]\nqueue_max_bytes = 1048576\nmax_publish_bytes = 1044288");
    // WebSocket `pub` messages count the same way.
    let e = err("[limits]\nmax_message_bytes = 4000000\nqueue_max_bytes = 3000000");
    assert_eq!(e.key, "limits.queue_max_bytes");
    assert!(e.message.contains("limits.max_message_bytes = 4000000"), "{e}");
    // The defaults are coherent.
    let d = Config::default();
    assert!(
        d.limits.max_publish_bytes + crate::protocol::MSG_FRAME_OVERHEAD + QUEUE_CONTROL_RESERVE
            <= d.limits.queue_max_bytes
    );
}

#[test]
fn redis_broker_accepts_its_urls() {
    for url in ["redis://127.0.0.1:6379/0", "rediss://cache:6380", "unix:///run/redis.sock"] {
        let c = Config::from_toml_str(&format!("[broker]\nkind = \"redis\"\nurl = \"{url}\"")).unwrap();
        assert_eq!(c.broker.cluster_urls(), None);
    }
    let c =
        Config::from_toml_str("[broker]\nkind = \"redis\"\nurls = [\"redis://a:7000\", \"redis://b:7001\"]").unwrap();
    assert_eq!(c.broker.cluster_urls().unwrap().len(), 2);
    assert_eq!(c.broker.key_prefix, "tether:");
    assert_eq!(c.broker.history_ttl_ms, 86_400_000);
}

#[test]
fn warnings_name_the_key() {
    let keys = |toml: &str, mem: Option<u64>| -> Vec<String> {
        Config::from_toml_str(toml).unwrap().warnings(mem).into_iter().map(|w| w.key).collect()
    };
    // The defaults raise none on a box with 8 GiB.
    assert_eq!(keys("", Some(8 << 30)), Vec::<String>::new());
    assert_eq!(keys("", None), Vec::<String>::new());
    // 1000 × 1 MiB of history is 1 GiB per channel: too much for a 2 GiB box.
    assert_eq!(keys("", Some(2 << 30)), vec!["channels[0].history"]);
    // 1,000,000 ids × 104 B is 104 MB.
    assert_eq!(keys("[[channels]]\npattern = \"*\"\nhistory = 0", Some(256 << 20)), vec!["dedup.max_entries"]);
    assert_eq!(
        keys("[heartbeat]\nping_interval_ms = 5000\npong_timeout_ms = 5000", None),
        vec!["heartbeat.pong_timeout_ms"]
    );
    assert_eq!(keys("[heartbeat]\nping_interval_ms = 60000", None), vec!["heartbeat.ping_interval_ms"]);
    assert_eq!(keys("[drain]\nwindow_ms = 28000", None), vec!["drain.window_ms"]);
    assert_eq!(keys("[drain]\nwindow_ms = 27999", None), Vec::<String>::new());
    assert_eq!(keys("[dedup]\nwindow_ms = 10000", None), vec!["dedup.window_ms"]);
    assert_eq!(keys("[limits]\nqueue_max_messages = 2", None), vec!["limits.queue_max_messages"]);
    assert_eq!(keys("[limits]\nhandshake_timeout_ms = 120000", None), vec!["limits.handshake_timeout_ms"]);
    let w = Config::from_toml_str("[drain]\nwindow_ms = 60000").unwrap().warnings(None);
    assert!(w[0].to_string().starts_with("config: drain.window_ms = 60000: "), "{}", w[0]);
    assert!(w[0].message.contains("TimeoutStopSec"), "{}", w[0]);
}

#[test]
fn send_batch_takes_its_two_values_and_names_a_bad_one() {
    use super::SendBatch;
    assert_eq!(Config::default().io.send_batch, SendBatch::Sendmsg);
    let c = Config::from_toml_str("[io]\nsend_batch = \"io_uring\"").unwrap();
    assert_eq!(c.io.send_batch, SendBatch::IoUring);
    let c = Config::from_toml_str("[io]\nsend_batch = \"sendmsg\"").unwrap();
    assert_eq!(c.io.send_batch, SendBatch::Sendmsg);
    let e = err("[io]\nsend_batch = \"uring\"");
    assert_eq!(e.key, "io.send_batch", "{e}");
    assert_eq!(e.value.as_deref(), Some("\"uring\""), "{e}");
    assert!(e.message.contains("io_uring") && e.message.contains("sendmsg"), "{e}");
}

#[test]
fn readiness_takes_its_two_values_and_names_a_bad_one() {
    use super::Readiness;
    assert_eq!(Config::default().io.readiness, Readiness::Epoll);
    for (text, want) in [("io_uring", Readiness::IoUring), ("epoll", Readiness::Epoll)] {
        let c = Config::from_toml_str(&format!("[io]\nreadiness = \"{text}\"")).unwrap();
        assert_eq!(c.io.readiness, want, "{text}");
    }
    let e = err("[io]\nreadiness = \"poll\"");
    assert_eq!(e.key, "io.readiness", "{e}");
    assert_eq!(e.value.as_deref(), Some("\"poll\""), "{e}");
    assert!(e.message.contains("io_uring") && e.message.contains("epoll"), "{e}");
}

#[test]
fn presence_keys_need_presence_and_info_must_fit_the_request_head() {
    let err = |toml: &str| Config::from_toml_str(toml).expect_err(toml);
    let e = err("[[channels]]\npattern = \"r\"\npresence_max_members = 5");
    assert_eq!(e.key, "channels[0].presence_max_members");
    let auth = "[auth]\njwt_hs256_secret = \"0123456789abcdef0123456789abcdef\"\n";
    let rule = "[[channels]]\npattern = \"r\"\npresence = true\n";
    let e = err(&format!("{auth}[presence]\ninfo_max_bytes = 16384\n{rule}"));
    assert_eq!(e.key, "presence.info_max_bytes");
    // Room enough in the head, or no presence channel, or no tokens: accepted.
    Config::from_toml_str(&format!(
        "{auth}[limits]\nmax_header_bytes = 65536\n[presence]\ninfo_max_bytes = 16384\n{rule}"
    ))
    .unwrap();
    Config::from_toml_str(&format!("{auth}[presence]\ninfo_max_bytes = 16384\n")).unwrap();
    Config::from_toml_str(&format!("[presence]\ninfo_max_bytes = 16384\n{rule}")).unwrap();
    assert!(
        Config::from_toml_str(&format!("{rule}presence_max_members = 5")).unwrap().channel_rule("r").max_members() == 5
    );
}

#[test]
fn tls_needs_both_files_and_a_listen_tls_apart_from_listen() {
    let c = Config::from_toml_str("[tls]\ncert_file = \"/etc/tether/cert.pem\"\nkey_file = \"/etc/tether/key.pem\"")
        .unwrap();
    let t = c.tls.expect("tls on");
    assert_eq!(t.listen_tls, None, "listen itself speaks TLS by default");
    assert_eq!(Config::default().tls, None, "TLS is off by default");
    let e = err("[tls]\ncert_file = \"c.pem\"");
    assert!(e.to_string().contains("key_file"), "both files are required: {e}");
    let e = err("[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nciphers = \"all\"");
    assert!(e.to_string().contains("ciphers"), "unknown keys are errors: {e}");
    let c = Config::from_toml_str("[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\nlisten_tls = \"0.0.0.0:8443\"")
        .unwrap();
    assert_eq!(c.tls.unwrap().listen_tls, Some("0.0.0.0:8443".parse().unwrap()));
}

#[test]
fn tls_records_per_key_is_absent_by_default_and_at_least_two() {
    let pair = "[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n";
    assert_eq!(Config::from_toml_str(pair).unwrap().tls.unwrap().records_per_key, None, "the suite's limit");
    let c = Config::from_toml_str(&format!("{pair}records_per_key = 1000")).unwrap();
    assert_eq!(c.tls.unwrap().records_per_key, Some(1000));
    let e = err(&format!("{pair}records_per_key = 1"));
    assert!(e.to_string().contains("tls.records_per_key"), "the field is named: {e}");
}
