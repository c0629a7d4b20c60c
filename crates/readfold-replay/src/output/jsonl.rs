//! One JSON object per row, keys in column order.

use std::io::{BufWriter, Write};

use super::RowSink;
use crate::error::Result;
use crate::table::{Column, Value};

pub struct JsonLines {
    /// Each column's `"name":` prefix, escaped once.
    keys: Vec<String>,
    out: BufWriter<Box<dyn Write + Send>>,
}

impl JsonLines {
    pub fn new(columns: Vec<Column>, out: Box<dyn Write + Send>) -> Self {
        JsonLines {
            keys: columns
                .iter()
                .map(|c| format!("{}:", serde_json::Value::from(c.name)))
                .collect(),
            out: BufWriter::with_capacity(1 << 16, out),
        }
    }
}

impl RowSink for JsonLines {
    fn write(&mut self, row: &[Value]) -> Result<()> {
        let out = &mut self.out;
        out.write_all(b"{")?;
        for (i, (key, value)) in self.keys.iter().zip(row).enumerate() {
            if i > 0 {
                out.write_all(b",")?;
            }
            out.write_all(key.as_bytes())?;
            match value {
                Value::Str(s) => serde_json::to_writer(&mut *out, s).map_err(std::io::Error::from)?,
                Value::Int(n) => write!(out, "{n}")?,
                Value::Bool(b) => write!(out, "{b}")?,
                Value::Null => out.write_all(b"null")?,
            }
        }
        out.write_all(b"}\n")?;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}
