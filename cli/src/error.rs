//! The command's errors: each says what went wrong and carries the exit status it ends with.

/// Why a command ends without doing what was asked, with its exit status ([`CliError::code`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CliError {
    /// Refused before anything was made: bad options, a profile that forbids them, an input
    /// that cannot be used (125, as `docker run`'s own failures).
    #[error("{0}")]
    Refused(String),
    /// The rung could not be reached or set up (`code`: 125 for `run`, 1 for the tools).
    #[error("{what}")]
    Unreachable {
        /// What was tried, with the cause's chain.
        what: String,
        /// The exit status.
        code: u8,
    },
    /// The attempt could not be launched.
    #[error("{0}")]
    Launch(#[source] stevedore::LaunchError),
    /// A tool's step failed (1).
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    /// The exit status the command ends with.
    pub fn code(&self) -> u8 {
        match self {
            Self::Refused(_) | Self::Launch(_) => 125,
            Self::Unreachable { code, .. } => *code,
            Self::Failed(_) => 1,
        }
    }

    /// Says it on stderr, once, with its causes, and gives the exit status.
    pub fn said(self) -> u8 {
        crate::say::say(stevedore::error_chain(&self));
        self.code()
    }

    /// The same error ending with `code` instead (a tool's failure is 1, `run`'s 125).
    pub fn exiting(self, code: u8) -> Self {
        match self {
            Self::Refused(what) | Self::Failed(what) => Self::Unreachable { what, code },
            Self::Unreachable { what, .. } => Self::Unreachable { what, code },
            Self::Launch(e) => Self::Unreachable { what: stevedore::error_chain(&e), code },
        }
    }
}

impl From<String> for CliError {
    fn from(why: String) -> Self {
        Self::Refused(why)
    }
}

impl From<&str> for CliError {
    fn from(why: &str) -> Self {
        Self::Refused(why.to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_ends_with_its_status() {
        assert_eq!(CliError::from("no").code(), 125);
        assert_eq!(CliError::Failed("no".into()).code(), 1);
        assert_eq!(CliError::Refused("no".into()).exiting(1).code(), 1);
        let e = CliError::Unreachable { what: "engine: down".into(), code: 125 };
        assert_eq!((e.to_string().as_str(), e.code()), ("engine: down", 125));
    }
}
