//! `cordon audit tail|query`: the audit log, for a person reading it.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;

use crate::exit;
use cordon_broker::default_audit_path;

#[derive(clap::Subcommand)]
pub enum AuditCmd {
    /// The last records, one line each; --follow keeps printing new ones.
    Tail {
        /// How many records.
        #[arg(short = 'n', default_value_t = 20)]
        n: usize,
        #[arg(short = 'f', long)]
        follow: bool,
        #[arg(long, env = "CORDON_AUDIT")]
        file: Option<PathBuf>,
    },
    /// Records matching filters, across rotated files, oldest first.
    Query {
        /// Only this tool.
        #[arg(long)]
        tool: Option<String>,
        /// Only records newer than this, e.g. 10m, 2h, 1d.
        #[arg(long)]
        since: Option<String>,
        /// Only calls where something was denied or refused.
        #[arg(long)]
        denied: bool,
        /// Only calls of this principal (its subject, e.g. `local:1000`).
        #[arg(long)]
        principal: Option<String>,
        /// Only calls of this tenant.
        #[arg(long)]
        tenant: Option<String>,
        /// Print JSON Lines instead of one readable line per record.
        #[arg(long)]
        json: bool,
        #[arg(long, env = "CORDON_AUDIT")]
        file: Option<PathBuf>,
    },
}

pub fn run(cmd: AuditCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        AuditCmd::Tail { n, follow, file } => {
            let path = file
                .map_or_else(default_audit_path, Ok)
                .map_err(|e| anyhow!(e))?;
            let mut out = std::io::stdout().lock();
            cordon_audit::tail(&path, n, follow, &mut out).map_err(|e| anyhow!("{e}"))?;
        }
        AuditCmd::Query {
            tool,
            since,
            denied,
            principal,
            tenant,
            json,
            file,
        } => {
            let path = file
                .map_or_else(default_audit_path, Ok)
                .map_err(|e| anyhow!(e))?;
            let since = since
                .map(|s| cordon_audit::parse_duration(&s))
                .transpose()
                .map_err(|e| anyhow!("--since: {e}"))?;
            let filter = cordon_audit::Filter {
                tool,
                since,
                denied_only: denied,
                principal,
                tenant,
            };
            for r in cordon_audit::query(&path, &filter) {
                let r = r.map_err(|e| anyhow!("{e}"))?;
                if json {
                    println!("{}", serde_json::to_string(&r)?);
                } else {
                    println!("{}", cordon_audit::render_line(&r));
                }
            }
        }
    }
    Ok(ExitCode::from(exit::OK))
}
