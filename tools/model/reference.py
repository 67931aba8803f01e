"""Reference sentence embeddings for the embedder test, computed WITHOUT ONNX: a plain numpy forward pass of the
BERT encoder read straight from model.safetensors (tokens from the model's own tokenizer.json through the
`tokenizers` package), masked mean pooling and L2 normalisation, as sentence-transformers does.

    python3 tools/model/reference.py MODEL_DIR > tests/data/minilm_reference.json

Needs numpy and tokenizers (pip). The output is committed; `tests/embed.rs` compares the worker's vectors with it
(cosine >= 0.999), so the ONNX graph, ONNX Runtime and the Rust tokenizer/pooling are all checked against code
that shares none of them."""
import json, math, sys
import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bert_safetensors_to_onnx import load_safetensors  # reads tensors only; builds no graph

SENTENCES = [
    "This is an example sentence",
    "Each sentence is converted",
    "The patient denies chest pain or shortness of breath.",
    "Assessment and plan: community-acquired pneumonia, start ceftriaxone and azithromycin.",
    "Mother with type 2 diabetes mellitus; father had a myocardial infarction at 54.",
    "Hemoglobin A1c 8.2 %, creatinine 1.4 mg/dL, potassium 5.1 mmol/L.",
]


def erf(x):
    return np.vectorize(math.erf)(x).astype(np.float32)


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def forward(W, cfg, ids):
    H, nH, L = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_hidden_layers"]
    dh, eps = H // nH, float(cfg.get("layer_norm_eps", 1e-12))
    S = len(ids)
    x = W["embeddings.word_embeddings.weight"][ids] + W["embeddings.position_embeddings.weight"][:S] \
        + W["embeddings.token_type_embeddings.weight"][np.zeros(S, dtype=np.int64)]
    x = layer_norm(x, W["embeddings.LayerNorm.weight"], W["embeddings.LayerNorm.bias"], eps)
    lin = lambda t, p: t @ W[p + ".weight"].T + W[p + ".bias"]
    for i in range(L):
        p = f"encoder.layer.{i}"
        q = lin(x, p + ".attention.self.query").reshape(S, nH, dh).transpose(1, 0, 2)
        k = lin(x, p + ".attention.self.key").reshape(S, nH, dh).transpose(1, 0, 2)
        v = lin(x, p + ".attention.self.value").reshape(S, nH, dh).transpose(1, 0, 2)
        sc = q @ k.transpose(0, 2, 1) / np.sqrt(dh)
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        ctx = (sc / sc.sum(-1, keepdims=True)) @ v
        ctx = ctx.transpose(1, 0, 2).reshape(S, H)
        x = layer_norm(lin(ctx, p + ".attention.output.dense") + x,
                       W[p + ".attention.output.LayerNorm.weight"], W[p + ".attention.output.LayerNorm.bias"], eps)
        hh = lin(x, p + ".intermediate.dense")
        g = 0.5 * hh * (1.0 + erf(hh / np.sqrt(2.0)))
        x = layer_norm(lin(g, p + ".output.dense") + x,
                       W[p + ".output.LayerNorm.weight"], W[p + ".output.LayerNorm.bias"], eps)
    pooled = x.mean(0)
    return pooled / np.linalg.norm(pooled)


def main():
    model_dir = sys.argv[1]
    cfg = json.load(open(f"{model_dir}/config.json"))
    W = load_safetensors(f"{model_dir}/model.safetensors")
    W = {k[5:] if k.startswith("bert.") else k: v.astype(np.float64) for k, v in W.items()}
    tok = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tok.no_padding()  # the file pads to 128; sentence-transformers pools over real tokens only
    out = []
    for s in SENTENCES:
        ids = tok.encode(s).ids
        vec = forward(W, cfg, np.array(ids, dtype=np.int64))
        out.append({"text": s, "token_ids": ids, "vector": [round(float(v), 7) for v in vec]})
    json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2", "produced_by": "tools/model/reference.py",
               "sentences": out}, sys.stdout, indent=None)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
