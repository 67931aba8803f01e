//! Context-Preserving Token Filtering (ConTextual's CPTF): a passage cut to its most important words within a
//! token allowance, in their order, so that a context carries more evidence per token.
//!
//! Importance comes from a transformer's attention: the attention each token *receives* (the column mean of the
//! softmax over heads and query positions, layers weighted by depth), computed in the model graph
//! (`model.importance.onnx`, `tools/model/bert_safetensors_to_onnx.py --importance`) and read by
//! `embed::importance`. Here, given those scores:
//! * whole words only: a word (a run between whitespace) scores its most important token and costs its tokens;
//! * protected words first: those overlapping a mention of an aligned entity or an assertion cue ("no", "without",
//!   "possible", "history of") are always kept, so the kept text asserts what the passage asserted;
//! * then the other words, most important first (earlier first on ties), while their tokens fit the allowance;
//! * kept words in their order, joined by one space.
//!
//! Pure: the caller scores and counts.

use crate::stages::clear::word_spans;

pub use crate::embed::importance::Token;

/// What a filter kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Filtered {
    /// The kept words, in order, joined by one space.
    pub text: String,
    /// Byte spans of the kept words in the passage.
    pub kept: Vec<(usize, usize)>,
    /// Tokens of the kept words (by the scores' tokenization; the caller recounts the joined text).
    pub tokens: usize,
    /// Words in the passage.
    pub words: usize,
}

/// Keeps the words of `text` that matter most within `allowance` tokens (module docs). `protect` are byte spans in
/// `text` whose words are always kept, even past the allowance.
pub fn filter(text: &str, tokens: &[Token], protect: &[(usize, usize)], allowance: usize) -> Filtered {
    let words = word_spans(text);
    let overlaps = |(a, b): (usize, usize), (c, d): (usize, usize)| a < d && c < b;
    // Per word: its score (best token), its cost (tokens in it, at least 1) and whether it is protected.
    let mut first = 0;
    let scored: Vec<(f32, usize, bool)> = words
        .iter()
        .map(|&w| {
            while first < tokens.len() && tokens[first].end <= w.0 {
                first += 1;
            }
            let inside = tokens[first..].iter().take_while(|t| t.start < w.1).filter(|t| overlaps(w, (t.start, t.end)));
            let (score, cost) = inside.fold((0f32, 0usize), |(s, n), t| (s.max(t.importance), n + 1));
            (score, cost.max(1), protect.iter().any(|&p| overlaps(w, p)))
        })
        .collect();
    let mut keep = vec![false; words.len()];
    let mut used = 0;
    for (i, &(_, cost, protected)) in scored.iter().enumerate() {
        if protected {
            keep[i] = true;
            used += cost;
        }
    }
    let mut order: Vec<usize> = (0..words.len()).filter(|&i| !keep[i]).collect();
    order.sort_by(|&a, &b| scored[b].0.total_cmp(&scored[a].0).then(a.cmp(&b)));
    for i in order {
        if used + scored[i].1 <= allowance {
            keep[i] = true;
            used += scored[i].1;
        }
    }
    let kept: Vec<(usize, usize)> = words.iter().zip(&keep).filter(|(_, k)| **k).map(|(w, _)| *w).collect();
    let text_out = kept.iter().map(|&(a, b)| &text[a..b]).collect::<Vec<_>>().join(" ");
    Filtered { text: text_out, kept, tokens: used, words: words.len() }
}

/// [`filter`], protecting the assertion cues of `text` (`stages::assertion`) beside `mentions`: what the read side
/// keeps of a window.
pub fn filter_window(text: &str, tokens: &[Token], mentions: &[(usize, usize)], allowance: usize) -> Filtered {
    let mut protect = mentions.to_vec();
    protect.extend(crate::stages::assertion::ContextRules::builtin().cue_spans(text));
    filter(text, tokens, &protect, allowance)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per word, with the given importances.
    fn tokens(text: &str, importance: &[f32]) -> Vec<Token> {
        word_spans(text)
            .into_iter()
            .zip(importance)
            .map(|((s, e), &i)| Token { start: s, end: e, importance: i })
            .collect()
    }

    #[test]
    fn keeps_the_most_important_words_in_order_within_the_allowance() {
        let text = "The heart size is within normal limits today";
        let t = tokens(text, &[0.01, 0.9, 0.8, 0.05, 0.02, 0.7, 0.6, 0.03]);
        let f = filter(text, &t, &[], 4);
        assert_eq!(f.text, "heart size normal limits");
        assert_eq!((f.tokens, f.words), (4, 8));
        // Everything fits: the passage unchanged (words joined by one space).
        assert_eq!(filter(text, &t, &[], 100).text, text);
        assert_eq!(filter(text, &t, &[], 0).text, "");
    }

    #[test]
    fn mentions_and_cues_are_kept_whatever_their_importance() {
        let text = "There is no   pleural effusion seen on this film";
        let t = tokens(text, &[0.5, 0.4, 0.0, 0.0, 0.0, 0.3, 0.2, 0.1, 0.6]);
        // "no" (a cue) and "pleural effusion" (a mention) score 0 but are protected.
        let cue = text.find("no").map(|i| (i, i + 2)).unwrap();
        let mention = text.find("pleural").map(|i| (i, i + "pleural effusion".len())).unwrap();
        let f = filter(text, &t, &[cue, mention], 4);
        assert_eq!(f.text, "no pleural effusion film", "{f:?}");
        // Protected words stay even past the allowance.
        assert_eq!(filter(text, &t, &[cue, mention], 1).text, "no pleural effusion");
    }

    #[test]
    fn a_window_keeps_its_negation_cue() {
        let text = "There is no pleural effusion today";
        let t = tokens(text, &[0.9, 0.8, 0.0, 0.0, 0.0, 0.7]);
        let mention = text.find("pleural").map(|i| (i, i + "pleural effusion".len())).unwrap();
        assert_eq!(filter(text, &t, &[mention], 3).text, "There pleural effusion");
        assert_eq!(filter_window(text, &t, &[mention], 3).text, "no pleural effusion", "the cue outranks importance");
    }

    #[test]
    fn a_word_is_scored_by_its_best_token_and_costs_all_of_them() {
        let text = "cardiomegaly noted";
        // "cardiomegaly" in three word pieces, one of them important; "noted" one token of middling importance.
        let t = vec![
            Token { start: 0, end: 5, importance: 0.1 },
            Token { start: 5, end: 8, importance: 0.9 },
            Token { start: 8, end: 12, importance: 0.1 },
            Token { start: 13, end: 18, importance: 0.5 },
        ];
        assert_eq!(filter(text, &t, &[], 1).text, "noted", "the whole word costs 3 tokens: it does not fit 1");
        let f = filter(text, &t, &[], 3);
        assert_eq!((f.text.as_str(), f.tokens), ("cardiomegaly", 3));
        assert_eq!(filter(text, &t, &[], 4).text, "cardiomegaly noted");
    }
}
