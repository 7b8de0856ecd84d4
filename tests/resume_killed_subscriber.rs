//! Resume after the subscriber process dies (issue 4, "Killed subscriber"; docs/protocol.md,
//! docs/clients.md):
//! `tether sub --append-to FILE` is SIGKILLed twice while seq 1..20000 is published and is
//! started again on the same file; writing a line is recording it, so the restarted process
//! resumes after the file's last line and the file ends up holding every seq exactly once.

mod common;
mod delivery;

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use delivery::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_and_restarted_subscriber_records_every_seq_once() {
    let _serial = serial().await;
    const N: u64 = 20_000;
    let ch = "resume.killed";
    let srv = Server::start("[[channels]]\npattern = \"*\"\nhistory = 100000\n", &["--cores", "2"]);
    let url = srv.ws_url();
    let file = temp_path("killed");
    let mut sub = SubProc::start(&url, ch, &file);
    srv.wait_gauge(1.0, STEP).await;

    let progress = Arc::new(AtomicU64::new(0));
    let publisher = tokio::spawn(publish_paced(srv.addr, ch, N, 4000.0, progress.clone()));

    for (k, at) in [6_000u64, 13_000].into_iter().enumerate() {
        eventually_reaches(&progress, at, Duration::from_secs(30), "the publisher").await;
        // Kill only once the subscriber has written part of the stream in this life.
        let what = format!("the subscriber past seq {} (life {})", at - 1_000, k + 1);
        eventually(Duration::from_secs(10), &what, || {
            sub.assert_running(&file);
            let last = last_seq(&file);
            std::future::ready(check(last >= at - 1_000, || last))
        })
        .await;
        let st = sub.stop(libc::SIGKILL);
        assert_eq!(std::os::unix::process::ExitStatusExt::signal(&st), Some(libc::SIGKILL), "{st:?}");
        let at_kill = last_seq(&file);
        // Stay away long enough for messages to pile up in history.
        tokio::time::sleep(Duration::from_millis(200)).await;
        sub = SubProc::start(&url, ch, &file);
        eprintln!("kill {} with the file at seq {at_kill}; restarted", k + 1);
    }
    tokio::time::timeout(Duration::from_secs(60), publisher).await.expect("publisher timed out").expect("publisher");
    wait_last_seq(&file, N, Duration::from_secs(30)).await;
    sub.stop(libc::SIGTERM);

    let seqs = read_seqs(&file, ch);
    assert_exactly_once(&seqs, N);
    let _ = std::fs::remove_file(&file);
    let _ = std::fs::remove_file(file.with_extension("stderr"));
}
