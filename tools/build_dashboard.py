#!/usr/bin/env python3
"""Writes dashboards/clinstream.json (Grafana) from the metric names in src/telemetry/metrics.rs.

Run from the repository root: python3 tools/build_dashboard.py. tests/ops.rs checks every metric the dashboard
queries is exported by the worker."""
import json
panels=[]
DS={"type":"prometheus","uid":"${datasource}"}
def s(m, extra=""):
    inner = 'namespace=~"$namespace", pod=~"$pod"' + (", " + extra if extra else "")
    return m + "{" + inner + "}"
def panel(title, exprs, unit, x, y, legend, w=12, h=8):
    targets=[{"expr":e,"legendFormat":legend[i],"refId":chr(65+i),"datasource":DS} for i,e in enumerate(exprs)]
    panels.append({"id":len(panels)+1,"type":"timeseries","title":title,"gridPos":{"x":x,"y":y,"w":w,"h":h},
                   "datasource":DS,"fieldConfig":{"defaults":{"unit":unit},"overrides":[]},"targets":targets,"options":{}})
dl = 'outcome="dead_lettered"'
panel("Throughput (documents/s)", ["sum(rate(%s[5m]))" % s("clinstream_documents_consumed_total"), "sum by (outcome) (rate(%s[5m]))" % s("clinstream_documents_finished_total")], "ops", 0,0, ["consumed","{{outcome}}"])
panel("Dead letters by reason (/s)", ["sum by (error_code) (rate(%s[5m]))" % s("clinstream_dead_letters_total")], "ops", 12,0, ["{{error_code}}"])
panel("Stage latency p50 per document", ["histogram_quantile(0.5, sum by (le, stage) (rate(%s[5m])))" % s("clinstream_stage_duration_seconds_bucket")], "s", 0,8, ["{{stage}}"])
panel("Stage latency p99 per document", ["histogram_quantile(0.99, sum by (le, stage) (rate(%s[5m])))" % s("clinstream_stage_duration_seconds_bucket")], "s", 12,8, ["{{stage}}"])
panel("In-flight documents", ["sum by (pod) (%s)" % s("clinstream_in_flight_documents")], "short", 0,16, ["{{pod}}"])
panel("Input (bytes/s)", ["sum(rate(%s[5m]))" % s("clinstream_input_bytes_total")], "Bps", 12,16, ["input"])
panel("CLEAR context tokens per note and variable", ["histogram_quantile(0.5, sum by (le) (rate(%s[5m])))" % s("clinstream_clear_context_tokens_bucket"), "histogram_quantile(0.99, sum by (le) (rate(%s[5m])))" % s("clinstream_clear_context_tokens_bucket")], "short", 0,24, ["p50","p99"])
panel("Mentions by entity kind (/s)", ["sum by (kind) (rate(%s[5m]))" % s("clinstream_mentions_total")], "ops", 12,24, ["{{kind}}"])
panel("Dead-letter share of finished documents", ["sum(rate(%s[5m])) / clamp_min(sum(rate(%s[5m])), 1e-9)" % (s("clinstream_documents_finished_total", dl), s("clinstream_documents_finished_total"))], "percentunit", 0,32, ["dead-lettered share"])
panel("Start-up time", ["max by (pod) (%s)" % s("clinstream_startup_duration_seconds")], "s", 12,32, ["{{pod}}"])
panel("Kafka consumer lag per partition (messages)", ["sum by (topic, partition) (%s)" % s("clinstream_consumer_lag_messages"), "sum by (topic) (deriv(%s[5m]))" % s("clinstream_kafka_committed_offset")], "short", 0,40, ["lag {{topic}}/{{partition}}","committed/s {{topic}}"])
panel("Kafka records produced (/s)", ["sum by (output) (rate(%s[5m]))" % s("clinstream_kafka_records_produced_total")], "ops", 12,40, ["{{output}}"])
panel("Kafka commits, retries, fetch requests (/s)", ["sum by (outcome) (rate(%s[5m]))" % s("clinstream_kafka_commits_total"), "sum by (operation) (rate(%s[5m]))" % s("clinstream_kafka_retries_total"), "sum by (pod) (rate(%s[5m]))" % s("clinstream_kafka_fetch_requests_total"), "sum by (pod) (rate(%s[5m]))" % s("clinstream_kafka_idle_pauses_total")], "ops", 0,48, ["commit {{outcome}}","retry {{operation}}","fetches {{pod}}","idle pauses {{pod}}"])
panel("Kafka partitions, pauses, rebalances", ["sum by (pod) (%s)" % s("clinstream_kafka_assigned_partitions"), "max by (pod) (%s)" % s("clinstream_kafka_paused"), "sum by (kind) (increase(%s[15m]))" % s("clinstream_kafka_rebalances_total")], "short", 12,48, ["assigned {{pod}}","paused {{pod}}","rebalances {{kind}}"])
panel("Embedding tokens/s", ["sum by (pod) (rate(%s[5m]))" % s("clinstream_embed_tokens_total"), "max by (pod) (%s)" % s("clinstream_embed_tokens_per_second")], "short", 0,56, ["tokens/s {{pod}}","latest batch {{pod}}"])
panel("Embedding batches (p50 inputs, p50 padded tokens)", ["histogram_quantile(0.5, sum by (le) (rate(%s[5m])))" % s("clinstream_embed_batch_items_bucket"), "histogram_quantile(0.5, sum by (le) (rate(%s[5m])))" % s("clinstream_embed_batch_tokens_bucket"), "histogram_quantile(0.99, sum by (le) (rate(%s[5m])))" % s("clinstream_embed_batch_duration_seconds_bucket")], "short", 12,56, ["inputs","padded tokens","p99 batch s"])
panel("Qdrant upsert latency p50/p99 and points/s", ["histogram_quantile(0.5, sum by (le, store) (rate(%s[5m])))" % s("clinstream_qdrant_upsert_duration_seconds_bucket"), "histogram_quantile(0.99, sum by (le, store) (rate(%s[5m])))" % s("clinstream_qdrant_upsert_duration_seconds_bucket"), "sum by (operation) (rate(%s[5m]))" % s("clinstream_qdrant_points_total"), "sum(rate(%s[5m]))" % s("clinstream_qdrant_retries_total"), "histogram_quantile(0.99, sum by (le) (rate(%s[30m])))" % s("clinstream_qdrant_maintenance_duration_seconds_bucket")], "s", 0,64, ["p50 {{store}}","p99 {{store}}","{{operation}}/s","retries/s","embedded maintenance p99"])
panel("Chunks per document (p50/p99)", ["histogram_quantile(0.5, sum by (le) (rate(%s[5m])))" % s("clinstream_chunks_per_document_bucket"), "histogram_quantile(0.99, sum by (le) (rate(%s[5m])))" % s("clinstream_chunks_per_document_bucket")], "short", 12,64, ["p50","p99"])
panel("FHIR fetches by outcome", ["sum by (outcome) (rate(%s[5m]))" % s("clinstream_fhir_fetches_total")], "reqps", 0,72, ["{{outcome}}"])
panel("FHIR fetch latency (p50, p99)", ["histogram_quantile(0.99, sum by (le) (rate(%s[5m])))" % s("clinstream_fhir_fetch_duration_seconds_bucket"), "histogram_quantile(0.5, sum by (le) (rate(%s[5m])))" % s("clinstream_fhir_fetch_duration_seconds_bucket")], "s", 12,72, ["p99","p50"])
panel("Query service requests by route and status (/s), p99 latency", ["sum by (route, status) (rate(%s[5m]))" % s("clinstream_api_requests_total"), "histogram_quantile(0.99, sum by (le, route) (rate(%s[5m])))" % s("clinstream_api_request_duration_seconds_bucket")], "reqps", 0,80, ["{{route}} {{status}}","p99 s {{route}}"])
panel("Query service access: denials by reason, audit records (/s)", ["sum by (reason) (rate(%s[5m]))" % s("clinstream_api_denials_total"), "sum by (sink, outcome) (rate(%s[5m]))" % s("clinstream_audit_records_total")], "reqps", 12,80, ["denied {{reason}}","audit {{sink}} {{outcome}}"])
panel("LLM generations (/v1/answer) by outcome (/s), p99 time, refused citations", ["sum by (outcome) (rate(%s[5m]))" % s("clinstream_llm_requests_total"), "histogram_quantile(0.99, sum by (le) (rate(%s[5m])))" % s("clinstream_llm_request_duration_seconds_bucket"), "sum(rate(%s[5m]))" % s("clinstream_llm_citations_refused_total")], "reqps", 0,88, ["{{outcome}}","p99 s","refused citations/s"], w=24)
panels.append({"id":len(panels)+1,"type":"table","title":"Build info","gridPos":{"x":0,"y":96,"w":24,"h":6},"datasource":DS,
  "targets":[{"expr":"max by (pod, version, lexicon_version, model, execution_provider) (%s)" % s("clinstream_build_info"),"format":"table","instant":True,"refId":"A","datasource":DS}],
  "fieldConfig":{"defaults":{},"overrides":[]},"options":{}})
dash={"title":"clinstream","uid":"clinstream","schemaVersion":39,"version":1,"editable":True,"time":{"from":"now-6h","to":"now"},
 "refresh":"30s","tags":["clinstream"],
 "templating":{"list":[
   {"name":"datasource","type":"datasource","query":"prometheus","current":{}},
   {"name":"namespace","type":"query","datasource":DS,"query":"label_values(clinstream_build_info, namespace)","includeAll":True,"multi":True,"current":{}},
   {"name":"pod","type":"query","datasource":DS,"query":"label_values(clinstream_build_info{namespace=~\"$namespace\"}, pod)","includeAll":True,"multi":True,"current":{}}]},
 "panels":panels,"annotations":{"list":[]}}
open('dashboards/clinstream.json','w').write(json.dumps(dash, indent=2)+"\n")
