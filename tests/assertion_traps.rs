//! The assertion-trap suite: sentences written for clinstream that cover the cases users of other ConText tools
//! report. The target is in [brackets]; the expected flags are `aff` (affirmed) or any of `neg unc hist fam hyp`.
//! Every other lexicon mention in the sentence is passed along too, as in the pipeline (it shapes scopes).

mod common;

use clinstream::lexicon::EntityKind;
use clinstream::stages::Pipeline;
use clinstream::stages::assertion::{Assertion, AssertionParams, ContextRules, assert_sentence};

const TRAPS: &[(&str, &str)] = &[
    // Plain negation and its scope.
    ("No [pleural effusion].", "neg"),
    ("The patient denies [chest pain].", "neg"),
    ("Patient has no [fever] or chills.", "neg"),
    ("She is negative for [fever], chills, night sweats or weight loss.", "neg"),
    ("She is negative for fever, chills, night sweats or [weight loss].", "neg"),
    ("Negative for fever, chills, [nausea] or vomiting.", "neg"),
    ("No evidence of [pneumothorax] or effusion.", "neg"),
    ("No evidence of pneumothorax or [effusion].", "neg"),
    ("There is no focal air space opacity to suggest a [pneumonia].", "neg"),
    ("Without [fever].", "neg"),
    ("Free of [cough] today.", "neg"),
    ("[Pneumonia] was ruled out.", "neg"),
    ("[Fracture] has been excluded.", "neg"),
    ("[Pneumothorax] is not seen.", "neg"),
    ("Lungs clear; no [wheezing].", "neg"),
    ("Never had a [seizure].", "neg"),
    ("No history of [diabetes].", "neg"),
    ("Denies any history of [hypertension].", "neg"),
    ("GI ROS is -ve for [bleeding].", "neg"),
    ("Doppler of the lower extremities negative   for [DVT].", "neg"),
    // Header or colon between cue and term, and "X: none".
    ("Denies: [chest pain], shortness of breath.", "neg"),
    ("ROS: negative for [headache].", "neg"),
    ("[Allergies]: none.", "neg"),
    ("[Complications]: None.", "neg"),
    ("[Chest pain]: denied.", "neg"),
    ("[Rash] - negative.", "neg"),
    // Scope ends.
    ("No pneumothorax, but there is a small [pleural effusion].", "aff"),
    ("No fever; [cough] is productive.", "aff"),
    ("No focal consolidation however there is [cardiomegaly].", "aff"),
    ("No biliary dilatation and positive for [cholelithiasis].", "aff"),
    ("The patient denies fever and presents with [cough].", "aff"),
    // Pseudo-triggers.
    ("No increase in [pleural effusion].", "aff"),
    ("Not only [hypertension] but also diabetes.", "aff"),
    ("Gram negative [bacteremia].", "aff"),
    ("No change in the [cardiomegaly].", "aff"),
    ("The [cysts] have not changed in size.", "aff"),
    // Affirmed.
    ("She has a [cough].", "aff"),
    ("Findings consistent with [pneumonia].", "aff"),
    ("Opacities compatible with [pulmonary edema].", "aff"),
    ("Borderline [cardiomegaly].", "aff"),
    ("Clear [emesis] noted.", "aff"),
    // Uncertainty.
    ("Rule out [pneumonia].", "unc"),
    ("R/O [appendicitis].", "unc"),
    ("Evaluate for [DVT].", "unc"),
    ("Possible [pneumonia].", "unc"),
    ("[Pneumonia] cannot be excluded.", "unc"),
    ("Cannot rule out [pulmonary embolism].", "unc"),
    ("Atelectasis versus [pneumonia].", "unc"),
    ("Opacity possibly consistent with [pneumonia].", "unc"),
    ("Interstitial opacities may be compatible with [pulmonary edema].", "unc"),
    ("Opacity concerning for [pneumonia].", "unc"),
    ("Nodule suspicious for [malignancy].", "unc"),
    ("Question of [pleural effusion].", "unc"),
    ("Aspiration or [edema] are also possible.", "unc"),
    ("This may represent [pneumonia].", "unc"),
    ("The differential diagnosis includes round [pneumonia].", "unc"),
    // Hypothetical.
    ("Return if [chest pain] develops.", "hyp"),
    ("Call if she has [fever].", "hyp"),
    ("Watch for [bleeding].", "hyp"),
    // Historical.
    ("History of [stroke] in 2001.", "hist"),
    ("Status post [appendectomy].", "hist"),
    ("S/p [cholecystectomy].", "hist"),
    ("Previous [myocardial infarction].", "hist"),
    ("His [nausea] resolved.", "neg hist"),
    ("[Hyponatremia] appears to have resolved.", "neg hist"),
    ("Resolved interstitial [edema].", "neg hist"),
    ("Quit [smoking] in 1990.", "neg hist"),
    ("Former [smoker].", "hist"),
    // Family and other experiencers.
    ("Her mother has [diabetes].", "fam"),
    ("Family history of [breast cancer].", "fam"),
    ("Father with [coronary artery disease].", "fam"),
    ("Maternal grandmother had [stroke].", "fam"),
    // Combinations.
    ("Mother denies [fever].", "neg fam"),
    ("Nonsmoker.", "aff"),
];

fn flags(a: &Assertion) -> String {
    a.short()
}

#[test]
fn assertion_traps() {
    let pipeline = Pipeline::new(&common::settings()).unwrap();
    let rules = ContextRules::builtin();
    let params = AssertionParams::default();
    assert!(TRAPS.len() >= 60, "the suite holds at least 60 cases");
    let mut failures = Vec::new();
    for (marked, expected) in TRAPS {
        let Some(open) = marked.find('[') else { continue };
        let close = marked.find(']').expect("closing bracket");
        let text = marked.replace(['[', ']'], "");
        let target = (open, close - 1);
        // Other mentions in the sentence with their kinds, as the pipeline would pass them; the target is a
        // finding (its kind where the lexicon knows it).
        let lexicon = pipeline.lexicon();
        let kind = |m: &clinstream::lexicon::TermMatch| lexicon.concept(m.concept).kind;
        let found = lexicon.find(&text);
        let target_kind = found.iter().find(|m| (m.start, m.end) == target).map_or(EntityKind::Disease, kind);
        let mut mentions: Vec<((usize, usize), EntityKind)> = found
            .iter()
            .filter(|m| m.end <= target.0 || m.start >= target.1)
            .map(|m| ((m.start, m.end), kind(m)))
            .collect();
        mentions.push((target, target_kind));
        mentions.sort();
        let i = mentions.iter().position(|m| m.0 == target).unwrap();
        let (spans, kinds): (Vec<(usize, usize)>, Vec<EntityKind>) = mentions.into_iter().unzip();
        let got = assert_sentence(&text, (0, text.len()), &spans, &kinds, rules, &params)[i];
        if flags(&got) != *expected {
            failures.push(format!("{marked}: got `{}`, expected `{expected}`", flags(&got)));
        }
    }
    // "Nonsmoker." checks the tobacco variable end to end: a cue that covers the mention applies to it.
    let doc = pipeline.analyse(clinstream::model::Note::from_text("t", "SOCIAL HISTORY: Nonsmoker.\n".into()));
    let tobacco = doc.variables.iter().find(|v| v.variable == "tobacco_use").unwrap();
    if tobacco.label != clinstream::stages::clear::Label::Absent {
        failures.push(format!("Nonsmoker: tobacco_use is {:?}, expected absent", tobacco.label));
    }
    assert!(failures.is_empty(), "{} of {} traps failed:\n{}", failures.len(), TRAPS.len(), failures.join("\n"));
}

#[test]
fn section_defaults_apply() {
    let pipeline = Pipeline::new(&common::settings()).unwrap();
    let doc = pipeline.analyse(clinstream::model::Note::from_text(
        "t",
        "FAMILY HISTORY: Diabetes.\nPAST MEDICAL HISTORY: Asthma.\nASSESSMENT: Pneumonia.\n".into(),
    ));
    let by_term =
        |t: &str| doc.mentions.iter().find(|m| doc.note.text[m.start..m.end].eq_ignore_ascii_case(t)).unwrap();
    assert!(by_term("diabetes").assertion.family);
    assert!(by_term("asthma").assertion.historical);
    assert!(by_term("pneumonia").assertion.is_affirmed());
}
