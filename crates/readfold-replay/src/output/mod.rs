//! Writers of a table: JSON lines, CSV and Parquet. Each takes the columns
//! once and rows one at a time, so rows can stream out as they are made.

mod csv;
mod jsonl;
mod parquet;

use std::io::Write;
use std::str::FromStr;

use crate::error::Result;
use crate::table::{Column, Value};

/// An output format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Csv,
    Parquet,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, String> {
        match raw {
            "jsonl" | "json" => Ok(Format::Jsonl),
            "csv" => Ok(Format::Csv),
            "parquet" => Ok(Format::Parquet),
            _ => Err(format!("{raw:?} is not a format: jsonl, csv or parquet")),
        }
    }
}

/// Where rows go.
pub trait RowSink {
    fn write(&mut self, row: &[Value]) -> Result<()>;
    /// Writes whatever is buffered and the format's footer.
    fn finish(self: Box<Self>) -> Result<()>;
}

/// A writer of `columns` in `format` to `out`.
pub fn sink(
    format: Format,
    table: &str,
    columns: Vec<Column>,
    out: Box<dyn Write + Send>,
) -> Result<Box<dyn RowSink>> {
    Ok(match format {
        Format::Jsonl => Box::new(jsonl::JsonLines::new(columns, out)),
        Format::Csv => Box::new(csv::Csv::new(&columns, out)?),
        Format::Parquet => Box::new(parquet::Parquet::new(table, columns, out)?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::Kind;
    use std::sync::{Arc, Mutex};

    /// A `Write` whose bytes the test can read afterwards.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn columns() -> Vec<Column> {
        vec![
            Column {
                name: "conversation",
                kind: Kind::Str,
                nullable: false,
            },
            Column {
                name: "first_read_ms",
                kind: Kind::Int,
                nullable: true,
            },
            Column {
                name: "present",
                kind: Kind::Bool,
                nullable: false,
            },
        ]
    }

    fn rows() -> Vec<Vec<Value>> {
        vec![
            vec![Value::Str("g,1 \"x\"".into()), Value::Int(5), Value::Bool(true)],
            vec![Value::Str("dm".into()), Value::Null, Value::Bool(false)],
        ]
    }

    fn render(format: Format) -> Vec<u8> {
        let out = Shared::default();
        let mut sink = sink(format, "t", columns(), Box::new(out.clone())).unwrap();
        for row in rows() {
            sink.write(&row).unwrap();
        }
        sink.finish().unwrap();
        let bytes = out.0.lock().unwrap().clone();
        bytes
    }

    #[test]
    fn json_lines_keep_column_order_and_nulls() {
        let text = String::from_utf8(render(Format::Jsonl)).unwrap();
        assert_eq!(
            text,
            "{\"conversation\":\"g,1 \\\"x\\\"\",\"first_read_ms\":5,\"present\":true}\n\
             {\"conversation\":\"dm\",\"first_read_ms\":null,\"present\":false}\n"
        );
    }

    #[test]
    fn csv_has_a_header_quotes_and_empty_nulls() {
        let text = String::from_utf8(render(Format::Csv)).unwrap();
        assert_eq!(
            text,
            "conversation,first_read_ms,present\n\"g,1 \"\"x\"\"\",5,true\ndm,,false\n"
        );
    }

    #[test]
    fn parquet_is_a_parquet_file_and_the_same_bytes_every_time() {
        let one = render(Format::Parquet);
        assert_eq!(&one[..4], b"PAR1");
        assert_eq!(&one[one.len() - 4..], b"PAR1");
        assert_eq!(one, render(Format::Parquet), "byte-identical output");
        use ::parquet::file::reader::{FileReader, SerializedFileReader};
        let reader = SerializedFileReader::new(bytes::Bytes::from(one)).unwrap();
        assert_eq!(reader.metadata().file_metadata().num_rows(), 2);
    }
}
