//! Log setup: the `TETHER_LOG` filter and what is logged at which level (docs/operations.md, "Logs").
//!
//! `TETHER_LOG` takes `tracing-subscriber` `EnvFilter` directives: a level (`debug`), or
//! `target=level` pairs (`info,tether::server=debug`). A value that does not parse, or a bare
//! word that is neither a level nor a tether target (`verbose`, `warning`: the filter would
//! read them as target names and silently log nothing more), is reported on stderr and logging
//! falls back to `info`.
//!
//! Bytes a client chose (channel names, header values, close reasons) go into log lines only
//! through [`Escaped`], so a client cannot forge lines or send terminal escapes to whoever
//! reads the log (docs/security.md, "Logs").

mod escape;

pub use escape::{Escaped, MAX_LOGGED_BYTES};
pub use tether_proto::redact::redact_url;
use tracing_subscriber::EnvFilter;

/// The levels `TETHER_LOG` accepts, quietest last.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// What is wrong with a `TETHER_LOG` value, if anything; `None` for a usable filter.
pub fn filter_problem(spec: &str) -> Option<String> {
    if let Err(e) = EnvFilter::builder().parse(spec) {
        return Some(format!("TETHER_LOG={spec:?} is not a valid filter ({e})"));
    }
    for directive in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if directive.contains('=') || directive.contains('[') {
            continue;
        }
        let is_level = LEVELS.iter().any(|l| l.eq_ignore_ascii_case(directive));
        let is_target = directive == "tether" || directive.starts_with("tether::") || directive.contains("::");
        if !is_level && !is_target {
            return Some(format!(
                "TETHER_LOG={spec:?}: {directive:?} is not a level (use error, warn, info, debug, trace or off, or target=level)"
            ));
        }
    }
    None
}

/// The filter from the `TETHER_LOG` value `spec` (`None`: unset), and the problem to report
/// when the value is unusable (then the filter is `info`).
pub fn filter(spec: Option<&str>) -> (EnvFilter, Option<String>) {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty());
    let Some(spec) = spec else {
        return (EnvFilter::new("info"), None);
    };
    match filter_problem(spec) {
        None => (EnvFilter::new(spec), None),
        Some(problem) => (EnvFilter::new("info"), Some(problem)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_target_directives_are_accepted() {
        for ok in
            ["debug", "INFO", "warn", "off", "tether=debug", "info,tether::server=trace", "tether", "monoio::driver"]
        {
            assert_eq!(filter_problem(ok), None, "{ok}");
        }
    }

    #[test]
    fn misspelt_levels_and_bad_syntax_are_reported() {
        for bad in ["verbose", "warning", "info,verbos", "tether=loud", "[{"] {
            let p = filter_problem(bad).unwrap_or_else(|| panic!("{bad:?} accepted"));
            assert!(p.starts_with("TETHER_LOG="), "{p}");
        }
        assert!(filter_problem("warning").unwrap().contains("\"warning\" is not a level"));
    }

    #[test]
    fn unset_empty_and_bad_values_fall_back_to_info() {
        for spec in [None, Some(""), Some("  ")] {
            let (f, problem) = filter(spec);
            assert_eq!((f.to_string(), problem), ("info".to_owned(), None));
        }
        let (f, problem) = filter(Some("verbose"));
        assert_eq!(f.to_string(), "info");
        assert!(problem.is_some());
        assert_eq!(filter(Some("debug")).0.to_string(), "debug");
    }
}
