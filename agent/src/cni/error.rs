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
    /// Transient: the runtime should try again later.
    TryAgainLater = 11,
    /// STATUS: the plugin cannot serve ADD now (CNI 1.1).
    NotAvailable = 50,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    #[test]
    fn errors_print_as_the_spec_says() {
        let e = CniError::new(Code::InvalidEnv, "CNI_NETNS is missing")
            .with_details("set by the runtime");
        let v: Value = serde_json::from_str(&e.to_json("0.4.0")).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "cniVersion": "0.4.0",
                "code": 4,
                "msg": "CNI_NETNS is missing",
                "details": "set by the runtime",
            })
        );
        // The codes are the spec's numbers.
        let codes = [
            (Code::IncompatibleVersion, 1),
            (Code::UnknownContainer, 3),
            (Code::InvalidEnv, 4),
            (Code::Io, 5),
            (Code::Decode, 6),
            (Code::InvalidConfig, 7),
            (Code::Plugin, 100),
        ];
        for (code, n) in codes {
            let v: Value =
                serde_json::from_str(&CniError::new(code, "m").to_json("1.0.0")).unwrap();
            assert_eq!(v["code"], n, "{code:?}");
            assert_eq!(v["details"], "", "{code:?}");
        }
    }
}
