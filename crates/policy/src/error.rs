//! Manifest diagnostics: every error and warning names the file, line and
//! column, says what is wrong, and what would be right.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub file: PathBuf,
    pub line: u64,
    pub column: u64,
    /// The tool concerned, when there is one.
    pub tool: Option<String>,
    pub message: String,
    /// What would be right.
    pub hint: Option<String>,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: ", self.file.display(), self.line, self.column)?;
        if let Some(t) = &self.tool {
            write!(f, "tool `{t}`: ")?;
        }
        f.write_str(&self.message)?;
        if let Some(h) = &self.hint {
            write!(f, "\n  hint: {h}")?;
        }
        Ok(())
    }
}

/// Why a manifest could not be loaded: one or more diagnostics.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    #[error("cannot read manifest {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
    #[error("{}", render(.0))]
    Invalid(Vec<Diagnostic>),
}

impl ManifestError {
    pub fn diagnostics(&self) -> &[Diagnostic] {
        match self {
            ManifestError::Io { .. } => &[],
            ManifestError::Invalid(d) => d,
        }
    }
}

fn render(diags: &[Diagnostic]) -> String {
    diags
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
