//! What an intercepting door reports: the destination it serves, and why a
//! request is refused (an exfiltration attempt or anything else).

use std::net::IpAddr;
use std::time::Instant;

use hyper::{Response, StatusCode};

use super::ws::Stop;
use crate::engine::Engine;
use crate::event::{Decision, Door, refusal};
use crate::http::{RespBody, text};
use crate::inject::{Injection, Placement};
use crate::interception::Interception;
use crate::name::Host;

/// A destination the check allowed and the door connected to.
#[derive(Clone)]
pub(crate) struct Dest {
    pub(crate) host: Host,
    pub(crate) port: u16,
    pub(crate) label: String,
    pub(crate) allowed_why: String,
    pub(crate) addr: IpAddr,
    pub(crate) door: Door,
}

impl Dest {
    pub(crate) fn event(
        &self,
        engine: &Engine,
        decision: Decision,
        reason: String,
        injected: Vec<String>,
        exfiltration: Option<String>,
        t0: &(Instant, String),
    ) {
        let mut e = engine.event(
            self.door,
            &self.label,
            self.port,
            Some(self.addr),
            decision,
            reason,
            (0, 0),
            t0.clone(),
        );
        e.injected = injected;
        e.exfiltration = exfiltration;
        engine.events.emit(e);
    }
}

/// Why a request is not forwarded.
pub(crate) enum Refusal {
    /// A placeholder where its secret is not bound.
    Exfiltration { secret: String, why: String },
    /// Anything else (no token, a misdirected request).
    Other { status: StatusCode, why: String },
}

impl Refusal {
    /// Why, as the tool is told.
    pub(crate) fn why(&self) -> &str {
        match self {
            Refusal::Exfiltration { why, .. } | Refusal::Other { why, .. } => why,
        }
    }

    /// Report it and answer the tool.
    pub(crate) fn respond(
        self,
        engine: &Engine,
        dest: &Dest,
        t0: &(Instant, String),
    ) -> Response<RespBody> {
        let (status, why, exfil) = match self {
            Refusal::Exfiltration { secret, why } => (StatusCode::FORBIDDEN, why, Some(secret)),
            Refusal::Other { status, why } => (status, why, None),
        };
        let msg = refusal(&dest.label, dest.port, &why);
        dest.event(
            engine,
            Decision::Refused,
            msg.clone(),
            Vec::new(),
            exfil,
            t0,
        );
        text(status, &msg)
    }
}

pub(crate) fn exfil(inj_secret: &str, place: &str, icpt: &Interception) -> Refusal {
    let bound = icpt
        .injections
        .iter()
        .find(|i| i.secret == inj_secret)
        .map(binding_text)
        .unwrap_or_default();
    Refusal::Exfiltration {
        secret: inj_secret.to_string(),
        why: format!(
            "the placeholder of secret {inj_secret} is in {place}, but {inj_secret} is bound to {bound}: refused as an exfiltration attempt"
        ),
    }
}

/// Why a scanned stream was ended, in `place`: a placeholder (an
/// exfiltration attempt) or WebSocket frames that cannot be scanned.
pub(crate) fn stopped(stop: Stop, place: &str, icpt: &Interception) -> Refusal {
    match stop {
        Stop::Placeholder(secret) => exfil(&secret, place, icpt),
        Stop::Unscannable(why) => Refusal::Other {
            status: StatusCode::FORBIDDEN,
            why: format!("{why} in {place}: refused, the stream is closed"),
        },
    }
}

fn binding_text(i: &Injection) -> String {
    let b = &i.binding;
    let place = match &b.placement {
        Placement::Header { name, .. } => format!("header {name}"),
        Placement::Basic { username } => format!("Basic auth as {username}"),
        Placement::Query { param } => format!("query parameter {param}"),
    };
    format!(
        "{}:{}{} ({place})",
        b.host,
        b.port,
        b.path_prefix.as_deref().unwrap_or("")
    )
}
