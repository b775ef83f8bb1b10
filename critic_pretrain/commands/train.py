"""``critic-pretrain train``: argparse, the run, and the seed check at its end (printing only).

    critic-pretrain train --config configs/demo.yaml train.max_steps=200
    accelerate launch critic_pretrain/train.py --config ... (the same command, through the router)

The library (setup, the step, the loop, saves) is ``critic_pretrain.train``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
from pathlib import Path

from ..checkpoint import find_checkpoints, remove_unstarted
from ..config_io import describe, load_config
from ..errors import EXIT_INTERRUPTED, UserError
from ..interop.check import check_seed
from ..train import Preemption, Run, setup, train_loop
from ..train import __doc__ as TRAIN_DOC
from .seed import print_report

log = logging.getLogger("critic_pretrain")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="critic-pretrain train", description=TRAIN_DOC,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="YAML run config (configs/*.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. optim.lr=1e-5")
    p.add_argument("--help-config", action="store_true", help="list every config key with its default and meaning")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.help_config:
        for key, default, doc in describe():
            print(f"{key} = {default}\n    {doc}")
        return 0
    if args.config is None and not args.overrides:
        raise UserError("nothing to train: try `critic-pretrain demo` (the bundled sample and a tiny model), or pass "
                        "--config configs/<recipe>.yaml data.train=[/your/rollouts] (see critic-pretrain train --help)")
    cfg = load_config(args.config, args.overrides)
    fresh = not Path(cfg.output_dir).exists()  # only the lock's holder removes it (remove_unstarted)
    with contextlib.ExitStack() as cleanup:  # releases the output_dir lock however we leave
        try:
            try:
                run = setup(cfg, cleanup)
            except UserError:  # refused before step 0: leave no folder that looks like a run
                if fresh:
                    remove_unstarted(Path(cfg.output_dir))
                raise
            with Preemption() as preempt:
                code = train_loop(run, preempt)
        except KeyboardInterrupt:  # the second Ctrl-C
            saved = sorted(find_checkpoints(cfg.output_dir)) if Path(cfg.output_dir).is_dir() else []
            raise UserError(f"interrupted; nothing was saved since step_{saved[-1]} (re-run the same command to resume "
                            "from it)" if saved else "interrupted before any step was saved (re-run the same command "
                            "to start)", exit_code=EXIT_INTERRUPTED) from None
    if code == 0 and run.accelerator.is_main_process:
        check_final_seed(run)
    return code  # the training result; the seed check says whether a PPO run can use the seed


def check_final_seed(run: Run) -> None:
    """The last checkpoint, checked the way a PPO run will load it, and the config lines to paste."""
    target = "nemo-rl" if run.cfg.model.head_bias else "openrlhf"  # bias-free heads are for OpenRLHF/TRL
    print()
    if print_report(check_seed((run.out / f"step_{run.state.step}").resolve(), target)) != 0:
        log.warning("training finished, but step_%d is not a usable %s seed (above)", run.state.step, target)
    for line in verdict_lines(run.out / f"step_{run.state.step}"):
        print(line)
    for line in overtraining_lines(run.out):
        print(line)
    if run.cfg.checkpoint.keep_best:
        for line in best_kept_lines(run.out, run.cfg.checkpoint.best_metric, run.state.step):
            print(line)


def overtraining_lines(out) -> list[str]:
    """``critic-pretrain report``'s over-training sentence, when its rule flags the run: the lines
    above load the newest step, and the report would prefer another (the demo's own run ended
    with its paste block on step_1200 while its report said "prefer step_1100")."""
    from ..report.runs import load_run
    from ..report.summary import overtraining_text, summarize_run

    s = summarize_run(load_run(out))
    text = overtraining_text(s)
    if text is None:
        return []
    step = out / f"step_{s.pick}"
    return [f"report: {text}" + (f" `critic-pretrain seed check {step}` prints its lines; compare the two on rollouts "
                                 "the run never saw first (`critic-pretrain eval STEP --rollouts R`; docs/warm.md, "
                                 "*Plateau, over-training and which checkpoint*)" if s.prefer_earlier else "")]


def best_kept_lines(out, metric: str, newest: int) -> list[str]:
    """With ``checkpoint.keep_best``: which saved step the rule ranks first when it is not the newest
    (the one the lines above load), so the user picks between the two knowingly."""
    from ..checkpoint import StepPaths, best_steps

    best = best_steps(out, metric, 1)
    if not best or best[0] == newest:
        return []
    at = {}
    for n in (best[0], newest):
        v = (StepPaths(out / f"step_{n}").read_training_info() or {}).get(metric)
        at[n] = f"{v:.4g}" if isinstance(v, (int, float)) else "not evaluated"
    return [f"checkpoint.keep_best: step_{best[0]} has the best {metric} of the saved steps ({at[best[0]]}; "
            f"step_{newest}, the newest, which the lines above load: {at[newest]}). If the report says "
            f"over-training, warm-start from step_{best[0]}: `critic-pretrain seed check {out / f'step_{best[0]}'}` "
            "prints its lines (docs/warm.md, *Plateau, over-training and which checkpoint*)"]


def verdict_lines(step_dir) -> list[str]:
    """The last evaluation's verdict per held-out set (the snippet above loads any valid seed; this
    says whether it helps): from the step's training info, no model run."""
    from ..checkpoint import Manifest, StepPaths
    from ..data import REGIMES
    from ..eval.verdict import CALLS, few_prompts_note, plateau_note
    info = StepPaths(step_dir).read_training_info() or {}
    split = getattr(Manifest.read(step_dir), "val_split", None) or "prompt"
    calls = {v: k for k, v in CALLS.items()}
    out = []
    for prefix in ("val", "val_response"):
        code = info.get(f"{prefix}:verdict")
        if isinstance(code, (int, float)) and code in calls:
            regime = REGIMES["response" if prefix == "val_response" or split == "response" else "prompt"]
            ev = [_num(info.get(f"{prefix}:ev_vs_group_mean{s}")) for s in ("", "_lo", "_hi")]
            out.append(f"verdict at the last evaluation on {regime} ({prefix}/): {calls[code]} (EV over the group "
                       f"mean {ev[0]} [{ev[1]}, {ev[2]}]); `critic-pretrain eval {step_dir}` gives every number")
            prompts = info.get(f"{prefix}:prompts")
            few = few_prompts_note(int(prompts)) if isinstance(prompts, (int, float)) else None
            if few:
                out.append(f"{regime} ({prefix}/): {few}")
            note = plateau_note(info.get(f"{prefix}:sibling_auc_q4"), info.get(f"{prefix}:sibling_pairs"))
            if note:
                out.append(f"prompt-only plateau on {regime} ({prefix}/)? {note}. Judge it on rollouts it never "
                           f"saw: `critic-pretrain seed check {step_dir} --rollouts R`")
    return out


def _num(v) -> str:
    """0.284, or n/a for a value the evaluation could not give (null in training_info.json)."""
    return f"{v:.3f}" if isinstance(v, (int, float)) and math.isfinite(v) else "n/a"
