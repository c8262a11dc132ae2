//! Who holds which point: the `--subs × --points-per-sub` subscriptions dealt round-robin
//! over the `--points` channels, and what that makes the subscribers owed.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use crate::scenario::streams::feed::Points;

/// The point feed and its subscribers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    pub points: Points,
    /// Held subscriber connections.
    pub subs: usize,
    /// Points each holds; at most `points.count`, so a subscriber's points are distinct.
    pub points_per_sub: usize,
}

impl Plan {
    /// Subscription `i` (of `subs × points_per_sub`, subscriber by subscriber) is on point
    /// `i mod points`: subscriber `g` holds `g·k, g·k + 1, …, g·k + k − 1` (mod `points`).
    pub fn points_of(&self, g: usize) -> impl Iterator<Item = usize> {
        let (k, n) = (self.points_per_sub, self.points.count.max(1));
        let first = g.wrapping_mul(k) % n;
        (0..k).map(move |j| (first + j) % n)
    }

    /// The position of point `p` among subscriber `g`'s points, if it holds it.
    pub fn slot(&self, g: usize, p: usize) -> Option<usize> {
        let n = self.points.count.max(1);
        let first = g.wrapping_mul(self.points_per_sub) % n;
        let s = (p % n + n - first) % n;
        (s < self.points_per_sub && p < n).then_some(s)
    }

    /// How many subscribers hold point `p`: the subscriptions `i ≡ p (mod points)`.
    pub fn subscribers_of(&self, p: usize) -> u64 {
        let n = self.points.count.max(1);
        let total = self.subs * self.points_per_sub;
        (total / n + usize::from(p < total % n)) as u64
    }

    /// Deliveries owed for `accepted[p]` accepted publications of each point `p`.
    pub fn expected(&self, accepted: &[u64]) -> u64 {
        accepted.iter().enumerate().map(|(p, a)| a * self.subscribers_of(p)).sum()
    }

    /// Points nobody holds (when `subs × points_per_sub < points`).
    pub fn unheld(&self) -> Range<usize> {
        (self.subs * self.points_per_sub).min(self.points.count)..self.points.count
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(subs: usize, k: usize, n: usize) -> Plan {
        Plan { points: Points { prefix: "pt:soak.".into(), count: n }, subs, points_per_sub: k }
    }

    #[test]
    fn soak_plan_deals_every_point_round_robin() {
        // 7 subscribers × 3 of 5 points: 21 subscriptions, points 0 held 5 times, others 4.
        let p = plan(7, 3, 5);
        let mut held = vec![0u64; 5];
        for g in 0..7 {
            let pts: Vec<usize> = p.points_of(g).collect();
            let mut distinct = pts.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), 3, "subscriber {g}: {pts:?}");
            for (j, &pt) in pts.iter().enumerate() {
                held[pt] += 1;
                assert_eq!(p.slot(g, pt), Some(j));
            }
            let others = (0..5).filter(|pt| !pts.contains(pt));
            assert!(others.clone().all(|pt| p.slot(g, pt).is_none()));
        }
        assert_eq!(held, (0..5).map(|pt| p.subscribers_of(pt)).collect::<Vec<_>>());
        assert_eq!(held, [5, 4, 4, 4, 4]);
        assert_eq!(p.points_of(2).collect::<Vec<_>>(), [1, 2, 3], "wraps around");
        assert!(p.unheld().is_empty());
        // The default: 2,000 × 10 of 1,000 points, 20 subscribers each.
        let d = plan(2000, 10, 1000);
        assert!((0..1000).all(|pt| d.subscribers_of(pt) == 20));
        assert_eq!(d.expected(&[3; 1000]), 60_000);
        assert_eq!(d.slot(0, 1000), None, "not a point");
        // Fewer subscriptions than points leaves some unheld and owed nothing.
        let thin = plan(2, 2, 10);
        assert_eq!(thin.unheld(), 4..10);
        assert_eq!(thin.expected(&[1; 10]), 4);
    }
}
