//! Clinical question answering over a patient's record (`clinstream-lab eval qa`; the set's README defines the
//! figures): for each question, the context each strategy returns for that patient at the same token budget, and
//! the answer decided from that context.
//!
//! Strategies:
//! * `clear` — question–entity alignment (`query::align`) and CLEAR windows (`query::context`), then the nearest
//!   chunks in what they leave; `clear-windows` the windows alone; `clear@S` with another related share;
//!   `clear+cptf[@R]` with each window filtered to R (0.5) of its tokens by CPTF (`query::cptf`), more windows
//!   fitting the budget — its evidence recall counts the evidence's words as kept, `evidence_covered` counts the
//!   evidence sentence inside what the windows were cut from;
//! * `dense`, `bm25`, `hybrid` — chunk retrieval over the patient's notes (sentence-packed chunks of about
//!   `CHUNK_WORDS` words, or with `--chunks index` the indexer's own chunks and vectors under `chunking.*`, so the
//!   SEOS modes can be compared; cosine of the question and chunk embeddings, BM25 over the whole corpus's
//!   statistics, and the two fused by their scaled scores as the store fuses them (`store::fuse_by_score`,
//!   `store.dense_weight`, `store.dense_weight_matched`, `store.bm25_full_share`, `store.bm25_partial_power`;
//!   `hybrid-rrf`: by reciprocal rank, k = 60; `hybrid+dense`: the fused ranking and the dense one taken in turn,
//!   fused first), chunks taken best first while they fit the budget. Ranked figures for these: Hit@1/5/10 and MRR
//!   of the first evidence-bearing chunk. Their answer comes from the same vote over the aligned entities' mentions
//!   inside the returned chunks, so the strategies differ only in the context they return;
//! * `tree` — RAPTOR's collapsed tree (`query::raptor`): each patient's tree built from the same chunks and
//!   vectors (`raptor.*`), its summaries ranked with the chunks by cosine to the question and taken while they fit
//!   the budget; the vote reads the mentions inside the chosen chunks and summary sentences. `tree+hybrid` ranks
//!   the same candidates by the fused score of `hybrid` (a summary's BM25 from its text); `tree:128` with
//!   summaries of 128 tokens; `tree@mean` retrieves summaries by their members' mean vector, not their text's;
//!   `tree+cptf[@R][:N]` with CPTF-compressed summaries (`raptor.compress` = R, 0.5): like `clear+cptf`, its
//!   `evidence_covered` and `evidence_notes` count the evidence inside what the context was cut from.
//!
//! Multi-note questions (`multi_note_questions`, `clinstream-lab eval qa-multi`) carry the note of each evidence
//! sentence; for them `evidence_notes` is the mean share of the evidence notes the context reaches.
//!
//! Figures per strategy: evidence recall (questions with evidence whose context contains an evidence sentence,
//! whitespace-insensitive), answer accuracy (present → yes; absent, uncertain, not mentioned → no), isolation
//! violations (returned text from another patient's notes), mean and max context tokens (the embedding model's
//! tokenizer) and how many contexts exceeded the budget. Question and note text are never printed.
//!
//! With an LLM (`--llm`, the `llm.*` endpoint): each strategy's context also goes to the model with the query
//! service's prompt and answer schema (`query::answer`), and the model's status is scored like the rule vote's
//! (`llm_accuracy`, beside `answer_accuracy`), with the tokens it used, its time, its failures and the citations it
//! made outside the context. `sample` takes every k-th question, so a small CPU model can run over a spread of the
//! set.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::EvalError;
use crate::embed::Embedder;
use crate::model::{Document, Label};
use crate::query::align::{self, AlignParams};
use crate::query::context::{self, ContextParams, PatientNote, Rules};
use crate::query::raptor;
use crate::stages::Pipeline;
use crate::stages::clear::word_spans;

/// Target chunk size for the chunk strategies (words).
const CHUNK_WORDS: usize = 100;
/// `clear+cptf`: the share of each window's tokens kept.
pub const CPTF_RATIO: f32 = 0.5;
const RRF_K: f32 = 60.0;

#[derive(Debug, Deserialize)]
struct Question {
    patient: String,
    question: String,
    variable: String,
    answer: String,
    evidence: Vec<String>,
    /// Multi-note questions (`multi_note_questions`): the note of each evidence sentence.
    #[serde(default)]
    evidence_doc_ids: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StrategyReport {
    pub strategy: String,
    pub questions: usize,
    pub with_evidence: usize,
    pub evidence_recall: f64,
    /// Of the questions with evidence, those whose evidence sentence lies in what the context was cut from (with
    /// CPTF: the windows before filtering, which keeps some of its words; otherwise `evidence_recall`).
    pub evidence_covered: f64,
    /// With CPTF: over the questions whose evidence is covered, the mean share of the evidence sentence's words
    /// that the filtered context still holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence_words_kept: Option<f64>,
    /// Questions whose evidence lies in several notes (`evidence_doc_ids`): the mean share of those notes with an
    /// evidence sentence in the context.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub evidence_notes: Option<f64>,
    pub answer_accuracy: f64,
    pub isolation_violations: usize,
    pub mean_tokens: f64,
    pub max_tokens: usize,
    pub over_budget: usize,
    /// With an LLM: the share of the questions it answered whose status is right (present → yes), over the
    /// questions asked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub llm: Option<LlmReport>,
    /// Accuracy per variable (the question's labelled finding).
    pub accuracy_by_variable: BTreeMap<String, f64>,
    /// CLEAR only: questions where nothing aligned.
    pub unaligned: usize,
    /// Chunk strategies: of the questions with evidence, the share whose first evidence-bearing chunk ranks within
    /// the top 1, 5 and 10 of the patient's chunks, and the mean reciprocal rank of that chunk (0 when none).
    pub hit_at_1: Option<f64>,
    pub hit_at_5: Option<f64>,
    pub hit_at_10: Option<f64>,
    pub mrr: Option<f64>,
}

/// What the LLM made of one strategy's contexts.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LlmReport {
    /// Questions sent.
    pub asked: usize,
    /// Right statuses over `asked` (a failed or unusable answer counts as wrong).
    pub accuracy: f64,
    /// The rule vote's accuracy over the same questions.
    pub rule_accuracy: f64,
    /// Calls that failed (timeout, endpoint error) or answered something unusable.
    pub failed: usize,
    /// Citations of passages outside the context (dropped by the parser).
    pub citations_refused: usize,
    pub prompt_tokens_mean: f64,
    pub completion_tokens_mean: f64,
    /// The endpoint's time per answer.
    pub ms_mean: f64,
    pub ms_max: u64,
}

/// The LLM of an evaluation: the endpoint and the prompts.
#[derive(Debug)]
pub struct EvalLlm<'a> {
    pub llm: &'a crate::llm::Llm,
    pub templates: &'a crate::query::answer::Templates,
}

#[derive(Debug, Clone, Serialize)]
pub struct QaReport {
    pub documents: usize,
    pub patients: usize,
    pub budget_tokens: usize,
    pub window_words: usize,
    pub strategies: Vec<StrategyReport>,
    /// `tree+llm`: summaries the LLM wrote, and nodes it wrote none for (failed or unusable; they stay extractive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub abstracts: Option<(usize, usize)>,
}

/// A chunk of one note: byte span and its text's embedding.
struct Chunk {
    doc: usize,
    start: usize,
    end: usize,
}

/// What to evaluate and how.
#[derive(Debug, Clone)]
pub struct QaRun<'a> {
    pub documents: &'a Path,
    pub questions: &'a Path,
    pub budget_tokens: usize,
    pub window_words: usize,
    /// Any of clear (windows, then the nearest chunks in what they leave of the budget), clear-windows, dense,
    /// bm25, hybrid.
    pub strategies: &'a [String],
    /// Where the label embeddings are cached.
    pub label_cache: &'a Path,
    pub show_errors: bool,
    /// The indexer's chunker for the chunk strategies (`--chunks index`); `None`: word-packed chunks.
    pub chunker: Option<&'a crate::index::Chunker>,
    /// `hybrid`: the dense share of the fused score (`store.dense_weight`, `store.dense_weight_matched`).
    pub fusion: crate::store::Fusion,
    /// `bm25`, `hybrid`: the BM25 encoder's average document length (`store.bm25_avg_len`).
    pub bm25_avg_len: f64,
    /// `hybrid`, `bm25`, `tree+hybrid`: a chunk that mentions an answer concept of the question's alignment counts
    /// as a full BM25 match (`serve.match_concepts`); a `+concepts` or `-concepts` suffix overrides it.
    pub match_concepts: bool,
    /// Ask this LLM too.
    pub llm: Option<&'a EvalLlm<'a>>,
    /// CPTF's token-importance model (`clear+cptf`).
    pub importance: Option<&'a crate::embed::importance::Importance>,
    /// Every `sample`-th question only (1: all).
    pub sample: usize,
    /// `tree`: how each patient's summary tree is built (`raptor.*`).
    pub tree: crate::query::raptor::TreeParams,
    /// `tree+llm`: the LLM and summary templates that write abstractive summaries, and the input tokens of one
    /// (`raptor.abstract_input_tokens`).
    pub summaries: Option<(&'a EvalLlm<'a>, usize)>,
}

/// Runs the evaluation.
pub async fn run(pipeline: &Pipeline, embedder: &Embedder, run: &QaRun<'_>) -> Result<QaReport, EvalError> {
    let QaRun {
        documents,
        questions,
        budget_tokens,
        window_words,
        strategies,
        label_cache,
        show_errors,
        chunker,
        fusion,
        bm25_avg_len,
        match_concepts,
        llm,
        sample,
        importance,
        tree,
        summaries,
    } = *run;

    let read =
        |p: &Path| std::fs::read_to_string(p).map_err(|source| EvalError::Io { path: p.display().to_string(), source });
    let fmt = |p: &Path, why: String| EvalError::Format { path: p.display().to_string(), why };
    if strategies.iter().any(|s| s.starts_with("clear+cptf") || s.starts_with("tree+cptf")) && importance.is_none() {
        return Err(fmt(documents, "clear+cptf and tree+cptf need the token-importance model".into()));
    }
    if strategies.iter().any(|s| s.starts_with("tree+llm")) && summaries.is_none() {
        return Err(fmt(documents, "tree+llm needs an LLM (llm.base_url)".into()));
    }
    let docs: Vec<Document> = read(documents)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            pipeline
                .process(l.as_bytes())
                .map_err(|e| fmt(documents, format!("line {}: {}", i + 1, e.error.code.as_str())))
        })
        .collect::<Result<_, _>>()?;
    let questions: Vec<Question> = read(questions)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| fmt(questions, format!("line {}: {e}", i + 1))))
        .collect::<Result<Vec<Question>, _>>()?
        .into_iter()
        .step_by(sample.max(1))
        .collect();
    // Patients as the notes carry them (`Patient/x`); questions may give the bare id.
    let mut by_patient: HashMap<String, Vec<usize>> = HashMap::new();
    for (i, d) in docs.iter().enumerate() {
        let p = d.note.patient.clone().unwrap_or_default();
        by_patient.entry(bare(&p).to_string()).or_default().push(i);
    }
    let embed_err = |e: crate::embed::EmbedError| fmt(documents, format!("embedding: {e}"));
    let lexicon = pipeline.lexicon();
    let variables = pipeline.variables();
    let index = crate::query::labels::label_index(pipeline, embedder, label_cache).await.map_err(embed_err)?;
    let count = |t: &str| embedder.count_tokens(t);
    let params = ContextParams::new(budget_tokens, window_words);

    let needs_chunks = strategies.iter().any(|s| s != "clear-windows");
    let (chunks, chunk_vectors, bm25) = if needs_chunks {
        let (chunks, vectors) = match chunker {
            Some(c) => index_chunks(c, &docs).await.map_err(|e| fmt(documents, format!("chunking: {e}")))?,
            None => {
                let chunks = chunk_all(&docs);
                let texts: Vec<&str> = chunks.iter().map(|c| &docs[c.doc].note.text[c.start..c.end]).collect();
                let mut vectors = Vec::with_capacity(texts.len());
                for batch in texts.chunks(256) {
                    vectors.extend(embedder.embed(batch).await.map_err(embed_err)?);
                }
                (chunks, vectors)
            }
        };
        let texts: Vec<&str> = chunks.iter().map(|c| &docs[c.doc].note.text[c.start..c.end]).collect();
        let bm25 = Bm25::new(&texts, bm25_avg_len).map_err(|e| fmt(documents, format!("BM25: {e}")))?;
        (chunks, vectors, Some(bm25))
    } else {
        (Vec::new(), Vec::new(), None)
    };
    let mut chunks_of: HashMap<usize, Vec<usize>> = HashMap::new();
    for (i, c) in chunks.iter().enumerate() {
        chunks_of.entry(c.doc).or_default().push(i);
    }

    let mut reports: Vec<StrategyReport> =
        strategies.iter().map(|s| StrategyReport { strategy: s.clone(), ..Default::default() }).collect();
    // Chunk strategies: per question with evidence, the rank (from 0) of the first evidence-bearing chunk.
    let mut ranks: Vec<Vec<Option<usize>>> = vec![Vec::new(); strategies.len()];
    let mut correct_by: Vec<BTreeMap<String, (usize, usize)>> = vec![BTreeMap::new(); reports.len()];
    let mut tokens_sum = vec![0usize; reports.len()];
    // Per strategy: LLM sums (prompt tokens, completion tokens, ms) and the rule vote's right answers.
    let mut llm_sums = vec![(0u64, 0u64, 0u64, 0usize); reports.len()];
    // Per strategy with CPTF: the sum of the evidence words kept and the questions counted.
    let mut words_kept = vec![(0f64, 0usize); reports.len()];
    // Per strategy: the sum of the evidence-note shares and the multi-note questions counted.
    let mut notes_reached = vec![(0f64, 0usize); reports.len()];
    // `tree`: each patient's summary nodes, built on first use.
    // Each tree's nodes, their tokens in the budget and (`tree+llm`) their abstracts.
    #[allow(clippy::type_complexity)]
    let mut trees: HashMap<String, (Vec<raptor::Node>, Vec<usize>, Vec<Option<String>>)> = HashMap::new();
    // `tree+llm`: abstracts written, and asked for without an answer.
    let mut llm_summaries = (0usize, 0usize);
    for q in &questions {
        let own = by_patient.get(bare(&q.patient)).cloned().unwrap_or_default();
        let phrases = align::phrases(&q.question);
        let refs: Vec<&str> = phrases.iter().map(String::as_str).collect();
        let phrase_vectors = embedder.embed(&refs).await.map_err(embed_err)?;
        let present: std::collections::HashSet<u32> =
            own.iter().flat_map(|&i| docs[i].mentions.iter().map(|m| m.concept)).collect();
        let alignment = align::align(
            &q.question,
            &phrase_vectors,
            lexicon,
            variables,
            &index,
            Some(&present),
            AlignParams::default(),
        );
        // The rule vote over the aligned answer concepts' mentions inside the returned spans (each item of the
        // context is one or more (doc, start, end) spans: a chunk, or a summary's sentences).
        let vote_over = |items: &[Vec<(usize, usize, usize)>]| {
            let variable = alignment.variable.and_then(|i| variables.get(i));
            let mut votes = Vec::new();
            for (wi, spans) in items.iter().enumerate() {
                for &(doc, start, end) in spans {
                    let d = &docs[doc];
                    for m in d.mentions.iter().filter(|m| m.start >= start && m.end <= end) {
                        let Some(score) = alignment.concepts.get(&m.concept) else { continue };
                        if !alignment.answer_concepts.contains(&m.concept) {
                            continue;
                        }
                        let section = &d.sections[m.section];
                        if variable.is_none_or(|v| v.admits_section(section.name)) {
                            votes.push((wi, m.assertion, score * section.weight));
                        }
                    }
                }
            }
            context::vote(votes.into_iter(), Rules::of(variable)).status
        };
        // Concept matches (`hybrid`, `bm25`, `tree+hybrid`): the chunks that mention an answer concept, unless the
        // alignment names a class too broad for that (`reader::MAX_MATCHED_CONCEPTS`), as `/v1/search` asks.
        let matchable = !alignment.answer_concepts.is_empty()
            && alignment.answer_concepts.len() <= crate::query::reader::MAX_MATCHED_CONCEPTS;
        let mentions_answer = |ch: &Chunk| {
            docs[ch.doc]
                .mentions
                .iter()
                .any(|m| m.start >= ch.start && m.end <= ch.end && alignment.answer_concepts.contains(&m.concept))
        };
        let notes: Vec<PatientNote<'_>> = own.iter().map(|&i| PatientNote::from(&docs[i])).collect();
        let question_vector =
            if needs_chunks { Some(embedder.embed(&[&q.question]).await.map_err(embed_err)?) } else { None };
        for (si, strategy) in strategies.iter().enumerate() {
            // (doc index, text) pieces of the returned context, and the answer; with CPTF, what the pieces were
            // cut from.
            let mut source: Option<Vec<String>> = None;
            let (pieces, status): (Vec<(usize, String)>, Label) = match strategy.as_str() {
                clear
                    if clear == "clear-windows"
                        || clear == "clear"
                        || clear.starts_with("clear@")
                        || clear.starts_with("clear+cptf") =>
                {
                    if alignment.is_empty() {
                        reports[si].unaligned += 1;
                    }
                    let ends = |t: &str| embedder.token_ends(t);
                    // `clear-windows` has no fill to leave room for; `clear@S` sets the related share;
                    // `clear+cptf[@R]` filters each window to R (0.5) of its tokens.
                    let mut params = match clear.strip_prefix("clear@").and_then(|s| s.parse::<f32>().ok()) {
                        Some(share) => ContextParams { related_share: share, ..params },
                        None if clear == "clear-windows" => ContextParams { related_share: 1.0, ..params },
                        None => params,
                    };
                    let filter = |text: &str, spans: &[(usize, usize)], allowance: usize| {
                        let Some(Ok(tokens)) = importance.map(|m| m.score(text)) else {
                            return (text.to_string(), count(text));
                        };
                        let kept = crate::query::cptf::filter_window(text, &tokens, spans, allowance);
                        let n = count(&kept.text);
                        (kept.text, n)
                    };
                    if let Some(cptf) = clear.strip_prefix("clear+cptf") {
                        let ratio = cptf.strip_prefix('@').and_then(|r| r.parse::<f32>().ok()).unwrap_or(CPTF_RATIO);
                        params.compress = Some(context::Compress { ratio, filter: &filter });
                    }
                    let c = context::assemble_with(&notes, &alignment, variables, lexicon, params, &count, Some(&ends));
                    let doc_of = |id: &str| docs.iter().position(|d| d.note.doc_id == id).unwrap_or(usize::MAX);
                    let mut pieces: Vec<(usize, String)> =
                        c.windows.iter().map(|w| (doc_of(&w.doc_id), w.text.clone())).collect();
                    // With CPTF: what the windows were cut from (their text before filtering).
                    source = params.compress.and_then(|_| {
                        c.windows
                            .iter()
                            .map(|w| docs.get(doc_of(&w.doc_id)).map(|d| d.note.text[w.start..w.end].to_string()))
                            .collect::<Option<Vec<String>>>()
                    });
                    // `clear` fills what the windows left with the nearest chunks, as `serve` does (`serve.fill`).
                    if clear != "clear-windows" {
                        let qv = question_vector.as_ref().and_then(|v| v.first()).cloned().unwrap_or_default();
                        let candidates: Vec<usize> =
                            own.iter().flat_map(|d| chunks_of.get(d).into_iter().flatten().copied()).collect();
                        let mut r: Vec<(usize, f32)> =
                            candidates.iter().map(|&c| (c, cosine(&qv, &chunk_vectors[c]))).collect();
                        r.sort_by(|a, b| b.1.total_cmp(&a.1));
                        // As many candidates as the service asks its store for.
                        let passages: Vec<context::Passage<'_>> = r
                            .iter()
                            .take(context::fill_candidates(budget_tokens))
                            .map(|&(c, _)| {
                                let ch = &chunks[c];
                                let d = &docs[ch.doc];
                                context::Passage {
                                    doc_id: &d.note.doc_id,
                                    start: ch.start,
                                    end: ch.end,
                                    text: &d.note.text[ch.start..ch.end],
                                    tokens: None,
                                }
                            })
                            .collect();
                        for f in context::fill(&c.windows, &passages, budget_tokens, &count) {
                            let d = chunks[r[f.index].0].doc;
                            pieces.push((d, docs[d].note.text[f.start..f.end].to_string()));
                            if let Some(src) = source.as_mut() {
                                src.push(docs[d].note.text[f.start..f.end].to_string());
                            }
                        }
                    }
                    (pieces, c.answer.status)
                }
                tree_strategy if tree_strategy.starts_with("tree") => {
                    let (tree_strategy, matching) = concept_matching(tree_strategy, match_concepts);
                    let tree_strategy = tree_strategy.as_str();
                    let params = tree_variant(tree_strategy, tree);
                    let key = format!("{tree_strategy}\u{1f}{}", bare(&q.patient));
                    if !trees.contains_key(&key) {
                        let leaves: Vec<raptor::Member> = own
                            .iter()
                            .flat_map(|d| chunks_of.get(d).into_iter().flatten().copied())
                            .map(|c| tree_leaf(&docs, &chunks[c], c, &chunk_vectors[c], &count))
                            .collect();
                        let mut built = raptor::build(&leaves, &params, &|level, children| {
                            format!("{level}:{}", children.join(","))
                        });
                        if let Some(ratio) = params.compress {
                            // CPTF-compressed summaries, as the indexer writes them with `raptor.compress`.
                            raptor::compress(&mut built, ratio, &mut |p| importance?.score(p).ok(), &count);
                        }
                        let mut tokens: Vec<usize> = built.iter().map(raptor::Node::tokens).collect();
                        let mut written_abstracts: Vec<Option<String>> = vec![None; built.len()];
                        if tree_strategy.starts_with("tree+llm") {
                            // Abstractive summaries as the worker writes them: each node's members' texts (chunks,
                            // or the abstracts below) to the LLM, the abstract embedded and counted in the budget;
                            // the node's cited sentences stay what the evidence is read from.
                            let (l, input) = summaries.expect("checked above");
                            let chunk_text: HashMap<String, String> = own
                                .iter()
                                .flat_map(|d| chunks_of.get(d).into_iter().flatten().copied())
                                .map(|c| {
                                    (
                                        format!("{c:08}"),
                                        docs[chunks[c].doc].note.text[chunks[c].start..chunks[c].end].to_string(),
                                    )
                                })
                                .collect();
                            let texts = abstracts(l, input, &built, &chunk_text, &count, &mut llm_summaries).await;
                            let written: Vec<(usize, &String)> =
                                texts.iter().enumerate().filter_map(|(i, t)| t.as_ref().map(|t| (i, t))).collect();
                            let refs: Vec<&str> = written.iter().map(|(_, t)| t.as_str()).collect();
                            let vectors = embedder.embed(&refs).await.map_err(embed_err)?;
                            for ((i, t), v) in written.iter().zip(vectors) {
                                built[*i].vector = v;
                                tokens[*i] = count(t);
                            }
                            written_abstracts = texts;
                        } else if !tree_strategy.starts_with("tree@mean") {
                            // The summaries' own text embedded, as the indexer stores them (`tree@mean`: kept as
                            // their members' mean vector).
                            let texts: Vec<String> = built.iter().map(raptor::Node::text).collect();
                            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                            for (n, v) in built.iter_mut().zip(embedder.embed(&refs).await.map_err(embed_err)?) {
                                n.vector = v;
                            }
                        }
                        trees.insert(key.clone(), (built, tokens, written_abstracts));
                    }
                    let (nodes, node_tokens, node_abstracts) = &trees[&key];
                    let own_chunks: Vec<usize> =
                        own.iter().flat_map(|d| chunks_of.get(d).into_iter().flatten().copied()).collect();
                    let texts: Vec<String> = own_chunks
                        .iter()
                        .map(|&c| docs[chunks[c].doc].note.text[chunks[c].start..chunks[c].end].to_string())
                        .collect();
                    let mut candidates: Vec<(&[f32], usize)> =
                        own_chunks.iter().zip(&texts).map(|(&c, t)| (chunk_vectors[c].as_slice(), count(t))).collect();
                    candidates.extend(nodes.iter().zip(node_tokens).map(|(n, &t)| (n.vector.as_slice(), t)));
                    let qv = question_vector.as_ref().and_then(|v| v.first()).cloned().unwrap_or_default();
                    // Every candidate ranked, for the ranked figures; then those that fit, best first.
                    let mut ranked: Vec<(usize, f32)> =
                        candidates.iter().enumerate().map(|(i, (v, _))| (i, cosine(&qv, v))).collect();
                    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    if tree_strategy.starts_with("tree+hybrid") {
                        // The same candidates fused with their BM25 scores as the stores fuse them: a chunk by its
                        // own terms, a summary by its text's (an abstract's, once written).
                        let b = bm25.as_ref().expect("bm25 built");
                        let query = b.query(&q.question);
                        let mut sparse: Vec<(usize, f32)> = (0..candidates.len())
                            .map(|i| match i.checked_sub(own_chunks.len()) {
                                None => (i, b.score(own_chunks[i], &query)),
                                Some(n) => {
                                    let text = node_abstracts[n].clone().unwrap_or_else(|| nodes[n].text());
                                    (i, b.score_text(&text, &query))
                                }
                            })
                            .filter(|&(_, s)| s > 0.0)
                            .collect();
                        sparse.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                        // The chunks that mention an answer concept, in the dense order (a summary has no concepts).
                        let matched: Vec<(usize, f32)> = if matching && matchable {
                            ranked
                                .iter()
                                .copied()
                                .filter(|&(i, _)| i < own_chunks.len() && mentions_answer(&chunks[own_chunks[i]]))
                                .collect()
                        } else {
                            Vec::new()
                        };
                        let (sparse, mass) =
                            crate::store::with_matches(as_hits(&sparse), as_hits(&matched), b.idf_mass(&query));
                        ranked = crate::store::fuse_by_score(as_hits(&ranked), sparse, fusion, mass, usize::MAX)
                            .into_iter()
                            .filter_map(|h| Some((h.id.parse().ok()?, h.score)))
                            .collect();
                    }
                    let doc_index = |id: &str| docs.iter().position(|d| d.note.doc_id == id).unwrap_or(usize::MAX);
                    let spans_of = |i: usize| -> Vec<(usize, usize, usize)> {
                        match i.checked_sub(own_chunks.len()) {
                            None => {
                                let ch = &chunks[own_chunks[i]];
                                vec![(ch.doc, ch.start, ch.end)]
                            }
                            Some(n) => {
                                nodes[n].sentences.iter().map(|s| (doc_index(&s.doc_id), s.start, s.end)).collect()
                            }
                        }
                    };
                    if !q.evidence.is_empty() {
                        let evidence: Vec<String> = q.evidence.iter().map(|e| squeeze(e)).collect();
                        let first = ranked.iter().position(|&(i, _)| {
                            spans_of(i).iter().any(|&(d, a, b)| {
                                let text = squeeze(&docs[d].note.text[a..b]);
                                evidence.iter().any(|e| text.contains(e.as_str()))
                            })
                        });
                        ranks[si].push(first);
                    }
                    let tokens: Vec<usize> = candidates.iter().map(|c| c.1).collect();
                    // What each candidate's context text quotes: a written abstract quotes nothing (its own text).
                    let quoted: Vec<Vec<(usize, usize, usize)>> = (0..candidates.len())
                        .map(|i| match i.checked_sub(own_chunks.len()) {
                            Some(n) if node_abstracts[n].is_some() => Vec::new(),
                            _ => spans_of(i),
                        })
                        .collect();
                    let chosen = raptor::collapsed(ranked.iter().map(|r| r.0), &tokens, &quoted, budget_tokens);
                    let items: Vec<Vec<(usize, usize, usize)>> = chosen.iter().map(|&i| spans_of(i)).collect();
                    if params.compress.is_some() {
                        // `tree+cptf`: what the compressed summaries were cut from (and the chunks as they are).
                        source = Some(
                            items.iter().flatten().map(|&(d, a, b)| docs[d].note.text[a..b].to_string()).collect(),
                        );
                    }
                    let status = vote_over(&items);
                    // What the context holds: a chunk's text, a summary's sentences — or its abstract, once written
                    // (then the evidence is in the context only where the abstract quotes it).
                    let pieces = chosen
                        .iter()
                        .zip(&items)
                        .flat_map(|(&i, spans)| {
                            let node = i.checked_sub(own_chunks.len());
                            let written = node.and_then(|n| node_abstracts[n].as_ref());
                            match (written, node) {
                                (Some(a), _) => vec![(spans.first().map_or(usize::MAX, |s| s.0), a.clone())],
                                // A summary's sentences as it holds them (CPTF-compressed with `tree+cptf`).
                                (None, Some(n)) => spans
                                    .iter()
                                    .zip(&nodes[n].sentences)
                                    .map(|(&(d, _, _), s)| (d, s.text.clone()))
                                    .collect(),
                                (None, None) => spans
                                    .iter()
                                    .map(|&(d, a, b)| {
                                        (d, docs.get(d).map_or(String::new(), |d| d.note.text[a..b].to_string()))
                                    })
                                    .collect(),
                            }
                        })
                        .collect();
                    (pieces, status)
                }
                other => {
                    let candidates: Vec<usize> =
                        own.iter().flat_map(|d| chunks_of.get(d).into_iter().flatten().copied()).collect();
                    let qv = question_vector.as_ref().and_then(|v| v.first()).cloned().unwrap_or_default();
                    let dense_scored = || {
                        let mut r: Vec<(usize, f32)> =
                            candidates.iter().map(|&c| (c, cosine(&qv, &chunk_vectors[c]))).collect();
                        r.sort_by(|a, b| b.1.total_cmp(&a.1));
                        r
                    };
                    let bm25_scored = || {
                        let b = bm25.as_ref().expect("bm25 built");
                        let query = b.query(&q.question);
                        // Chunks sharing no term with the question are not BM25 candidates (as in the store).
                        let mut r: Vec<(usize, f32)> =
                            candidates.iter().map(|&c| (c, b.score(c, &query))).filter(|&(_, s)| s > 0.0).collect();
                        r.sort_by(|a, b| b.1.total_cmp(&a.1));
                        r
                    };
                    let ids = |r: Vec<(usize, f32)>| r.into_iter().map(|x| x.0).collect::<Vec<_>>();
                    // Dense and BM25 fused by score as the stores fuse them (`store::fuse_by_score`).
                    // With concept matches, the BM25 candidates and the chunks that mention an answer concept (in
                    // the dense order), as the stores combine them (`store::with_matches`).
                    let (other, matching) = concept_matching(other, match_concepts);
                    let other = other.as_str();
                    let sparse_hits = || {
                        let mass = bm25.as_ref().map_or(0.0, |b| b.idf_mass(&b.query(&q.question)));
                        let matched: Vec<(usize, f32)> = if matching && matchable {
                            dense_scored().into_iter().filter(|&(c, _)| mentions_answer(&chunks[c])).collect()
                        } else {
                            Vec::new()
                        };
                        crate::store::with_matches(as_hits(&bm25_scored()), as_hits(&matched), mass)
                    };
                    let fused = |f: crate::store::Fusion| -> Vec<usize> {
                        let (sparse, mass) = sparse_hits();
                        crate::store::fuse_by_score(as_hits(&dense_scored()), sparse, f, mass, usize::MAX)
                            .into_iter()
                            .filter_map(|h| h.id.parse().ok())
                            .collect()
                    };
                    let ranked = match other {
                        "dense" => ids(dense_scored()),
                        "bm25" => sparse_hits().0.into_iter().filter_map(|h| h.id.parse().ok()).collect(),
                        "hybrid-rrf" => rrf(&[ids(dense_scored()), ids(bm25_scored())]),
                        // The fused ranking and the dense one taken in turn, fused first (`hybrid+dense[@W[:M]]`).
                        s if s.starts_with("hybrid+dense") => interleave(&[
                            fused(s.strip_prefix("hybrid+dense@").and_then(parse_fusion).unwrap_or(fusion)),
                            ids(dense_scored()),
                        ]),
                        // `hybrid`, or `hybrid@W` with a fixed dense weight, `hybrid@W:M` with `W` and `M` as
                        // `store.dense_weight` and `store.dense_weight_matched` (to compare weights in one run).
                        _ => fused(other.strip_prefix("hybrid@").and_then(parse_fusion).unwrap_or(fusion)),
                    };
                    if !q.evidence.is_empty() {
                        let evidence: Vec<String> = q.evidence.iter().map(|e| squeeze(e)).collect();
                        let first = ranked.iter().position(|&c| {
                            let ch = &chunks[c];
                            let text = squeeze(&docs[ch.doc].note.text[ch.start..ch.end]);
                            evidence.iter().any(|e| text.contains(e.as_str()))
                        });
                        ranks[si].push(first);
                    }
                    let mut remaining = budget_tokens;
                    let mut chosen = Vec::new();
                    for c in ranked {
                        let ch = &chunks[c];
                        let t = count(&docs[ch.doc].note.text[ch.start..ch.end]);
                        if t <= remaining {
                            remaining -= t;
                            chosen.push(c);
                        }
                    }
                    let spans: Vec<Vec<(usize, usize, usize)>> =
                        chosen.iter().map(|&c| vec![(chunks[c].doc, chunks[c].start, chunks[c].end)]).collect();
                    let status = vote_over(&spans);
                    let pieces = chosen
                        .iter()
                        .map(|&c| {
                            (chunks[c].doc, docs[chunks[c].doc].note.text[chunks[c].start..chunks[c].end].to_string())
                        })
                        .collect();
                    (pieces, status)
                }
            };
            let r = &mut reports[si];
            r.questions += 1;
            let tokens: usize = pieces.iter().map(|(_, t)| count(t)).sum();
            tokens_sum[si] += tokens;
            r.max_tokens = r.max_tokens.max(tokens);
            r.over_budget += usize::from(tokens > budget_tokens);
            r.isolation_violations += pieces.iter().filter(|(d, _)| !own.contains(d)).count();
            let mut found_evidence = None;
            if !q.evidence.is_empty() {
                r.with_evidence += 1;
                let context: String = pieces.iter().map(|(_, t)| squeeze(t)).collect::<Vec<_>>().join("\u{1f}");
                let found = q.evidence.iter().any(|e| context.contains(&squeeze(e)));
                found_evidence = Some(found);
                r.evidence_recall += f64::from(u8::from(found));
                if q.evidence_doc_ids.len() == q.evidence.len() {
                    // A compressed context reaches a note when the evidence is in what it was cut from.
                    let cut_from =
                        source.as_ref().map(|src| src.iter().map(|t| squeeze(t)).collect::<Vec<_>>().join("\u{1f}"));
                    let context = cut_from.as_ref().unwrap_or(&context);
                    let mut notes: Vec<&str> = q.evidence_doc_ids.iter().map(String::as_str).collect();
                    notes.sort_unstable();
                    notes.dedup();
                    if notes.len() >= 2 {
                        let reached = notes
                            .iter()
                            .filter(|n| {
                                q.evidence
                                    .iter()
                                    .zip(&q.evidence_doc_ids)
                                    .any(|(e, d)| d == *n && context.contains(&squeeze(e)))
                            })
                            .count();
                        let (sum, k) = notes_reached[si];
                        notes_reached[si] = (sum + reached as f64 / notes.len() as f64, k + 1);
                    }
                }
                let covered = match &source {
                    Some(src) => {
                        let from: String = src.iter().map(|t| squeeze(t)).collect::<Vec<_>>().join("\u{1f}");
                        let covered = q.evidence.iter().any(|e| from.contains(&squeeze(e)));
                        if covered {
                            // The share of the evidence's words the filtered context holds (best sentence).
                            let words = |t: &str| {
                                t.split_whitespace()
                                    .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()).to_lowercase())
                                    .filter(|w| !w.is_empty())
                                    .collect::<Vec<_>>()
                            };
                            let held: std::collections::HashSet<String> =
                                pieces.iter().flat_map(|(_, t)| words(t)).collect();
                            let kept = q
                                .evidence
                                .iter()
                                .map(|e| {
                                    let w = words(e);
                                    w.iter().filter(|x| held.contains(*x)).count() as f64 / w.len().max(1) as f64
                                })
                                .fold(0.0, f64::max);
                            let (sum, n) = words_kept[si];
                            words_kept[si] = (sum + kept, n + 1);
                        }
                        covered
                    }
                    None => found,
                };
                r.evidence_covered += f64::from(u8::from(covered));
            }
            let said_yes = status == Label::Present;
            let right = said_yes == (q.answer == "yes");
            if show_errors && (!right || (!q.evidence.is_empty() && found_evidence.is_some_and(|f| !f))) {
                // Development aid on the public development set (not patient data): what went wrong.
                let aligned: Vec<String> = alignment
                    .aligned
                    .iter()
                    .map(|a| format!("{}={:.2}{:?}{}", a.id, a.score, a.found, if a.answer { "*" } else { "" }))
                    .collect();
                eprintln!(
                    "{strategy} {} [{}] expected {} got {} evidence_found {:?} aligned {aligned:?}",
                    q.variable,
                    q.question,
                    q.answer,
                    status.as_str(),
                    found_evidence
                );
            }
            r.answer_accuracy += f64::from(u8::from(right));
            if let Some(l) = llm {
                let passages: Vec<crate::query::answer::Passage> = pieces
                    .iter()
                    .map(|(d, text)| crate::query::answer::Passage {
                        doc_id: docs.get(*d).map(|d| d.note.doc_id.clone()).unwrap_or_default(),
                        date: docs.get(*d).and_then(|d| d.note.date.clone()),
                        section: String::new(),
                        start: 0,
                        end: text.len(),
                        text: text.clone(),
                    })
                    .collect();
                let messages = crate::query::answer::messages(l.templates, &q.question, &passages);
                let schema = crate::query::answer::schema(passages.len());
                let clock = std::time::Instant::now();
                let completion = l.llm.chat(&messages, Some(&schema)).await;
                let ms = clock.elapsed().as_millis() as u64;
                let rep = r.llm.get_or_insert_with(LlmReport::default);
                rep.asked += 1;
                rep.ms_max = rep.ms_max.max(ms);
                llm_sums[si].2 += ms;
                llm_sums[si].3 += usize::from(right);
                match completion {
                    Ok(c) => {
                        llm_sums[si].0 += c.prompt_tokens;
                        llm_sums[si].1 += c.completion_tokens;
                        match crate::query::answer::parse(&c.content, passages.len()) {
                            Ok(g) => {
                                rep.citations_refused += g.refused;
                                rep.accuracy += f64::from(u8::from((g.status == "present") == (q.answer == "yes")));
                            }
                            Err(_) => rep.failed += 1,
                        }
                    }
                    Err(_) => rep.failed += 1,
                }
            }
            let e = correct_by[si].entry(q.variable.clone()).or_default();
            e.0 += usize::from(right);
            e.1 += 1;
        }
    }
    for (si, r) in reports.iter_mut().enumerate() {
        r.evidence_recall /= r.with_evidence.max(1) as f64;
        r.evidence_covered /= r.with_evidence.max(1) as f64;
        if notes_reached[si].1 > 0 {
            r.evidence_notes = Some(notes_reached[si].0 / notes_reached[si].1 as f64);
        }
        if words_kept[si].1 > 0 {
            r.evidence_words_kept = Some(words_kept[si].0 / words_kept[si].1 as f64);
        }
        r.answer_accuracy /= r.questions.max(1) as f64;
        r.mean_tokens = tokens_sum[si] as f64 / r.questions.max(1) as f64;
        if let Some(l) = r.llm.as_mut() {
            let n = l.asked.max(1) as f64;
            let (prompt, completion, ms, rule_right) = llm_sums[si];
            l.accuracy /= n;
            l.rule_accuracy = rule_right as f64 / n;
            l.prompt_tokens_mean = prompt as f64 / n;
            l.completion_tokens_mean = completion as f64 / n;
            l.ms_mean = ms as f64 / n;
        }
        r.accuracy_by_variable =
            correct_by[si].iter().map(|(k, (c, n))| (k.clone(), *c as f64 / (*n).max(1) as f64)).collect();
        if !ranks[si].is_empty() {
            let n = ranks[si].len() as f64;
            let within = |k: usize| ranks[si].iter().filter(|r| r.is_some_and(|r| r < k)).count() as f64 / n;
            r.hit_at_1 = Some(within(1));
            r.hit_at_5 = Some(within(5));
            r.hit_at_10 = Some(within(10));
            r.mrr = Some(ranks[si].iter().map(|r| r.map_or(0.0, |r| 1.0 / (r + 1) as f64)).sum::<f64>() / n);
        }
    }
    let abstracts = strategies.iter().any(|s| s.starts_with("tree+llm")).then_some(llm_summaries);
    Ok(QaReport {
        documents: docs.len(),
        patients: by_patient.len(),
        budget_tokens,
        window_words,
        strategies: reports,
        abstracts,
    })
}

fn bare(patient: &str) -> &str {
    patient.strip_prefix("Patient/").unwrap_or(patient)
}

/// Whitespace removed (the README's whitespace-insensitive match).
fn squeeze(text: &str) -> String {
    text.chars().filter(|c| !c.is_whitespace()).collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let (mut dot, mut na, mut nb) = (0.0, 0.0, 0.0);
    for (x, y) in a.iter().zip(b) {
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    dot / (na.sqrt() * nb.sqrt()).max(1e-12)
}

/// Rankings taken in turn — the first one's best, the second one's best not yet taken, … — each item once.
fn interleave(rankings: &[Vec<usize>]) -> Vec<usize> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut at = vec![0; rankings.len()];
    loop {
        let mut advanced = false;
        for (r, i) in rankings.iter().zip(at.iter_mut()) {
            while *i < r.len() {
                let id = r[*i];
                *i += 1;
                if seen.insert(id) {
                    out.push(id);
                    advanced = true;
                    break;
                }
            }
        }
        if !advanced {
            return out;
        }
    }
}

/// Reciprocal rank fusion of rankings (best first).
fn rrf(rankings: &[Vec<usize>]) -> Vec<usize> {
    let mut score: HashMap<usize, f32> = HashMap::new();
    for r in rankings {
        for (rank, id) in r.iter().enumerate() {
            *score.entry(*id).or_default() += 1.0 / (RRF_K + rank as f32 + 1.0);
        }
    }
    let mut out: Vec<(usize, f32)> = score.into_iter().collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    out.into_iter().map(|x| x.0).collect()
}

/// The indexer's chunks and vectors of every note (64 notes at once, so the model batches across notes as in
/// the worker).
async fn index_chunks(
    chunker: &crate::index::Chunker,
    docs: &[Document],
) -> Result<(Vec<Chunk>, Vec<Vec<f32>>), String> {
    let semaphore = std::sync::Arc::new(tokio::sync::Semaphore::new(64));
    let mut tasks = Vec::with_capacity(docs.len());
    for d in docs {
        let permit = semaphore.clone().acquire_owned().await.map_err(|e| e.to_string())?;
        let (c, d) = (chunker.clone(), std::sync::Arc::new(d.clone()));
        tasks.push(tokio::spawn(async move {
            let r = c.chunk(&d).await;
            drop(permit);
            r
        }));
    }
    let (mut chunks, mut vectors) = (Vec::new(), Vec::new());
    for (doc, t) in tasks.into_iter().enumerate() {
        let got = t.await.map_err(|e| e.to_string())?.map_err(|e| e.code.as_str().to_string())?;
        for (c, v) in got.chunks.iter().zip(got.vectors) {
            // The chunk's own text, its overlap included (what a search returns).
            chunks.push(Chunk { doc, start: c.start, end: c.end });
            vectors.push(v);
        }
    }
    Ok((chunks, vectors))
}

/// Abstractive summaries of a patient's tree (`tree+llm`), as `index::abstracts` writes them: lowest level first,
/// a level-1 node from its chunks' text, a higher one from its members' abstracts (or, where none was written,
/// their extractive text), cut to `input` tokens; one request per node. `None` where the LLM failed or answered
/// nothing; `tally` counts (written, not written).
async fn abstracts(
    l: &EvalLlm<'_>,
    input: usize,
    nodes: &[raptor::Node],
    chunk_text: &HashMap<String, String>,
    count: &dyn Fn(&str) -> usize,
    tally: &mut (usize, usize),
) -> Vec<Option<String>> {
    let mut out: Vec<Option<String>> = vec![None; nodes.len()];
    let mut by_id: HashMap<&str, usize> = HashMap::new();
    for (i, n) in nodes.iter().enumerate() {
        by_id.insert(n.id.as_str(), i);
    }
    let mut levels: Vec<usize> = nodes.iter().map(|n| n.level).collect();
    levels.sort_unstable();
    levels.dedup();
    for level in levels {
        let asks = nodes.iter().enumerate().filter(|(_, n)| n.level == level).map(|(i, n)| {
            let members: Vec<String> = n
                .children
                .iter()
                .filter_map(|c| match by_id.get(c.as_str()) {
                    Some(&j) => out[j].clone().or_else(|| Some(nodes[j].text())),
                    None => chunk_text.get(c).cloned(),
                })
                .collect();
            let messages =
                crate::query::answer::summary_messages(l.templates, &crate::query::answer::fit(members, input, count));
            async move { (i, l.llm.chat(&messages, None).await) }
        });
        for (i, r) in futures_util::future::join_all(asks).await {
            out[i] = r.ok().and_then(|c| crate::query::answer::summary_of(&c.content));
            if out[i].is_some() {
                tally.0 += 1;
            } else {
                tally.1 += 1;
            }
        }
    }
    out
}

/// `tree` with the configured parameters; `tree:128` with summaries of that many tokens. (`tree@mean`: summaries
/// retrieved by their members' mean vector instead of their text's embedding.)
pub fn tree_variant(strategy: &str, base: raptor::TreeParams) -> raptor::TreeParams {
    let tokens = strategy.rsplit_once(':').and_then(|(_, t)| t.parse().ok());
    // `tree+cptf[@R]`: summaries CPTF-compressed to R (0.5) of their sentences' tokens; the other tree strategies
    // never (whatever `raptor.compress` says), so `tree` beside `tree+cptf` is the plain tree.
    let compress = strategy
        .strip_prefix("tree+cptf")
        .map(|r| r.strip_prefix('@').and_then(|r| r.split(':').next()?.parse::<f32>().ok()).unwrap_or(CPTF_RATIO));
    raptor::TreeParams { summary_tokens: tokens.unwrap_or(base.summary_tokens), compress, ..base }
}

/// A chunk as a leaf of the patient's tree: its vector and the note's sentences inside it.
fn tree_leaf(
    docs: &[Document],
    ch: &Chunk,
    index: usize,
    vector: &[f32],
    count: &dyn Fn(&str) -> usize,
) -> raptor::Member {
    let d = &docs[ch.doc];
    let sentences = d
        .sentences
        .iter()
        .filter(|s| s.start >= ch.start && s.end <= ch.end)
        .map(|s| {
            let text = &d.note.text[s.start..s.end];
            raptor::Sentence {
                doc_id: d.note.doc_id.clone(),
                date: d.note.date.clone(),
                start: s.start,
                end: s.end,
                tokens: count(text),
                text: text.to_string(),
            }
        })
        .collect();
    // Ids sort like the chunks' order (zero-padded), as the store's UUIDs sort in some fixed order.
    raptor::Member { id: format!("{index:08}"), vector: vector.to_vec(), sentences }
}

/// Sentence-packed chunks of about `CHUNK_WORDS` words per note.
fn chunk_all(docs: &[Document]) -> Vec<Chunk> {
    let mut out = Vec::new();
    for (di, d) in docs.iter().enumerate() {
        let mut start: Option<usize> = None;
        let mut end = 0;
        let mut words = 0;
        for s in &d.sentences {
            let n = word_spans(&d.note.text[s.start..s.end]).len();
            if start.is_some() && words + n > CHUNK_WORDS {
                out.push(Chunk { doc: di, start: start.unwrap_or(0), end });
                start = None;
                words = 0;
            }
            start.get_or_insert(s.start);
            end = s.end;
            words += n;
        }
        if let Some(s) = start {
            out.push(Chunk { doc: di, start: s, end });
        }
    }
    out
}

/// A chunk strategy's name without its `+concepts` or `-concepts` suffix, and whether a chunk that mentions an
/// answer concept counts as a full BM25 match (`default`: `serve.match_concepts`).
pub fn concept_matching(strategy: &str, default: bool) -> (String, bool) {
    match (strategy.strip_suffix("+concepts"), strategy.strip_suffix("-concepts")) {
        (Some(s), _) => (s.to_string(), true),
        (_, Some(s)) => (s.to_string(), false),
        _ => (strategy.to_string(), default),
    }
}

/// The fusion of a `hybrid@W` (a fixed dense weight) or `hybrid@W:M` strategy (`store.dense_weight` W and
/// `store.dense_weight_matched` M, both between 0 and 1), optionally `^P` (`store.bm25_partial_power` P ≥ 1, with
/// `store.bm25_full_share` 1) or `^P/F` (and F in (0, 1]); without `^`, every BM25 share counts linearly.
pub fn parse_fusion(spec: &str) -> Option<crate::store::Fusion> {
    let weight = |w: &str| w.parse::<f32>().ok().filter(|w| (0.0..=1.0).contains(w));
    let (weights, fading) = spec.split_once('^').map_or((spec, None), |(w, f)| (w, Some(f)));
    let mut fusion = match weights.split_once(':') {
        None => crate::store::Fusion::fixed(weight(weights)?),
        Some((w, m)) => {
            crate::store::Fusion { dense_weight_matched: weight(m)?, ..crate::store::Fusion::fixed(weight(w)?) }
        }
    };
    if let Some(f) = fading {
        let (power, full) = f.split_once('/').map_or((f, None), |(p, f)| (p, Some(f)));
        fusion.partial_power = power.parse::<f32>().ok().filter(|p| p.is_finite() && *p >= 1.0)?;
        if let Some(full) = full {
            fusion.full_share = weight(full).filter(|f| *f > 0.0)?;
        }
    }
    Some(fusion)
}

/// Ranked (candidate, score) pairs as store hits with the candidate's index as the id, for `store::fuse_by_score`.
fn as_hits(ranked: &[(usize, f32)]) -> Vec<crate::store::Hit> {
    ranked
        .iter()
        .map(|&(i, score)| crate::store::Hit {
            id: i.to_string(),
            score,
            payload: Default::default(),
            found: Default::default(),
        })
        .collect()
}

/// BM25 as the stores score it: the store's own sparse vectors (`store::bm25`: Qdrant's tokenizer, stemmer and
/// stopwords, the document side's term-frequency saturation) times Qdrant's IDF modifier over every chunk of the set,
/// so that `bm25` and `hybrid` here rank what `/v1/search` would rank.
struct Bm25 {
    encoder: crate::store::bm25::Encoder,
    docs: Vec<HashMap<u32, f32>>,
    idf: HashMap<u32, f32>,
}

impl Bm25 {
    fn new(texts: &[&str], avg_len: f64) -> Result<Bm25, crate::store::StoreError> {
        let encoder = crate::store::bm25::encoder(avg_len)?;
        let mut df: HashMap<u32, f32> = HashMap::new();
        let docs: Vec<HashMap<u32, f32>> = texts
            .iter()
            .map(|t| {
                let v = crate::store::bm25::sparse_document(&encoder, t);
                for &i in &v.indices {
                    *df.entry(i).or_default() += 1.0;
                }
                v.indices.into_iter().zip(v.values).collect()
            })
            .collect();
        let n = texts.len() as f32;
        let idf = df.into_iter().map(|(i, d)| (i, idf(n, d))).collect();
        Ok(Bm25 { encoder, docs, idf })
    }

    fn query(&self, text: &str) -> crate::store::Sparse {
        crate::store::bm25::sparse_query(&self.encoder, text)
    }

    /// The query's IDF mass (`store::fuse_by_score`): its terms' IDFs summed, a term in no chunk 0.
    fn idf_mass(&self, query: &crate::store::Sparse) -> f32 {
        query.indices.iter().map(|i| self.idf.get(i).copied().unwrap_or(0.0)).sum()
    }

    fn score(&self, chunk: usize, query: &crate::store::Sparse) -> f32 {
        self.score_terms(&self.docs[chunk], query)
    }

    /// The score of a text outside the chunks (a summary) under the chunks' statistics.
    fn score_text(&self, text: &str, query: &crate::store::Sparse) -> f32 {
        let v = crate::store::bm25::sparse_document(&self.encoder, text);
        self.score_terms(&v.indices.into_iter().zip(v.values).collect(), query)
    }

    fn score_terms(&self, doc: &HashMap<u32, f32>, query: &crate::store::Sparse) -> f32 {
        query
            .indices
            .iter()
            .zip(&query.values)
            .map(|(i, q)| q * doc.get(i).copied().unwrap_or(0.0) * self.idf.get(i).copied().unwrap_or(0.0))
            .sum()
    }
}

/// Qdrant's IDF modifier: `ln((N − n + 0.5) / (n + 0.5) + 1)` for a term in `n` of `N` points.
fn idf(n: f32, df: f32) -> f32 {
    ((n - df + 0.5) / (df + 0.5) + 1.0).ln()
}

/// Multi-note questions built from a record set (`clinstream-lab eval qa-multi`), where RAPTOR's tree is meant to
/// help: per patient, up to `per_patient` concepts (not anatomy) that the patient's notes mention as affirmed in at least three
/// different notes while at most `max_share` of all notes in the set mention them (so not "pain" or "normal"), most
/// notes first, then by concept id. The question names the concept's preferred term in one fixed template; the
/// evidence is every sentence holding such a mention, with its note (`evidence_doc_ids`). Deterministic: the
/// same notes give the same questions. The evidence comes from the lexicon's own mentions, so CLEAR's recall on
/// these is not a fair figure; the questions compare chunk retrieval with the tree.
pub fn multi_note_questions(
    pipeline: &Pipeline,
    documents: &Path,
    per_patient: usize,
    max_share: f64,
) -> Result<Vec<serde_json::Value>, EvalError> {
    let text = std::fs::read_to_string(documents)
        .map_err(|source| EvalError::Io { path: documents.display().to_string(), source })?;
    let docs: Vec<Document> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            pipeline.process(l.as_bytes()).map_err(|e| EvalError::Format {
                path: documents.display().to_string(),
                why: format!("line {}: {}", i + 1, e.error.code.as_str()),
            })
        })
        .collect::<Result<_, _>>()?;
    // Findings, treatments and tests; a body part alone is not a question.
    let askable = |m: &crate::model::Mention| m.assertion.is_affirmed() && m.kind != crate::model::EntityKind::Anatomy;
    let affirmed = |d: &Document| {
        let mut c: Vec<u32> = d.mentions.iter().filter(|m| askable(m)).map(|m| m.concept).collect();
        c.sort_unstable();
        c.dedup();
        c
    };
    let mut notes_with: HashMap<u32, usize> = HashMap::new();
    for d in &docs {
        for c in affirmed(d) {
            *notes_with.entry(c).or_default() += 1;
        }
    }
    let limit = (docs.len() as f64 * max_share).floor() as usize;
    let mut by_patient: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, d) in docs.iter().enumerate() {
        if let Some(p) = &d.note.patient {
            by_patient.entry(bare(p).to_string()).or_default().push(i);
        }
    }
    let lexicon = pipeline.lexicon();
    let mut out = Vec::new();
    for (patient, own) in by_patient {
        let mut per_concept: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for &i in &own {
            for c in affirmed(&docs[i]) {
                per_concept.entry(c).or_default().push(i);
            }
        }
        let mut chosen: Vec<(u32, Vec<usize>)> = per_concept
            .into_iter()
            .filter(|(c, n)| n.len() >= 3 && notes_with.get(c).is_some_and(|&k| k <= limit))
            .collect();
        chosen.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(lexicon.concept(a.0).id.cmp(&lexicon.concept(b.0).id)));
        for (concept, notes) in chosen.into_iter().take(per_patient) {
            let c = lexicon.concept(concept);
            let (mut evidence, mut evidence_docs) = (Vec::new(), Vec::new());
            for &i in &notes {
                let d = &docs[i];
                for s in &d.sentences {
                    let holds = d
                        .mentions
                        .iter()
                        .any(|m| m.concept == concept && askable(m) && m.start >= s.start && m.end <= s.end);
                    if holds {
                        evidence.push(d.note.text[s.start..s.end].to_string());
                        evidence_docs.push(d.note.doc_id.clone());
                    }
                }
            }
            out.push(serde_json::json!({
                "patient": patient,
                "question": format!("What do the patient's notes say about {} over time?", c.preferred),
                "variable": format!("multi:{}", c.id),
                "answer": "yes",
                "evidence": evidence,
                "evidence_doc_ids": evidence_docs,
            }));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fusion_specs_name_the_weights_and_the_fading_of_partial_matches() {
        use crate::store::Fusion;
        assert_eq!(parse_fusion("0.8"), Some(Fusion::fixed(0.8)));
        let f = parse_fusion("0.95:0.7").unwrap();
        assert_eq!((f.dense_weight, f.dense_weight_matched, f.partial_power, f.full_share), (0.95, 0.7, 1.0, 1.0));
        let f = parse_fusion("0.95:0.7^3").unwrap();
        assert_eq!((f.dense_weight_matched, f.partial_power, f.full_share), (0.7, 3.0, 1.0));
        let f = parse_fusion("0.9^2/0.5").unwrap();
        assert_eq!((f.dense_weight, f.dense_weight_matched, f.partial_power, f.full_share), (0.9, 0.9, 2.0, 0.5));
        for bad in ["1.2", "0.9:x", "0.9^0.5", "0.9^2/0", "0.9^2/1.5", "0.9^", "0.9^inf"] {
            assert_eq!(parse_fusion(bad), None, "{bad}");
        }
    }

    #[test]
    fn interleaving_takes_each_ranking_in_turn_and_every_item_once() {
        assert_eq!(interleave(&[vec![1, 2, 3], vec![2, 4, 1, 5]]), vec![1, 2, 3, 4, 5]);
        assert_eq!(interleave(&[vec![7], vec![8, 9, 10]]), vec![7, 8, 9, 10]);
        assert_eq!(interleave(&[vec![], vec![3, 3]]), vec![3]);
    }

    #[test]
    fn bm25_scores_as_the_store_does_stems_stopwords_and_idf() {
        let texts = [
            "Small bilateral pleural effusions.",
            "Is there anything of note here? There is.",
            "The heart rate was regular; heart sounds normal.",
            "Pleural thickening at the apex.",
        ];
        let b = Bm25::new(&texts, 10.0).unwrap();
        let q = b.query("Is there a pleural effusion?");
        let scores: Vec<f32> = (0..texts.len()).map(|c| b.score(c, &q)).collect();
        // Stemmed: "effusion" finds "effusions"; two terms beat one.
        assert!(scores[0] > scores[3] && scores[3] > 0.0, "{scores:?}");
        // Stopwords ("is", "there", "a") match nothing, so a note of nothing but them is no candidate.
        assert_eq!(scores[1], 0.0, "{scores:?}");
        assert_eq!(scores[2], 0.0, "{scores:?}");
        // A rarer term weighs more: "effusion" (1 of 4 chunks) against "pleural" (2 of 4).
        assert!(idf(4.0, 1.0) > idf(4.0, 2.0));
        assert!((idf(4.0, 1.0) - ((4.0f32 - 1.0 + 0.5) / 1.5 + 1.0).ln()).abs() < 1e-6);
        // The same text scores the same through the store's encoder as the store would index it.
        let doc = crate::store::bm25::sparse_document(&b.encoder, texts[0]);
        let direct: f32 = q
            .indices
            .iter()
            .zip(&q.values)
            .filter_map(|(i, v)| doc.indices.iter().position(|d| d == i).map(|p| v * doc.values[p] * b.idf[i]))
            .sum();
        assert!((direct - scores[0]).abs() < 1e-6);
    }
}
