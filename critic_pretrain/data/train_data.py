"""Everything a training run needs from the data: the stores, the split, what truncation leaves."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DataConfig, TargetsConfig
from ..errors import UserError
from .sampling import effective_lengths, max_length_of, split_by_group, split_by_response, weighted_rows
from .store import RolloutStore, check_bad_fraction, prepare_store

log = logging.getLogger(__name__)



REGIMES = {"prompt": "prompts it never trained on", "response": "fresh responses to prompts it trained on"}
"""The two held-out regimes (``data.val_split``; ``eval`` and ``seed check`` split other rollouts by
the same rule), as every report names them (docs/warm.md, *Should I use this seed?*)."""


@dataclass(frozen=True)
class ValSet:
    """One held-out set: its rows of a store, the regime they measure and the metric prefix."""

    regime: str
    """`prompt` (prompts the critic never trained on) or `response` (fresh responses to prompts
    it trained on: PPO's regime)."""
    prefix: str
    """`val` for the first set, `val_response` for the response regime of `data.val_split=both`."""
    store: RolloutStore
    idx: np.ndarray

    @property
    def label(self) -> str:
        return REGIMES[self.regime]


@dataclass
class TrainData:
    train: RolloutStore
    train_idx: np.ndarray
    """Rows of ``train`` used for training (after split and `overlong: skip`)."""
    train_len: np.ndarray
    """Their effective lengths (after `overlong: truncate`)."""
    val_sets: list[ValSet]
    """The held-out sets, the one logged as `val/` first; empty without validation."""
    max_length: int
    overlong_rows: int
    """Rollouts longer than max_length (truncated or skipped, by ``overlong_policy``)."""
    overlong_policy: str
    """`data.overlong`: truncate or skip."""
    capped_by_model: bool
    """max_length is the model's position limit, below `data.max_length` / `data.max_tokens`."""
    source_weights: np.ndarray
    """Sampling weight of each training source (indexed by the store's `source` column)."""
    policy_tokens: int = 0
    """Policy tokens of the training rollouts after truncation: what the loss sees."""
    without_policy: int = 0
    """Training rollouts left out: no policy token within max_length (a prompt that long)."""
    val_groups: tuple[int, int] = (0, 0)
    """(held-out groups, all groups) of the prompt split by `val_fraction`; (0, 0) with `data.val`."""

    @property
    def val(self) -> RolloutStore:
        """The store of the first held-out set (``train`` when there is none)."""
        return self.val_sets[0].store if self.val_sets else self.train

    @property
    def val_idx(self) -> np.ndarray:
        """Rows of the first held-out set, logged as `val/` (empty without validation)."""
        return self.val_sets[0].idx if self.val_sets else np.zeros(0, np.int64)

    @functools.cached_property
    def trained_hashes(self) -> dict[str, np.ndarray]:
        """{"prompts", "rollouts"}: sorted unique uint64 hashes (``RolloutStore.row_hashes``) of the
        training rows' prompts (the tokens before each first policy token) and of the rows
        themselves, saved with every checkpoint so that `eval` and `seed check --rollouts` can
        tell fresh responses to trained prompts (PPO's regime) from new prompts, and leave out
        rollouts the critic trained on. Two passes over the training rows, on first use."""
        return {"prompts": np.unique(self.train.row_hashes(prompt_only=True)[self.train_idx]),
                "rollouts": np.unique(self.train.row_hashes()[self.train_idx])}

    def val_rows(self) -> dict[str, int]:
        """{regime: held-out rows}, for the manifest (a resume compares them)."""
        return {v.regime: len(v.idx) for v in self.val_sets}

    def epoch(self, seed: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's rollouts and lengths after source weights (see ``weighted_rows``)."""
        return weighted_rows(self.train_idx, self.train_len, self.train.source[self.train_idx],
                             self.source_weights, seed=seed, epoch=epoch)

    def describe(self) -> str:
        """The start-up ``data:`` line: what is trained, after truncation and every filter."""
        st = self.train.stats
        held = []
        for v in self.val_sets:
            how = (f"{self.val_groups[0]} of {self.val_groups[1]} prompts held out" if v.regime == "prompt" and
                   self.val_groups[1] else "from data.val" if v.regime == "prompt" else
                   f"responses of {len(set(v.store.split_keys_of(v.idx)))} training prompts held out")
            held.append(f"{len(v.idx)} for validation as {v.prefix}/: {how}")
        cut = "truncated" if self.overlong_policy == "truncate" else "skipped"
        return (f"{len(self.train_idx)} training rollouts ({'; '.join(held) or '0 for validation'}), "
                f"{int(self.train_len.sum()):,} tokens after truncation, {self.policy_tokens:,} policy tokens; "
                f"{self.overlong_rows} longer than max_length={self.max_length}"
                f"{' (the model position limit)' if self.capped_by_model else ''} {cut}"
                + f"; left out: {self.without_policy} with no policy token within max_length, "
                f"{st.duplicates} duplicate sample_ids, {st.bad_rows} bad rows, {st.bad_files} bad "
                f"files, {st.zero_weight_rows} zero-weight rows"
                + "".join(f", {n} by filter {k}" for k, n in st.filtered.items() if n))


MIN_POLICY_SHARE = 0.5
"""Training stops before step 1 when fewer than this share of the rollouts (training or
validation) keep a policy token after truncation: the window is then mostly prompt."""


def with_policy_left(store: RolloutStore, idx: np.ndarray, max_length: int, what: str, data: DataConfig
                     ) -> tuple[np.ndarray, int]:
    """(the rows of ``idx`` that keep a policy token after truncation to ``max_length``, their
    policy tokens). The others carry no loss and are left out (a step of them alone would train
    on nothing); a one-line UserError when fewer than MIN_POLICY_SHARE of the rows keep one."""
    kept = store.policy_tokens(max_length)[idx]
    with_policy = int((kept > 0).sum())
    if len(idx) and with_policy < MIN_POLICY_SHARE * len(idx):
        limits = f"data.max_tokens={data.max_tokens}" + (f", data.max_length={data.max_length}"
                                                         if data.max_length else "")
        raise UserError(f"only {with_policy} of {len(idx)} {what} rollouts keep a policy token after truncation to "
                        f"max_length={max_length} tokens ({limits}): the rest hold prompt tokens only and carry no "
                        "loss; raise data.max_tokens (and data.max_length), or data.overlong=skip to leave long "
                        "rollouts out")
    return idx[kept > 0], int(kept.sum())


def log_sources(data: DataConfig, kept: dict[str, int]) -> None:
    """With several sources, one line of what each kept (the start-up ``data:`` line gives totals
    only), and a warning for a source that trains nothing: every rollout filtered out or a repeat
    of an earlier source's sample_id (two `rollouts synth` archives with one --seed share all
    their ids), or a weight of 0. A trial's second source vanished behind the totals."""
    sources = data.all_sources()
    if len(sources) < 2:
        return
    rows = [(src.name or src.paths[0], kept.get(src.name or src.paths[0], 0), src.weight) for src in sources]
    log.info("data sources: %s", ", ".join(f"{name} {n:,} rollouts (weight {w:g})" for name, n, w in rows))
    for name, n, w in rows:
        if n == 0 or w == 0:
            log.warning("data source %s trains nothing: %s", name,
                        "its weight is 0" if n else "no rollout kept (its filters left none, or every sample_id "
                        "repeats an earlier source's: de-duplication keeps the first)")


def build_train_data(data: DataConfig, targets: TargetsConfig, cache_dir: Path, *, main_first, progress: bool,
                     model_limit: int | None = None, vocab_size: int | None = None) -> TrainData:
    """Prepare (or reuse) the stores and split them. ``main_first`` is a context manager that
    lets rank 0 build the stores before the other ranks read them. ``model_limit``: the
    model's position limit (caps `max_length`); ``vocab_size``: its vocabulary."""
    with main_first():
        train = prepare_store(data.all_sources(), cache_dir, data, targets, name="train", progress=progress,
                              vocab_size=vocab_size)
        val = (prepare_store(data.val, cache_dir, data, targets, name="val", vocab_size=vocab_size) if data.val
               else train)
    for store in {id(train): train, id(val): val}.values():
        check_bad_fraction(store.stats, data.max_bad_fraction, store.path.name, store.path / "quarantine.jsonl")
    log_sources(data, train.stats.sources)
    train_idx, held, val_groups = split(train, val, data)
    if data.recency_half_life:  # ages count from the newest version in the training data
        newest = None
        for store in {id(train): train, id(val): val}.values():
            r = store.set_recency(data.recency_half_life, newest)
            newest = r["newest"]
            log.info("%s data: recency weights, policy versions %d..%d, the oldest weigh %.3g (half-life %g "
                     "versions)%s%s", store.path.name, r["oldest"], r["newest"], r["oldest_weight"],
                     data.recency_half_life, f"; {r['without_version']} rollouts without a version weigh as the "
                     "oldest" if r["without_version"] else "",
                     "; one policy version only: the weights change nothing" if r["oldest"] == r["newest"] else "")
    max_length = max_length_of(data, model_limit)
    overlong_rows = int((train.lengths[train_idx] > max_length).sum())
    train_idx, _ = effective_lengths(train, train_idx, max_length, data.overlong)
    rows = len(train_idx)
    train_idx, policy = with_policy_left(train, train_idx, max_length, "training", data)
    without = rows - len(train_idx)
    train_len = np.minimum(train.lengths[train_idx], max_length)
    val_sets = [ValSet(regime, prefix, store, with_policy_left(store, idx, max_length, f"{prefix} validation",
                                                               data)[0])
                for regime, prefix, store, idx in held]
    weights = np.array([s.weight for s in data.all_sources()], dtype=np.float64)
    return TrainData(train, train_idx, train_len, val_sets, max_length, overlong_rows, data.overlong,
                     max_length < max_length_of(data), weights, policy_tokens=policy, without_policy=without,
                     val_groups=val_groups)


def split(train: RolloutStore, val: RolloutStore, data: DataConfig
          ) -> tuple[np.ndarray, list[tuple[str, str, RolloutStore, np.ndarray]], tuple[int, int]]:
    """(training rows, held-out sets as (regime, prefix, store, rows), (held-out prompts, all
    prompts)) by `data.val_split`: prompts first (or `data.val`), then responses of the prompts
    left; a regime that holds out nothing is a one-line UserError."""
    keys = train.split_keys()
    train_idx, held, val_groups = np.arange(len(train)), [], (0, 0)
    if data.val:
        held.append(("prompt", "val", val, np.arange(len(val))))
    elif data.val_split in ("prompt", "both") and data.val_fraction > 0:
        train_idx, val_idx = split_by_group(keys, data.val_fraction)
        val_groups = (len({keys[i] for i in val_idx}), len(set(keys)))
        if not len(val_idx):
            raise UserError(f"data.val_fraction={data.val_fraction:g} holds out prompts by group_id, but all "
                            f"{len(train)} rollouts share one group ({keys[0]!r}), so none can be held out: add "
                            "rollouts of other prompts, pass data.val=[...], set data.val_split=response (fresh "
                            "responses of that prompt), or data.val_fraction=0 (no validation)")
        held.append(("prompt", "val", train, val_idx))
    if data.val_split in ("response", "both"):
        stay, out = split_by_response([keys[i] for i in train_idx], train.row_hashes()[train_idx], data.val_fraction)
        if not len(out):
            raise UserError(f"data.val_split={data.val_split} holds out {data.val_fraction:g} of each prompt's "
                            "responses, but none was picked: no training prompt has two or more responses (group_id "
                            "names the prompt) or the share is too small for so few rollouts; raise "
                            "data.val_fraction, add group_id to the rollouts, or set data.val_split=prompt")
        held.append(("response", "val_response" if held else "val", train, train_idx[out]))
        train_idx = train_idx[stay]
    return train_idx, held, val_groups
