//! Chunk planning (pure): where a note is cut into chunks for embedding.
//!
//! Input: the note's *units* — sentences, with over-long sentences already cut into token-bounded pieces — each
//! with its token count and its segment (the section, or one segment for the whole note when chunks may cross
//! sections). Output: chunks as ranges of units, each beginning with `overlap` units repeated from before.
//!
//! * **SEOS** (semantic): `shifts[i]` is the embedding distance between the sentence groups around unit `i` and
//!   unit `i + 1`. A segment of T tokens gets `⌈T / budget⌉ − 1` breakpoints at its largest shifts; a chunk still
//!   over the budget (its overlap included) is cut again at its own largest shift, until every chunk fits.
//! * **Fixed**: units are packed in order while the chunk (overlap included) stays within the budget.
//!
//! Invariants (property-tested below): chunks never cross a segment; their own units cover every unit once, in
//! order; every chunk after the first of its segment starts with exactly `min(overlap, units before it in the
//! segment)` repeated units; no chunk is over the budget when every unit is at most `budget / (overlap + 1)`
//! tokens (the caller's job: `max_unit_tokens`).

use std::ops::Range;

/// One sentence (or piece of one): a byte span of the note, its tokens, and its segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unit {
    pub start: usize,
    pub end: usize,
    pub tokens: usize,
    pub segment: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkStrategy {
    Seos,
    Fixed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkParams {
    pub strategy: ChunkStrategy,
    /// Tokens per chunk at most (special tokens excluded).
    pub budget: usize,
    /// Units repeated at the start of the next chunk.
    pub overlap: usize,
}

impl ChunkParams {
    /// The largest unit the planner can always fit together with a full overlap.
    pub fn max_unit_tokens(&self) -> usize {
        (self.budget / (self.overlap + 1)).max(1)
    }
}

/// A planned chunk: `units` includes the leading `overlap` units repeated from the previous chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    pub units: Range<usize>,
    pub overlap: usize,
}

impl Planned {
    /// The units this chunk adds (its overlap excluded).
    pub fn own(&self) -> Range<usize> {
        self.units.start + self.overlap..self.units.end
    }
}

/// Plans the chunks of one note. `shifts` (SEOS only) has one entry per adjacent pair of units; it is ignored for
/// `Fixed` and may then be empty.
pub fn plan(units: &[Unit], shifts: &[f32], p: &ChunkParams) -> Vec<Planned> {
    let mut out = Vec::new();
    let mut a = 0;
    while a < units.len() {
        let mut b = a + 1;
        while b < units.len() && units[b].segment == units[a].segment {
            b += 1;
        }
        let own = match p.strategy {
            ChunkStrategy::Fixed => pack(units, a..b, p),
            ChunkStrategy::Seos => seos(units, shifts, a..b, p),
        };
        for r in own {
            let overlap = p.overlap.min(r.start - a);
            out.push(Planned { units: r.start - overlap..r.end, overlap });
        }
        a = b;
    }
    out
}

fn tokens(units: &[Unit], r: Range<usize>) -> usize {
    units[r].iter().map(|u| u.tokens).sum()
}

/// Tokens of a chunk whose own units are `own`, with its overlap (inside `segment`).
fn with_overlap(units: &[Unit], segment: &Range<usize>, own: &Range<usize>, overlap: usize) -> usize {
    let from = own.start.saturating_sub(overlap).max(segment.start);
    tokens(units, from..own.end)
}

fn pack(units: &[Unit], segment: Range<usize>, p: &ChunkParams) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = segment.start;
    while start < segment.end {
        let mut end = start + 1;
        while end < segment.end && with_overlap(units, &segment, &(start..end + 1), p.overlap) <= p.budget {
            end += 1;
        }
        out.push(start..end);
        start = end;
    }
    out
}

fn seos(units: &[Unit], shifts: &[f32], segment: Range<usize>, p: &ChunkParams) -> Vec<Range<usize>> {
    let total = tokens(units, segment.clone());
    let wanted = total.div_ceil(p.budget.max(1)).max(1);
    // Boundary `i` cuts between unit i-1 and unit i; its shift is shifts[i-1].
    let shift = |i: usize| shifts.get(i - 1).copied().unwrap_or(0.0);
    let mut boundaries: Vec<usize> = (segment.start + 1..segment.end).collect();
    boundaries.sort_by(|x, y| shift(*y).total_cmp(&shift(*x)).then(x.cmp(y)));
    let mut cuts: Vec<usize> = boundaries.into_iter().take(wanted - 1).collect();
    cuts.sort_unstable();
    let mut pieces = Vec::new();
    let mut start = segment.start;
    for c in cuts.into_iter().chain(std::iter::once(segment.end)) {
        pieces.push(start..c);
        start = c;
    }
    // Cut any piece still over the budget at its own largest shift, until all fit.
    let mut out = Vec::new();
    while let Some(piece) = pieces.pop() {
        if piece.len() < 2 || with_overlap(units, &segment, &piece, p.overlap) <= p.budget {
            out.push(piece);
            continue;
        }
        let cut = (piece.start + 1..piece.end)
            .max_by(|x, y| shift(*x).total_cmp(&shift(*y)).then(y.cmp(x)))
            .expect("a piece of two or more units has a boundary");
        pieces.push(piece.start..cut);
        pieces.push(cut..piece.end);
    }
    out.sort_by_key(|r| r.start);
    out
}

/// Cosine distance between two unit vectors (1 − dot).
pub fn shift(a: &[f32], b: &[f32]) -> f32 {
    1.0 - a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()
}

/// SEOS sentence groups as unit ranges: each unit with up to `neighbours` units on each side in its segment. Empty
/// when there are fewer than two units (nothing to cut between).
pub fn groups(units: &[Unit], neighbours: usize) -> Vec<Range<usize>> {
    if units.len() < 2 {
        return Vec::new();
    }
    (0..units.len())
        .map(|i| {
            let seg = units[i].segment;
            let mut a = i;
            while a > 0 && i - a < neighbours && units[a - 1].segment == seg {
                a -= 1;
            }
            let mut b = i;
            while b + 1 < units.len() && b - i < neighbours && units[b + 1].segment == seg {
                b += 1;
            }
            a..b + 1
        })
        .collect()
}

/// A text vector composed from its units' vectors: their sum weighted by each unit's tokens, scaled to unit
/// length. The model pools by the mean over tokens, so this is the pooled vector of the concatenation without
/// the attention across unit boundaries (the approximation that the `sentences` and `composed` SEOS modes make).
pub fn compose(vectors: &[Vec<f32>], units: &[Unit], range: Range<usize>) -> Vec<f32> {
    let dim = vectors.first().map_or(0, Vec::len);
    let mut sum = vec![0f32; dim];
    for i in range {
        let w = units[i].tokens as f32;
        for (s, x) in sum.iter_mut().zip(&vectors[i]) {
            *s += w * x;
        }
    }
    let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        sum.iter_mut().for_each(|x| *x /= norm);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn unit(tokens: usize, segment: usize) -> Unit {
        Unit { start: 0, end: 1, tokens, segment }
    }

    #[test]
    fn groups_stay_inside_their_segment() {
        let units = [unit(3, 0), unit(3, 0), unit(3, 0), unit(3, 1), unit(3, 1)];
        assert_eq!(groups(&units, 1), vec![0..2, 0..3, 1..3, 3..5, 3..5]);
        assert_eq!(groups(&units, 2), vec![0..3, 0..3, 0..3, 3..5, 3..5]);
        assert_eq!(groups(&units, 0), vec![0..1, 1..2, 2..3, 3..4, 4..5]);
        assert!(groups(&units[..1], 1).is_empty());
    }

    #[test]
    fn composed_vectors_weigh_units_by_tokens_and_have_unit_length() {
        let units = [unit(1, 0), unit(3, 0)];
        let vectors = vec![vec![1.0, 0.0], vec![0.0, 1.0]];
        assert_eq!(compose(&vectors, &units, 0..1), vec![1.0, 0.0]);
        let v = compose(&vectors, &units, 0..2);
        let want = [1.0 / 10f32.sqrt(), 3.0 / 10f32.sqrt()];
        assert!((v[0] - want[0]).abs() < 1e-6 && (v[1] - want[1]).abs() < 1e-6, "{v:?}");
        // Opposite vectors cancel: a zero vector stays zero rather than dividing by zero.
        let v = compose(&[vec![1.0, 0.0], vec![-1.0, 0.0]], &[unit(2, 0), unit(2, 0)], 0..2);
        assert_eq!(v, vec![0.0, 0.0]);
    }

    fn units_strategy() -> impl Strategy<Value = (Vec<Unit>, Vec<f32>, ChunkParams)> {
        (16usize..300, 0usize..3, prop::bool::ANY, 1usize..60).prop_flat_map(|(budget, overlap, fixed, n)| {
            let cap = (budget / (overlap + 1)).max(1);
            (
                prop::collection::vec((1usize..=cap, 0usize..3), n),
                prop::collection::vec(0f32..2.0, n.saturating_sub(1)),
                Just(ChunkParams {
                    strategy: if fixed { super::ChunkStrategy::Fixed } else { super::ChunkStrategy::Seos },
                    budget,
                    overlap,
                }),
            )
                .prop_map(|(raw, shifts, p)| {
                    let mut pos = 0;
                    let mut segment = 0;
                    let units = raw
                        .into_iter()
                        .map(|(tokens, seg_step)| {
                            if seg_step == 0 {
                                segment += 1;
                            }
                            let u = Unit { start: pos, end: pos + tokens * 4, tokens, segment };
                            pos += tokens * 4 + 1;
                            u
                        })
                        .collect::<Vec<_>>();
                    (units, shifts, p)
                })
        })
    }

    proptest! {
        #[test]
        fn chunks_cover_in_order_fit_the_budget_and_overlap_exactly((units, shifts, p) in units_strategy()) {
            let chunks = plan(&units, &shifts, &p);
            // Own units cover every unit once, in order.
            let mut next = 0;
            for c in &chunks {
                prop_assert_eq!(c.own().start, next);
                prop_assert!(!c.own().is_empty());
                next = c.own().end;
                // Never across a segment.
                let seg = units[c.units.start].segment;
                prop_assert!(units[c.units.clone()].iter().all(|u| u.segment == seg));
                // Never over the budget.
                prop_assert!(tokens(&units, c.units.clone()) <= p.budget, "{:?} over {}", c, p.budget);
                // Overlap exactly as configured (less only at the start of a segment).
                let before = units[..c.own().start].iter().rev().take_while(|u| u.segment == seg).count();
                prop_assert_eq!(c.overlap, p.overlap.min(before));
            }
            prop_assert_eq!(next, units.len());
        }
    }

    #[test]
    fn seos_cuts_at_the_largest_shift() {
        let units: Vec<Unit> =
            (0..6).map(|i| Unit { start: i * 10, end: i * 10 + 9, tokens: 10, segment: 0 }).collect();
        // Total 60 tokens, budget 40 → 2 chunks → one breakpoint, at the biggest shift (before unit 4).
        let shifts = [0.1, 0.2, 0.1, 0.9, 0.1];
        let p = ChunkParams { strategy: super::ChunkStrategy::Seos, budget: 40, overlap: 0 };
        let chunks = plan(&units, &shifts, &p);
        let owns: Vec<_> = chunks.iter().map(Planned::own).collect();
        assert_eq!(owns, vec![0..4, 4..6]);
        // With one sentence of overlap the first chunk still fits, the second starts with unit 3.
        let p = ChunkParams { overlap: 1, ..p };
        let chunks = plan(&units, &shifts, &p);
        assert_eq!(chunks[1].units, 3..6);
        assert_eq!(chunks[1].overlap, 1);
    }

    #[test]
    fn fixed_packs_sentences_up_to_the_budget() {
        let units: Vec<Unit> =
            (0..5).map(|i| Unit { start: i * 10, end: i * 10 + 9, tokens: 10, segment: 0 }).collect();
        let p = ChunkParams { strategy: super::ChunkStrategy::Fixed, budget: 25, overlap: 0 };
        let owns: Vec<_> = plan(&units, &[], &p).iter().map(Planned::own).collect();
        assert_eq!(owns, vec![0..2, 2..4, 4..5]);
    }
}
