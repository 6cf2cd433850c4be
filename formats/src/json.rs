//! Reading the fields of flannel's JSON (the network config and its
//! backends' sections): each getter takes an absent or null field, or an
//! empty string, for unset, and names the field in its error.

use serde_json::{Map, Value};
use thiserror::Error;

/// A config that cannot be used, naming the field at fault.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("network config: {field}: {reason}")]
pub struct ConfigError {
    pub field: &'static str,
    pub reason: String,
}

pub fn err(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

pub fn get_str<'a>(
    obj: &'a Map<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(err(key, format!("must be a string, found {v}"))),
    }
}

pub fn get_u64(obj: &Map<String, Value>, key: &'static str) -> Result<Option<u64>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_u64()
            .map(Some)
            .ok_or_else(|| err(key, format!("must be a non-negative integer, found {n}"))),
        Some(v) => Err(err(key, format!("must be a number, found {v}"))),
    }
}

pub fn get_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, ConfigError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(err(key, format!("must be true or false, found {v}"))),
    }
}
