"""Tokenizer fingerprints: token ids only mean something under the tokenizer that produced them.

``fingerprint(tokenizer)``: vocabulary size, special token ids and a hash of the whole
vocabulary. It is recorded by ``rollouts convert --tokenizer`` (``_rollouts.json`` next to the
shards), checked by training against the model's tokenizer, written into every checkpoint's
manifest, and compared by ``seed check`` with the PPO run's tokenizer. Another vocabulary
means every token id maps to another string: a critic trained across one is garbage.
transformers is imported only by ``fingerprint_of`` (this package stays torch-free).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .errors import UserError
from .provenance import SYNTH_MANIFEST, is_synthetic, read_manifest, synth_manifest

SPECIAL = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")


def fingerprint(tokenizer) -> dict:
    """{vocab_size, special ids, vocab_sha256 (first 16 hex digits), class} of a HF tokenizer."""
    vocab = tokenizer.get_vocab()
    digest = hashlib.sha256(json.dumps(sorted(vocab.items()), ensure_ascii=False).encode()).hexdigest()[:16]
    return {"vocab_size": len(vocab), "special_ids": {k: getattr(tokenizer, k, None) for k in SPECIAL},
            "vocab_sha256": digest, "class": type(tokenizer).__name__}


def chat_template_sha256(tokenizer) -> str | None:
    """First 16 hex digits of SHA-256 over the tokenizer's chat template (a dict of named
    templates as sorted JSON), or None when it has none. The same ids under another template
    are other conversations."""
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return None
    text = template if isinstance(template, str) else json.dumps(template, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "tokenizer.model")
"""A folder holding none of these has no tokenizer (transformers 5 builds an empty one from the
model's config.json alone: one token, a "real tokenizer" to every check)."""


def has_tokenizer(folder: str | Path) -> bool:
    return any((Path(folder) / n).is_file() for n in TOKENIZER_FILES)


def load(folder: str | Path):
    """The tokenizer saved in ``folder`` (no remote code), or None without a loadable one."""
    return load_for_model(str(folder), explicit=False, trust_remote_code=False) if has_tokenizer(folder) else None


def load_for_model(src: str, *, explicit: bool, trust_remote_code: bool):
    """The tokenizer a run trains with: ``model.tokenizer`` (``explicit``: a failure is an error) or
    ``model.name_or_path`` (a folder or hub id without one: None, and checkpoints carry none)."""
    if Path(src).is_dir() and not has_tokenizer(src):
        if explicit:
            raise UserError(f"model.tokenizer={src!r} holds no tokenizer files ({', '.join(TOKENIZER_FILES)}); "
                            "pass a tokenizer folder")
        return None
    from transformers import AutoTokenizer
    try:
        return AutoTokenizer.from_pretrained(src, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError, TypeError) as e:
        if explicit:
            raise UserError(f"model.tokenizer={src!r}: cannot load it ({e}); pass a tokenizer folder") from None
        return None


def fingerprint_of(folder: str | Path) -> dict | None:
    """The fingerprint of the tokenizer saved in ``folder`` (no remote code), or None without one."""
    tokenizer = load(folder)
    return fingerprint(tokenizer) if tokenizer is not None else None


def differences(seed: dict, ppo: dict) -> tuple[list[str], list[str]]:
    """(errors, warnings) between the seed's fingerprint and the PPO run's."""
    errors, warnings = [], []
    if seed["vocab_sha256"] != ppo["vocab_sha256"] or seed["vocab_size"] != ppo["vocab_size"]:
        errors.append(f"vocabulary {ppo['vocab_size']} tokens (hash {ppo['vocab_sha256']}) vs the seed's "
                      f"{seed['vocab_size']} (hash {seed['vocab_sha256']})")
    for key in SPECIAL:
        a, b = seed["special_ids"].get(key), ppo["special_ids"].get(key)
        if a != b:
            warnings.append(f"{key.removesuffix('_id')} id {b} vs the seed's {a}")
    return errors, warnings


def describe(fp: dict | None) -> str:
    if not fp:
        return "unknown (no tokenizer recorded: a random-init model or model.tokenizer unset)"
    ids = ", ".join(f"{k.removesuffix('_token_id')} {v}" for k, v in fp["special_ids"].items() if v is not None)
    return f"{fp['class']}, {fp['vocab_size']} tokens, vocab hash {fp['vocab_sha256']}" + (f" ({ids})" if ids else "")


def recorded(folder: str | Path | None) -> dict | None:
    """The tokenizer fingerprint recorded with the rollouts in ``folder`` (``_rollouts.json``)."""
    fp = read_manifest(folder).get("tokenizer") if folder is not None else None
    return fp if isinstance(fp, dict) else None


def mismatch(folder: str | Path | None, model_fp: dict | None) -> str | None:
    """Why the rollouts in ``folder`` cannot meet a model whose tokenizer is ``model_fp``, or None:
    a recorded tokenizer with another vocabulary, or synthetic rollouts (``rollouts synth``: ids
    of a toy vocabulary with no text) given to a model with a real tokenizer, whose ids are all
    in range and would pass every other check (a new user trained SmolLM2 on the bundled sample
    and got "OK ... a valid critic seed"). None when either side records nothing."""
    if model_fp is None or folder is None:
        return None
    fp = recorded(folder)
    if fp is not None:
        errors = differences(fp, model_fp)[0]
        if not errors:
            return None
        what = errors[0].replace("the seed's", "the rollouts'")
        return f"these rollouts were tokenized with another tokenizer than the model's (the model's {what})"
    if is_synthetic(folder):
        vocab = synth_manifest(folder).get("vocab_size")
        ids = f"ids of a {vocab}-token toy vocabulary" if vocab else "ids of a toy vocabulary"
        return (f"these are synthetic rollouts (rollouts synth, {SYNTH_MANIFEST}: {ids}, no text), and the model "
                f"has a real tokenizer ({describe(model_fp)}): its tokens would read them as other text (synthetic "
                "rollouts are for random-init models from model.config, as in the demo)")
    return None
