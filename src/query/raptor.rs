//! RAPTOR's summary tree over one patient's chunks (pure). The leaves are the patient's stored chunks — their
//! dense vectors and their sentences; each level clusters the nodes of the level below and gives every cluster of
//! two or more members a summary node; the next level clusters those summaries, up to `TreeParams::max_levels`
//! or until one cluster is left. Retrieval ranks the leaves and the summary nodes together ("collapsed tree").
//!
//! Choices, each cheaper than the paper's and said so in docs/read-side.md:
//! * **Reduction**: PCA to `dims` components (subspace iteration on the centred vectors, a fixed start, so the
//!   same input gives the same tree) in place of UMAP — linear, deterministic, and a few milliseconds for a
//!   patient's few hundred chunks, where UMAP's neighbour graph and optimisation cost far more and vary by seed.
//! * **Clustering**: a Gaussian mixture with diagonal covariances on the reduced vectors, fitted by EM from a
//!   seeded k-means++ start, for every k from 1 to `max_clusters` (and at most a third of the nodes); the k with
//!   the lowest BIC wins. Each node goes to its most likely cluster (the paper also lets a node join every cluster
//!   above a probability threshold; hard assignment keeps a sentence from being repeated across summaries).
//! * **Summaries are extractive**: a cluster's members are ordered by the cosine of their vector to the cluster's
//!   centre, and sentences are taken round-robin — the first sentence of each member nearest the centre first,
//!   then each one's second, … — while they fit `summary_tokens` (each sentence's token count as the indexer
//!   counted it). So a summary holds something of every member, nearest first, across the patient's notes. Its
//!   text is those sentences in reading order (date, note, offset); each keeps its note and offsets, so a summary
//!   is cited like a chunk.
//!   Choosing instead the sentences nearest the cluster's TF-IDF centroid (MEAD-style) was measured and gained
//!   nothing on the multi-note questions (docs/read-side.md).
//! * **Vectors**: `build` clusters the upper levels on each summary's members' vectors averaged and normalised
//!   (`Node::vector` as built); the vector a summary is *stored and retrieved* by is its text embedded, as in
//!   the paper (the indexer's job) — retrieval by the members' mean was measured and ranks summaries above
//!   better chunks.
//!
//! Node ids are UUIDv5 of the patient, the level and the sorted child ids (`store::summary_id`). A node's text
//! depends only on its children (their sentences and vectors), so an unchanged cluster keeps its id *and* its text
//! when the tree is rebuilt, and the indexer re-embeds only the nodes whose id is new.

use ndarray::{Array1, Array2, Axis};
use serde::{Deserialize, Serialize};

/// One sentence of a leaf or a summary: where it is, its tokens, its text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sentence {
    pub doc_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub date: Option<String>,
    pub start: usize,
    pub end: usize,
    pub tokens: usize,
    pub text: String,
}

/// A node to cluster: a leaf (a chunk: its point id, vector and sentences in reading order) or a summary of the
/// level below (its sentences in the order they were picked, nearest the centre first).
#[derive(Debug, Clone, PartialEq)]
pub struct Member {
    pub id: String,
    pub vector: Vec<f32>,
    pub sentences: Vec<Sentence>,
}

/// A summary node of the tree.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub id: String,
    /// 1 = a summary of leaves; 2 = of level-1 summaries; ...
    pub level: usize,
    /// The ids of the members it summarises (leaves' point ids at level 1).
    pub children: Vec<String>,
    /// Unit length.
    pub vector: Vec<f32>,
    /// In the order picked (nearest the centre first); `text` gives them in reading order.
    pub sentences: Vec<Sentence>,
}

impl Node {
    /// The summary's tokens (its sentences').
    pub fn tokens(&self) -> usize {
        self.sentences.iter().map(|s| s.tokens).sum()
    }

    /// The sentences in reading order (note date, note, offset).
    pub fn in_reading_order(&self) -> Vec<&Sentence> {
        let mut s: Vec<&Sentence> = self.sentences.iter().collect();
        s.sort_by(|a, b| a.date.cmp(&b.date).then(a.doc_id.cmp(&b.doc_id)).then(a.start.cmp(&b.start)));
        s
    }

    /// The summary's text: its sentences in reading order, one per line.
    pub fn text(&self) -> String {
        self.in_reading_order().iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join("\n")
    }

    /// The notes it quotes, sorted, each once.
    pub fn doc_ids(&self) -> Vec<String> {
        let mut d: Vec<String> = self.sentences.iter().map(|s| s.doc_id.clone()).collect();
        d.sort();
        d.dedup();
        d
    }

    /// As a member of the level above.
    fn member(&self) -> Member {
        Member { id: self.id.clone(), vector: self.vector.clone(), sentences: self.sentences.clone() }
    }
}

/// How the tree is built (`raptor.*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TreeParams {
    /// Tokens of one summary.
    pub summary_tokens: usize,
    /// Summary levels above the leaves.
    pub max_levels: usize,
    /// The largest number of clusters tried at one level.
    pub max_clusters: usize,
    /// PCA components the vectors are reduced to before clustering.
    pub dims: usize,
    /// CPTF-compressed summaries (`raptor.compress`): sentences are picked against `summary_tokens / ratio` and each
    /// is then cut to about `ratio` of its tokens ([`compress`]), so a summary of the same size quotes more.
    pub compress: Option<f32>,
}

impl Default for TreeParams {
    fn default() -> Self {
        TreeParams { summary_tokens: 256, max_levels: 3, max_clusters: 8, dims: 10, compress: None }
    }
}

impl From<&crate::config::RaptorSettings> for TreeParams {
    fn from(r: &crate::config::RaptorSettings) -> Self {
        TreeParams {
            summary_tokens: r.summary_tokens,
            max_levels: r.max_levels,
            max_clusters: r.max_clusters,
            dims: r.dims,
            compress: (r.compress > 0.0).then_some(r.compress),
        }
    }
}

impl TreeParams {
    /// The tokens of original sentences one summary picks: `summary_tokens`, or `summary_tokens / ratio` when the
    /// sentences are then compressed to about `ratio` of their tokens.
    pub fn pick_tokens(&self) -> usize {
        match self.compress {
            Some(r) if r > 0.0 && r < 1.0 => (self.summary_tokens as f32 / r).floor() as usize,
            _ => self.summary_tokens,
        }
    }
}

/// CPTF-compresses the summaries' sentences (`TreeParams::compress`). Each node's sentences, in the order picked,
/// are scored as one passage by `score` (the token-importance model: one call per node, each sentence seen in the
/// company of the others, as a window is); then each sentence keeps its most important words within
/// `ceil(ratio × its tokens)` (`cptf::filter_window`: whole words in order, assertion cues always kept), and its
/// text and token count (`count`) become the kept words'. The offsets stay the original sentence's, so a
/// compressed summary is cited like any other. A node `score` cannot read stays whole. Call it on the built tree:
/// the levels above pick from the original sentences, so nothing is compressed twice.
pub fn compress(
    nodes: &mut [Node],
    ratio: f32,
    score: &mut dyn FnMut(&str) -> Option<Vec<super::cptf::Token>>,
    count: &dyn Fn(&str) -> usize,
) {
    for node in nodes {
        let passage = node.sentences.iter().map(|s| s.text.as_str()).collect::<Vec<_>>().join("\n");
        let Some(tokens) = score(&passage) else { continue };
        let mut at = 0;
        for s in &mut node.sentences {
            let (from, to) = (at, at + s.text.len());
            at = to + 1;
            // The sentence's tokens, their spans made relative to it.
            let own: Vec<super::cptf::Token> = tokens
                .iter()
                .filter(|t| t.start >= from && t.end <= to)
                .map(|t| super::cptf::Token { start: t.start - from, end: t.end - from, importance: t.importance })
                .collect();
            let allowance = ((s.tokens as f32 * ratio).ceil() as usize).max(1);
            let kept = super::cptf::filter_window(&s.text, &own, &[], allowance);
            s.tokens = count(&kept.text);
            s.text = kept.text;
        }
    }
}

/// The summary nodes of one patient's tree over `leaves`, lowest level first. `node_id(level, sorted child ids)`
/// names a node. The leaves are taken in id order, so the tree does not depend on the order the store returned
/// them in.
pub fn build(leaves: &[Member], p: &TreeParams, node_id: &dyn Fn(usize, &[String]) -> String) -> Vec<Node> {
    let mut current: Vec<Member> = leaves.iter().filter(|m| !m.vector.is_empty()).cloned().collect();
    current.sort_by(|a, b| a.id.cmp(&b.id));
    let mut nodes = Vec::new();
    for level in 1..=p.max_levels {
        if current.len() < 2 {
            break;
        }
        let labels = cluster(&current, p.max_clusters, p.dims);
        let k = labels.iter().max().map_or(0, |m| m + 1);
        let mut next = Vec::new();
        for c in 0..k {
            let members: Vec<&Member> = current.iter().zip(&labels).filter(|(_, l)| **l == c).map(|(m, _)| m).collect();
            if members.len() < 2 {
                // One member summarises itself: it stays where it is in the collapsed tree.
                continue;
            }
            next.push(summarise(&members, level, p.pick_tokens(), node_id));
        }
        let done = next.len() <= 1;
        current = next.iter().map(Node::member).collect();
        nodes.extend(next);
        if done {
            break;
        }
    }
    nodes
}

/// One cluster's summary node (module docs: round-robin over the members nearest the centre first).
fn summarise(members: &[&Member], level: usize, budget: usize, node_id: &dyn Fn(usize, &[String]) -> String) -> Node {
    let dim = members[0].vector.len();
    let mut centre = vec![0f32; dim];
    for m in members {
        for (c, x) in centre.iter_mut().zip(&m.vector) {
            *c += x;
        }
    }
    normalise(&mut centre);
    let mut order: Vec<(&Member, f32)> = members.iter().map(|m| (*m, dot(&m.vector, &centre))).collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.id.cmp(&b.0.id)));
    // Round-robin: every member's first sentence (nearest the centre first), then every second one, ...
    let rounds = members.iter().map(|m| m.sentences.len()).max().unwrap_or(0);
    let offered = (0..rounds).flat_map(|r| order.iter().filter_map(move |(m, _)| m.sentences.get(r)));
    let mut picked: Vec<Sentence> = Vec::new();
    let mut used = 0usize;
    for s in offered {
        let repeated =
            picked.iter().any(|x| (x.doc_id == s.doc_id && x.start < s.end && s.start < x.end) || x.text == s.text);
        if repeated || used + s.tokens > budget {
            continue;
        }
        used += s.tokens;
        picked.push(s.clone());
        if used >= budget {
            break;
        }
    }
    let mut children: Vec<String> = members.iter().map(|m| m.id.clone()).collect();
    children.sort();
    Node { id: node_id(level, &children), level, children, vector: centre, sentences: picked }
}

/// Cluster labels (0..k, numbered by first appearance) of the members' vectors: PCA to `dims`, then the diagonal
/// Gaussian mixture with the lowest BIC for k = 1..=min(max_k, n / 3).
pub fn cluster(members: &[Member], max_k: usize, dims: usize) -> Vec<usize> {
    let n = members.len();
    if n < 3 {
        return vec![0; n];
    }
    let d = members[0].vector.len();
    let x = Array2::from_shape_fn((n, d), |(i, j)| f64::from(members[i].vector.get(j).copied().unwrap_or(0.0)));
    let r = dims.min(n - 1).min(d).max(1);
    let y = pca(&x, r);
    let k_max = max_k.min(n / 3).max(1);
    let mut best: Option<(f64, Vec<usize>)> = None;
    for k in 1..=k_max {
        let (bic, labels) = gmm(&y, k);
        if best.as_ref().is_none_or(|(b, _)| bic < *b) {
            best = Some((bic, labels));
        }
    }
    renumber(best.map(|(_, l)| l).unwrap_or_else(|| vec![0; n]))
}

/// Labels renumbered by first appearance (empty clusters vanish).
fn renumber(labels: Vec<usize>) -> Vec<usize> {
    let mut map: Vec<(usize, usize)> = Vec::new();
    labels
        .into_iter()
        .map(|l| match map.iter().find(|(from, _)| *from == l) {
            Some(&(_, to)) => to,
            None => {
                map.push((l, map.len()));
                map.len() - 1
            }
        })
        .collect()
}

/// The rows of `x` projected on its top `r` principal components (subspace iteration from a fixed start).
fn pca(x: &Array2<f64>, r: usize) -> Array2<f64> {
    let d = x.ncols();
    let mean = x.mean_axis(Axis(0)).unwrap_or_else(|| Array1::zeros(d));
    let xc = x - &mean;
    // A fixed, well-spread start (no randomness: the same chunks give the same tree).
    let mut q = Array2::from_shape_fn((d, r), |(i, j)| {
        let h = splitmix((i as u64) << 32 | j as u64);
        (h >> 11) as f64 / (1u64 << 53) as f64 - 0.5
    });
    orthonormalise(&mut q);
    for _ in 0..PCA_ITERATIONS {
        let z = xc.t().dot(&xc.dot(&q));
        q = z;
        orthonormalise(&mut q);
    }
    xc.dot(&q)
}

const PCA_ITERATIONS: usize = 12;
const EM_ITERATIONS: usize = 60;

/// Modified Gram–Schmidt on the columns (a column that vanishes is left at zero).
fn orthonormalise(q: &mut Array2<f64>) {
    let cols = q.ncols();
    for j in 0..cols {
        for i in 0..j {
            let proj = q.column(i).dot(&q.column(j));
            let ci = q.column(i).to_owned();
            q.column_mut(j).scaled_add(-proj, &ci);
        }
        let norm = q.column(j).dot(&q.column(j)).sqrt();
        if norm > 1e-12 {
            q.column_mut(j).mapv_inplace(|v| v / norm);
        } else {
            q.column_mut(j).fill(0.0);
        }
    }
}

/// A diagonal Gaussian mixture of `k` components fitted to the rows of `y` by EM from a seeded k-means++ start:
/// its BIC and each row's most likely component.
fn gmm(y: &Array2<f64>, k: usize) -> (f64, Vec<usize>) {
    let (n, r) = y.dim();
    let global_var: Vec<f64> = (0..r)
        .map(|j| {
            let c = y.column(j);
            let m = c.mean().unwrap_or(0.0);
            c.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / n as f64
        })
        .collect();
    let floor: Vec<f64> = global_var.iter().map(|v| v * 1e-3 + 1e-9).collect();
    let mut means = kmeans_pp(y, k);
    let mut vars: Vec<Vec<f64>> = vec![global_var.iter().zip(&floor).map(|(v, f)| v.max(*f)).collect(); k];
    let mut weights = vec![1.0 / k as f64; k];
    let mut resp = Array2::<f64>::zeros((n, k));
    let mut ll = f64::NEG_INFINITY;
    let rows: Vec<Vec<f64>> = y.rows().into_iter().map(|row| row.to_vec()).collect();
    for _ in 0..EM_ITERATIONS {
        let (total, fitted) = e_step(&rows, &weights, &means, &vars);
        resp = fitted;
        // M step.
        for c in 0..k {
            let nk: f64 = resp.column(c).sum();
            if nk < 1e-9 {
                weights[c] = 0.0;
                continue;
            }
            weights[c] = nk / n as f64;
            for j in 0..r {
                let m = (0..n).map(|i| resp[[i, c]] * y[[i, j]]).sum::<f64>() / nk;
                let v = (0..n).map(|i| resp[[i, c]] * (y[[i, j]] - m).powi(2)).sum::<f64>() / nk;
                means[c][j] = m;
                vars[c][j] = v.max(floor[j]);
            }
        }
        let converged = (total - ll).abs() <= 1e-6 * total.abs().max(1.0);
        ll = total;
        if converged {
            break;
        }
    }
    let params = (k * 2 * r + k - 1) as f64;
    let bic = -2.0 * ll + params * (n as f64).ln();
    let labels =
        (0..n).map(|i| (0..k).fold(0, |best, c| if resp[[i, c]] > resp[[i, best]] { c } else { best })).collect();
    (bic, labels)
}

/// The E step: the mixture's log-likelihood of the rows and each row's responsibilities (`n × k`), in logs. Each
/// component's normalising term and inverse variances are computed once per step, not once per row and dimension
/// (those logarithms were most of a rebuild's time).
fn e_step(rows: &[Vec<f64>], weights: &[f64], means: &[Vec<f64>], vars: &[Vec<f64>]) -> (f64, Array2<f64>) {
    let k = weights.len();
    let norms: Vec<f64> = (0..k)
        .map(|c| {
            weights[c].max(1e-300).ln()
                - 0.5 * vars[c].iter().map(|v| (2.0 * std::f64::consts::PI * v).ln()).sum::<f64>()
        })
        .collect();
    let inverse: Vec<Vec<f64>> = vars.iter().map(|v| v.iter().map(|x| 1.0 / x).collect()).collect();
    let mut resp = Array2::<f64>::zeros((rows.len(), k));
    let mut logs = vec![0f64; k];
    let mut total = 0.0;
    for (i, row) in rows.iter().enumerate() {
        for c in 0..k {
            let distance: f64 = row
                .iter()
                .zip(&means[c])
                .zip(&inverse[c])
                .map(|((x, m), inv)| {
                    let diff = x - m;
                    diff * diff * inv
                })
                .sum();
            logs[c] = norms[c] - 0.5 * distance;
        }
        let m = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        logs.iter_mut().for_each(|l| *l = (*l - m).exp());
        let s: f64 = logs.iter().sum();
        total += m + s.ln();
        for c in 0..k {
            resp[[i, c]] = logs[c] / s;
        }
    }
    (total, resp)
}

/// k-means++ starting means (seeded by k, so a given input always starts alike), refined by a few Lloyd steps.
fn kmeans_pp(y: &Array2<f64>, k: usize) -> Vec<Vec<f64>> {
    let (n, _) = y.dim();
    let mut state = 0x9e37_79b9_7f4a_7c15u64 ^ k as u64;
    let mut next = || {
        state = splitmix(state);
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let dist = |a: ndarray::ArrayView1<f64>, b: &[f64]| a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>();
    let mut means: Vec<Vec<f64>> = vec![y.row(((next() * n as f64) as usize).min(n - 1)).to_vec()];
    while means.len() < k {
        let d2: Vec<f64> =
            (0..n).map(|i| means.iter().map(|m| dist(y.row(i), m)).fold(f64::INFINITY, f64::min)).collect();
        let total: f64 = d2.iter().sum();
        let pick = if total <= 0.0 {
            means.len() % n
        } else {
            let mut t = next() * total;
            d2.iter()
                .position(|&v| {
                    t -= v;
                    t <= 0.0
                })
                .unwrap_or(n - 1)
        };
        means.push(y.row(pick).to_vec());
    }
    for _ in 0..5 {
        let labels: Vec<usize> = (0..n)
            .map(|i| {
                (0..k)
                    .fold(0, |best, c| if dist(y.row(i), &means[c]) < dist(y.row(i), &means[best]) { c } else { best })
            })
            .collect();
        for (c, mean) in means.iter_mut().enumerate() {
            let rows: Vec<usize> = (0..n).filter(|&i| labels[i] == c).collect();
            if rows.is_empty() {
                continue;
            }
            for (j, m) in mean.iter_mut().enumerate() {
                *m = rows.iter().map(|&i| y[[i, j]]).sum::<f64>() / rows.len() as f64;
            }
        }
    }
    means
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn normalise(v: &mut [f32]) {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if n > 0.0 {
        v.iter_mut().for_each(|x| *x /= n);
    }
}

/// Where a candidate's text lies: (document, start, end) byte spans — a chunk's one span, an extractive
/// summary's sentences; none for text of its own (an abstract).
pub type Span<D> = (D, usize, usize);

/// Whether a candidate only repeats what was taken: every one of its spans inside one span already taken, in the
/// same document (an extractive summary whose sentences are all in chunks already chosen, or a chunk of one
/// sentence a chosen summary quotes). A candidate without spans (an abstract) is never a repeat.
pub fn repeats<D: PartialEq>(spans: &[Span<D>], taken: &[Span<D>]) -> bool {
    !spans.is_empty() && spans.iter().all(|(d, a, b)| taken.iter().any(|(e, x, y)| d == e && x <= a && b <= y))
}

/// The collapsed tree's retrieval: leaves and summaries in the order they rank (best first; by cosine to the
/// question, or fused with BM25), taken while their `tokens` fit `budget`, skipping a candidate that only repeats
/// what was taken (`repeats`: an extractive summary quotes its chunks, and a summary ranked below the chunks it
/// quotes would spend the budget on the same words twice). Returns the candidates' indices.
pub fn collapsed<D: PartialEq + Clone>(
    ranked: impl IntoIterator<Item = usize>,
    tokens: &[usize],
    spans: &[Vec<Span<D>>],
    budget: usize,
) -> Vec<usize> {
    let mut left = budget;
    let mut out = Vec::new();
    let mut taken: Vec<Span<D>> = Vec::new();
    for i in ranked {
        let t = tokens[i];
        if t <= left && !repeats(&spans[i], &taken) {
            left -= t;
            out.push(i);
            taken.extend(spans[i].iter().cloned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mixture's log-likelihood and responsibilities for given parameters, the textbook way (every term of the
    /// Gaussian density per row): what `gmm`'s E step must compute.
    fn textbook_e_step(y: &Array2<f64>, weights: &[f64], means: &[Vec<f64>], vars: &[Vec<f64>]) -> (f64, Array2<f64>) {
        let (n, r) = y.dim();
        let k = weights.len();
        let mut resp = Array2::<f64>::zeros((n, k));
        let mut total = 0.0;
        for i in 0..n {
            let logs: Vec<f64> = (0..k)
                .map(|c| {
                    let mut l = weights[c].max(1e-300).ln();
                    for j in 0..r {
                        let diff = y[[i, j]] - means[c][j];
                        l -= 0.5 * ((2.0 * std::f64::consts::PI * vars[c][j]).ln() + diff * diff / vars[c][j]);
                    }
                    l
                })
                .collect();
            let m = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + logs.iter().map(|l| (l - m).exp()).sum::<f64>().ln();
            total += lse;
            for c in 0..k {
                resp[[i, c]] = (logs[c] - lse).exp();
            }
        }
        (total, resp)
    }

    #[test]
    fn the_e_step_is_the_textbook_one() {
        let mut state = 7u64;
        let mut next = || {
            state = splitmix(state);
            (state >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let (n, r, k) = (90, 6, 3);
        let y = Array2::from_shape_fn((n, r), |(i, j)| next() + if j == i % 3 { 4.0 } else { 0.0 });
        let weights = vec![0.5, 0.3, 0.2];
        let means: Vec<Vec<f64>> = (0..k).map(|c| (0..r).map(|j| if j == c { 3.5 } else { 0.1 }).collect()).collect();
        let vars: Vec<Vec<f64>> = (0..k).map(|c| (0..r).map(|j| 0.05 + 0.1 * (c + j) as f64).collect()).collect();
        let (want_total, want) = textbook_e_step(&y, &weights, &means, &vars);
        let (total, got) =
            e_step(&y.rows().into_iter().map(|r| r.to_vec()).collect::<Vec<_>>(), &weights, &means, &vars);
        assert!((total - want_total).abs() <= 1e-9 * want_total.abs(), "{total} vs {want_total}");
        for (a, b) in got.iter().zip(want.iter()) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        // And every row's responsibilities sum to one.
        assert!(got.rows().into_iter().all(|row| (row.sum() - 1.0).abs() < 1e-12));
    }

    /// A unit vector near axis `axis` of `dim`, nudged by `jitter` on another axis.
    fn near(axis: usize, jitter: f32, other: usize, dim: usize) -> Vec<f32> {
        let mut v = vec![0f32; dim];
        v[axis] = 1.0;
        v[other] += jitter;
        normalise(&mut v);
        v
    }

    fn leaf(id: &str, vector: Vec<f32>, doc: &str, sentences: &[(&str, usize)]) -> Member {
        let mut at = 0;
        Member {
            id: id.into(),
            vector,
            sentences: sentences
                .iter()
                .map(|(t, tokens)| {
                    let s = Sentence {
                        doc_id: doc.into(),
                        date: Some(format!("2024-01-0{}", doc.len() % 9 + 1)),
                        start: at,
                        end: at + t.len(),
                        tokens: *tokens,
                        text: (*t).into(),
                    };
                    at += t.len() + 1;
                    s
                })
                .collect(),
        }
    }

    fn id(level: usize, children: &[String]) -> String {
        format!("L{level}:{}", children.join(","))
    }

    /// Three topics, four chunks each, from different notes: the first level finds the three clusters.
    fn three_topics() -> Vec<Member> {
        let dim = 16;
        let mut leaves = Vec::new();
        for (t, axis) in [(0, 0), (1, 5), (2, 10)] {
            for j in 0..4 {
                let v = near(axis, 0.05 * (j as f32 + 1.0), axis + 1 + j % 3, dim);
                let doc = format!("doc{t}{j}");
                let texts = [format!("first of c{t}{j}"), format!("second of c{t}{j}"), format!("third of c{t}{j}")];
                leaves.push(leaf(&format!("c{t}{j}"), v, &doc, &[(&texts[0], 5), (&texts[1], 7), (&texts[2], 9)]));
            }
        }
        leaves
    }

    #[test]
    fn clusters_follow_the_topics_whatever_the_order() {
        let leaves = three_topics();
        let labels = cluster(&leaves, 8, 10);
        for t in 0..3 {
            let l = &labels[t * 4..t * 4 + 4];
            assert!(l.iter().all(|x| *x == l[0]), "{labels:?}");
        }
        assert_eq!(labels.iter().max(), Some(&2), "{labels:?}");
        // The same leaves in another order give the same tree.
        let mut shuffled = leaves.clone();
        shuffled.reverse();
        shuffled.swap(1, 7);
        let p = TreeParams::default();
        assert_eq!(build(&leaves, &p, &id), build(&shuffled, &p, &id));
    }

    #[test]
    fn summaries_take_every_member_first_sentence_first_within_the_budget() {
        let leaves = three_topics();
        let p = TreeParams { summary_tokens: 30, ..TreeParams::default() };
        let nodes = build(&leaves, &p, &id);
        let level1: Vec<&Node> = nodes.iter().filter(|n| n.level == 1).collect();
        assert_eq!(level1.len(), 3);
        for n in &level1 {
            assert_eq!(n.children.len(), 4);
            assert!(n.tokens() <= 30, "{}", n.tokens());
            // Round-robin: the four first sentences (5 tokens each), then as many seconds (7) as fit: 20 + 7.
            assert_eq!(n.sentences.iter().filter(|s| s.text.starts_with("first")).count(), 4);
            assert_eq!(n.sentences.iter().filter(|s| s.text.starts_with("second")).count(), 1);
            assert_eq!(n.doc_ids().len(), 4);
            assert!((n.vector.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-4);
            // Reading order: by date, note, offset.
            let order = n.in_reading_order();
            assert!(
                order
                    .windows(2)
                    .all(|w| (&w[0].date, &w[0].doc_id, w[0].start) <= (&w[1].date, &w[1].doc_id, w[1].start))
            );
            assert_eq!(n.text().lines().count(), n.sentences.len());
        }
        // The three summaries are summarised once more, into one root.
        let roots: Vec<&Node> = nodes.iter().filter(|n| n.level == 2).collect();
        assert_eq!(roots.len(), 1, "{:?}", nodes.iter().map(|n| n.level).collect::<Vec<_>>());
        let mut kids = roots[0].children.clone();
        kids.sort();
        let mut ids: Vec<String> = level1.iter().map(|n| n.id.clone()).collect();
        ids.sort();
        assert_eq!(kids, ids);
        assert!(roots[0].tokens() <= 30);
    }

    #[test]
    fn compressed_summaries_quote_more_sentences_within_the_same_tokens() {
        let leaves = three_topics();
        let plain = TreeParams { summary_tokens: 30, ..TreeParams::default() };
        assert_eq!(TreeParams { compress: Some(0.5), ..plain }.pick_tokens(), 60);
        assert_eq!(TreeParams { compress: Some(1.0), ..plain }.pick_tokens(), 30);
        let cut = TreeParams { compress: Some(0.3), ..plain };
        let mut nodes = build(&leaves, &cut, &id);
        let before: Vec<Node> = nodes.clone();
        // A stand-in model: one token per word, the later words of a sentence more important ("first of c00":
        // "c00" ranks highest), one call per node over its sentences joined by newlines.
        let mut calls = 0;
        let mut score = |passage: &str| {
            calls += 1;
            let mut out = Vec::new();
            for line in passage.split('\n') {
                let base = line.as_ptr() as usize - passage.as_ptr() as usize;
                for (i, (s, e)) in crate::stages::clear::word_spans(line).into_iter().enumerate() {
                    out.push(super::super::cptf::Token { start: base + s, end: base + e, importance: i as f32 });
                }
            }
            Some(out)
        };
        let words = |t: &str| t.split_whitespace().count();
        compress(&mut nodes, 0.3, &mut score, &words);
        assert_eq!(calls, nodes.len(), "one model call per node");
        let plain_nodes = build(&leaves, &plain, &id);
        let mut shorter = 0;
        for (n, b) in nodes.iter().zip(&before).filter(|(n, _)| n.level == 1) {
            // Picked against 99 tokens, each sentence then cut to 0.3 of its tokens (rounded up): about the 30 of a
            // plain summary, and more sentences than it holds.
            assert!(n.tokens() <= 30 + n.sentences.len(), "{}", n.tokens());
            let plain_n = plain_nodes.iter().find(|p| p.children == n.children).expect("same clusters");
            assert!(
                n.sentences.len() > plain_n.sentences.len(),
                "{} vs {}",
                n.sentences.len(),
                plain_n.sentences.len()
            );
            for (s, o) in n.sentences.iter().zip(&b.sentences) {
                // Offsets stay the original sentence's; the text is its most important words, in order.
                assert_eq!((&s.doc_id, s.start, s.end), (&o.doc_id, o.start, o.end));
                let keep = ((o.tokens as f32 * 0.3).ceil() as usize).min(words(&o.text));
                let want: Vec<&str> = o.text.split_whitespace().skip(words(&o.text) - keep).collect();
                assert_eq!(s.text, want.join(" "));
                assert_eq!(s.tokens, keep);
                shorter += usize::from(s.text.len() < o.text.len());
            }
        }
        assert!(shorter > 0);
        // A node the model cannot read stays whole.
        let mut whole = before.clone();
        compress(&mut whole, 0.3, &mut |_| None, &words);
        assert_eq!(whole, before);
    }

    #[test]
    fn one_topic_is_one_root_and_one_leaf_is_no_tree() {
        let dim = 8;
        let leaves: Vec<Member> =
            (0..5).map(|j| leaf(&format!("c{j}"), near(2, 0.01 * j as f32, 3, dim), "d", &[("s", 1)])).collect();
        let nodes = build(&leaves, &TreeParams::default(), &id);
        assert_eq!(nodes.len(), 1);
        assert_eq!(nodes[0].level, 1);
        assert_eq!(nodes[0].children.len(), 5);
        assert!(build(&leaves[..1], &TreeParams::default(), &id).is_empty());
        // Two leaves: one summary of both.
        assert_eq!(build(&leaves[..2], &TreeParams::default(), &id).len(), 1);
        // A sentence never repeats inside one summary, even when two members share it (an overlap).
        let a = leaf("a", near(0, 0.0, 1, dim), "d", &[("same", 3)]);
        let b = leaf("b", near(0, 0.1, 1, dim), "d", &[("same", 3)]);
        let n = build(&[a, b], &TreeParams::default(), &id);
        assert_eq!(n[0].sentences.len(), 1);
    }

    #[test]
    fn the_collapsed_tree_takes_the_nearest_nodes_that_fit() {
        // Ranked a, c, b with 60, 50 and 10 tokens: a first, c does not fit the 40 left, b does.
        let (ranked, tokens) = ([0, 2, 1], [60, 10, 50]);
        let spans: [Vec<Span<u8>>; 3] = [vec![(0, 0, 60)], vec![(0, 60, 70)], vec![(1, 0, 50)]];
        assert_eq!(collapsed(ranked, &tokens, &spans, 100), vec![0, 1]);
        assert_eq!(collapsed(ranked, &tokens, &spans, 120), vec![0, 2, 1]);
        assert!(collapsed(ranked, &tokens, &spans, 5).is_empty());
    }

    #[test]
    fn the_collapsed_tree_skips_a_summary_of_what_it_already_holds() {
        // Chunks 0 (doc a, 0..100) and 1 (doc b, 0..80); summary 2 quotes a sentence of each, summary 3 quotes one
        // of chunk 0 and one of a chunk not taken, 4 is an abstract (no spans).
        let spans: [Vec<Span<&str>>; 5] = [
            vec![("a", 0, 100)],
            vec![("b", 0, 80)],
            vec![("a", 10, 40), ("b", 50, 80)],
            vec![("a", 10, 40), ("c", 0, 30)],
            vec![],
        ];
        let tokens = [25, 20, 15, 15, 15];
        // Ranked 0, 1, 2, 3, 4: 2 repeats 0 and 1, 3 adds doc c, 4 is text of its own.
        assert_eq!(collapsed([0, 1, 2, 3, 4], &tokens, &spans, 200), vec![0, 1, 3, 4]);
        assert_eq!(collapsed([0, 1, 2, 3, 4], &tokens, &spans, 70), vec![0, 1, 3]);
        // The budget 2 would have spent goes to the next candidate: without the skip, 4 would not fit.
        assert_eq!(collapsed([0, 1, 2, 4], &tokens, &spans, 60), vec![0, 1, 4]);
        // A summary ranked first is taken; the chunk below it adds what the summary does not quote.
        assert_eq!(collapsed([2, 0, 1], &tokens, &spans, 200), vec![2, 0, 1]);
        // A one-sentence chunk a summary taken before it quotes whole is a repeat too.
        let spans: [Vec<Span<&str>>; 2] = [vec![("a", 0, 30), ("a", 31, 60)], vec![("a", 31, 60)]];
        assert_eq!(collapsed([0, 1], &[10, 5], &spans, 100), vec![0]);
        assert!(!repeats::<&str>(&[], &[("a", 0, 10)]));
        assert!(!repeats(&[("a", 5, 12)], &[("a", 0, 10)]), "a span past what was taken is new text");
    }
}
