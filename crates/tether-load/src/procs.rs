//! `--procs P`: re-executes the current binary P times with the same arguments plus the hidden
//! `--child-index i --child-of P`, so each child holds 1/P of the connections under its own
//! open-file limit, then aggregates the children's final JSON lines into one report.
//!
//! SIGTERM or SIGINT to the parent is forwarded to every child (which then ends its hold and
//! reports as usual).

use std::io::{BufRead, BufReader};
use std::process::{Command, ExitStatus, Stdio};

use serde_json::{Map, Value};
use tokio::sync::mpsc;

use super::report::Report;

/// Runs `procs` children of this same command line and aggregates their reports: integer
/// fields are summed, except `max_keys` (maxima, e.g. durations); objects of integers (error
/// tallies) are summed key by key; other values come from child 0. Fields are shown in `order`
/// (others after). `ok` is true when every child reported `errors == 0` and exited 0.
pub fn run_children(procs: usize, scenario: &str, order: &[&str], max_keys: &[&str]) -> Result<Report, String> {
    run_children_raw(procs, scenario, order, max_keys).map(|(report, _)| report)
}

/// [`run_children`], also returning the children's reports as parsed (in child order), for
/// fields the generic rules cannot merge (histograms).
pub fn run_children_raw(
    procs: usize,
    scenario: &str,
    order: &[&str],
    max_keys: &[&str],
) -> Result<(Report, Vec<Value>), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let args: Vec<_> = std::env::args_os().skip(1).collect();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(usize, Option<String>, Option<ExitStatus>)>();
    let mut pids = Vec::with_capacity(procs);
    for i in 0..procs {
        let mut child = Command::new(&exe)
            .args(&args)
            .arg("--child-index")
            .arg(i.to_string())
            .arg("--child-of")
            .arg(procs.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| format!("cannot start child {i}: {e}"))?;
        pids.push(child.id() as i32);
        let done = done_tx.clone();
        // One reader per child: its report is its last JSON line.
        std::thread::spawn(move || {
            let mut last = None;
            if let Some(out) = child.stdout.take() {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if line.trim_start().starts_with('{') {
                        last = Some(line);
                    }
                }
            }
            let status = child.wait().ok();
            let _ = done.send((i, last, status));
        });
    }
    drop(done_tx);
    let rt = super::runtime()?;
    let mut outcomes: Vec<(Option<String>, Option<ExitStatus>)> = vec![(None, None); procs];
    rt.block_on(async {
        let mut forwarded = false;
        let end = super::idle::wait_for_end(std::time::Duration::MAX);
        tokio::pin!(end);
        loop {
            tokio::select! {
                got = done_rx.recv() => match got {
                    Some((i, line, status)) => outcomes[i] = (line, status),
                    None => break,
                },
                _ = &mut end, if !forwarded => {
                    forwarded = true;
                    for &pid in &pids {
                        // SAFETY: kill(2) on a child this process started.
                        unsafe {
                            libc::kill(pid, libc::SIGTERM);
                        }
                    }
                }
            }
        }
    });

    let mut reports = Vec::with_capacity(procs);
    let mut ok = true;
    for (i, (line, status)) in outcomes.into_iter().enumerate() {
        let Some(line) = line else {
            return Err(format!("child {i} printed no report (exit {status:?})"));
        };
        let value: Value = serde_json::from_str(&line).map_err(|e| format!("child {i} report is not JSON: {e}"))?;
        ok &= status.is_some_and(|s| s.success());
        reports.push(value);
    }
    let mut report = aggregate(scenario, &reports, max_keys);
    // Children's JSON objects come back with sorted keys; restore the scenario's order.
    let rank =
        |k: &str| if k == "scenario" { 0 } else { order.iter().position(|o| *o == k).map_or(usize::MAX, |p| p + 1) };
    report.fields.sort_by_key(|(k, _)| rank(k));
    report.set("procs", procs);
    ok &= report.get("errors").and_then(Value::as_u64) == Some(0);
    report.ok = ok;
    Ok((report, reports))
}

/// Merges child reports (see [`run_children`] for the rules); field order follows child 0.
pub fn aggregate(scenario: &str, reports: &[Value], max_keys: &[&str]) -> Report {
    let mut report = Report::new(scenario);
    let Some(Value::Object(first)) = reports.first() else { return report };
    for (key, value) in first {
        if key == "scenario" {
            continue;
        }
        let all = reports.iter().filter_map(|r| r.get(key));
        let merged = match value {
            Value::Number(n) if n.is_u64() => {
                let nums = all.filter_map(Value::as_u64);
                Value::from(if max_keys.contains(&key.as_str()) { nums.max().unwrap_or(0) } else { nums.sum() })
            }
            Value::Number(_) => {
                let nums = all.filter_map(Value::as_f64);
                if max_keys.contains(&key.as_str()) {
                    Value::from(nums.fold(0.0, f64::max))
                } else {
                    Value::from(nums.sum::<f64>())
                }
            }
            Value::Object(_) => {
                let mut sum = Map::new();
                for obj in all.filter_map(Value::as_object) {
                    for (k, v) in obj {
                        let prev = sum.get(k).and_then(Value::as_u64).unwrap_or(0);
                        sum.insert(k.clone(), Value::from(prev + v.as_u64().unwrap_or(0)));
                    }
                }
                Value::Object(sum)
            }
            other => other.clone(),
        };
        report.set(key, merged);
    }
    report
}
