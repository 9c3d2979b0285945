//! `cordon serve`'s continuous conformance: every served tool is proved
//! again on a schedule (`gateway: {reprobe: {every, jitter}}`, or
//! `--reprobe-every`), at once on SIGUSR1, and at once when an input of its
//! proof changed (its key in [`crate::proof`]: a program or mount source
//! replaced, the cordon binary rebuilt...). One tool at a time, on a thread
//! of its own: calls never wait for it. A run that does not hold takes the
//! tool out of service ([`cordon_mcp::Service`]); a later one that holds
//! returns it.

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use cordon_broker::Broker;
use cordon_policy::ToolPolicy;

/// How often the inputs of every proof are looked at (at most).
const KEY_CHECK: Duration = Duration::from_secs(10);

/// When and how each tool is proved again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Schedule {
    pub every: Duration,
    /// Each run moves by up to this share of `every`, either way.
    pub jitter_percent: u64,
}

impl Schedule {
    /// The wait before a tool's next scheduled run: `every`, moved by a
    /// random amount within the jitter.
    pub fn next(&self) -> Duration {
        let span = self.every.as_secs_f64() * self.jitter_percent as f64 / 100.0;
        let r = std::collections::hash_map::RandomState::new()
            .build_hasher()
            .finish();
        // Uniform in [-1, 1].
        let unit = (r as f64 / u64::MAX as f64) * 2.0 - 1.0;
        Duration::from_secs_f64((self.every.as_secs_f64() + unit * span).max(1.0))
    }
}

/// One served tool as the re-prober sees it.
struct Watched {
    policy: ToolPolicy,
    /// The key of the inputs its last run (or its start proof) saw.
    key: Option<String>,
    due: Instant,
}

/// Start re-proving `tools` (the served ones, proved at start) on a thread
/// of its own, for as long as the process runs. SIGUSR1's handler is in
/// place when this returns.
pub fn start(
    tools: Vec<ToolPolicy>,
    broker: Arc<Broker>,
    service: Arc<cordon_mcp::Service>,
    schedule: Schedule,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the re-probe thread's runtime")?;
    let usr1 = {
        let _in = rt.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())
            .context("listening for SIGUSR1")?
    };
    let host = crate::proof::Host::detect();
    let now = Instant::now();
    let served: Vec<String> = service.tools();
    let watched: BTreeMap<String, Watched> = tools
        .into_iter()
        .filter(|p| served.contains(&p.name))
        .map(|p| {
            let key = host.key(&p);
            (
                p.name.clone(),
                Watched {
                    policy: p,
                    key,
                    due: now + schedule.next(),
                },
            )
        })
        .collect();
    if watched.is_empty() {
        return Ok(());
    }
    eprintln!(
        "cordon: proving {} tool{} again every {} (±{}%), on SIGUSR1, and when an input of a proof changes",
        watched.len(),
        if watched.len() == 1 { "" } else { "s" },
        crate::proof::age(schedule.every),
        schedule.jitter_percent
    );
    std::thread::Builder::new()
        .name("cordon-reprobe".into())
        .spawn(move || rt.block_on(run(watched, broker, service, schedule, usr1)))
        .context("starting the re-probe thread")?;
    Ok(())
}

async fn run(
    mut watched: BTreeMap<String, Watched>,
    broker: Arc<Broker>,
    service: Arc<cordon_mcp::Service>,
    schedule: Schedule,
    mut usr1: tokio::signal::unix::Signal,
) {
    let state = crate::state::state_dir().ok();
    loop {
        let next_due = watched
            .values()
            .map(|w| w.due)
            .min()
            .unwrap_or_else(|| Instant::now() + schedule.every);
        let wait = next_due
            .saturating_duration_since(Instant::now())
            .min(KEY_CHECK);
        let signalled = tokio::select! {
            _ = tokio::time::sleep(wait) => false,
            r = usr1.recv() => r.is_some(),
        };
        if signalled {
            eprintln!("cordon: SIGUSR1: proving every served tool again");
        }
        let host = crate::proof::Host::detect();
        for (name, w) in watched.iter_mut() {
            let key = host.key(&w.policy);
            let trigger = if signalled {
                "signal"
            } else if key.is_some() && key != w.key {
                "input_changed"
            } else if Instant::now() >= w.due {
                "schedule"
            } else {
                continue;
            };
            let started = Instant::now();
            let at = SystemTime::now();
            let at_text = crate::state::now_rfc3339();
            let policy = w.policy.clone();
            let b = broker.clone();
            // Blocking, on purpose: this runtime is this thread's alone
            // (SIGUSR1 that comes meanwhile is kept for the next wait);
            // the sandboxes run and are waited for here, one tool at a
            // time.
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::probe::reprobe_tool(&policy, b.registry())
            }))
            .unwrap_or_else(|_| {
                Err(crate::probe::NotHeld {
                    probes: vec!["(set-up)".into()],
                    why: "its probe run failed (a panic)".into(),
                })
            });
            let took = started.elapsed().as_secs_f64();
            w.key = key.clone();
            w.due = Instant::now() + schedule.next();
            match r {
                Ok(()) => {
                    eprintln!("cordon: {name}: held ({trigger}, {took:.1} s)");
                    service.held(name, trigger, unix_seconds(at));
                    if let (Some(d), Some(k)) = (&state, key)
                        && let Err(e) = crate::proof::store(d, &[(name.clone(), k)], &[], at)
                    {
                        eprintln!("cordon: the proof cache was not written: {e:#}");
                    }
                }
                Err(not) => {
                    eprintln!(
                        "cordon: {name}: taken out of service: its probe run ({trigger}, {took:.1} s) did not hold: {}",
                        not.why
                    );
                    service.take_out(
                        name,
                        trigger,
                        cordon_mcp::OutOfService {
                            probes: not.probes,
                            at: at_text,
                            why: not.why,
                        },
                    );
                    if let Some(d) = &state
                        && let Err(e) = crate::proof::store(d, &[], std::slice::from_ref(name), at)
                    {
                        eprintln!("cordon: the proof cache was not written: {e:#}");
                    }
                }
            }
        }
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_run_stays_within_the_jitter() {
        let s = Schedule {
            every: Duration::from_secs(100),
            jitter_percent: 10,
        };
        for _ in 0..200 {
            let d = s.next();
            assert!(
                d >= Duration::from_secs(90) && d <= Duration::from_secs(110),
                "{d:?}"
            );
        }
        let exact = Schedule {
            jitter_percent: 0,
            ..s
        };
        assert_eq!(exact.next(), Duration::from_secs(100));
    }
}
