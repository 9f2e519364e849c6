//! The values that cross the seam: parameters in, cells out. Both dialects
//! store the same four kinds (times and flags as integers, JSON as text).

use std::sync::Arc;

use crate::store::{StoreError, StoreResult};

/// A parameter or a cell.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// Any integer column (times in unix ms, counts, flags 0/1).
    Int(i64),
    /// A floating-point column.
    Real(f64),
    /// Text (ids, JSON, statuses).
    Text(String),
}

macro_rules! from_int {
    ($($t:ty),*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::Int(v as i64)
            }
        }
    )*};
}
from_int!(i64, i32, u32, u16, u8);

impl From<u64> for Value {
    /// Saturates at `i64::MAX` (no stored quantity comes near it).
    fn from(v: u64) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<usize> for Value {
    /// Saturates at `i64::MAX`.
    fn from(v: usize) -> Value {
        Value::Int(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Int(v as i64)
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Real(v)
    }
}

/// Text as stored: a NUL character (which a command's output, a note or a
/// summary may hold, and PostgreSQL's text cannot) becomes U+FFFD, on both
/// stores alike, so every text round-trips the same way on either.
fn text(v: String) -> Value {
    if v.contains('\0') {
        Value::Text(v.replace('\0', "\u{FFFD}"))
    } else {
        Value::Text(v)
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        text(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        text(v.clone())
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        text(v.to_owned())
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map_or(Value::Null, Into::into)
    }
}

impl<T: Clone + Into<Value>> From<&Option<T>> for Value {
    fn from(v: &Option<T>) -> Value {
        v.clone().map_or(Value::Null, Into::into)
    }
}

/// A type a cell reads into; a mismatch is a corrupt store, named.
pub trait FromValue: Sized {
    /// The cell's value as `Self`.
    fn from_value(v: &Value) -> Result<Self, String>;
}

impl FromValue for i64 {
    fn from_value(v: &Value) -> Result<i64, String> {
        match v {
            Value::Int(n) => Ok(*n),
            other => Err(format!("expected an integer, found {other:?}")),
        }
    }
}

macro_rules! from_value_int {
    ($($t:ty),*) => {$(
        impl FromValue for $t {
            fn from_value(v: &Value) -> Result<$t, String> {
                let n = i64::from_value(v)?;
                <$t>::try_from(n).map_err(|_| format!("{n} is out of range"))
            }
        }
    )*};
}
from_value_int!(i32, u32, u64, u16, u8, usize);

impl FromValue for bool {
    fn from_value(v: &Value) -> Result<bool, String> {
        Ok(i64::from_value(v)? != 0)
    }
}

impl FromValue for f64 {
    fn from_value(v: &Value) -> Result<f64, String> {
        match v {
            Value::Real(x) => Ok(*x),
            Value::Int(n) => Ok(*n as f64),
            other => Err(format!("expected a number, found {other:?}")),
        }
    }
}

impl FromValue for String {
    fn from_value(v: &Value) -> Result<String, String> {
        match v {
            Value::Text(s) => Ok(s.clone()),
            other => Err(format!("expected text, found {other:?}")),
        }
    }
}

impl<T: FromValue> FromValue for Option<T> {
    fn from_value(v: &Value) -> Result<Option<T>, String> {
        match v {
            Value::Null => Ok(None),
            v => T::from_value(v).map(Some),
        }
    }
}

/// One row of a query: its cells by column name.
#[derive(Debug, Clone)]
pub struct Row {
    names: Arc<[String]>,
    values: Vec<Value>,
}

impl Row {
    /// A row of `values` under the query's column `names`.
    pub fn new(names: Arc<[String]>, values: Vec<Value>) -> Row {
        Row { names, values }
    }

    /// The cell of column `name`.
    pub fn get<T: FromValue>(&self, name: &str) -> StoreResult<T> {
        let i = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| StoreError::Corrupt(format!("no column {name:?} in the row")))?;
        self.read(i, name)
    }

    /// The cell at column `index` (0-based).
    pub fn at<T: FromValue>(&self, index: usize) -> StoreResult<T> {
        self.read(index, &index.to_string())
    }

    fn read<T: FromValue>(&self, i: usize, name: &str) -> StoreResult<T> {
        let v = self
            .values
            .get(i)
            .ok_or_else(|| StoreError::Corrupt(format!("no column {name} in the row")))?;
        T::from_value(v).map_err(|e| StoreError::Corrupt(format!("column {name}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_read_back_as_their_types_and_mismatches_are_named() {
        let names: Arc<[String]> = ["n", "t", "x", "z"].map(String::from).into();
        let row = Row::new(
            names,
            vec![
                Value::from(7u32),
                Value::from("a"),
                Value::from(1.5),
                Value::from(None::<i64>),
            ],
        );
        assert_eq!(row.get::<u64>("n").ok(), Some(7));
        assert_eq!(row.get::<bool>("n").ok(), Some(true));
        assert_eq!(row.get::<String>("t").ok().as_deref(), Some("a"));
        assert_eq!(row.get::<f64>("x").ok(), Some(1.5));
        assert_eq!(row.get::<Option<i64>>("z").ok(), Some(None));
        let err = row
            .get::<i64>("t")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("column t"), "{err}");
        assert!(row.get::<i64>("missing").is_err());
        assert_eq!(Value::from(u64::MAX), Value::Int(i64::MAX));
        assert_eq!(row.at::<u8>(0).ok(), Some(7));
    }
}
