"""Held-out evaluation of a value model, and ``critic-pretrain eval``.

``buckets`` (what is measured: per-token buckets, per-group sufficient sums, metrics and tables),
``advantage`` (how well the critic's advantages match the true ones, and the oracle-free
measures), ``loop`` (the evaluation loop and ``EvalSums``, which owns every sum), and
``from_checkpoint`` (``critic-pretrain eval``).
"""

from .buckets import (
    POSITION_BUCKETS,
    TURN_BUCKETS,
    CalibrationGrid,
    Evaluation,
    calibration_error,
    calibration_table,
    finish,
    group_index,
    group_sums,
    merge_cells,
    n_groups,
    token_buckets,
    token_sums,
)
from .from_checkpoint import (
    COLD_EVERY,
    checkpoint_model_config,
    cold_critic,
    default_out,
    eval_autocast,
    evaluate_checkpoint,
    held_out_sets,
    load_checkpoint_model,
    resolve_device,
    write_json,
)
from .loop import EvalSums, eval_batches, evaluate, evaluate_detailed

__all__ = ["COLD_EVERY", "POSITION_BUCKETS", "TURN_BUCKETS", "CalibrationGrid", "EvalSums", "Evaluation",
           "group_sums", "calibration_error", "calibration_table", "checkpoint_model_config", "cold_critic",
           "default_out", "eval_autocast", "eval_batches", "evaluate", "evaluate_checkpoint", "evaluate_detailed",
           "finish", "group_index", "held_out_sets", "load_checkpoint_model", "merge_cells", "n_groups",
           "resolve_device", "token_buckets", "token_sums", "write_json"]
