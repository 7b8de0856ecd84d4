//! The engine's four I/O setups, for tests that must hold on each: every monoio driver
//! (io_uring, and epoll with `MONOIO_FORCE_LEGACY_DRIVER=1`) with every readiness source
//! (`io.readiness`: the epoll set, the multishot-poll ring), each checked in the server's log.

use super::Server;

/// Every monoio driver with every readiness source (`io.readiness`): the epoll set (the
/// default) and the multishot-poll ring, each awaited through either driver.
pub const DRIVERS: [Setup; 4] = [
    Setup { driver: Driver::IoUring, readiness: "epoll" },
    Setup { driver: Driver::IoUring, readiness: "io_uring" },
    Setup { driver: Driver::Epoll, readiness: "epoll" },
    Setup { driver: Driver::Epoll, readiness: "io_uring" },
];

/// A monoio driver.
#[derive(Debug, Clone, Copy)]
pub enum Driver {
    IoUring,
    Epoll,
}

/// A monoio driver and an `io.readiness` value.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub driver: Driver,
    pub readiness: &'static str,
}

/// Starts a server with `config` (an `[io]` table is appended: leave it out) and `--cores
/// cores` on `setup`'s driver and readiness source, and checks both in its log.
pub fn start(setup: Setup, config: &str, cores: &str) -> Server {
    let (env, driver): (&[(&str, &str)], _) = match setup.driver {
        Driver::IoUring => (&[("MONOIO_FORCE_LEGACY_DRIVER", "0")], "io_uring"),
        Driver::Epoll => (&[("MONOIO_FORCE_LEGACY_DRIVER", "1")], "epoll"),
    };
    let readiness = setup.readiness;
    let config = format!("{config}\n[io]\nreadiness = \"{readiness}\"\n");
    let srv = Server::start_with_env(&config, "127.0.0.1:0".parse().unwrap(), &["--cores", cores], env);
    let log = String::from_utf8_lossy(&srv.log_bytes()).into_owned();
    for want in [format!("driver=\"{driver}\""), format!("readiness=\"{readiness}\"")] {
        assert!(log.contains(&want), "expected {want} in the server log:\n{log}");
    }
    srv
}
