#!/usr/bin/env python3
"""Turns a GGUF model into a Hugging Face safetensors directory vLLM loads (no model hub needed).

    python scripts/vllm_model.py                     # SmolLM2-135M-Instruct (scripts/fetch_smollm2.sh)
    python scripts/vllm_model.py --gguf X.gguf --out DIR

Run with the vLLM venv's python (scripts/setup-vllm.sh: transformers, gguf, accelerate). transformers
dequantizes the GGUF; a GGUF-loaded model refuses save_pretrained, so the state dict is written with
safetensors and the config without its quantization_config. Prints the directory. Idempotent: a
directory with its stamp file is kept. Default output:
${TQKV_CACHE_DIR:-$HOME/.cache/tqkv}/hf-SmolLM2-135M-Instruct-Q4_1.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TQKV_CACHE_DIR", Path.home() / ".cache" / "tqkv"))


def convert(gguf: Path, out: Path, dtype: str) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch_dtype = getattr(torch, dtype)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch_dtype)
    tok.save_pretrained(str(tmp))
    state = {k: v.to(torch_dtype).contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shared with the embeddings; safetensors refuses aliases
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg["architectures"] = [type(model).__name__]
    cfg["torch_dtype"] = dtype
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    if model.generation_config is not None:
        model.generation_config.save_pretrained(str(tmp))
    (tmp / ".tqkv-ready").write_text(gguf.name + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", type=Path, help="the GGUF (default: SmolLM2 via fetch_smollm2.sh)")
    ap.add_argument("--out", type=Path, help="the output directory")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    a = ap.parse_args()
    gguf = a.gguf
    if gguf is None:
        r = subprocess.run([str(ROOT / "scripts" / "fetch_smollm2.sh")], capture_output=True,
                           text=True)
        if r.returncode != 0:
            sys.stderr.write(r.stderr)
            print("vllm_model: fetching the SmolLM2 GGUF failed", file=sys.stderr)
            return 3
        gguf = Path(r.stdout.strip().splitlines()[-1])
    out = a.out or CACHE / ("hf-" + gguf.name.removesuffix(".gguf").replace(".", "-"))
    if a.dtype != "bfloat16" and a.out is None:
        out = out.with_name(out.name + "-" + a.dtype)
    if not (out / ".tqkv-ready").exists():
        convert(gguf, out, a.dtype)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
