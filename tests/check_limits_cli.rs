//! `tether check-limits` end to end: the binary reads a fake /proc (hidden `--proc-root`),
//! prints its table, and exits 0 when the target is reachable and 1, with the lines to change,
//! when it is not.

use std::path::{Path, PathBuf};
use std::process::Command;

struct FakeProc(PathBuf);

impl Drop for FakeProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fake procfs with the given open-file limit, fs.file-max and available memory (kB).
fn fake_proc(name: &str, nofile: u64, file_max: u64, mem_available_kb: u64) -> FakeProc {
    let root = std::env::temp_dir().join(format!("tether-check-limits-{}-{name}", std::process::id()));
    let put = |rel: &str, text: String| {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    put(
        "self/limits",
        format!(
            "Limit                     Soft Limit           Hard Limit           Units     \n\
             Max open files            {nofile:<20} {nofile:<20} files     \n"
        ),
    );
    put("sys/fs/file-max", format!("{file_max}\n"));
    put("sys/fs/file-nr", "1000\t0\t100\n".into());
    put("sys/fs/nr_open", format!("{}\n", nofile.max(1_048_576)));
    put("sys/net/ipv4/ip_local_port_range", "1024\t65535\n".into());
    put("sys/net/core/somaxconn", "65535\n".into());
    put("sys/net/ipv4/tcp_max_syn_backlog", "65535\n".into());
    put(
        "meminfo",
        format!("MemTotal:       {} kB\nMemAvailable:   {mem_available_kb} kB\n", mem_available_kb + 1_000_000),
    );
    put("cpuinfo", "processor\t: 0\n\nprocessor\t: 1\n".into());
    FakeProc(root)
}

fn check(root: &Path, target: u64) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(["check-limits", "--target", &target.to_string(), "--proc-root"])
        .arg(root)
        .output()
        .expect("run tether check-limits");
    (out.status.code().expect("exit code"), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn a_tuned_box_reaches_one_million() {
    let p = fake_proc("tuned", 1_048_576, 2_097_152, 32 << 20);
    let (code, table) = check(&p.0, 1_000_000);
    assert_eq!(code, 0, "{table}");
    assert!(table.contains("1048576"), "the nofile limit is in the table:\n{table}");
}

#[test]
fn low_limits_exit_1_with_the_lines_to_change() {
    let p = fake_proc("low", 1024, 50_000, 8 << 20);
    let (code, table) = check(&p.0, 1_000_000);
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("LimitNOFILE=") || table.contains("nofile"), "names the nofile change:\n{table}");
    assert!(table.contains("fs.file-max"), "names fs.file-max:\n{table}");
    // The same box is fine for a small target.
    assert_eq!(check(&p.0, 500).0, 0);
}
