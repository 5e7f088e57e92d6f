//! A small seeded generator (xorshift64*): every load and cost sample is reproducible from its seed,
//! and the harness needs no dependency for it.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so nearby seeds give unrelated streams; never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Self((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean` (Poisson inter-arrival times).
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }

    /// Uniform in `[mean (1 - spread), mean (1 + spread)]`, at least 1.
    pub fn around(&mut self, mean: u64, spread: f64) -> u64 {
        let spread = spread.clamp(0.0, 1.0);
        ((mean as f64) * (1.0 - spread + 2.0 * spread * self.unit())).round().max(1.0) as u64
    }

    /// Uniform integer in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo { lo } else { lo + self.next() % (hi - lo + 1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.between(1, 5)).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.between(1, 5)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|x| (1..=5).contains(x)));
    }
}
