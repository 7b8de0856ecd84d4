//! The kernel's side of a connection as /proc shows it (benches/kernel_mem.rs): slab caches
//! (`/proc/slabinfo`, with the caches SLUB merged into each from `/sys/kernel/slab`), TCP
//! socket memory (`/proc/net/sockstat`), what sockets leave queued (`/proc/net/tcp`), and the
//! shipped sysctl profile applied for the length of a run and restored after.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One slab cache's line of `/proc/slabinfo`.
#[derive(Debug, Clone, Copy)]
pub struct Cache {
    /// `<active_objs>`: objects in use. SLUB counts the free objects of a CPU's current slab as
    /// in use, so a sample can be off by a few slabs per CPU; deltas over thousands of sockets
    /// and slopes over several counts make that small.
    pub active: u64,
    /// `<objsize>`: bytes per object, alignment and metadata included.
    pub objsize: u64,
}

impl Cache {
    /// `active × objsize`, in bytes.
    pub fn bytes(&self) -> u64 {
        self.active * self.objsize
    }
}

/// Every cache of `/proc/slabinfo` by name (the file needs root). Panics when it cannot be
/// read: the bench measures nothing without it.
pub fn slabinfo() -> BTreeMap<String, Cache> {
    let text = std::fs::read_to_string("/proc/slabinfo")
        .unwrap_or_else(|e| panic!("cannot read /proc/slabinfo ({e}): run the bench as root"));
    text.lines()
        .filter(|l| !l.starts_with("slabinfo") && !l.starts_with('#'))
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (active, objsize) = (f.get(1)?.parse().ok()?, f.get(3)?.parse().ok()?);
            Some((f[0].to_string(), Cache { active, objsize }))
        })
        .collect()
}

/// For each cache name that SLUB merged with others, the other names (from the symlinks of
/// `/sys/kernel/slab`: merged caches point at one `:flags-size` directory). `/proc/slabinfo`
/// shows a merged cache under one of its names, so e.g. `eventpoll_pwq` objects may be counted
/// under `anon_vma_chain`. Empty when the directory cannot be read.
pub fn slab_aliases() -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    for entry in std::fs::read_dir("/sys/kernel/slab").into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with(':') {
            continue;
        }
        if let Ok(target) = std::fs::read_link(entry.path()) {
            groups.entry(target).or_default().push(name);
        }
    }
    let mut out = BTreeMap::new();
    for names in groups.values() {
        for n in names {
            out.insert(n.clone(), names.iter().filter(|m| *m != n).cloned().collect());
        }
    }
    out
}

/// The `TCP:` line of `/proc/net/sockstat`: sockets in use, orphans, TIME_WAIT, allocated, and
/// `mem`, the pages (4 KiB) charged to TCP socket buffers system-wide (what `net.ipv4.tcp_mem`
/// bounds). Zeros when it cannot be read.
#[derive(Debug, Clone, Copy, Default)]
pub struct TcpSockstat {
    pub inuse: u64,
    pub orphan: u64,
    pub tw: u64,
    pub alloc: u64,
    pub mem_pages: u64,
}

/// Reads [`TcpSockstat`].
pub fn sockstat_tcp() -> TcpSockstat {
    let text = std::fs::read_to_string("/proc/net/sockstat").unwrap_or_default();
    let line = text.lines().find(|l| l.starts_with("TCP:")).unwrap_or("");
    let f: Vec<&str> = line.split_whitespace().collect();
    let field = |key: &str| f.iter().position(|w| *w == key).and_then(|i| f.get(i + 1)?.parse().ok()).unwrap_or(0);
    TcpSockstat {
        inuse: field("inuse"),
        orphan: field("orphan"),
        tw: field("tw"),
        alloc: field("alloc"),
        mem_pages: field("mem"),
    }
}

/// A `/proc/meminfo` field (e.g. `"SUnreclaim:"`) in bytes; 0 when absent.
pub fn meminfo_bytes(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What the established IPv4 sockets whose local port is `port` hold, from `/proc/net/tcp`:
/// (sockets, bytes in their receive queues, bytes sent and not yet acknowledged). For a server
/// port these are the accepted sockets: unread input and unacknowledged output.
pub fn tcp_queues(port: u16) -> (u64, u64, u64) {
    let text = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let mut out = (0, 0, 0);
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        // sl local_address rem_address st tx_queue:rx_queue …; 01 = ESTABLISHED.
        let (Some(local), Some(st), Some(queues)) = (f.get(1), f.get(3), f.get(4)) else { continue };
        let local_port = local.rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok());
        if local_port != Some(port) || *st != "01" {
            continue;
        }
        let (tx, rx) = queues.split_once(':').unwrap_or(("0", "0"));
        out.0 += 1;
        out.1 += u64::from_str_radix(rx, 16).unwrap_or(0);
        out.2 += u64::from_str_radix(tx, 16).unwrap_or(0);
    }
    out
}

/// "At least" keys of the profile: like sysctl/install.sh, a running value that is already
/// higher is kept.
const RAISE_ONLY: [&str; 7] = [
    "fs.file-max",
    "fs.nr_open",
    "net.core.somaxconn",
    "net.ipv4.tcp_max_syn_backlog",
    "net.core.netdev_max_backlog",
    "net.ipv4.tcp_max_tw_buckets",
    "net.netfilter.nf_conntrack_max",
];

/// The shipped sysctl profile (sysctl/99-tether.conf) applied to the running kernel; dropped
/// (also on a panic), every value it changed is written back. Before changing anything it
/// writes a shell script that restores them (`restore_script`), for a run killed by SIGKILL.
pub struct SysctlProfile {
    saved: Vec<(PathBuf, String)>,
    /// The script that restores the values the profile replaced.
    pub restore_script: PathBuf,
}

impl SysctlProfile {
    /// Applies `conf` (`key = value` lines; `#` comments) as sysctl/install.sh would, keeping
    /// higher running values of the "at least" keys. Keys the kernel lacks are skipped. Panics
    /// when a value cannot be written (the bench would measure the wrong profile).
    pub fn apply(conf: &Path, restore_script: PathBuf) -> SysctlProfile {
        let text = std::fs::read_to_string(conf).unwrap_or_else(|e| panic!("cannot read {}: {e}", conf.display()));
        let mut plan = Vec::new();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
            let Some((key, value)) = line.split_once('=') else { continue };
            let (key, value) = (key.trim(), value.split_whitespace().collect::<Vec<_>>().join(" "));
            let path = PathBuf::from("/proc/sys").join(key.replace('.', "/"));
            let Ok(current) = std::fs::read_to_string(&path) else { continue };
            let current = current.split_whitespace().collect::<Vec<_>>().join(" ");
            let higher = matches!((current.parse::<u64>(), value.parse::<u64>()), (Ok(c), Ok(v)) if c > v);
            if current == value || (RAISE_ONLY.contains(&key) && higher) {
                continue;
            }
            plan.push((path, current, value));
        }
        let script: String = std::iter::once("#!/bin/sh\n# Restores what benches/kernel_mem.rs changed.\n".to_string())
            .chain(plan.iter().map(|(p, old, _)| format!("echo '{old}' > {}\n", p.display())))
            .collect();
        std::fs::write(&restore_script, script).expect("write the sysctl restore script");
        let mut saved = Vec::new();
        for (path, old, new) in plan {
            eprintln!("sysctl profile: {} = {new} (was {old})", path.display());
            std::fs::write(&path, format!("{new}\n"))
                .unwrap_or_else(|e| panic!("cannot write {new} to {}: {e}", path.display()));
            saved.push((path, old));
        }
        SysctlProfile { saved, restore_script }
    }

    /// The `(path, previous value)` pairs this profile replaced.
    pub fn changed(&self) -> &[(PathBuf, String)] {
        &self.saved
    }
}

impl Drop for SysctlProfile {
    fn drop(&mut self) {
        for (path, old) in self.saved.iter().rev() {
            // A newline, not an empty write: an empty value (ip_local_reserved_ports) must be written.
            if let Err(e) = std::fs::write(path, format!("{old}\n")) {
                eprintln!("cannot restore {} to {old}: {e} (see {})", path.display(), self.restore_script.display());
            }
        }
        eprintln!("sysctl profile: {} values restored", self.saved.len());
    }
}
