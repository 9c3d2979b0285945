//! `cordon schema`: the manifest's JSON Schema, generated from the types,
//! or the bundled example manifest (built into the binary, so a user with
//! only the binary has it).

use std::process::ExitCode;

use crate::exit;

/// The bundled example manifest, `examples/cordon.yaml`.
const EXAMPLE: &str = include_str!("../../../examples/cordon.yaml");

pub fn run(example: bool) -> anyhow::Result<ExitCode> {
    if example {
        print!("{EXAMPLE}");
        return Ok(ExitCode::from(exit::OK));
    }
    println!(
        "{}",
        serde_json::to_string_pretty(&cordon_policy::json_schema())?
    );
    Ok(ExitCode::from(exit::OK))
}
