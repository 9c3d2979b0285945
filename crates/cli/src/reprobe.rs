//! `cordon serve`'s continuous conformance: every served tool is proved
//! again on a schedule (`gateway: {reprobe: {every, jitter}}`, or
//! `--reprobe-every`), at once on SIGUSR1, and at once when an input of its
//! proof changed (its key in [`crate::proof`]: a program or mount source
//! replaced, the cordon binary rebuilt...). One tool at a time, on a thread
//! of its own: calls never wait for it. A run that does not hold takes the
//! tool out of service ([`cordon_mcp::Service`]); a later one that holds
//! returns it.
//!
//! The same thread reloads the manifest on SIGHUP ([`Reload`]), so a
//! reload's probes and the scheduled ones never run at once.

use std::collections::BTreeMap;
use std::hash::{BuildHasher as _, Hasher as _};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use cordon_broker::Broker;
use cordon_policy::ToolPolicy;
use cordon_policy::policy::{PolicySet, Profile};

/// The nice value of probe runs while serving (calls keep 0).
const PROBE_NICE: i32 = 10;

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

/// What a reload on SIGHUP needs: where the manifest is, the one running
/// (as loaded, before any tool was refused at start), and what it may do.
pub struct Reload {
    pub path: std::path::PathBuf,
    pub running: PolicySet,
    pub reloader: cordon_mcp::reload::Reloader,
    /// `--accept-weakening`: apply a change that weakens isolation.
    pub accept_weakening: bool,
    /// `--no-probe`: changed tools are served unproved.
    pub no_probe: bool,
    /// `--reprobe-every`, which a reloaded `gateway: {reprobe}` does not
    /// override.
    pub every_override: Option<Duration>,
    /// Where a signed report of every run is kept (`None`: no key).
    pub reports: Option<crate::report::Keeper>,
}

/// One served tool as the re-prober sees it.
struct Watched {
    policy: ToolPolicy,
    /// The key of the inputs its last run (or its start proof) saw.
    key: Option<String>,
    /// Its next scheduled run (`None`: no schedule).
    due: Option<Instant>,
}

struct Control {
    watched: BTreeMap<String, Watched>,
    broker: Arc<Broker>,
    service: Arc<cordon_mcp::Service>,
    schedule: Option<Schedule>,
    reload: Reload,
    state: Option<std::path::PathBuf>,
}

/// Start re-proving `tools` (the served ones, proved at start) on a thread
/// of its own, for as long as the process runs (`schedule: None`: only a
/// reload's probes), and reloading the manifest on SIGHUP. The handlers of
/// SIGUSR1 and SIGHUP are in place when this returns.
pub fn start(
    tools: Vec<ToolPolicy>,
    broker: Arc<Broker>,
    service: Arc<cordon_mcp::Service>,
    schedule: Option<Schedule>,
    reload: Reload,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the re-probe thread's runtime")?;
    let (usr1, hup) = {
        use tokio::signal::unix::{SignalKind, signal};
        let _in = rt.enter();
        (
            signal(SignalKind::user_defined1()).context("listening for SIGUSR1")?,
            signal(SignalKind::hangup()).context("listening for SIGHUP")?,
        )
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
                    due: schedule.map(|s| now + s.next()),
                },
            )
        })
        .collect();
    if let Some(s) = schedule
        && !watched.is_empty()
    {
        eprintln!(
            "cordon: proving {} tool{} again every {} (±{}%), on SIGUSR1, and when an input of a proof changes",
            watched.len(),
            if watched.len() == 1 { "" } else { "s" },
            crate::proof::age(s.every),
            s.jitter_percent
        );
    }
    let mut ctl = Control {
        watched,
        broker,
        service,
        schedule,
        reload,
        state: crate::state::state_dir().ok(),
    };
    std::thread::Builder::new()
        .name("cordon-reprobe".into())
        .spawn(move || {
            // Probe runs yield the CPU to calls: this thread, and every
            // sandbox and process it starts, at a lower priority.
            if let Err(e) = cordon_sys::io::nice_this_thread(PROBE_NICE) {
                eprintln!("cordon: probe runs keep the gateway's priority: setpriority: {e}");
            }
            rt.block_on(ctl.run(usr1, hup))
        })
        .context("starting the re-probe thread")?;
    Ok(())
}

/// Why a run was made, as the records and stderr say it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trigger {
    Schedule,
    Signal,
    InputChanged,
    Reload,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Signal => "signal",
            Trigger::InputChanged => "input_changed",
            Trigger::Reload => "reload",
        }
    }
}

impl Control {
    async fn run(
        &mut self,
        mut usr1: tokio::signal::unix::Signal,
        mut hup: tokio::signal::unix::Signal,
    ) {
        loop {
            let wait = if self.schedule.is_some() && !self.watched.is_empty() {
                let next_due = self.watched.values().filter_map(|w| w.due).min();
                next_due
                    .map(|d| d.saturating_duration_since(Instant::now()))
                    .unwrap_or(KEY_CHECK)
                    .min(KEY_CHECK)
            } else {
                // No schedule: only signals.
                Duration::from_secs(3600)
            };
            let mut signalled = false;
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                r = usr1.recv() => signalled = r.is_some(),
                r = hup.recv() => {
                    if r.is_some() {
                        self.reload();
                    }
                    continue;
                }
            }
            if signalled {
                eprintln!("cordon: SIGUSR1: proving every served tool again");
            } else if self.schedule.is_none() {
                continue;
            }
            self.tick(signalled);
        }
    }

    /// Prove each tool whose time came, whose inputs changed, or all of
    /// them (`signalled`).
    fn tick(&mut self, signalled: bool) {
        let host = crate::proof::Host::detect();
        let names: Vec<String> = self.watched.keys().cloned().collect();
        for name in names {
            let Some(w) = self.watched.get(&name) else {
                continue;
            };
            let key = host.key(&w.policy);
            let trigger = if signalled {
                Trigger::Signal
            } else if key.is_some() && key != w.key {
                Trigger::InputChanged
            } else if w.due.is_some_and(|d| Instant::now() >= d) {
                Trigger::Schedule
            } else {
                continue;
            };
            let policy = w.policy.clone();
            let r = self.prove(&policy, key, trigger);
            match r {
                Ok(()) => self.service.held(&name, trigger.as_str(), unix_now()),
                Err(not) => self.service.take_out(
                    &name,
                    trigger.as_str(),
                    cordon_mcp::OutOfService {
                        probes: not.probes,
                        at: crate::state::now_rfc3339(),
                        why: not.why,
                    },
                ),
            }
        }
    }

    /// One run of `p`'s probes, said on stderr and kept in the proof
    /// cache; its key and next due time recorded.
    fn prove(
        &mut self,
        p: &ToolPolicy,
        key: Option<String>,
        trigger: Trigger,
    ) -> Result<(), crate::probe::NotHeld> {
        let started = Instant::now();
        let at = SystemTime::now();
        let began = crate::state::now_rfc3339();
        // Blocking, on purpose: this runtime is this thread's alone
        // (a signal that comes meanwhile is kept for the next wait); the
        // sandboxes run and are waited for here, one tool at a time.
        let b = self.broker.clone();
        let (r, report) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            crate::probe::reprobe_tool(p, b.registry())
        }))
        .unwrap_or_else(|_| {
            (
                Err(crate::probe::NotHeld {
                    probes: vec!["(set-up)".into()],
                    why: "its probe run failed (a panic)".into(),
                }),
                None,
            )
        });
        if let (Some(keeper), Some(report)) = (&self.reload.reports, &report) {
            match keeper.keep(
                p,
                report,
                &began,
                &crate::state::now_rfc3339(),
                trigger.as_str(),
            ) {
                Ok(f) => eprintln!("cordon: {}: signed report {}", p.name, f.display()),
                Err(e) => eprintln!(
                    "cordon: {}: the signed report was not written: {e:#}",
                    p.name
                ),
            }
        }
        let took = started.elapsed().as_secs_f64();
        let name = &p.name;
        let t = trigger.as_str();
        // A reload's candidate is not the tool served (yet): what is
        // recorded of the served one stays.
        let served = match self.watched.get_mut(name) {
            Some(w) if w.policy == *p => {
                w.key = key.clone();
                w.due = self.schedule.map(|s| Instant::now() + s.next());
                true
            }
            _ => false,
        };
        let state = self.state.as_ref().filter(|_| served || r.is_ok());
        let stored = match (&r, state) {
            (Ok(()), Some(d)) => {
                eprintln!("cordon: {name}: held ({t}, {took:.1} s)");
                key.map(|k| crate::proof::store(d, &[(name.clone(), k)], &[], at))
            }
            (Err(not), d) => {
                eprintln!(
                    "cordon: {name}: did not hold ({t}, {took:.1} s): {}",
                    not.why
                );
                d.map(|d| crate::proof::store(d, &[], std::slice::from_ref(name), at))
            }
            (Ok(()), None) => {
                eprintln!("cordon: {name}: held ({t}, {took:.1} s)");
                None
            }
        };
        if let Some(Err(e)) = stored {
            eprintln!("cordon: the proof cache was not written: {e:#}");
        }
        r
    }

    /// SIGHUP: load, check and admit the manifest again; apply it when
    /// nothing weakens isolation (or `--accept-weakening`) and every
    /// changed tool's probes hold. Otherwise nothing changes, and why is
    /// said on stderr and audited.
    fn reload(&mut self) {
        let path = self.reload.path.clone();
        eprintln!("cordon: SIGHUP: reloading {}", path.display());
        let new = match cordon_policy::load(&path) {
            Ok(l) => l.policy,
            Err(e) => return self.refuse(&format!("the manifest does not load: {e}"), &[]),
        };
        let changes = cordon_policy::diff::diff(&self.reload.running, &new);
        if changes.is_empty() {
            eprintln!("cordon: reload: nothing changed");
            return;
        }
        let lines: Vec<String> = changes.iter().map(|c| c.to_string()).collect();
        for l in &lines {
            eprintln!("cordon: reload: {l}");
        }
        let weakens = changes.iter().filter(|c| c.weakens).count();
        if weakens > 0 && !self.reload.accept_weakening {
            return self.refuse(
                &format!(
                    "{weakens} change(s) weaken isolation (marked WEAKENS); start cordon serve with --accept-weakening to apply such a reload"
                ),
                &lines,
            );
        }
        if let Err(why) = reloadable(&self.reload.running, &new, &changes) {
            return self.refuse(&format!("{why}; restart cordon serve to apply it"), &lines);
        }
        let old = &self.reload.running;
        let served =
            |s: &PolicySet, n: &str| s.tools.get(n).is_some_and(|p| p.profile != Profile::P0);
        let names: std::collections::BTreeSet<&String> =
            old.tools.keys().chain(new.tools.keys()).collect();
        let mut serve = Vec::new();
        let mut remove = Vec::new();
        for n in names {
            let changed = old.tools.get(n) != new.tools.get(n);
            if !changed {
                continue;
            }
            if served(&new, n) {
                serve.push(n.clone());
            } else if self.reload.reloader.serves(n) {
                remove.push(n.clone());
            }
        }
        // Admitted first, all of them; then proved, one at a time.
        for n in &serve {
            if let Some(p) = new.tools.get(n)
                && let Err(why) = self.reload.reloader.admit(p)
            {
                return self.refuse(&format!("{n}: not admitted: {why}"), &lines);
            }
        }
        let host = crate::proof::Host::detect();
        if self.reload.no_probe {
            eprintln!("cordon: warning: --no-probe: changed tools are served without probing");
        } else {
            for n in &serve {
                let Some(p) = new.tools.get(n) else { continue };
                if let Err(not) = self.prove(p, host.key(p), Trigger::Reload) {
                    return self.refuse(
                        &format!(
                            "{n}: its probes do not hold ({}): {}",
                            not.probes.join(", "),
                            not.why
                        ),
                        &lines,
                    );
                }
            }
        }
        if let Err(why) = self.reload.reloader.apply(&new, &serve, &remove) {
            return self.refuse(&why, &lines);
        }
        let now = Instant::now();
        for n in &remove {
            self.watched.remove(n);
        }
        for n in &serve {
            if let Some(p) = new.tools.get(n) {
                self.watched.insert(
                    n.clone(),
                    Watched {
                        policy: p.clone(),
                        key: host.key(p),
                        due: self.schedule.map(|s| now + s.next()),
                    },
                );
                self.service.held(n, Trigger::Reload.as_str(), unix_now());
            }
        }
        if let Some(s) = self.schedule.as_mut() {
            let r = &new.gateway.reprobe;
            s.every = self
                .reload
                .every_override
                .unwrap_or(Duration::from_secs(r.every_seconds));
            s.jitter_percent = r.jitter_percent;
        }
        eprintln!(
            "cordon: reload: applied ({} tool(s) served anew, {} removed; the others and every session kept)",
            serve.len(),
            remove.len()
        );
        self.record("reloaded", cordon_audit::Status::Ok, "reloaded", &lines);
        self.reload.running = new;
    }

    /// A reload refused: said and audited; nothing changed.
    fn refuse(&self, why: &str, lines: &[String]) {
        eprintln!("cordon: reload refused, the running configuration is kept: {why}");
        self.record("reload_refused", cordon_audit::Status::Denied, why, lines);
    }

    fn record(&self, event: &str, status: cordon_audit::Status, why: &str, lines: &[String]) {
        let mut rec = cordon_audit::AuditRecord::new("", "");
        rec.runtime = "reload".into();
        rec.caller = "reload".into();
        rec.status = status;
        rec.reason = Some(if lines.is_empty() {
            why.to_string()
        } else {
            format!("{why}; changes: {}", lines.join("; "))
        });
        rec.service = Some(cordon_audit::ServiceEvent {
            event: event.into(),
            probes: Vec::new(),
            trigger: "sighup".into(),
        });
        self.broker.record_after(&rec);
    }
}

/// Whether a reload from `old` to `new` can be applied while serving:
/// tools can be added, changed and removed (command tools and `mcp:`
/// servers); a change of a tool's `max_concurrent`, of the `gateway:`
/// section (but `reprobe`) or of `access:` needs a restart.
fn reloadable(
    old: &PolicySet,
    new: &PolicySet,
    changes: &[cordon_policy::diff::Change],
) -> Result<(), String> {
    use cordon_policy::diff::{ACCESS, GATEWAY_CHANGE};
    for c in changes {
        if c.tool == ACCESS {
            return Err("the `access:` grants changed".into());
        }
        if c.tool == GATEWAY_CHANGE && !c.field.starts_with("reprobe.") {
            return Err(format!("the gateway's `{}` changed", c.field));
        }
        if c.tool == GATEWAY_CHANGE {
            continue;
        }
        let (o, n) = (old.tools.get(&c.tool), new.tools.get(&c.tool));
        if o.and_then(|p| p.concurrency) != n.and_then(|p| p.concurrency) {
            return Err(format!("`{}`'s `max_concurrent` changed", c.tool));
        }
    }
    Ok(())
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
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

    fn set(yaml: &str) -> PolicySet {
        cordon_policy::load_str(std::path::Path::new("m.yaml"), yaml)
            .unwrap()
            .policy
    }

    #[test]
    fn tools_and_the_schedule_reload_while_serving() {
        let base = "tools:\n  wc:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {memory: 128M}\n";
        let old = set(base);
        let ok = |new: &str| {
            let new = set(new);
            reloadable(&old, &new, &cordon_policy::diff::diff(&old, &new))
        };
        assert_eq!(ok(&base.replace("128M", "64M")), Ok(()));
        assert_eq!(
            ok(&format!(
                "{base}  head:\n    profile: P1\n    command: [/usr/bin/head]\n"
            )),
            Ok(())
        );
        assert_eq!(
            ok(&format!("gateway:\n  reprobe: {{every: 1h}}\n{base}")),
            Ok(())
        );
        let e = ok(&format!("gateway:\n  max_sandboxes: 3\n{base}")).unwrap_err();
        assert!(e.contains("max_sandboxes"), "{e}");
        let e = ok(&base.replace("limits: {memory: 128M}", "max_concurrent: 2")).unwrap_err();
        assert!(e.contains("max_concurrent"), "{e}");
        assert_eq!(
            ok(&format!(
                "{base}  fs:\n    profile: P2\n    network: none\n    mcp: {{command: [/usr/bin/true]}}\n"
            )),
            Ok(())
        );
        let e = ok(&format!(
            "{base}access:\n  grants:\n    - subject: bob\n      tools: [wc]\n"
        ))
        .unwrap_err();
        assert!(e.contains("access"), "{e}");
    }
}
