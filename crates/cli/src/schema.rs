//! `cordon schema`: the manifest's JSON Schema, generated from the types.

use std::process::ExitCode;

use crate::exit;

pub fn run() -> anyhow::Result<ExitCode> {
    println!(
        "{}",
        serde_json::to_string_pretty(&cordon_policy::json_schema())?
    );
    Ok(ExitCode::from(exit::OK))
}
