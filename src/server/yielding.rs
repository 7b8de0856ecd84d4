//! A yield that lets the core's other tasks run (docs/architecture.md, "The fan-out pass and
//! its tail").
//!
//! monoio reschedules a task that woke itself while it was being polled at the *front* of
//! the core's run queue (`task::harness`: a `Notified` poll goes to `Schedule::yield_now`, which
//! is `push_front`), so the classic `wake_by_ref(); Pending` yield runs the same task again at
//! once: the reactor and the clock, woken meanwhile, wait at the back until the yielding task
//! really goes idle. A fan-out pass over 10,000 subscribers yields between chunks so that the
//! next publish is read while it writes; with the front-of-queue yield that read waited for
//! the whole pass.
//!
//! [`yield_now`] parks the task's waker on its thread instead and wakes the core's `run`
//! task, which is queued at the back like any task woken from outside; when it runs (after
//! every task queued before it) it wakes the parked tasks, which are queued at the back in
//! turn. Off a core thread (no `run` task on the thread: [`spawn`] was not called) it falls
//! back to waking itself.

use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::task::{Poll, Waker};

/// The wakers of the tasks that yielded on this thread, and the [`run`] task's waker.
struct Parked {
    yielded: RefCell<Vec<Waker>>,
    runner: RefCell<Option<Waker>>,
    /// A [`run`] task lives on this thread.
    running: Cell<bool>,
}

thread_local! {
    static PARKED: Parked = const {
        Parked { yielded: RefCell::new(Vec::new()), runner: RefCell::new(None), running: Cell::new(false) }
    };
}

/// Yields once to the runtime, letting the tasks of this core that are ready run before this
/// one continues.
pub async fn yield_now() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        PARKED.with(|p| {
            if !p.running.get() {
                cx.waker().wake_by_ref();
                return;
            }
            p.yielded.borrow_mut().push(cx.waker().clone());
            // Taken out first: waking it must not find the cell borrowed.
            let runner = p.runner.borrow_mut().take();
            if let Some(w) = runner {
                w.wake();
            }
        });
        Poll::Pending
    })
    .await
}

/// Spawns the task that wakes the tasks yielding on this thread (one per core thread, before
/// anything yields; a second call spawns nothing). Must run inside the core's monoio runtime.
pub fn spawn() {
    if PARKED.with(|p| p.running.replace(true)) {
        return;
    }
    monoio::spawn(run());
}

/// Wakes the tasks that yielded on this core thread, each time it is woken, until the runtime
/// stops. A yield made before its first poll parks too: that poll wakes it.
async fn run() {
    let mut woken = Vec::new();
    poll_fn(|cx| {
        PARKED.with(|p| {
            std::mem::swap(&mut woken, &mut *p.yielded.borrow_mut());
            *p.runner.borrow_mut() = Some(cx.waker().clone());
        });
        // Another task's wakers: each is queued at the back of the run queue.
        for w in woken.drain(..) {
            w.wake();
        }
        Poll::<()>::Pending
    })
    .await;
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A task that yields in a loop lets a task woken meanwhile run at its next yield; a
    /// `wake_by_ref` yield would run the looping task again first each time (monoio queues a
    /// self-woken task at the front), so the other would wait for the whole loop. Returns the
    /// yields the loop made before the other task ran.
    async fn yields_before_other_task_runs() -> u32 {
        spawn();
        let ran = Rc::new(Cell::new(false));
        let ran2 = ran.clone();
        let mut yields = 0u32;
        // Queued behind the yielding loop below: it runs only if a yield lets it.
        monoio::spawn(async move { ran2.set(true) });
        while !ran.get() && yields < 1000 {
            yield_now().await;
            yields += 1;
        }
        yields
    }

    #[test]
    fn yield_lets_other_tasks_run_io_uring() {
        let Ok(mut rt) = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new().build() else {
            // No io_uring here (old kernel, seccomp): the legacy test covers the scheduling.
            return;
        };
        let n = rt.block_on(yields_before_other_task_runs());
        assert!(n <= 2, "the other task ran only after {n} yields");
    }

    #[test]
    fn yield_lets_other_tasks_run_legacy() {
        let mut rt = monoio::RuntimeBuilder::<monoio::LegacyDriver>::new().build().expect("epoll runtime");
        let n = rt.block_on(yields_before_other_task_runs());
        assert!(n <= 2, "the other task ran only after {n} yields");
    }
}
