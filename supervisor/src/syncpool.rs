//! Parked threads that run a turn's concurrent `fsync`s, and its
//! long-lived helpers.
//!
//! A group of syncs issued together (two ledgers' appends, a new session's
//! tree) shares the file system's flushes instead of queueing one behind
//! the other. Each sync needs a thread of its own while it waits, and
//! making one costs 40–90 µs on the test host (`pthread_create` + join,
//! measured), paid in turn by the thread that issues the group: a cold turn
//! issued ~14 of them on its critical path. The workers here are made once
//! per process ([`warm`], off that path, or on first need) and park between
//! groups. A worker that cannot be made never loses a sync: the caller
//! runs it itself ([`run_all`]).
//!
//! A turn's helpers that live as long as its command — the output pumps,
//! the timer, the seccomp listener, the interrupt watcher — run on the same
//! workers ([`spawn`]), and so do the daemon's connections: a `serve`
//! worker's turns then make no thread at all. Such a job never waits in the
//! queue behind another long one (it could wait for ever behind one that
//! waits for it): it goes to an idle worker, or to one made for it, or to a
//! thread of its own. Only a sync may wait there, for a sync ahead of it to
//! finish; and the long jobs running never count against the syncs'
//! [`MAX_WORKERS`].

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, OnceLock};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// At most this many workers: a group larger than this (+ the caller)
/// queues the rest behind the first to finish, still all at once in effect.
const MAX_WORKERS: usize = 16;

/// At most this many workers more while long jobs run (past them, a long
/// job gets a thread of its own that ends with it): parked workers are
/// never given back, and a burst of connections must not leave hundreds.
const MAX_LONG_WORKERS: usize = 48;

/// How many workers [`warm`] makes for a turn that opens a new session: the
/// largest group a turn issues (the new session's tree: four directories,
/// four files, and its scratch and output directories with their parents)
/// less the caller.
pub const NEW_SESSION_WORKERS: usize = 11;

/// How many [`warm`] makes for a turn of an existing session: its largest
/// group is a finish append's (two ledgers) less the caller, and one to
/// spare. Each worker made costs ~60 µs of a core that the turn's own
/// setup is using; a larger group (a commit's outputs) makes the rest.
pub const TURN_WORKERS: usize = 2;

#[derive(Default)]
struct State {
    queue: VecDeque<Job>,
    idle: usize,
    workers: usize,
    /// Long jobs ([`spawn`]) queued or running.
    long: usize,
}

#[derive(Default)]
struct Pool {
    state: Mutex<State>,
    ready: Condvar,
}

fn pool() -> &'static Pool {
    static POOL: OnceLock<Pool> = OnceLock::new();
    POOL.get_or_init(Pool::default)
}

impl Pool {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A job never panics while holding the lock (jobs run outside it).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes one more worker; false if the thread could not be made.
    fn spawn_worker(&'static self) -> bool {
        std::thread::Builder::new()
            .name("sync".into())
            .spawn(move || self.work())
            .is_ok()
    }

    fn work(&self) {
        loop {
            let job = {
                let mut s = self.lock();
                loop {
                    if let Some(job) = s.queue.pop_front() {
                        break job;
                    }
                    s.idle += 1;
                    s = self.ready.wait(s).unwrap_or_else(|p| p.into_inner());
                    s.idle -= 1;
                }
            };
            job();
        }
    }

    /// Queues `job` for a worker, making one if none is idle; gives the
    /// job back when no worker exists or can be made (the caller runs it).
    fn submit(&'static self, job: Job) -> Result<(), Job> {
        let mut s = self.lock();
        // Jobs already queued are waiting for the idle workers too; the
        // workers a long job holds are not the syncs'.
        if s.idle <= s.queue.len() && s.workers - s.long.min(s.workers) < MAX_WORKERS {
            if self.spawn_worker() {
                s.workers += 1;
            } else if s.workers == 0 {
                return Err(job);
            }
        }
        s.queue.push_back(job);
        drop(s);
        self.ready.notify_one();
        Ok(())
    }

    /// Hands the long job `job` to a worker that takes it once the jobs
    /// queued ahead of it (syncs) are taken — an idle one, or one made for
    /// it —, or gives it back.
    fn start(&'static self, job: Job) -> Result<(), Job> {
        let mut s = self.lock();
        if s.idle <= s.queue.len() {
            if s.workers >= MAX_WORKERS + MAX_LONG_WORKERS || !self.spawn_worker() {
                return Err(job);
            }
            s.workers += 1;
        }
        s.long += 1;
        s.queue.push_back(Box::new(move || {
            job();
            pool().lock().long -= 1;
        }));
        drop(s);
        self.ready.notify_one();
        Ok(())
    }
}

/// A job started by [`spawn`]: joined like a thread.
#[derive(Debug)]
pub struct Task<T> {
    rx: std::sync::mpsc::Receiver<std::thread::Result<T>>,
    /// Its result, once [`Task::is_finished`] saw it.
    done: Option<std::thread::Result<T>>,
}

impl<T> Task<T> {
    /// Waits for the job; `Err` carries its panic, as a joined thread's.
    pub fn join(self) -> std::thread::Result<T> {
        match self.done {
            Some(r) => r,
            None => self
                .rx
                .recv()
                .unwrap_or_else(|_| Err(Box::new("a pooled job was lost"))),
        }
    }

    /// Whether the job has returned (or was lost), without waiting.
    pub fn is_finished(&mut self) -> bool {
        if self.done.is_none() {
            match self.rx.try_recv() {
                Ok(r) => self.done = Some(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => return false,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.done = Some(Err(Box::new("a pooled job was lost")));
                }
            }
        }
        true
    }
}

/// Runs `f` at once on a parked worker (see the module docs), or on a new
/// thread named `name` when none can take it; fails only when no thread
/// can be made at all (as [`std::thread::Builder::spawn`]).
pub fn try_spawn<T, F>(name: &str, f: F) -> std::io::Result<Task<T>>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (task, job) = task(f);
    if let Err(job) = pool().start(job) {
        std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(job)?;
    }
    Ok(task)
}

/// [`try_spawn`] for a job that, like [`std::thread::spawn`]'s, cannot do
/// without its thread.
pub fn spawn<T, F>(f: F) -> Task<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (task, job) = task(f);
    if let Err(job) = pool().start(job) {
        std::thread::spawn(job);
    }
    task
}

/// `f` as a job that sends its result (or its panic: the worker lives on)
/// to the returned task.
fn task<T, F>(f: F) -> (Task<T>, Job)
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = std::sync::mpsc::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
    });
    (Task { rx, done: None }, job)
}

/// Makes `workers` workers (the turn's largest group less the caller: see
/// [`NEW_SESSION_WORKERS`], [`TURN_WORKERS`]), on a thread of its own (the
/// caller goes on at once). Once per process; a failure to make one is not
/// an error (groups then make or run what they need).
pub fn warm(workers: usize) {
    static WARMED: OnceLock<()> = OnceLock::new();
    WARMED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("sync-warm".into())
            .spawn(move || {
                let p = pool();
                let mut s = p.lock();
                while s.workers < workers.min(MAX_WORKERS) && p.spawn_worker() {
                    s.workers += 1;
                }
            });
    });
}

/// Runs every one of `jobs` at once — the first on the calling thread, the
/// rest on parked workers — and returns their results in order, once all
/// have returned. A job no worker can take runs on the calling thread.
pub fn run_all<T: Send + 'static>(jobs: Vec<Box<dyn FnOnce() -> T + Send + 'static>>) -> Vec<T> {
    let mut jobs = jobs.into_iter();
    let Some(first) = jobs.next() else {
        return Vec::new();
    };
    let (tx, rx) = std::sync::mpsc::channel();
    let mut inline = Vec::new();
    let mut n = 1;
    for job in jobs {
        let (tx, i) = (tx.clone(), n);
        n += 1;
        // A panic is carried back to the caller, as a joined thread's is;
        // the worker lives on.
        let wrapped: Job = Box::new(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
            let _ = tx.send((i, r));
        });
        if let Err(back) = pool().submit(wrapped) {
            inline.push(back);
        }
    }
    drop(tx);
    let mut results: Vec<Option<std::thread::Result<T>>> =
        std::iter::repeat_with(|| None).take(n).collect();
    results[0] = Some(std::panic::catch_unwind(std::panic::AssertUnwindSafe(
        first,
    )));
    for job in inline {
        job();
    }
    // Every wrapped job sends exactly once (the inline ones already have):
    // the channel ends when all have.
    for (i, r) in rx {
        results[i] = Some(r);
    }
    results
        .into_iter()
        .map(|r| match r {
            Some(Ok(v)) => v,
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            None => std::panic::panic_any("a sync job was lost"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_runs_once_and_results_keep_their_order() {
        warm(NEW_SESSION_WORKERS);
        for n in [0usize, 1, 2, 8, 40] {
            let jobs: Vec<Box<dyn FnOnce() -> usize + Send>> = (0..n)
                .map(|i| Box::new(move || i * 10) as Box<dyn FnOnce() -> usize + Send>)
                .collect();
            assert_eq!(run_all(jobs), (0..n).map(|i| i * 10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn groups_from_many_threads_at_once_all_complete() {
        let handles: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let jobs: Vec<Box<dyn FnOnce() -> usize + Send>> = (0..5usize)
                            .map(|i| {
                                Box::new(move || t * 100 + i) as Box<dyn FnOnce() -> usize + Send>
                            })
                            .collect();
                        assert_eq!(
                            run_all(jobs),
                            (0..5).map(|i| t * 100 + i).collect::<Vec<_>>()
                        );
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
        // Other tests of this process start long jobs meanwhile.
        assert!(pool().lock().workers <= MAX_WORKERS + MAX_LONG_WORKERS);
    }

    #[test]
    fn a_spawned_job_never_waits_behind_another() {
        // Every job waits until all have started: one queued behind a
        // waiting job would never start. More of them than workers can be
        // made for long jobs: the rest get threads of their own.
        let n = MAX_WORKERS + MAX_LONG_WORKERS + 5;
        let started = std::sync::Arc::new((Mutex::new(0usize), Condvar::new()));
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let started = std::sync::Arc::clone(&started);
                spawn(move || {
                    let (count, all) = &*started;
                    let mut c = count.lock().unwrap();
                    *c += 1;
                    all.notify_all();
                    let (c, _) = all
                        .wait_timeout_while(c, std::time::Duration::from_secs(20), |c| *c < n)
                        .unwrap();
                    *c
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.join().unwrap(), n, "a job waited behind another");
        }
    }

    #[test]
    fn syncs_run_while_long_jobs_hold_every_worker() {
        // More long jobs than MAX_WORKERS, each held until a group of syncs
        // issued meanwhile has returned.
        let (release, held) = std::sync::mpsc::channel::<()>();
        let held = std::sync::Arc::new(Mutex::new(held));
        let long: Vec<_> = (0..MAX_WORKERS + 2)
            .map(|_| {
                let held = std::sync::Arc::clone(&held);
                spawn(move || {
                    let _ = held.lock().unwrap().recv();
                })
            })
            .collect();
        let (done, group) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let jobs: Vec<Box<dyn FnOnce() -> usize + Send>> = (0..5usize)
                .map(|i| Box::new(move || i) as Box<dyn FnOnce() -> usize + Send>)
                .collect();
            let _ = done.send(run_all(jobs));
        });
        let got = group.recv_timeout(std::time::Duration::from_secs(20));
        drop(release);
        for t in long {
            t.join().unwrap();
        }
        assert_eq!(
            got.ok(),
            Some(vec![0, 1, 2, 3, 4]),
            "the syncs waited behind long jobs"
        );
    }

    #[test]
    fn a_spawned_jobs_panic_reaches_its_joiner_and_the_worker_lives_on() {
        let t = try_spawn("test", || -> usize { panic!("on purpose") }).unwrap();
        assert!(t.join().is_err());
        assert_eq!(spawn(|| 7).join().unwrap(), 7);
    }
}
