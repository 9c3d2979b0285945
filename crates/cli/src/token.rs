//! `cordon token`: static bearer tokens for `cordon serve --http --auth`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::anyhow;

#[derive(clap::Subcommand)]
pub enum TokenCmd {
    /// Make a token named NAME, print it once, and append only its hash to
    /// the token file (created mode 0600).
    Add {
        name: String,
        /// The token file (the authentication file's `static_tokens`).
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        /// The tenant of the token's caller (default: `default`).
        #[arg(long)]
        tenant: Option<String>,
        /// A group of the token's caller (repeatable).
        #[arg(long = "group", value_name = "GROUP")]
        groups: Vec<String>,
    },
}

pub fn run(cmd: TokenCmd) -> anyhow::Result<ExitCode> {
    match cmd {
        TokenCmd::Add {
            name,
            file,
            tenant,
            groups,
        } => {
            let token = cordon_auth::static_tokens::add(&file, &name, tenant.as_deref(), &groups)
                .map_err(|e| anyhow!(e))?;
            eprintln!(
                "cordon: token `{name}` added to {} (only its hash is stored; it is shown once):",
                file.display()
            );
            println!("{token}");
            Ok(ExitCode::SUCCESS)
        }
    }
}
