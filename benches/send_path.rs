//! The send path alone (docs/architecture.md, "The send path"): CPU time per send of one
//! small frame to each of N loopback connections, with one `sendmsg(2)` per connection
//! (`server::io::send`) against a chunk of 128 per `io_uring_enter` (`server::io::batch`).
//!
//! `cargo bench --bench send_path`. Env: SEND_CONNS (2000 connections), SEND_PASSES (40 passes
//! over every connection per measurement), SEND_FRAME (100 bytes, about a 64-byte `msg`),
//! SEND_ROUNDS (3). Each round measures both paths, alternating, on the same connections.
//!
//! The figure is the sending thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`) divided by the
//! sends, so other processes on a shared box lengthen the wall time but not the figure much
//! (they still cost it cache). On loopback the sender's time includes the TCP receive
//! processing of the peer socket (done in the sender's context), as in the server.
//!
//! **The cold floor** instead with `SEND_COLD=1000000` (`common::floor`; SEND_PER_PROC 9,900,
//! SEND_ROUNDS 3, SEND_CPU 0, SEND_FRAME 100): one send to each of a million connections held
//! by a hundred processes at once, what a million-subscriber broadcast costs one core without
//! the server around it; writes `send_path_cold.json`.

use std::io::IoSlice;
use std::os::fd::AsRawFd;

use serde_json::json;
use tether::server::io::{self as sock, batch::SendBatch, batch::BATCH};

mod common;
use common::*;

/// Sends `frame` once to every connection of `fds`, `passes` times; CPU ns per send.
fn measure(mode: &str, fds: &[i32], frame: &[u8], passes: usize, batch: &mut SendBatch) -> f64 {
    let t0 = thread_cpu_ns();
    for _ in 0..passes {
        if mode == "sendmsg" {
            for &fd in fds {
                let n = sock::send(fd, &[IoSlice::new(frame)]).expect("sendmsg");
                assert_eq!(n, frame.len());
            }
        } else {
            for chunk in fds.chunks(BATCH) {
                for &fd in chunk {
                    // SAFETY: `frame` and the sockets outlive the submit below.
                    unsafe { batch.stage(fd, &[IoSlice::new(frame)]) };
                }
                for r in batch.submit().iter_mut() {
                    assert_eq!(r.take().expect("sent").expect("send ok"), frame.len());
                }
            }
        }
    }
    (thread_cpu_ns() - t0) as f64 / (passes * fds.len()) as f64
}

fn main() {
    floor::child_if_asked();
    if !should_run() {
        return;
    }
    let cold: usize = env_or("SEND_COLD", 0);
    if cold > 0 {
        let (per_proc, rounds) = (env_or("SEND_PER_PROC", floor::PER_PROC), env_or("SEND_ROUNDS", 3));
        let f = floor::Floor::measure(cold, per_proc, rounds, env_or("SEND_CPU", 0), env_or("SEND_FRAME", 100));
        f.print();
        write_json("send_path_cold", &f.json());
        return;
    }
    let conns: usize = env_or("SEND_CONNS", 2000);
    let passes: usize = env_or("SEND_PASSES", 40);
    let size: usize = env_or("SEND_FRAME", 100);
    let rounds: usize = env_or("SEND_ROUNDS", 3);
    let (tx, mut rx) = loopback_pairs(conns);
    let fds: Vec<i32> = tx.iter().map(|s| s.as_raw_fd()).collect();
    let frame = vec![b'x'; size];
    let mut batch = SendBatch::new().expect("io_uring ring");
    let mut rows = Vec::new();
    let mut runs = Vec::new();
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for round in 1..=rounds {
        for mode in ["sendmsg", "io_uring"] {
            let load = loadavg();
            let ns = measure(mode, &fds, &frame, passes, &mut batch);
            floor::drain(&mut rx);
            if mode == "sendmsg" {
                a.push(ns)
            } else {
                b.push(ns)
            }
            rows.push(vec![round.to_string(), mode.to_string(), format!("{ns:.0}"), format!("{load:.2}")]);
            runs.push(json!({"round": round, "send_batch": mode, "cpu_ns_per_send": ns, "loadavg": load}));
        }
    }
    table(
        &format!("send path: {conns} loopback connections × {passes} passes, {size}-byte frame"),
        &["round", "send", "cpu ns/send", "load 1m"],
        &rows,
    );
    let (ma, mb) = (median(&a), median(&b));
    println!("\nmedians: sendmsg {ma:.0} ns, io_uring {mb:.0} ns per send; io_uring/sendmsg = {:.3}", mb / ma);
    write_json(
        "send_path",
        &json!({"conns": conns, "passes": passes, "frame": size, "runs": runs,
        "median_ns": {"sendmsg": ma, "io_uring": mb}, "ratio": mb / ma}),
    );
}
