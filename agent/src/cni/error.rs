//! CNI errors: a code, a message and details, printed as JSON on stdout.

use serde_json::json;

/// The error codes of the CNI spec that this plugin uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Code {
    IncompatibleVersion = 1,
    UnknownContainer = 3,
    InvalidEnv = 4,
    Io = 5,
    Decode = 6,
    InvalidConfig = 7,
    /// Plugin-specific (the CNI spec reserves 100 and up).
    Plugin = 100,
}

#[derive(Debug)]
pub(crate) struct CniError {
    code: Code,
    msg: String,
    details: String,
}

impl CniError {
    pub(crate) fn new(code: Code, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    pub(crate) fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    pub(crate) fn to_json(&self, cni_version: &str) -> String {
        json!({
            "cniVersion": cni_version,
            "code": self.code as u32,
            "msg": self.msg,
            "details": self.details,
        })
        .to_string()
    }
}
