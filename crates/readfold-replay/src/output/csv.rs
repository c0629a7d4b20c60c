//! RFC 4180 CSV with a header row; a null is an empty field.

use std::io::Write;

use super::RowSink;
use crate::error::Result;
use crate::table::{Column, Value};

pub struct Csv {
    out: csv::Writer<Box<dyn Write + Send>>,
    cells: Vec<String>,
}

impl Csv {
    pub fn new(columns: &[Column], out: Box<dyn Write + Send>) -> Result<Self> {
        let mut out = csv::WriterBuilder::new().from_writer(out);
        out.write_record(columns.iter().map(|c| c.name))?;
        Ok(Csv { out, cells: vec![] })
    }
}

impl RowSink for Csv {
    fn write(&mut self, row: &[Value]) -> Result<()> {
        self.cells.clear();
        self.cells.extend(row.iter().map(|v| match v {
            Value::Str(s) => s.clone(),
            Value::Int(n) => n.to_string(),
            Value::Bool(b) => b.to_string(),
            Value::Null => String::new(),
        }));
        self.out.write_record(&self.cells)?;
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.out.flush()?;
        Ok(())
    }
}
