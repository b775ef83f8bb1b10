"""What every export format writes with: the result record, the weights (load, cast, save),
file placement (hard link or copy), the tokenizer, our manifest in the export, key prefixes."""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import checkpoint as ckpt
from ..errors import UserError
from .frameworks import HEAD

HF_WEIGHTS = "model.safetensors"


@dataclass
class ExportResult:
    """What an export wrote and how the value head's bias was handled."""

    format: str
    source: Path
    out: Path                      # the folder to point the framework at
    head_bias: float | None        # the source head's bias (None: trained without one)
    bias_handling: str             # one sentence, also printed
    notes: list[str] = field(default_factory=list)
    config_lines: list[str] = field(default_factory=list)
    files: dict[str, str] = field(default_factory=dict)  # relative path -> "linked" | "copied" | "written"
    normalization: dict | None = None  # openrlhf: the mean/std written into config.json

    @property
    def config_text(self) -> str:
        return "\n".join(self.config_lines)

    def summary(self) -> str:
        written = sum(v == "written" for v in self.files.values())
        linked = sum(v == "linked" for v in self.files.values())
        copied = sum(v == "copied" for v in self.files.values())
        lines = [f"exported {self.source} -> {self.out} (format {self.format}: {written} written, "
                 f"{linked} hard-linked, {copied} copied)", f"  head bias: {self.bias_handling}"]
        lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines + ["", *self.config_lines])


def load_state(files: list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    return state


def prepare_state(state: dict[str, torch.Tensor], cast, *, add_bias: bool) -> dict[str, torch.Tensor]:
    if cast is not None:
        state = {k: v.to(cast) if v.is_floating_point() else v for k, v in state.items()}
    if add_bias and f"{HEAD}.bias" not in state:
        state[f"{HEAD}.bias"] = torch.zeros(1, dtype=state[f"{HEAD}.weight"].dtype)
    return state


def save_state(state: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata={"format": "pt"})


def place(src: Path, dst: Path, link: bool) -> str:
    """Hard-link (the checkpoint's files are never modified in place) or copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    if link:
        try:
            os.link(src, dst)
            return "linked"
        except OSError:  # another filesystem, or links not supported
            pass
    shutil.copy2(src, dst)
    return "copied"


def add_tokenizer(src_dir: Path, spec: str | None, dst_dir: Path, result: ExportResult, link: bool) -> None:
    if spec:
        from transformers import AutoTokenizer

        try:
            tok = AutoTokenizer.from_pretrained(spec)
        except (OSError, ValueError) as e:
            raise UserError(f"--tokenizer {spec}: cannot load it ({str(e).splitlines()[0][:200]}); "
                            "pass a tokenizer folder") from None
        before = set(dst_dir.glob("*")) if dst_dir.exists() else set()
        tok.save_pretrained(str(dst_dir))
        for f in sorted(set(dst_dir.glob("*")) - before):
            result.files[rel(f, result.out)] = "written"
        result.notes.append(f"tokenizer: from {spec}")
    elif src_dir.is_dir():
        for f in sorted(src_dir.iterdir()):
            if f.is_file():
                result.files[rel(dst_dir / f.name, result.out)] = place(f, dst_dir / f.name, link)
        result.notes.append("tokenizer: copied from the checkpoint")
    else:
        result.notes.append("tokenizer: none known (pass --tokenizer; NeMo-RL takes value.tokenizer.name, verl "
                            "critic.model.tokenizer_path, TRL/OpenRLHF the policy's tokenizer)")


def write_export_manifest(src_root: Path, dst_root: Path, fmt: str, *, dtype, add_bias: bool, files_list: bool,
                          optimizer: str) -> None:
    """Our manifest, with where the export came from; a step tree gets a fresh file list
    (so ``find_checkpoints``/``verify`` accept it), an HF folder none."""
    exported = {"format": fmt, "from": str(src_root.resolve()), "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "dtype": dtype_name(dtype) if dtype else None, "head_bias_added": add_bias, "optimizer": optimizer}
    ckpt.write_export_manifest(src_root, dst_root, exported, ckpt.files_manifest(dst_root) if files_list else None)


def rel(path: Path, root: Path) -> str:
    return str(Path(path).relative_to(root))


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def reprefix(key: str, config, prefix: str) -> str:
    """Token-classification backbone prefix -> the AutoModel's (the same for most models)."""
    from transformers import AutoModelForTokenClassification

    src_prefix = AutoModelForTokenClassification._model_mapping[type(config)].base_model_prefix
    if key.startswith(f"{src_prefix}.") and src_prefix != prefix:
        return f"{prefix}.{key[len(src_prefix) + 1:]}"
    return key
