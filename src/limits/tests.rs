use super::*;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A real `/proc/self/limits` layout (Linux 6.x).
const LIMITS: &str = "\
Limit                     Soft Limit           Hard Limit           Units     
Max cpu time              unlimited            unlimited            seconds   
Max file size             unlimited            unlimited            bytes     
Max data size             unlimited            unlimited            bytes     
Max stack size            8388608              unlimited            bytes     
Max core file size        0                    unlimited            bytes     
Max resident set          unlimited            unlimited            bytes     
Max processes             96365                96365                processes 
Max open files            NOFILE_SOFT          NOFILE_HARD          files     
Max locked memory         8388608              8388608              bytes     
Max address space         unlimited            unlimited            bytes     
Max file locks            unlimited            unlimited            locks     
Max pending signals       96365                96365                signals   
Max msgqueue size         819200               819200               bytes     
Max nice priority         0                    0                    
Max realtime priority     0                    0                    
Max realtime timeout      unlimited            unlimited            us        
";

struct FakeProc {
    root: PathBuf,
}

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Values written into a fake procfs tree.
struct Box_ {
    nofile: (&'static str, &'static str),
    file_max: &'static str,
    nr_open: &'static str,
    ports: &'static str,
    somaxconn: &'static str,
    syn_backlog: &'static str,
    ehash: &'static str,
    mem_total_kb: u64,
    mem_available_kb: u64,
}

/// A tuned 32 GiB box: every limit at the shipped profile.
fn tuned() -> Box_ {
    Box_ {
        nofile: ("1048576", "1048576"),
        file_max: "2097152",
        nr_open: "2097152",
        ports: "1024\t65535",
        somaxconn: "65535",
        syn_backlog: "65535",
        ehash: "1048576",
        mem_total_kb: 32 << 20,
        mem_available_kb: 30 << 20,
    }
}

fn fake(b: &Box_) -> FakeProc {
    static N: AtomicUsize = AtomicUsize::new(0);
    let root = std::env::temp_dir().join(format!(
        "tether-limits-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let put = |rel: &str, text: &str| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put("self/limits", &LIMITS.replace("NOFILE_SOFT", b.nofile.0).replace("NOFILE_HARD", b.nofile.1));
    put("sys/fs/file-max", &format!("{}\n", b.file_max));
    put("sys/fs/file-nr", "1000\t0\t2097152\n");
    put("sys/fs/nr_open", &format!("{}\n", b.nr_open));
    put("sys/net/ipv4/ip_local_port_range", &format!("{}\n", b.ports));
    put("sys/net/core/somaxconn", &format!("{}\n", b.somaxconn));
    put("sys/net/ipv4/tcp_max_syn_backlog", &format!("{}\n", b.syn_backlog));
    put("sys/net/ipv4/tcp_ehash_entries", &format!("{}\n", b.ehash));
    put(
        "meminfo",
        &format!(
            "MemTotal:       {} kB\nMemFree:         1000 kB\nMemAvailable:   {} kB\nBuffers:          100 kB\n",
            b.mem_total_kb, b.mem_available_kb
        ),
    );
    put(
        "cpuinfo",
        "processor\t: 0\nmodel name\t: x\n\nprocessor\t: 1\nmodel name\t: x\n\nprocessor\t: 2\n\nprocessor\t: 3\n",
    );
    FakeProc { root }
}

fn run(b: &Box_, tweak: impl FnOnce(&mut CheckOptions)) -> (bool, String) {
    let f = fake(b);
    let mut opts = CheckOptions { proc_root: f.root.clone(), ..CheckOptions::default() };
    tweak(&mut opts);
    let mut out = Vec::new();
    let ok = check_limits(&opts, &mut out).unwrap();
    (ok, String::from_utf8(out).unwrap())
}

#[test]
fn parses_real_looking_proc_self_limits() {
    let text = LIMITS.replace("NOFILE_SOFT", "1024").replace("NOFILE_HARD", "524288");
    assert_eq!(parse_nofile(&text), Some((1024, 524288)));
    let text = LIMITS.replace("NOFILE_SOFT", "unlimited").replace("NOFILE_HARD", "unlimited");
    assert_eq!(parse_nofile(&text), Some((u64::MAX, u64::MAX)));
    assert_eq!(parse_nofile("Limit Soft Hard\n"), None);
    assert_eq!(parse_nofile("Max open files  lots  many  files\n"), None);
}

#[test]
fn parses_meminfo() {
    let m = "MemTotal:       16318412 kB\nMemAvailable:    8000000 kB\nHugePages_Total:       0\n";
    assert_eq!(meminfo_bytes(m, "MemTotal"), Some(16318412 * 1024));
    assert_eq!(meminfo_bytes(m, "MemAvailable"), Some(8000000 * 1024));
    assert_eq!(meminfo_bytes(m, "HugePages_Total"), Some(0));
    assert_eq!(meminfo_bytes(m, "MemFree"), None);
}

#[test]
fn reads_every_value_from_a_fake_root() {
    let f = fake(&tuned());
    let r = read(&f.root);
    assert_eq!(r.nofile_soft, Some(1_048_576));
    assert_eq!(r.nofile_hard, Some(1_048_576));
    assert_eq!(r.file_max, Some(2_097_152));
    assert_eq!(r.file_allocated, Some(1000));
    assert_eq!(r.nr_open, Some(2_097_152));
    assert_eq!(r.port_range, Some((1024, 65535)));
    assert_eq!(r.somaxconn, Some(65535));
    assert_eq!(r.tcp_max_syn_backlog, Some(65535));
    assert_eq!(r.tcp_ehash_entries, Some(1_048_576));
    assert_eq!(r.mem_total, Some(32 << 30));
    assert_eq!(r.mem_available, Some(30 << 30));
    assert_eq!(r.cores, 4, "a fake root's cpuinfo gives the cores");
}

#[test]
fn tuned_box_reaches_one_million() {
    let (ok, out) = run(&tuned(), |_| {});
    assert!(ok, "{out}");
    assert!(out.contains("target 1000000: reachable"), "{out}");
    // nofile hard 1048576 less the fd reserve is the tightest bound after max_connections.
    assert!(out.contains("capacity: 1000000 connections per process (bound by max_connections (default))"), "{out}");
    assert!(!out.contains("<- change"), "{out}");
    assert!(!out.contains("change these lines"), "{out}");
}

#[test]
fn low_limits_fail_and_print_exact_lines() {
    let b = Box_ {
        nofile: ("1024", "20000"),
        file_max: "100000",
        nr_open: "1048576",
        ports: "32768\t60999",
        somaxconn: "4096",
        syn_backlog: "1024",
        ehash: "262144",
        mem_total_kb: 2 << 20,
        mem_available_kb: 1 << 20,
    };
    let (ok, out) = run(&b, |_| {});
    assert!(!ok, "{out}");
    assert!(out.contains("target 1000000: NOT reachable"), "{out}");
    assert!(out.contains("capacity: 19744 connections per process (bound by nofile soft/hard)"), "{out}");
    for line in [
        "change these lines:",
        "# /etc/security/limits.d/tether.conf",
        "tether soft nofile 1048576\n",
        "tether hard nofile 1048576\n",
        "LimitNOFILE=1048576\n",
        "# /etc/sysctl.d/99-tether.conf",
        "fs.file-max = 2097152\n",
        "net.ipv4.ip_local_port_range = 1024 65535\n",
        "net.core.somaxconn = 65535\n",
        "net.ipv4.tcp_max_syn_backlog = 65535\n",
        "memory: 1000000 connections x (512 user + 5120 kernel) B = 5.2 GiB needed, 1.0 GiB available",
    ] {
        assert!(out.contains(line), "missing {line:?} in\n{out}");
    }
    // nr_open 1048576 already allows LimitNOFILE=1048576.
    assert!(!out.contains("fs.nr_open ="), "{out}");
    assert!(out.contains("28232 per client source IP, 36 IPs for the target"), "{out}");
}

#[test]
fn nr_open_below_recommended_nofile_is_raised_too() {
    let b = Box_ { nofile: ("1024", "4096"), nr_open: "1000000", ..tuned() };
    let (ok, out) = run(&b, |_| {});
    assert!(!ok, "{out}");
    assert!(out.contains("fs.nr_open = 2097152\n"), "{out}");
    assert!(out.contains("LimitNOFILE=1048576\n"), "{out}");
}

#[test]
fn memory_can_be_the_bound() {
    let b = Box_ { mem_available_kb: 2 << 20, ..tuned() };
    let (ok, out) = run(&b, |_| {});
    assert!(!ok, "{out}");
    // 2 GiB / 5632 B per connection.
    assert!(out.contains("capacity: 381300 connections per process (bound by memory available/total)"), "{out}");
    // With the measured figures overridden to 1 KiB total, it fits.
    let (ok, out) = run(&b, |o| {
        o.per_conn_user_bytes = 512;
        o.per_conn_kernel_bytes = 512;
    });
    assert!(ok, "{out}");
}

#[test]
fn config_max_connections_caps_and_is_named() {
    let config = Config { max_connections: 50_000, ..Config::default() };
    let (ok, out) = run(&tuned(), |o| o.config = Some(config));
    assert!(!ok, "{out}");
    assert!(out.contains("# /etc/tether/tether.toml\nmax_connections = 1000000\n"), "{out}");
}

#[test]
fn small_target_on_a_small_box_passes_with_advice() {
    let b = Box_ { nofile: ("20000", "20000"), somaxconn: "4096", ..tuned() };
    let (ok, out) = run(&b, |o| o.target = 19_000);
    assert!(ok, "{out}");
    assert!(out.contains("recommended changes (not required for this target):"), "{out}");
    assert!(out.contains("net.core.somaxconn = 65535"), "{out}");
    assert!(!out.contains("LimitNOFILE"), "{out}");
}

#[test]
fn missing_files_are_unreadable_not_fatal() {
    let f = fake(&tuned());
    std::fs::remove_file(f.root.join("sys/net/core/somaxconn")).unwrap();
    std::fs::remove_file(f.root.join("sys/fs/file-max")).unwrap();
    let opts = CheckOptions { proc_root: f.root.clone(), ..CheckOptions::default() };
    let mut out = Vec::new();
    assert!(check_limits(&opts, &mut out).unwrap());
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("unreadable"), "{out}");
}

#[test]
fn recommended_nofile_rounds_up() {
    assert_eq!(recommended_nofile(1_000_000), 1_048_576);
    assert_eq!(recommended_nofile(30_000), 32_768);
    assert_eq!(recommended_nofile(1), 1024);
    assert_eq!(recommended_nofile(u64::MAX), u64::MAX);
}

#[test]
fn cli_args_build_options() {
    let f = fake(&tuned());
    let path = f.root.join("tether.toml");
    std::fs::write(&path, "max_connections = 20000\n").unwrap();
    let args = CheckLimitsArgs {
        target: 10,
        config: Some(path),
        conn_user_bytes: 1,
        conn_kernel_bytes: 2,
        proc_root: f.root.clone(),
    };
    let o = args.to_options().unwrap();
    assert_eq!(o.config.unwrap().max_connections, 20000);
    assert_eq!((o.target, o.per_conn_user_bytes, o.per_conn_kernel_bytes), (10, 1, 2));
    let bad = CheckLimitsArgs { config: Some(Path::new("/nonexistent/tether.toml").into()), ..args };
    assert!(bad.to_options().is_err());
}

#[test]
fn real_proc_does_not_fail() {
    let mut out = Vec::new();
    let opts = CheckOptions { target: 1, ..CheckOptions::default() };
    check_limits(&opts, &mut out).unwrap();
    assert!(String::from_utf8(out).unwrap().contains("capacity:"));
}

#[test]
fn needed_column_shows_minimums_never_above_a_sufficient_current_value() {
    // A box with more than the target needs everywhere: no row may claim more is needed.
    let b = Box_ { nofile: ("4194304", "4194304"), file_max: "9000000", nr_open: "4194304", ..tuned() };
    let (ok, out) = run(&b, |o| o.target = 20_000);
    assert!(ok, "{out}");
    assert!(out.contains("needed for target"), "{out}");
    assert!(!out.contains("recommended  "), "the column is not 'recommended': {out}");
    assert!(out.contains(">= 20256 hard"), "nofile: target + reserved fds: {out}");
    for row in ["nofile soft/hard", "fs.nr_open", "fs.file-max"] {
        let line = out.lines().find(|l| l.starts_with(row)).unwrap();
        assert!(!line.contains("<- "), "{line}");
    }
    // 64,512 ports per source IP hold 20,000 connections: one IP, singular.
    assert!(out.contains("64512 per client source IP, 1 IP for the target"), "{out}");
}

#[test]
fn advisory_rows_are_marked_advised_not_change() {
    let b = Box_ { somaxconn: "4096", ..tuned() };
    let (ok, out) = run(&b, |o| o.target = 19_000);
    assert!(ok, "{out}");
    let line = out.lines().find(|l| l.starts_with("net.core.somaxconn")).unwrap();
    assert!(line.ends_with("<- advised"), "{line}");
}

#[test]
fn a_small_established_hash_is_a_note_not_a_bound() {
    // 262,144 buckets (this development box's boot-time size) for a million: advised, and the
    // target is still reached. A namespace sharing the initial table reads negative.
    for ehash in ["262144", "-262144"] {
        let b = Box_ { ehash, ..tuned() };
        let (ok, out) = run(&b, |_| {});
        assert!(ok, "{out}");
        assert!(out.contains("262144 buckets for 1000000 connections"), "{out}");
        assert!(out.contains("thash_entries=1048576"), "{out}");
        assert!(out.contains("tcp_child_ehash_entries=1048576"), "{out}");
        assert!(out.contains("3.8 sockets per bucket"), "{out}");
    }
    // Enough buckets, or a kernel without the file: nothing to change.
    let (ok, out) = run(&tuned(), |_| {});
    assert!(ok && !out.contains("thash_entries"), "{out}");
    let f = fake(&tuned());
    std::fs::remove_file(f.root.join("sys/net/ipv4/tcp_ehash_entries")).unwrap();
    let opts = CheckOptions { proc_root: f.root.clone(), ..CheckOptions::default() };
    let mut out = Vec::new();
    assert!(check_limits(&opts, &mut out).unwrap());
    assert!(!String::from_utf8(out).unwrap().contains("thash_entries"));
}
