"""The outcome of a seed check: its problems, warnings and facts, and how the CLI prints it."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rollouts.provenance import RewardsLogged
from rollouts.tokenizer import describe as describe_tokenizer

from .frameworks import FRAMEWORKS, describe_head, describe_optimizer, describe_targets

log = logging.getLogger(__name__)


def left_out_note(quality: dict) -> str:
    """``; 2,200 more left out: the critic trained on them`` when a quality check left rollouts out
    (they would flatter it), else empty: a user who passed 2,400 rollouts reads why 200 were judged."""
    left = quality.get("trained_on_left_out") or 0
    return f"; {left:,} more left out: the critic trained on them" if left else ""


@dataclass(frozen=True)
class SeedProblem:
    """One failed check. ``area`` lets callers (export) decide which problems they repair."""

    area: str  # path | weights | keys | head | bias | arch | finite | info | manifest | optimizer
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass
class SeedReport:
    """The outcome of ``check_seed``: problems (each one line saying what to do), warnings,
    and the facts found (step, parameters, head, dtype, targets, optimizer...)."""

    path: Path
    target: str
    kind: str = "unknown"  # "step": a step_<n> tree; "hf": an exported Hugging Face folder
    problems: list[SeedProblem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def fail(self, area: str, message: str) -> None:
        self.problems.append(SeedProblem(area, message))

    def warn(self, message: str) -> None:
        self.warnings.append(message)

    def to_dict(self) -> dict:
        return {"path": str(self.path), "target": self.target, "kind": self.kind, "ok": self.ok,
                "problems": [asdict(p) for p in self.problems], "warnings": list(self.warnings),
                "facts": self.facts}

    @property
    def export_source(self) -> bool:
        """A step_<n> folder checked for a target that loads an export of it, not the folder itself."""
        return self.kind == "step" and self.target != "nemo-rl"

    def summary(self) -> str:
        """Human-readable report: the verdict, the facts, then what the target needs."""
        f = self.facts
        if not self.ok:
            return "\n".join([f"FAILED  {self.path} is not a usable {self.target} critic seed "
                              f"({len(self.problems)} problem(s))"]
                             + [f"  verdict on {line.replace('**', '')}"
                                for line in (f.get("quality") or {}).get("verdicts") or []])
        lines = [f"OK  {self.path} is a valid critic seed for {self.target}" if not self.export_source else
                 f"OK  {self.path} is a valid source for a {self.target} export ({self.target} loads the exported "
                 "folder, not a step_<n>: export it, as the last line says)"]
        arch = f.get("arch", {})
        shape = ", ".join(f"{k} {v}" for k, v in (("hidden", arch.get("hidden_size")),
                                                    ("layers", arch.get("num_layers")),
                                                    ("vocab", arch.get("vocab_size"))) if v is not None)
        lines.append(f"  step {f.get('step', '?')} · {f.get('parameters', 0):,} parameters · "
                     f"{'/'.join(f.get('dtypes', [])) or '?'} · {arch.get('model_type', '?')}: {shape}")
        lines.append(f"  head: {describe_head(f.get('head', {}))}")
        norm = f.get("normalization") or {}
        if norm.get("mean") is not None:
            lines.append(f"  config.json mean {norm['mean']:.6g}, std {norm['std']:g}: OpenRLHF applies "
                         "(value - mean) / std only with --normalize_reward / --reward.normalize_enable")
        lines.append(f"  trained on: {describe_targets(f.get('targets'))}")
        logged = (f.get("rewards") or {}).get("logged")
        if logged:
            r = RewardsLogged.from_dict(logged)
            lines.append(f"  rewards relative to the reward function's: the rollouts logged them as {r.formula()} "
                         f"({r.stated_by})")
        if self.kind == "step":
            lines.append(f"  tokenizer: {describe_tokenizer(f.get('tokenizer_fingerprint'))}")
        if f.get("training_info"):
            info = f["training_info"]
            headline = ("val:loss", "val:explained_variance", "val:oracle_loss", "val:oracle_explained_variance")
            val = ", ".join(f"{k} {info[k]:.4g}" for k in headline if isinstance(info.get(k), float))
            lines.append(f"  training: total_steps {info.get('total_steps')}" + (f", {val}" if val else ""))
        q = f.get("quality")
        if q and "critic" in q and "call" in q:
            lines.append(f"  quality on the current policy ({q['rows']:,} rollouts{left_out_note(q)}): PASSED, "
                         f"{q['measure']}: helps")
        elif q and "critic" in q:
            judged = f"{q['rows']:,} rollouts" + (f", {q['tokens']} turn-first tokens" if q.get("tokens") else "")
            lines.append(f"  quality on the current policy ({judged}{left_out_note(q)}): PASSED, {q['measure']} "
                         f"{q['critic']:.3f} > group-mean baseline {q['baseline']:.3f} (margin "
                         f"{q['critic'] - q['baseline']:.3f}; a small margin may be noise: check more rollouts)")
            if q.get("explained_variance") is not None:
                ceiling = f" (true values: {q['ceiling']:.3f})" if q.get("ceiling") is not None else ""
                lines.append(f"  explained variance there: {q['explained_variance']:.3f}{ceiling}; a low one means "
                             "the value levels are off for this policy, which PPO's first steps re-learn")
        for line in (q or {}).get("verdicts") or []:
            lines.append(f"  verdict on {line.replace('**', '')}")
        opt = f.get("optimizer")
        if self.kind == "step":
            lines.append("  optimizer: " + (describe_optimizer(opt) if opt else "none (the PPO run builds a fresh one)")
                         + (" (NeMo-RL since PR #4213 ignores it on a warm start; --legacy-nemo-rl checks it for "
                            "older versions)" if opt and self.target == "nemo-rl" and not f.get("legacy_nemo_rl")
                            else ""))
        lines.append(f"  {self.target} needs: {FRAMEWORKS[self.target].needs}")
        return "\n".join(lines)
