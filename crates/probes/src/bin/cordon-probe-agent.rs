//! Standalone probe agent: the same code `cordon __probe-agent` runs.
#![forbid(unsafe_code)]

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(cordon_probes::agent::main(&args));
}
