//! `cordon run` stopped by SIGTERM or SIGINT: the call's credentials are
//! revoked and its end is audited before the process exits with
//! 128 + the signal's number. The tool's sandbox dies with the process
//! (its processes are the jail's children with `PR_SET_PDEATHSIG(SIGKILL)`,
//! under a pid namespace whose init is among them).

use std::sync::Arc;

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

use cordon_broker::Broker;
use cordon_secrets::CredentialBroker;

/// What a signal ends: the broker (for the audit record), its credential
/// broker (whose leases are revoked) and the tool called. The broker is
/// not kept alive by the watcher: when the call has ended and the broker
/// with it (its sandbox's host directories removed), a signal only exits.
pub struct Interrupted {
    pub broker: std::sync::Weak<Broker>,
    pub credentials: Option<Arc<CredentialBroker>>,
    pub tool: String,
    pub profile: &'static str,
}

/// Catch SIGTERM and SIGINT from now on (the handlers are in place when
/// this returns); the first to come ends the process as [`stop`] says.
pub fn on_signal(what: Interrupted) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal watcher")?;
    let (mut term, mut int) = {
        let _in = rt.enter();
        (
            signal(SignalKind::terminate()).context("catching SIGTERM")?,
            signal(SignalKind::interrupt()).context("catching SIGINT")?,
        )
    };
    std::thread::Builder::new()
        .name("cordon-signals".into())
        .spawn(move || {
            let sig = rt.block_on(async {
                tokio::select! {
                    _ = term.recv() => (libc_sig::TERM, "SIGTERM"),
                    _ = int.recv() => (libc_sig::INT, "SIGINT"),
                }
            });
            std::process::exit(stop(&what, sig));
        })
        .context("starting the signal watcher")?;
    Ok(())
}

/// Signal numbers (POSIX: the same on every Linux architecture).
mod libc_sig {
    pub const INT: i32 = 2;
    pub const TERM: i32 = 15;
}

/// Revoke every lease, write the call's record, and say what could not be
/// done; the exit status: 128 + the signal.
fn stop(what: &Interrupted, (num, name): (i32, &str)) -> i32 {
    eprintln!("cordon: {name}: stopping {}", what.tool);
    if let Some(cb) = &what.credentials
        && let Err(e) = cb.revoke_all(&format!("cordon run was stopped by {name}"))
    {
        eprintln!("cordon: {e}");
    }
    let Some(broker) = what.broker.upgrade() else {
        // The call has ended, and was audited.
        return 128 + num;
    };
    let mut rec = cordon_audit::AuditRecord::new(&what.tool, what.profile);
    rec.session = broker.session().to_string();
    rec.caller = "cli".into();
    rec.status = cordon_audit::Status::Killed;
    rec.signal = Some(num);
    rec.reason = Some(format!(
        "{}: cordon run was stopped by {name}; the tool was ended and its credentials revoked",
        what.tool
    ));
    // One that cannot be written is said on stderr by the auditor.
    broker.record_after(&rec);
    128 + num
}
