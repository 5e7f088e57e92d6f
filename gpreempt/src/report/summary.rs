//! `--summary-json FILE`: the closing summary alone, as one pretty-printed JSON document.

use std::io::Write;

use super::{Sink, TraceSummary};

pub struct SummaryFile<W: Write> {
    out: W,
}

impl<W: Write> SummaryFile<W> {
    pub fn new(out: W) -> Self {
        Self { out }
    }
}

impl<W: Write> Sink for SummaryFile<W> {
    fn summary(&mut self, summary: &TraceSummary) -> std::io::Result<()> {
        serde_json::to_writer_pretty(&mut self.out, summary)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_the_summary_as_one_document() {
        let mut out = Vec::new();
        SummaryFile::new(&mut out).summary(&TraceSummary { events: 3, ..Default::default() }).unwrap();
        let doc: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!((doc["events"].as_u64(), doc["processes"].as_array().map(Vec::len)), (Some(3), Some(0)));
        assert!(out.ends_with(b"}\n"));
    }
}
