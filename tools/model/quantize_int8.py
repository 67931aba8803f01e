"""model.int8.onnx: the fp32 encoder with its MatMul weights dynamically quantized to int8 (ONNX Runtime's own
quantize_dynamic from the pinned onnxruntime 1.31.1 wheel: signed int8 weights with one scale per output channel,
activations quantized per batch at run time). Per-tensor scales lost 3-7 points of cosine to fp32 on the six
reference sentences (tests/data/minilm_reference.json), one scale per channel 0.6-1.5 points. The pooling and normalisation stay fp32. Deterministic: the same input gives the same bytes,
so tools/model/SHA256SUMS pins the output.

Usage: quantize_int8.py MODEL.onnx OUT.onnx
"""
import logging
import sys

from onnxruntime.quantization import QuantType, quantize_dynamic

logging.getLogger().setLevel(logging.ERROR)  # its "consider pre-processing" hint is for CNNs with static shapes
quantize_dynamic(sys.argv[1], sys.argv[2], weight_type=QuantType.QInt8, per_channel=True)
