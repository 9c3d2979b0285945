//! `cordon state`: the tools' per-tenant state images (`state:` in the
//! manifest), listed and removed.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;
use clap::Subcommand;

use crate::exit;

#[derive(Subcommand, Debug)]
pub enum StateCmd {
    /// Every tenant's state of every tool: tenant, tool, size.
    Ls {
        /// cordon's state directory (default: $CORDON_STATE_DIR, else
        /// /var/lib/cordon); the images are in its `tool-state`.
        #[arg(long)]
        dir: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Remove a tool's state for one tenant (refused while a running
    /// cordon has it mounted).
    Rm {
        /// The tool, by its manifest name.
        tool: String,
        /// The tenant (default: `default`).
        #[arg(long, default_value = cordon_runtime::DEFAULT_TENANT)]
        tenant: String,
        /// cordon's state directory (default: $CORDON_STATE_DIR, else
        /// /var/lib/cordon); the images are in its `tool-state`.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

fn dir_or_default(dir: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    Ok(match dir {
        Some(d) => d.join("tool-state"),
        None => cordon_dirs::Dirs::current()
            .tool_state()
            .map_err(|e| anyhow!(e))?,
    })
}

pub fn run(cmd: StateCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        StateCmd::Ls { dir, json } => {
            let d = dir_or_default(dir)?;
            let list = cordon_runtime::volume::list_states(&d).map_err(|e| anyhow!(e))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
            } else {
                for e in &list {
                    println!(
                        "{}\t{}\t{}",
                        e.tenant,
                        e.tool,
                        cordon_policy::units::format_size(e.size)
                    );
                }
            }
            Ok(ExitCode::from(exit::OK))
        }
        StateCmd::Rm { tool, tenant, dir } => {
            let d = dir_or_default(dir)?;
            match cordon_runtime::volume::remove_state(&d, &tenant, &tool) {
                Ok(true) => {
                    println!("removed the state of {tool} for tenant {tenant}");
                    Ok(ExitCode::from(exit::OK))
                }
                Ok(false) => Err(anyhow!(
                    "no state of {tool} for tenant {tenant} in {}",
                    d.display()
                )),
                Err(e) => Err(anyhow!(e)),
            }
        }
    }
}
