#!/usr/bin/env python3
"""Renders and lints helm/clinstream with the real Helm library (PyPI helm-python-sdk) and prints the manifests
as JSON for tests/ops.rs to assert on; with --objects also each manifest parsed (PyYAML), for tests/image.rs.
Usage: helm_check.py CHART VALUES_JSON [--objects]"""
import json
import sys

import helm_python as helm

chart_dir, values = sys.argv[1], json.loads(sys.argv[2])
findings = helm.lint(chart_dir)
with helm.Chart.load(chart_dir) as chart:
    chart.validate_schema(values)
    manifests = chart.render(values, name="clinstream", namespace="clinical")
out = {"lint": findings if isinstance(findings, (list, dict, str)) else str(findings), "manifests": manifests}
if "--objects" in sys.argv[3:]:
    import yaml
    out["objects"] = {path: [d for d in yaml.safe_load_all(text) if d] for path, text in manifests.items()}
print(json.dumps(out, default=str))
