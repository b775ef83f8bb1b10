"""``critic-pretrain audit STEP --policy MODEL --reward module:function``: the critic against the
policy's own Monte-Carlo values (argparse and printing over ``critic_pretrain.eval.audit``)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import time
from pathlib import Path

from ..data import REGIMES
from ..errors import UserError
from ..eval import audit
from ..eval.from_checkpoint import write_json


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="critic-pretrain audit",
        description="Sample the policy from states inside held-out responses and compare the critic's values there "
                    "with the Monte-Carlo values (mean reward of the continuations), against the prompt-only value. "
                    "Time grows with --max-rollouts x --cuts x --samples x --max-new-tokens.")
    p.add_argument("step_dir", metavar="STEP_DIR", help="a step_<n> folder written by critic-pretrain train")
    p.add_argument("--policy", required=True, metavar="MODEL",
                   help="the policy that sampled the rollouts: a local folder or hub id (its tokenizer must match)")
    p.add_argument("--reward", required=True, metavar="MODULE:FUNCTION",
                   help="fn(prompt_text, response_text) -> float, the rollouts' reward (prompt: the tokens before the "
                        "first policy token; response: all after, tool output included; decoded without special "
                        "tokens): module:function importable from here (e.g. examples.smollm2.task:reward) or "
                        "path/file.py:function. It must give every audited stored response its stored reward")
    p.add_argument("--rollouts", nargs="+", metavar="PATH",
                   help="rollouts of the policy (the critic's trained-on ones are left out); default: the run's own "
                        "held-out sets")
    p.add_argument("--cuts", type=int, default=audit.CUTS, help=f"states per rollout (default {audit.CUTS})")
    p.add_argument("--samples", type=int, default=audit.SAMPLES,
                   help=f"continuations per state (default {audit.SAMPLES})")
    p.add_argument("--max-rollouts", type=int, default=audit.MAX_ROLLOUTS,
                   help=f"rollouts to audit (default {audit.MAX_ROLLOUTS})")
    p.add_argument("--max-new-tokens", type=int, help="the turn's token budget (default: as the rollouts record it in "
                   "_rollouts.json 'generation'; required when they do not)")
    p.add_argument("--temperature", type=float, help="default: as the rollouts record it (required when they do not); "
                   "0: greedy")
    p.add_argument("--top-p", type=float, help="default: as the rollouts record it, else 1")
    p.add_argument("--batch", type=int, default=4, help="states per generate call (x --samples sequences)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", metavar="FILE.json", help="default: <run>/eval/step_<n>-audit.json (report reads it)")
    p.add_argument("--cache-dir", metavar="DIR", help="where --rollouts are prepared (default: a temporary folder)")
    p.add_argument("--device", help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--no-vllm", action="store_true", help="sample with transformers even when vLLM is installed")
    p.add_argument("--mc-from", metavar="AUDIT.json",
                   help="reuse the continuations of an earlier audit of the same policy, rollouts and settings (MC "
                        "values belong to the policy): score another checkpoint without sampling again")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    out = Path(args.out) if args.out else audit.default_out(Path(args.step_dir))
    with contextlib.ExitStack() as stack:
        setup = audit.prepare(args.step_dir, args.policy, args.reward, args.rollouts, stack, cuts=args.cuts,
                              samples=args.samples, max_new_tokens=args.max_new_tokens,
                              max_rollouts=args.max_rollouts, temperature=args.temperature, top_p=args.top_p,
                              seed=args.seed, batch=args.batch, device=args.device, cache_dir=args.cache_dir,
                              use_vllm=False if args.no_vllm else None, mc_from=args.mc_from)
        if not setup.rollouts:
            raise UserError("no held-out rollout to audit: pass --rollouts with fresh rollouts of the policy")
        if setup.reused:
            print(f"reused the continuations of {setup.reused} state(s) from {args.mc_from}")
        if setup.sampler is not None and setup.sampler.name != "vLLM" and not audit.vllm_available():
            print("note: vLLM is not installed: sampling with transformers generate (pip install vllm for faster "
                  "sampling on GPU)")
        regimes = {}
        for ro in setup.rollouts:
            regimes[ro.regime] = regimes.get(ro.regime, 0) + 1
        s = setup.sampling
        # "6 of prompts it never trained on": the regime's own words, not its key ("6 prompt")
        kinds = ", ".join(f"{n} of {REGIMES.get(r, r)}" for r, n in regimes.items())
        print(f"audit: {len(setup.rollouts)} held-out rollouts ({kinds}) "
              f"x up to {args.cuts} cuts, {len(setup.jobs)} states to sample, {setup.samples} continuation(s) each of "
              f"at most {s.max_new_tokens} tokens (temperature {s.temperature:g}, top-p {s.top_p:g})"
              + (f" with {setup.sampler.name}" if setup.sampler else ""))
        t0 = time.perf_counter()
        if setup.jobs:
            _sample(setup)
        result = setup.result(time.perf_counter() - t0)
    write_json(result, out)
    for line in result["lines"]:
        print(line.replace("**", ""))
    print(f"wrote {out} ({result['seconds'] / 60:.1f} min of sampling)")
    return 0


def _sample(setup) -> None:
    """Every state's continuations, with an estimate after the first batch and a progress bar."""
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    batches = setup.run()
    done = next(batches)
    first = time.perf_counter() - t0
    left = len(setup.jobs) - done
    print(f"estimate: the first batch of {done} states took {first:.1f} s; the other {left} need about "
          f"{first * left / done / 60:.1f} min more")
    with tqdm(total=len(setup.jobs), initial=done, desc="audit", unit="state") as bar:
        for done in batches:
            bar.update(done)
