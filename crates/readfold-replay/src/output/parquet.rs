//! Parquet through the parquet crate's column writers (no Arrow): strings as
//! UTF-8 byte arrays, integers as INT64, flags as BOOLEAN; nullable columns
//! are OPTIONAL. Rows are buffered per column and written in row groups.

use std::io::Write;
use std::sync::Arc;

use parquet::basic::Compression;
use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use super::RowSink;
use crate::error::Result;
use crate::table::{Column, Kind, Value};

/// Rows per row group: large enough for good compression and scans, small
/// enough that buffering one costs a few MB.
const ROW_GROUP_ROWS: usize = 65_536;

enum Values {
    Str(Vec<ByteArray>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

struct Buffer {
    values: Values,
    /// Definition levels of a nullable column: 1 for a value, 0 for null.
    defs: Option<Vec<i16>>,
}

pub struct Parquet {
    writer: SerializedFileWriter<Box<dyn Write + Send>>,
    columns: Vec<Column>,
    buffers: Vec<Buffer>,
    rows: usize,
}

impl Parquet {
    pub fn new(table: &str, columns: Vec<Column>, out: Box<dyn Write + Send>) -> Result<Self> {
        let fields: String = columns
            .iter()
            .map(|c| {
                let repetition = if c.nullable { "OPTIONAL" } else { "REQUIRED" };
                let physical = match c.kind {
                    Kind::Str => "BYTE_ARRAY",
                    Kind::Int => "INT64",
                    Kind::Bool => "BOOLEAN",
                };
                let logical = if c.kind == Kind::Str { " (UTF8)" } else { "" };
                format!("  {repetition} {physical} {}{logical};\n", c.name)
            })
            .collect();
        let schema = format!("message {} {{\n{fields}}}", table.replace('-', "_"));
        let schema = Arc::new(parse_message_type(&schema)?);
        let properties = Arc::new(
            WriterProperties::builder()
                .set_compression(Compression::SNAPPY)
                .set_created_by("readfold replay".into())
                .build(),
        );
        let writer = SerializedFileWriter::new(out, schema, properties)?;
        let buffers = columns.iter().map(Buffer::new).collect();
        Ok(Parquet {
            writer,
            columns,
            buffers,
            rows: 0,
        })
    }

    fn write_row_group(&mut self) -> Result<()> {
        if self.rows == 0 {
            return Ok(());
        }
        let mut group = self.writer.next_row_group()?;
        for buffer in &mut self.buffers {
            let Some(mut column) = group.next_column()? else {
                break;
            };
            let defs = buffer.defs.as_deref();
            match &buffer.values {
                Values::Str(v) => column.typed::<ByteArrayType>().write_batch(v, defs, None)?,
                Values::Int(v) => column.typed::<Int64Type>().write_batch(v, defs, None)?,
                Values::Bool(v) => column.typed::<BoolType>().write_batch(v, defs, None)?,
            };
            column.close()?;
            buffer.clear();
        }
        group.close()?;
        self.rows = 0;
        Ok(())
    }
}

impl Buffer {
    fn new(column: &Column) -> Self {
        Buffer {
            values: match column.kind {
                Kind::Str => Values::Str(vec![]),
                Kind::Int => Values::Int(vec![]),
                Kind::Bool => Values::Bool(vec![]),
            },
            defs: column.nullable.then(Vec::new),
        }
    }

    fn clear(&mut self) {
        match &mut self.values {
            Values::Str(v) => v.clear(),
            Values::Int(v) => v.clear(),
            Values::Bool(v) => v.clear(),
        }
        if let Some(d) = &mut self.defs {
            d.clear();
        }
    }

    fn push(&mut self, column: &Column, value: &Value) {
        let present = !matches!(value, Value::Null);
        if let Some(defs) = &mut self.defs {
            defs.push(i16::from(present));
        }
        match (&mut self.values, value) {
            (Values::Str(v), Value::Str(s)) => v.push(ByteArray::from(s.as_str())),
            (Values::Int(v), Value::Int(n)) => v.push(*n),
            (Values::Bool(v), Value::Bool(b)) => v.push(*b),
            (_, Value::Null) if column.nullable => {}
            (_, other) => unreachable!("column {} got {other:?}", column.name),
        }
    }
}

impl RowSink for Parquet {
    fn write(&mut self, row: &[Value]) -> Result<()> {
        for ((buffer, column), value) in self.buffers.iter_mut().zip(&self.columns).zip(row) {
            buffer.push(column, value);
        }
        self.rows += 1;
        if self.rows >= ROW_GROUP_ROWS {
            self.write_row_group()?;
        }
        Ok(())
    }

    fn finish(mut self: Box<Self>) -> Result<()> {
        self.write_row_group()?;
        let mut out = self.writer.into_inner()?;
        out.flush()?;
        Ok(())
    }
}
