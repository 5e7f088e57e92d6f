//! The matrix (BENCHMARKS §9): filled in below.

use anyhow::Result;

pub fn run(_quick: bool) -> Result<()> {
    anyhow::bail!("not yet")
}
