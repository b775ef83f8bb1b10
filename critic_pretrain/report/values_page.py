"""What ``values.html`` shows: a few held-out rollouts of the checkpoint a report picks, token by token.

For each run the page takes ``PAGE_ROLLOUTS`` rollouts of the rows its calibration evaluates (the
run's own held-out sets, ``eval.held_out_sets``; shared evenly between the `val` and `val_response`
sets), spread evenly over their returns within each set (the lowest and the highest included), and
runs the checkpoint on each of them:

- ``values``: ``model.token_values`` of the rollout alone, with ``eval``'s numerics (bf16 autocast on
  CUDA where training used it); the value of token ``t`` is the head on the hidden state at ``t - 1``:
  the value PPO reads for the action at ``t``;
- ``advantages``: the one-step advantage ``delta_t = r_t + gamma * V(s_t') - V(s_t)``, ``t'`` the next
  policy token (carry-forward across prompt and tool tokens, 0 after the last): ``targets.compute_gae``
  with lambda 0 on the micro-batch's policy rows, the alignment PPO's advantages have here;
- the rewards and value targets the critic was trained on (``data.collate_packed``: after the run's
  reward transform; a rollout cut at ``max_length`` carries its return on the last kept policy token).

Tokens are decoded with the checkpoint's tokenizer (``value/tokenizer/``, else the run's
``model.tokenizer`` / ``model.name_or_path`` when it is a local folder), never with remote code and
only when its vocabulary is the one the checkpoint records; else the page shows token ids.

Where ``critic-pretrain audit`` ran on that step (``<run>/eval/step_<n>-audit.json``), audited rollouts
are shown first and each cut carries the policy's Monte-Carlo value: audit rows are matched by
``row_hash`` (xxh3-64 of the token ids, ``RolloutStore.row_hashes``). Library code: prints nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from rollouts import fileio

from ..errors import UserError
from .calibration import checkpoint_to_draw
from .runs import RunData
from .summary import pick_checkpoint

PAGE_ROLLOUTS = 6
PAGE_FILE = "values.html"


@dataclasses.dataclass
class PageRollout:
    """One rollout as the page shows it; lists run over its (kept) tokens."""

    regime: str
    """The held-out set's label (``data.REGIMES``)."""
    group: str
    """Its ``split_key`` (``group_id``, else ``sample_id``): the prompt."""
    row: int
    """Its row in the prepared store."""
    row_hash: str
    """xxh3-64 of its token ids (hex) when an audit was read (how audit rows are matched), else empty."""
    ids: list[int]
    text: list[str]
    """What each token shows: its decoded text, or its id without a tokenizer."""
    piece: list[str]
    """The tokenizer's own token string (empty without a tokenizer)."""
    policy: list[bool]
    """The policy generated it (loss mask 1)."""
    values: list[float]
    """V(s_t) at every token."""
    advantages: list[float]
    """delta_t on policy tokens, nan elsewhere."""
    rewards: list[float]
    """r_t after the run's reward transform."""
    targets: list[float]
    """The stored value target (the return the critic was trained towards) on policy tokens, 0 elsewhere."""
    outcome: float
    """The rollout's return from its first policy token, in target units."""
    prompt_only: float
    """The leave-one-out mean return of the prompt's other rollouts (nan: it has none)."""
    length: int
    """Tokens in the rollout (more than ``ids`` when cut at ``max_length``)."""
    oracle: list[float] | None = None
    """True values in target units where the rollouts carry them (synthetic rollouts), else None."""
    cuts: dict[int, dict] = dataclasses.field(default_factory=dict)
    """Audit cut position -> ``{mc, mc_se, critic, samples, ...}`` as the audit wrote it."""


@dataclasses.dataclass
class ValuesPage:
    """One run's section of the page."""

    run: str
    step_dir: Path
    step: int | None
    gamma: float
    lam: float
    transform: dict
    decoded: str
    """How tokens are shown: which tokenizer, or why ids."""
    audit: str | None
    """What the audit contributed (None: no audit of this step)."""
    rollouts: list[PageRollout]
    problem: str | None = None
    """Why no rollout is shown (e.g. the run's rollouts moved since training), else None."""


def write_values_page(runs: list[RunData], out_dir: str | os.PathLike, *, rollouts: int = PAGE_ROLLOUTS,
                      device: str | torch.device | None = None) -> list[Path]:
    """Write ``values.html`` into ``out_dir`` for the checkpoint each run's report picks
    (``pick_checkpoint``, else the newest); [] when no run has a checkpoint with validation rows
    (or ``rollouts`` is 0), else [the page]. A run whose rollouts cannot be read back gets a
    section that says why."""
    from .values_html import render_page

    pages = []
    for run in runs:
        step_dir = checkpoint_to_draw(run.path, pick_checkpoint(run)[1]) if rollouts > 0 else None
        if step_dir is None:
            continue
        try:
            pages.append(values_page(step_dir, run.name, rollouts, device=device))
        except UserError as e:  # the page says why; the rest of the report stands
            pages.append(ValuesPage(run.name, step_dir, None, math.nan, math.nan, {}, "", None, [], problem=str(e)))
    if not pages:
        return []
    path = Path(out_dir) / PAGE_FILE
    fileio.write_text(path, render_page(pages))
    return [path]


@torch.no_grad()
def values_page(step_dir: str | os.PathLike, run_name: str, n: int = PAGE_ROLLOUTS, *,
                device: str | torch.device | None = None, seed: int = 0) -> ValuesPage:
    """``n`` held-out rollouts of checkpoint ``step_dir`` with their per-token values and advantages."""
    from .. import checkpoint as ckpt
    from ..config_io import load_config
    from ..data import REGIMES, collate_packed, max_length_of, reward_transform
    from ..eval import (
        checkpoint_model_config,
        eval_autocast,
        held_out_sets,
        load_checkpoint_model,
        resolve_device,
    )
    from ..eval.advantage import GroupStats
    from ..eval.audit import default_out as audit_path
    from ..eval.from_checkpoint import checked_step_dir
    from ..model import position_limit, token_values

    step_dir = checked_step_dir(str(step_dir))
    paths = ckpt.StepPaths(step_dir)
    cfg = load_config(paths.config_yaml)
    dev = resolve_device(device)
    configs = checkpoint_model_config(step_dir, cfg)
    max_length = max_length_of(cfg.data, position_limit(configs[1]))
    sets = held_out_sets(step_dir, cfg, configs)
    audit = read_audit(audit_path(step_dir))
    hashes = {id(h.store): [f"{x:016x}" for x in h.store.row_hashes()] for h in sets} if audit else {}
    picked = pick_held_out(sets, n, seed, audit, hashes)
    manifest = ckpt.Manifest.read(step_dir) or ckpt.Manifest({})
    tokenizer, decoded = load_tokenizer(paths.tokenizer_dir, cfg.model, manifest.tokenizer)
    model = load_checkpoint_model(step_dir, cfg, dev, configs=configs)
    stats = [GroupStats.of(h.store, h.idx) for h in sets]
    gamma = float(cfg.targets.gamma)
    out = []
    for i, row in picked:
        store = sets[i].store
        batch = collate_packed(store, np.array([row]), max_length, with_rewards=True).to(dev)
        with eval_autocast(dev, cfg.train.mixed_precision):                                          # as `eval`
            values = token_values(model, batch.input_ids, batch.position_ids, seq_lens=batch.seq_lens)  # [1, N]
        delta = one_step_advantages(values, batch, gamma)                                            # [1, N]
        ids = batch.input_ids[0].tolist()
        policy = (batch.weights[0] > 0).tolist()
        text, piece = token_texts(tokenizer, ids)
        row_hash = hashes[id(store)][row] if audit else ""
        out.append(PageRollout(
            regime=REGIMES[sets[i].regime], group=str(store.table.column("split_key")[row].as_py()), row=row,
            row_hash=row_hash, ids=ids, text=text, piece=piece, policy=policy, values=values[0].tolist(),
            advantages=[d if p else math.nan for d, p in zip(delta[0].tolist(), policy)],
            rewards=batch.rewards[0].tolist(), targets=batch.targets[0].tolist(),
            outcome=float(batch.outcome[0]), prompt_only=stats[i].loo_mean[row], length=int(store.lengths[row]),
            oracle=batch.oracle[0].tolist() if batch.oracle is not None else None,
            cuts={int(c["position"]): c for c in audit.get(row_hash, [])} if audit else {}))
    info = ckpt.StepPaths(step_dir).read_training_info() or {}
    lam = cfg.targets.lam_at(info.get("total_steps") or 0, cfg.train.max_steps)  # targets.lam_end: this step's
    return ValuesPage(run=run_name, step_dir=step_dir, step=info.get("total_steps"), gamma=gamma,
                      lam=float(lam), transform=reward_transform(cfg.targets).to_dict(), decoded=decoded,
                      audit=audit_note(audit, out) if audit else None, rollouts=out)


def pick_held_out(sets, n: int, seed: int, audit: dict | None, hashes: dict) -> list[tuple[int, int]]:
    """(set index, store row) of ``n`` rollouts of the held-out ``sets``: shared between the sets
    (``shares``), spread over each set's returns, audited ones first (``hashes``: store id -> row
    hashes, as ``read_audit`` keys them)."""
    picked = []
    for i, (h, share) in enumerate(zip(sets, shares(n, [len(h.idx) for h in sets]))):
        outcome = h.store.table.column("outcome").to_numpy().astype(np.float64)[h.idx]
        audited = np.array([hashes[id(h.store)][r] in audit for r in h.idx], bool) if audit else None
        picked += [(i, int(h.idx[j])) for j in pick_rows(outcome, share, seed, prefer=audited)]
    return picked


def one_step_advantages(values: torch.Tensor, batch, gamma: float) -> torch.Tensor:
    """[1, N] ``delta_t = r_t + gamma * V(s_t') - V(s_t)`` on the policy tokens of a packed batch
    (0 elsewhere): ``targets.compute_gae`` with lambda 0 on ``batch.policy_rows()``, as the
    evaluation's advantages (``t'``: the next policy token of the rollout; V = 0 after its last)."""
    from ..targets import compute_gae

    pr = batch.policy_rows()
    adv, _ = compute_gae(pr.rows(batch.rewards), pr.mask, gamma=gamma, lam=0.0, values=pr.rows(values))
    return pr.packed(adv, batch.input_ids.shape[1])


def shares(n: int, sizes: list[int]) -> list[int]:
    """``n`` split over sets of ``sizes`` as evenly as they allow (every regime shows)."""
    out = [0] * len(sizes)
    while sum(out) < n and any(o < s for o, s in zip(out, sizes)):
        for k, size in enumerate(sizes):
            if out[k] < size and sum(out) < n:
                out[k] += 1
    return out


def pick_rows(outcome: np.ndarray, n: int, seed: int = 0, prefer: np.ndarray | None = None) -> list[int]:
    """Indices of ``n`` items spread evenly over the ranks of ``outcome`` (the lowest and the
    highest included; ties in a seeded order), from the ``prefer`` ones first (e.g. audited),
    highest outcome first."""
    rng = np.random.default_rng(seed)
    tie = rng.permutation(len(outcome))
    prefer = np.zeros(len(outcome), bool) if prefer is None else np.asarray(prefer, bool)
    picked: list[int] = []
    for pool in (np.flatnonzero(prefer), np.flatnonzero(~prefer)):
        want = min(n - len(picked), len(pool))
        if want <= 0:
            continue
        order = pool[np.lexsort((tie[pool], outcome[pool]))]
        picked += order[np.unique(np.round(np.linspace(0, len(order) - 1, want)).astype(int))].tolist()
    return sorted(picked, key=lambda j: (-outcome[j], tie[j]))


def load_tokenizer(saved: Path, model_cfg, recorded: dict | None) -> tuple[object | None, str]:
    """(tokenizer, how tokens are shown): the checkpoint's ``value/tokenizer/``, else the run's
    ``model.tokenizer`` / ``model.name_or_path`` from local files; no remote code, and only a
    vocabulary that equals the one the checkpoint records (``recorded``: its fingerprint)."""
    from transformers import AutoTokenizer

    from rollouts.tokenizer import differences, fingerprint

    sources = [(saved, "the checkpoint's tokenizer (value/tokenizer)")] if saved.is_dir() else []
    sources += [(s, f"the run's tokenizer {s}") for s in dict.fromkeys((model_cfg.tokenizer, model_cfg.name_or_path))
                if s]
    why = "the checkpoint carries no tokenizer (a random-init model or model.tokenizer unset)"
    for src, label in sources:
        try:
            tok = AutoTokenizer.from_pretrained(str(src), trust_remote_code=False, local_files_only=True)
        except Exception as e:  # any loading failure (missing files, remote code, old formats): show ids
            why = f"{label} does not load here ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
            continue
        if recorded and differences(recorded, fingerprint(tok))[0]:
            why = f"{label} has another vocabulary than the checkpoint records"
            continue
        return tok, f"decoded with {label}"
    return None, f"token ids: {why}"


def token_texts(tokenizer, ids: list[int]) -> tuple[list[str], list[str]]:
    """(text each token shows, its token string): each id decoded on its own, special tokens
    kept (a byte split across tokens shows as U+FFFD); the ids themselves without a tokenizer."""
    if tokenizer is None:
        return [str(i) for i in ids], [""] * len(ids)
    pieces = [str(p) for p in tokenizer.convert_ids_to_tokens(ids)]
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return [t if t else p for t, p in zip(texts, pieces)], pieces


def read_audit(path: Path) -> dict[str, list[dict]] | None:
    """``row_hash`` -> the cuts ``critic-pretrain audit`` wrote for that rollout; None without an
    audit file (or an unreadable one: the page does without MC values)."""
    try:
        audit = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    rows = audit.get("rows") if isinstance(audit, dict) else None
    if not isinstance(rows, list):
        return None
    found = {r["row_hash"]: [c for c in r.get("cuts", []) if isinstance(c, dict) and "position" in c]
             for r in rows if isinstance(r, dict) and r.get("row_hash")}
    return found or None


def audit_note(audit: dict[str, list[dict]], shown: list[PageRollout]) -> str:
    matched = sum(1 for r in shown if r.cuts)
    if not matched:
        return (f"the audit of this step covers {len(audit)} rollouts, none of them in the run's held-out "
                "sets (it ran on other rollouts): no Monte-Carlo values on this page")
    return (f"{matched} of these rollouts were audited ({len(audit)} in the audit): the markers show the "
            "policy's Monte-Carlo value ± its standard error at each cut")
