//! [`Search`]: the sweep behind `--search` (largest load a setup sustains), shared by the
//! scenarios that offer it.

/// The sizes a `--search` tries (subscribers for `broadcast`, points for `streams`): doubling
/// from the start until a size fails (or the ceiling, which is tried itself), then halving the
/// interval between the largest pass and the smallest failure `refine` times, stopping early
/// once it is within 2 % of the pass.
#[derive(Debug, Clone)]
pub(crate) struct Search {
    max: usize,
    refine: usize,
    pass: Option<usize>,
    fail: Option<usize>,
    next: Option<usize>,
}

impl Search {
    pub fn new(start: usize, max: usize, refine: usize) -> Search {
        Search { max, refine, pass: None, fail: None, next: (start <= max).then_some(start) }
    }

    pub fn next(&mut self) -> Option<usize> {
        self.next.take()
    }

    pub fn record(&mut self, m: usize, passed: bool) {
        if passed {
            self.pass = Some(self.pass.map_or(m, |p| p.max(m)));
        } else {
            self.fail = Some(self.fail.map_or(m, |f| f.min(m)));
        }
        self.next = match (self.pass, self.fail) {
            (Some(p), None) if p < self.max => Some(p.saturating_mul(2).min(self.max)),
            (Some(p), Some(f)) if self.refine > 0 && f - p > (p / 50).max(1) => {
                self.refine -= 1;
                Some(p + (f - p) / 2)
            }
            _ => None,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a server whose capacity is `cap` subscribers; returns the counts tried.
    fn tried(start: usize, max: usize, refine: usize, cap: usize) -> Vec<usize> {
        let mut s = Search::new(start, max, refine);
        let mut tried = Vec::new();
        while let Some(m) = s.next() {
            tried.push(m);
            s.record(m, m <= cap);
        }
        tried
    }

    #[test]
    fn search_doubles_then_bisects() {
        assert_eq!(tried(1000, 64_000, 3, 5000), vec![1000, 2000, 4000, 8000, 6000, 5000, 5500]);
        assert_eq!(tried(1000, 64_000, 0, 5000), vec![1000, 2000, 4000, 8000], "no refinement asked");
        assert_eq!(tried(1000, 3000, 3, 100_000), vec![1000, 2000, 3000], "the ceiling itself is tried");
        assert_eq!(tried(1000, 3000, 3, 500), vec![1000], "nothing passes");
        assert_eq!(tried(4000, 3000, 3, 500), Vec::<usize>::new(), "start above the ceiling");
        // Stops once the interval is within 2 % of the largest pass.
        assert_eq!(tried(1000, 64_000, 10, 1010), vec![1000, 2000, 1500, 1250, 1125, 1062, 1031, 1015]);
    }
}
