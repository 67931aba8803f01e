//! CLEAR variables: windows, merging, section ranking and filters, the token budget, labels and confidence,
//! definition errors; and the three eval commands on small self-written files in the sets' formats.

mod common;

use clinstream::config::Settings;
use clinstream::lexicon::Lexicon;
use clinstream::model::Note;
use clinstream::stages::Pipeline;
use clinstream::stages::clear::{self, Label, VariableDef, VariableResult};

fn result(pipeline: &Pipeline, text: &str, variable: &str) -> VariableResult {
    let doc = pipeline.analyse(Note::from_text("t", text.to_string()));
    doc.variables.into_iter().find(|v| v.variable == variable).expect("variable evaluated")
}

fn def(name: &str, synonyms: &[&str]) -> VariableDef {
    toml::from_str(&format!("name = \"{name}\"\nsynonyms = {:?}\n", synonyms)).unwrap()
}

fn settings_with_variables(defs: Vec<VariableDef>, window: usize, budget: usize) -> Settings {
    let mut s = common::settings();
    s.clear.variables = defs;
    s.clear.window_words = window;
    s.clear.token_budget = budget;
    s
}

#[test]
fn labels_for_each_kind_of_evidence() {
    let p = Pipeline::new(&common::settings()).unwrap();
    let cases = [
        ("IMPRESSION: Small left pleural effusion.\n", "pleural_effusion", Label::Present),
        ("IMPRESSION: No pleural effusion.\n", "pleural_effusion", Label::Absent),
        ("IMPRESSION: Possible small pleural effusion.\n", "pleural_effusion", Label::Uncertain),
        ("IMPRESSION: Clear lungs.\n", "pleural_effusion", Label::NotMentioned),
        ("INDICATION: Rule out pneumonia.\nIMPRESSION: Clear lungs.\n", "pneumonia", Label::NotMentioned),
        ("FINDINGS: No pneumothorax.\nIMPRESSION: Small apical pneumothorax.\n", "pneumothorax", Label::Present),
        ("FINDINGS: Enlarged heart.\n", "cardiomegaly", Label::Present),
        // A projected outline is a sign: an enlarged cardiac silhouette may be a pericardial effusion.
        ("FINDINGS: Enlarged cardiac silhouette.\n", "cardiomegaly", Label::Uncertain),
        ("SOCIAL HISTORY: Smokes one pack per day.\n", "tobacco_use", Label::Present),
        ("SOCIAL HISTORY: Quit smoking in 1990.\n", "tobacco_use", Label::Absent),
        ("SOCIAL HISTORY: Denies alcohol.\n", "alcohol_use", Label::Absent),
        ("SOCIAL HISTORY: He is homeless and lives in a shelter.\n", "homelessness", Label::Present),
        ("FAMILY HISTORY: Mother with bipolar disorder.\n", "bipolar_disorder", Label::NotMentioned),
        ("PAST MEDICAL HISTORY: Cirrhosis.\n", "liver_disease", Label::Present),
        ("ASSESSMENT: Hepatitis C.\n", "liver_disease", Label::Present),
        ("HPI: Denies suicidal ideation.\n", "suicidal_behaviour", Label::Absent),
    ];
    for (text, variable, expected) in cases {
        let r = result(&p, text, variable);
        assert_eq!(r.label, expected, "{variable} in {text:?}: {r:?}");
    }
}

/// Phrasings that no synonym lists, reached through the compound's glossed parts (clear.gloss_compounds): the
/// variables generalise to them, with their assertions; off, the same reports are not mentioned.
#[test]
fn compounds_are_found_by_their_parts_plain_words() {
    let on = Pipeline::new(&common::settings()).unwrap();
    let mut s = common::settings();
    s.clear.gloss_compounds = false;
    let off = Pipeline::new(&s).unwrap();
    let cases = [
        ("FINDINGS: Small right pleural air collection at the apex.\n", "pneumothorax", Label::Present),
        ("FINDINGS: There is no air in the pleural space.\n", "pneumothorax", Label::Absent),
        ("FINDINGS: Possible tiny amount of air within the left pleural space.\n", "pneumothorax", Label::Uncertain),
        ("FINDINGS: The heart is severely enlarged.\n", "cardiomegaly", Label::Present),
        ("FINDINGS: The cardiac silhouette is severely enlarged.\n", "cardiomegaly", Label::Uncertain),
        ("FINDINGS: No enlarged cardiac contour.\n", "cardiomegaly", Label::Absent),
    ];
    for (text, variable, expected) in cases {
        let r = result(&on, text, variable);
        assert_eq!(r.label, expected, "{variable} in {text:?}: {r:?}");
        let r = result(&off, text, variable);
        assert_eq!(r.label, Label::NotMentioned, "gloss off: {variable} in {text:?}: {r:?}");
    }
    // A cue between the parts applies (the mention starts after it): denied, or hedged.
    for (text, variable, expected) in [
        ("FINDINGS: The heart is not enlarged.\n", "cardiomegaly", Label::Absent),
        ("FINDINGS: The pleural spaces are without air.\n", "pneumothorax", Label::Absent),
        ("FINDINGS: The heart is possibly enlarged.\n", "cardiomegaly", Label::Uncertain),
    ] {
        assert_eq!(result(&on, text, variable).label, expected, "{text:?}");
        assert_eq!(result(&off, text, variable).label, Label::NotMentioned, "gloss off: {text:?}");
    }
    // Other variables are untouched.
    assert_eq!(
        result(&on, "FINDINGS: Small right pleural air collection.\n", "pleural_effusion").label,
        Label::NotMentioned
    );
}

/// A radiology-style variable over `concepts`: `any_present`, with or without `elliptic_heads`, and its
/// `elliptic_sections` when given.
fn heads_variable(name: &str, concepts: &[&str], on: bool, sections: Option<&[&str]>) -> VariableDef {
    let mut t =
        format!("name = \"{name}\"\nconcepts = {concepts:?}\nelliptic_heads = {on}\ndecision = \"any_present\"\n");
    if let Some(s) = sections {
        t.push_str(&format!("elliptic_sections = {s:?}\n"));
    }
    toml::from_str(&t).unwrap()
}

/// `elliptic_heads`: with no hand-written synonym, the head noun of a concept's name said alone is a mention of the
/// variable ("large right effusion", "interstitial edema", a modifier between the name's words), with its assertion;
/// another site's anatomy term right before it makes it that site's finding ("ankle edema", "knee effusion"), while
/// the variable's own site does not ("lung edema"); a longer lexicon term of another concept keeps its words
/// ("pericardial effusion"); a head that is anatomy ("heart" of "enlarged heart") is never one; off, none counts.
#[test]
fn elliptic_heads_are_mentions_unless_another_site_names_them() {
    let variable = |name: &str, concepts: &[&str], on: bool| heads_variable(name, concepts, on, None);
    let defs = |on: bool| {
        vec![
            variable("effusion_x", &["MESH:D010996"], on),
            variable("edema_x", &["DOID:11396"], on),
            variable("heart_x", &["MESH:D006332"], on),
        ]
    };
    let on = Pipeline::new(&settings_with_variables(defs(true), 150, 1024)).unwrap();
    let off = Pipeline::new(&settings_with_variables(defs(false), 150, 1024)).unwrap();
    let heads = |p: &Pipeline, name: &str| {
        let v = p.variables().iter().find(|v| v.name() == name).unwrap();
        let mut f: Vec<String> = v.heads().forms.iter().cloned().collect();
        f.sort();
        f
    };
    assert_eq!(heads(&on, "effusion_x"), ["effusion", "effusions"]);
    assert_eq!(heads(&on, "edema_x"), ["edema", "edemas"]);
    assert!(heads(&on, "heart_x").is_empty(), "cardiomegaly is one word: no head");
    assert!(heads(&off, "effusion_x").is_empty());
    let cases = [
        ("IMPRESSION: Cardiomegaly. Large right effusion.\n", "effusion_x", Label::Present),
        ("IMPRESSION: Bilateral effusions, right greater than left.\n", "effusion_x", Label::Present),
        ("FINDINGS: No effusion or pneumothorax.\n", "effusion_x", Label::Absent),
        ("IMPRESSION: Possible small effusion.\n", "effusion_x", Label::Uncertain),
        ("IMPRESSION: Cardiomegaly with interstitial edema.\n", "edema_x", Label::Present),
        ("IMPRESSION: Pulmonary interstitial edema.\n", "edema_x", Label::Present),
        ("IMPRESSION: Mild lung edema.\n", "edema_x", Label::Present),
        ("FINDINGS: No edema.\n", "edema_x", Label::Absent),
    ];
    for (text, variable, expected) in cases {
        assert_eq!(result(&on, text, variable).label, expected, "{variable} in {text:?}");
        assert_eq!(result(&off, text, variable).label, Label::NotMentioned, "off: {variable} in {text:?}");
    }
    let other_site = [
        ("IMPRESSION: Left ankle edema.\n", "edema_x"),
        ("IMPRESSION: Moderate knee effusion.\n", "effusion_x"),
        ("IMPRESSION: Small pericardial effusion.\n", "effusion_x"),
        ("IMPRESSION: The heart is enlarged. Enlarged heart.\n", "edema_x"),
    ];
    for (text, variable) in other_site {
        assert_eq!(result(&on, text, variable).label, Label::NotMentioned, "{variable} in {text:?}");
    }
    // The full name still counts after another site's term ("ankle" then "pulmonary edema" is pulmonary edema).
    assert_eq!(result(&on, "IMPRESSION: Ankle fracture. Pulmonary edema.\n", "edema_x").label, Label::Present);
}

/// A head said alone stands for the variable only where an imaging result is written (`elliptic_sections`: findings,
/// impression, imaging, the unheaded body by default): an examination's, a history's or a review of systems' bare
/// "edema" is the limbs', and their "effusion" a joint's. A site attached after the head by a preposition is its
/// site too ("edema of the lower extremities", "effusion in the knee joint"), the variable's own site included
/// ("edema in both lungs" counts). The full name counts everywhere; the sections are a setting of the variable.
#[test]
fn heads_said_alone_count_where_imaging_is_reported_and_not_of_a_site_named_after_them() {
    let defs = |sections: Option<&[&str]>| {
        vec![
            heads_variable("effusion_x", &["MESH:D010996"], true, sections),
            heads_variable("edema_x", &["DOID:11396"], true, sections),
        ]
    };
    let shipped = Pipeline::new(&settings_with_variables(defs(None), 150, 1024)).unwrap();
    let exam = Pipeline::new(&settings_with_variables(defs(Some(&["physical_exam"])), 150, 1024)).unwrap();
    let elsewhere = [
        ("PHYSICAL EXAMINATION: Extremities: 2+ pitting edema bilaterally.\n", "edema_x"),
        ("REVIEW OF SYSTEMS: No orthopnea or edema.\n", "edema_x"),
        ("HISTORY OF PRESENT ILLNESS: Her knee has an effusion.\n", "effusion_x"),
        ("PLAN: Ice to decrease the edema.\n", "edema_x"),
    ];
    for (text, variable) in elsewhere {
        assert_eq!(result(&shipped, text, variable).label, Label::NotMentioned, "{variable} in {text:?}");
    }
    // The setting is read: with the examination admitted, its bare head counts (and the findings' no longer does).
    let pe = "PHYSICAL EXAMINATION: Extremities: 2+ pitting edema bilaterally.\n";
    assert_eq!(result(&exam, pe, "edema_x").label, Label::Present);
    assert_eq!(result(&exam, "FINDINGS: Mild edema.\n", "edema_x").label, Label::NotMentioned);
    let site_after = [
        ("FINDINGS: Edema of the lower extremities.\n", "edema_x"),
        ("IMPRESSION: Mild edema in the left ankle.\n", "edema_x"),
        ("IMPRESSION: Small effusion in the knee joint.\n", "effusion_x"),
    ];
    for (text, variable) in site_after {
        assert_eq!(result(&shipped, text, variable).label, Label::NotMentioned, "{variable} in {text:?}");
    }
    let counted = [
        ("FINDINGS: Mild edema.\n", "edema_x", Label::Present),
        ("Small effusions. No pneumothorax.\n", "effusion_x", Label::Present),
        ("IMPRESSION: Edema in both lungs.\n", "edema_x", Label::Present),
        ("IMPRESSION: No edema, in keeping with the clinical picture.\n", "edema_x", Label::Absent),
        // The full name counts in any section, a site after it or not.
        ("PHYSICAL EXAMINATION: Crackles; pulmonary edema of both lower lobes.\n", "edema_x", Label::Present),
        ("REVIEW OF SYSTEMS: Known pleural effusion.\n", "effusion_x", Label::Present),
    ];
    for (text, variable, expected) in counted {
        assert_eq!(result(&shipped, text, variable).label, expected, "{variable} in {text:?}");
    }
    // An unknown section name is a definition error that names the key.
    let mut bad = settings_with_variables(defs(Some(&["exam"])), 150, 1024);
    bad.clear.variables.truncate(1);
    let err = Pipeline::new(&bad).map(|_| ()).unwrap_err().to_string();
    assert!(err.contains("effusion_x") && err.contains("unknown section `exam`"), "{err}");
}

#[test]
fn weighted_votes_favour_heavier_sections_and_report_confidence() {
    let p = Pipeline::new(&common::settings()).unwrap();
    // depression uses the weighted decision: the assessment (1.0) outweighs the review of systems (0.5).
    let r = result(&p, "REVIEW OF SYSTEMS: No depression.\nASSESSMENT: Major depressive disorder.\n", "depression");
    assert_eq!(r.label, Label::Present);
    assert!((r.confidence - 1.0 / 1.5).abs() < 1e-3, "{}", r.confidence);
    assert_eq!(r.mentions_found, 2);
}

#[test]
fn windows_merge_and_respect_the_budget() {
    let s = settings_with_variables(vec![def("widget", &["widget"])], 3, 1000);
    let p = Pipeline::new(&s).unwrap();
    // Two mentions 4 words apart: their ±3-word windows touch and merge into one.
    let r = result(&p, "one two three widget a b c d widget x y z end\n", "widget");
    assert_eq!(r.evidence.len(), 1);
    assert_eq!(r.evidence[0].mentions.len(), 2);
    // Far apart: two windows.
    let far = format!("widget {} widget\n", "w ".repeat(50));
    assert_eq!(result(&p, &far, "widget").evidence.len(), 2);

    // The budget holds however long the note grows, and the best sections come first.
    let s = settings_with_variables(vec![def("widget", &["widget"])], 20, 60);
    let p = Pipeline::new(&s).unwrap();
    let mut text = String::new();
    for _ in 0..30 {
        text.push_str(&format!("OTHER: {} widget {}\n", "filler ".repeat(30), "filler ".repeat(30)));
    }
    text.push_str(&format!("ASSESSMENT: {} widget {}\n", "word ".repeat(30), "word ".repeat(30)));
    let r = result(&p, &text, "widget");
    assert!(r.context_tokens <= 60, "{}", r.context_tokens);
    assert!(r.context_tokens > 0);
    assert!(r.evidence.iter().any(|w| w.section == "assessment"), "the heaviest window is kept: {:?}", r.evidence);
    assert!(r.evidence.windows(2).all(|w| w[0].start < w[1].start), "evidence is reported in text order");
    assert_eq!(r.mentions_found, 31);
    let tokens: usize = r.evidence.iter().map(|w| w.tokens).sum();
    assert_eq!(tokens, r.context_tokens);
}

#[test]
fn section_filters() {
    let mut d = def("widget", &["widget"]);
    d.sections = vec!["assessment".into()];
    let p = Pipeline::new(&settings_with_variables(vec![d], 150, 1000)).unwrap();
    assert_eq!(result(&p, "HPI: widget.\n", "widget").label, Label::NotMentioned);
    assert_eq!(result(&p, "ASSESSMENT: widget.\n", "widget").label, Label::Present);
}

#[test]
fn definition_errors_name_the_variable_and_field() {
    let lex = Lexicon::builtin();
    let mut bad = def("Bad Name", &[]);
    bad.concepts = vec!["DOID:does-not-exist".into()];
    bad.sections = vec!["nowhere".into()];
    let err = clear::compile(&[bad, def("dup", &["x"]), def("dup", &["y"])], 150, 1024, &lex).unwrap_err().to_string();
    for expected in [
        "name: must be snake_case",
        "unknown concept id `DOID:does-not-exist`",
        "unknown section `nowhere`",
        "defined twice",
    ] {
        assert!(err.contains(expected), "missing {expected} in {err}");
    }
}

#[test]
fn descendants_are_targets() {
    let p = Pipeline::new(&common::settings()).unwrap();
    // Aspiration pneumonia is a child of pneumonia (DOID:552) in the Disease Ontology.
    assert_eq!(result(&p, "IMPRESSION: Aspiration pneumonia.\n", "pneumonia").label, Label::Present);
}

/// Findings a report offers as alternatives are uncertain; a hedge before a cause leaves the finding present.
#[test]
fn alternatives_are_uncertain_and_a_hedged_cause_leaves_the_finding() {
    let p = Pipeline::new(&common::settings()).unwrap();
    let text = "FINDINGS: Pleural effusions or pneumothorax. Heart size normal.\n";
    assert_eq!(result(&p, text, "pneumothorax").label, Label::Uncertain);
    assert_eq!(result(&p, text, "pleural_effusion").label, Label::Uncertain);
    let text = "IMPRESSION: Bilateral large pleural effusion, possibly from pleuritis or the known pancreatitis.\n";
    assert_eq!(result(&p, text, "pleural_effusion").label, Label::Present);
    let text = "IMPRESSION: Bibasilar opacities, pulmonary edema difficult to entirely exclude.\n";
    assert_eq!(result(&p, text, "pulmonary_edema").label, Label::Uncertain);
}

/// A finding named in a differential with no other hedge is uncertain, or present for a variable that says
/// `differential_is_present` (the five shipped radiology findings do); another hedge keeps it uncertain either way.
#[test]
fn a_differential_counts_as_present_only_where_the_variable_says_so() {
    let shipped = Pipeline::new(&common::settings()).unwrap();
    let mut s = common::settings();
    for v in &mut s.clear.variables {
        v.differential_is_present = false;
    }
    let strict = Pipeline::new(&s).unwrap();
    for (text, variable) in [
        ("IMPRESSION: Small left pleural effusion versus pleural thickening.\n", "pleural_effusion"),
        ("IMPRESSION: Left basilar opacity, atelectasis versus pneumonia.\n", "pneumonia"),
    ] {
        assert_eq!(result(&shipped, text, variable).label, Label::Present, "{text}");
        assert_eq!(result(&strict, text, variable).label, Label::Uncertain, "{text}");
    }
    for text in [
        "IMPRESSION: This may represent a small pleural effusion versus pleural thickening.\n",
        "IMPRESSION: Question small right pleural effusion versus pleural thickening.\n",
    ] {
        assert_eq!(result(&shipped, text, "pleural_effusion").label, Label::Uncertain, "{text}");
    }
    let off: VariableDef = toml::from_str("name = \"x\"\nsynonyms = [\"y\"]\n").unwrap();
    assert!(!off.differential_is_present, "a differential is uncertain unless a variable says otherwise");
}

#[test]
fn eval_openi_on_a_small_file() {
    let dir = tempfile::tempdir().unwrap();
    let reports = dir.path().join("reports.csv");
    let labels = dir.path().join("labels.csv");
    std::fs::write(
        &reports,
        "uid,MeSH,Problems,image,indication,comparison,findings,impression\n\
         1,x,x,x,\"Cough, fever\",None.,\"The heart is enlarged. No pleural effusion.\",Cardiomegaly.\n\
         2,x,x,x,Pain,,\"Lungs are clear.\",No acute disease.\n\
         3,x,x,x,,,\"Small right pleural effusion.\",\"Effusion, no pneumothorax.\"\n",
    )
    .unwrap();
    std::fs::write(
        &labels,
        "filename,Cardiomegaly,Effusion,Pneumonia,Pneumothorax,Edema\nCXR1,1,0,0,0,0\nCXR2,0,0,0,0,0\nCXR3,0,1,0,1,0\n",
    )
    .unwrap();
    let p = Pipeline::new(&common::settings()).unwrap();
    let r = clinstream::eval::openi::run(&p, &reports, &labels, false).unwrap();
    assert_eq!(r.n, 3);
    let c = &r.per_variable["cardiomegaly"];
    assert_eq!((c.tp, c.fp, c.fn_), (1, 0, 0));
    let e = &r.per_variable["pleural_effusion"];
    assert_eq!((e.tp, e.fp, e.fn_), (1, 0, 0));
    let x = &r.per_variable["pneumothorax"];
    assert_eq!((x.tp, x.fp, x.fn_), (0, 0, 1), "a negated pneumothorax against a gold 1 is a miss");
    // Reports by predicted label, with their gold positives: the negated pneumothorax is the gold positive among
    // the absent ones; every report is counted once per variable.
    let by = &r.by_label["pneumothorax"];
    assert_eq!((by["absent"].reports, by["absent"].gold_positive), (1, 1), "{by:?}");
    assert_eq!((by["not_mentioned"].reports, by["not_mentioned"].gold_positive), (2, 0), "{by:?}");
    for (variable, labels) in &r.by_label {
        assert_eq!(labels.values().map(|c| c.reports).sum::<u64>(), r.n, "{variable}");
        let p = &r.per_variable[variable];
        assert_eq!(labels.values().map(|c| c.gold_positive).sum::<u64>(), p.tp + p.fn_, "{variable}");
        assert_eq!(labels.get("present").map_or(0, |c| c.reports), p.tp + p.fp, "{variable}");
    }
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["per_variable"]["cardiomegaly"]["f1"].is_number() && json["macro_f1"].is_number());
}

#[test]
fn eval_sdoh_on_a_small_file() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("sdoh.csv");
    std::fs::write(
        &csv,
        "premise,hypothesis,label\n\
         Smokes 1 ppd.,The person is currently a smoker.,True\n\
         Smokes 1 ppd.,The person is currently not a smoker.,False\n\
         Quit smoking 10 years ago.,The person was a smoker in the past.,True\n\
         Quit smoking 10 years ago.,The person is currently a smoker.,False\n\
         Never smoked.,The person wasn't a smoker in the past.,True\n\
         Drinks wine socially.,The person currently drinks alcohol.,True\n\
         Denies alcohol.,The person currently does not drink alcohol.,True\n\
         Denies alcohol.,The person has access to transportation.,False\n",
    )
    .unwrap();
    let p = Pipeline::new(&common::settings()).unwrap();
    let r = clinstream::eval::sdoh::run(&p, &csv, false).unwrap();
    assert_eq!(r.n, 7, "only smoking and alcohol statements are scored");
    assert_eq!(r.accuracy, 1.0, "{r:?}");
}
