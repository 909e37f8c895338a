//! The test-data generator's random numbers.

/// A small deterministic generator (SplitMix64) for test inputs.
#[derive(Debug, Clone)]
pub struct Rng(u64);

const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Rng::from_state(seed ^ GAMMA)
    }

    /// A generator whose SplitMix64 counter starts at `state` ([`Rng::new`]
    /// starts it at `seed ^ 0x9e37_79b9_7f4a_7c15`), for callers that turn
    /// their seeds into states their own way.
    pub const fn from_state(state: u64) -> Self {
        Rng(state)
    }

    /// The generator `n` draws ahead: SplitMix64's state is a counter,
    /// so this equals calling [`next_u64`](Self::next_u64) `n` times.
    pub fn skipped(&self, n: u64) -> Rng {
        Rng(self.0.wrapping_add(n.wrapping_mul(GAMMA)))
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GAMMA);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = 1.0 - self.uniform();
        let u2 = self.uniform();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }

    /// `n` random bytes (one draw each).
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        self.par_draws(n, 1, |r| r.next_u64() as u8)
    }

    /// `n` values of `draw`, each taking `draws_each` draws: the same as
    /// calling it `n` times in a row, computed on all cores (the state is
    /// a counter, so each chunk starts from its own offset).
    pub fn par_draws<T: Copy + Default + Send>(
        &mut self,
        n: usize,
        draws_each: u64,
        draw: impl Fn(&mut Rng) -> T + Sync,
    ) -> Vec<T> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 15;
        let base = self.clone();
        let mut out = vec![T::default(); n];
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, c)| {
            let mut r = base.skipped(draws_each * (i * CHUNK) as u64);
            for v in c.iter_mut() {
                *v = draw(&mut r);
            }
        });
        *self = base.skipped(draws_each * n as u64);
        out
    }

    /// A random permutation of `0..n`.
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = self.below(i as u64 + 1) as usize;
            p.swap(i, j);
        }
        p
    }
}

/// `n` values of [`Rng::normal`], the same as drawing them one by one
/// (each takes two draws), computed on all cores: the large benchmark
/// cases need tens of millions.
pub fn normals(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.par_draws(n, 2, Rng::normal)
}

#[cfg(test)]
mod tests {
    use super::{normals, Rng};

    #[test]
    fn parallel_normals_are_the_sequential_draws() {
        // Across chunk boundaries, and the generator ends where the
        // sequential draws leave it.
        for n in [0usize, 1, 32_767, 32_768, 100_003] {
            let mut a = Rng::new(0x5eed + n as u64);
            let mut b = a.clone();
            let par = normals(&mut a, n);
            let seq: Vec<f32> = (0..n).map(|_| b.normal()).collect();
            assert_eq!(par.len(), n);
            assert!(
                par.iter()
                    .zip(&seq)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "n = {n}"
            );
            assert_eq!(a.next_u64(), b.next_u64(), "state after n = {n}");
            let par = a.bytes(n + 65_536);
            let seq: Vec<u8> = (0..n + 65_536).map(|_| b.next_u64() as u8).collect();
            assert_eq!(par, seq, "bytes, n = {n}");
            assert_eq!(a.next_u64(), b.next_u64(), "state after the bytes, n = {n}");
        }
    }
}
