#!/usr/bin/env python3
"""A second qa set for `clinstream-lab eval qa`: other patients, other reports, other question phrasings.

Usage: bench/qa_second_set.py SHARED OUT_DIR

The development set (SHARED/eval/qa) is what the read side's settings were chosen on; this set asks how they hold on
data they were not chosen on. It takes 60 Open-i chest X-ray reports of SHARED/eval/openi that the development set
does not use (8 each with pneumonia and edema labelled, 6 each with effusion and cardiomegaly, the rest at random;
the split holds no pneumothorax that the development set does not use), gives each to a patient of its own with 3-20
MTSamples notes the development set does not use and that name none of the five findings, and asks each patient
five questions, one per finding, in phrasings the development set does not have (two per finding, alternating;
written before the first measurement and never changed after it). Answers are the reports' NegBio labels (1 = yes,
otherwise no); evidence is each findings/impression sentence holding one of the CheXpert labeler's mention phrases
for the finding (pneumonia with its consolidation and lung-opacity phrases, cardiomegaly with the cardiomediastinum
ones), an independent word list, not clinstream's lexicon. Deterministic (fixed seed). Writes
OUT_DIR/documents.ndjson and OUT_DIR/questions.jsonl; the texts stay outside the repository.
"""

import base64
import collections
import csv
import gzip
import json
import os
import random
import re
import sys
S, OUT = sys.argv[1], sys.argv[2]
os.makedirs(OUT, exist_ok=True)
csv.field_size_limit(10**9)
rng = random.Random(20261206)
dev = [json.loads(l) for l in open(f'{S}/eval/qa/documents.ndjson')]
dev_cxr = {d['id'].split('-cxr-')[1] for d in dev if '-cxr-' in d['id']}
dev_mts = {d['id'].split('-mts-')[1] for d in dev if '-mts-' in d['id']}
reports = {r['uid']: r for r in csv.DictReader(open(f'{S}/eval/openi/indiana_reports_dev.csv'))}
labels = {r['filename'][3:]: r for r in csv.DictReader(open(f'{S}/eval/openi/labels_dev.csv'))}
col = {'cardiomegaly': 'Cardiomegaly', 'pleural_effusion': 'Effusion', 'pneumonia': 'Pneumonia',
       'pneumothorax': 'Pneumothorax', 'pulmonary_edema': 'Edema'}
P = f'{S}/vocab/chexpert-labeler/phrases/mention/'
def plist(*names):
    out = []
    for n in names:
        out += [l.strip().replace('_', ' ').strip() for l in open(P + n + '.txt') if l.strip()]
    return out
evid = {'cardiomegaly': plist('cardiomegaly', 'enlarged_cardiomediastinum'),
        'pleural_effusion': plist('pleural_effusion'),
        'pneumonia': plist('pneumonia', 'consolidation', 'lung_opacity'),
        'pneumothorax': plist('pneumothorax'),
        'pulmonary_edema': plist('edema')}
questions = {
    'cardiomegaly': ['Is the cardiac silhouette enlarged?', 'Does the chest film show an enlarged heart?'],
    'pleural_effusion': ['Is there fluid around the lung?', 'Are there any effusions?'],
    'pneumonia': ['Is there a chest infection?', 'Any signs of pneumonia on imaging?'],
    'pneumothorax': ['Is there air in the pleural space?', 'Any sign of a pneumothorax?'],
    'pulmonary_edema': ['Is there fluid in the lungs?', 'Are there signs of pulmonary congestion?'],
}
usable = [u for u in reports if u not in dev_cxr and u in labels and (reports[u]['findings'] or reports[u]['impression'])]
rng.shuffle(usable)
chosen = []
for c in ['Pneumonia', 'Pneumothorax', 'Edema', 'Effusion', 'Cardiomegaly']:
    pos = [u for u in usable if labels[u][c] == '1' and u not in chosen]
    chosen += pos[:8 if c in ('Pneumonia', 'Pneumothorax', 'Edema') else 6]
chosen += [u for u in usable if u not in chosen][:60 - len(chosen)]
chosen = chosen[:60]
rng.shuffle(chosen)
bad = re.compile(r'edema|effusion|pneumon|cardiomegal|pneumothora|consolidat|infiltrat|heart size|enlarged heart|'
                 r'cardiac enlargement|fluid overload|collaps|atelecta|hydrothorax|congestion|opacit', re.I)
mts = [r for r in csv.DictReader(gzip.open(f'{S}/corpora/mtsamples/mtsamples.csv.gz', 'rt'))
       if r['note_id'] not in dev_mts and r['transcription'].strip() and not bad.search(r['transcription'])]
rng.shuffle(mts)
def doc(id_, patient, text, code, display, date):
    return {'resourceType': 'DocumentReference', 'id': id_, 'meta': {'versionId': '1'}, 'status': 'current',
            'docStatus': 'final', 'type': {'coding': [{'system': 'http://loinc.org', 'code': code, 'display': display}]},
            'subject': {'reference': f'Patient/{patient}'}, 'date': date,
            'content': [{'attachment': {'contentType': 'text/plain; charset=utf-8',
                                        'data': base64.b64encode(text.encode()).decode()}}]}
def day():
    return f'{rng.randint(2015, 2020)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T09:00:00Z'
docs, qs, k = [], [], 0
for i, u in enumerate(chosen):
    p = f'qh-p{i:03d}'
    r = reports[u]
    parts = [(n.upper(), r[n]) for n in ('indication', 'comparison', 'findings', 'impression') if r[n].strip()]
    text = '\n\n'.join(f'{n}: {t}' for n, t in parts)
    docs.append(doc(f'qh-cxr-{u}', p, text, '18748-4', 'Diagnostic imaging study', day()))
    for _ in range(rng.randint(3, 20)):
        m = mts[k % len(mts)]; k += 1
        docs.append(doc(f'{p}-mts-{m["note_id"]}', p, m['transcription'], '11506-3', 'Progress note', day()))
    sents = [s.strip() for n in ('findings', 'impression') for s in re.split(r'(?<=\.)\s+', r[n]) if s.strip()]
    for v, c in col.items():
        ev = [s for s in sents if any(ph.lower() in s.lower() for ph in evid[v])]
        qs.append({'patient': p, 'question': questions[v][i % 2], 'variable': v,
                   'answer': 'yes' if labels[u][c] == '1' else 'no', 'needle_doc_id': f'qh-cxr-{u}', 'evidence': ev})
rng.shuffle(docs)
with open(os.path.join(OUT, 'documents.ndjson'), 'w') as f:
    for d in docs: f.write(json.dumps(d) + '\n')
with open(os.path.join(OUT, 'questions.jsonl'), 'w') as f:
    for q in qs: f.write(json.dumps(q) + '\n')
print(len(docs), 'documents', len(qs), 'questions', k, 'notes used of', len(mts))
print(collections.Counter((q['variable'], q['answer']) for q in qs))
print(collections.Counter((q['variable'], bool(q['evidence'])) for q in qs))
