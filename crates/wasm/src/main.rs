//! `cordon-wasm`: the runner of `runtime: wasm` tools (see the library).
//!
//! ```text
//! cordon-wasm compile MODULE SHA256 CACHE_DIR MEMORY [FUNCTION]
//!     -> stdout: `hit|compiled CODE_SHA256 CODE_PATH`
//!        (and with a FUNCTION, `schema JSON`: its arguments' schema)
//! cordon-wasm run --code PATH --code-sha256 HEX --memory BYTES --wall-ms MS
//!     [--dir PATH]... [--call FUNCTION] -- ARGV0 [ARG]...
//! cordon-wasm serve --output-bytes N --stderr-bytes N (then as run)
//!     -> one call per request on stdin, one reply each on stdout
//! ```
//!
//! cordon starts it; it is not meant to be run by hand.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use cordon_wasm::{
    ARGUMENTS_EXIT, ARGUMENTS_MARKER, Failure, RunOptions, SETUP_EXIT, SETUP_MARKER, TRAP_EXIT,
    TRAP_MARKER,
};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("compile") => compile(&args[1..]),
        Some("run") => match parse_run(&args[1..]) {
            Ok(o) => run(&o),
            Err(e) => setup_failed(&e),
        },
        Some("serve") => match parse_serve(&args[1..]) {
            Ok((o, out, err)) => match cordon_wasm::worker::serve(&o, out, err) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => setup_failed(&e),
            },
            Err(e) => setup_failed(&e),
        },
        Some("version") => {
            println!("wasmtime {}", cordon_wasm::wasmtime_version());
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!(
                "usage: cordon-wasm compile MODULE SHA256 CACHE_DIR MEMORY [FUNCTION] | run ... -- ARGV | serve ..."
            );
            ExitCode::from(2)
        }
    }
}

fn compile(args: &[String]) -> ExitCode {
    const USAGE: &str = "usage: cordon-wasm compile MODULE SHA256 CACHE_DIR MEMORY [FUNCTION]";
    let (module, sha, cache, memory, function) = match args {
        [m, s, c, n] => (m, s, c, n, None),
        [m, s, c, n, f] => (m, s, c, n, Some(f.as_str())),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let Ok(memory) = memory.parse::<u64>() else {
        eprintln!("MEMORY (the linear-memory limit, bytes): not a number: {memory}\n{USAGE}");
        return ExitCode::from(2);
    };
    match cordon_wasm::compile_cached(module.as_ref(), sha, cache.as_ref(), memory, function) {
        Ok(c) => {
            println!("{}", c.line());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn parse_run(args: &[String]) -> Result<RunOptions, String> {
    let mut o = RunOptions {
        code: PathBuf::new(),
        code_sha256: String::new(),
        memory: 0,
        wall: Duration::ZERO,
        dirs: Vec::new(),
        argv: Vec::new(),
        call: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{a} needs a value"))
        };
        match a.as_str() {
            "--code" => o.code = PathBuf::from(value()?),
            "--code-sha256" => o.code_sha256 = value()?,
            "--memory" => {
                o.memory = value()?
                    .parse()
                    .map_err(|_| "--memory: not a number".to_string())?
            }
            "--wall-ms" => {
                o.wall = Duration::from_millis(
                    value()?
                        .parse()
                        .map_err(|_| "--wall-ms: not a number".to_string())?,
                )
            }
            "--dir" => o.dirs.push(value()?),
            "--call" => o.call = Some(value()?),
            "--" => {
                o.argv = it.cloned().collect();
                break;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if o.code.as_os_str().is_empty() || o.code_sha256.is_empty() || o.argv.is_empty() {
        return Err("run needs --code, --code-sha256 and an argv after --".into());
    }
    Ok(o)
}

/// `serve`'s caps, then `run`'s options.
fn parse_serve(args: &[String]) -> Result<(RunOptions, u64, u64), String> {
    let mut caps = [None, None];
    let mut rest = args;
    while let [flag, value, tail @ ..] = rest {
        let at = match flag.as_str() {
            "--output-bytes" => 0,
            "--stderr-bytes" => 1,
            _ => break,
        };
        caps[at] = Some(
            value
                .parse::<u64>()
                .map_err(|_| format!("{flag}: not a number"))?,
        );
        rest = tail;
    }
    let [Some(out), Some(err)] = caps else {
        return Err("serve needs --output-bytes and --stderr-bytes".into());
    };
    Ok((parse_run(rest)?, out, err))
}

fn setup_failed(why: &str) -> ExitCode {
    eprintln!("{SETUP_MARKER}{why}");
    ExitCode::from(SETUP_EXIT as u8)
}

fn run(o: &RunOptions) -> ExitCode {
    match cordon_wasm::run(o) {
        Ok(code) => ExitCode::from((code & 0xff) as u8),
        Err(Failure::Setup(why)) => setup_failed(&why),
        // Only a worker's calls have an output cap of their own.
        Err(Failure::OutputCap) => setup_failed("output past its cap"),
        Err(Failure::Arguments(why)) => {
            eprintln!("{ARGUMENTS_MARKER}{why}");
            ExitCode::from(ARGUMENTS_EXIT as u8)
        }
        Err(Failure::Trap(kind, detail)) => {
            // Last: the runtime reads the kind from stderr's last line.
            eprintln!("{detail}");
            eprintln!("{TRAP_MARKER}{kind}");
            ExitCode::from(TRAP_EXIT as u8)
        }
    }
}
