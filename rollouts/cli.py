"""``critic-pretrain rollouts ...`` (also ``python -m rollouts ...``): check, convert, synth, schema.

Torch-free. Like every command module of both packages, ``main(argv) -> int`` parses its own
argv and raises ``UserError``; the one command table (``critic_pretrain.cli.COMMANDS``) routes
``critic-pretrain rollouts ...`` here. The subcommands' parsers and printing live here
(``check``, ``convert``, ``schema``) or in their own module (``synth.cli``); each registers
``func=...`` returning the exit code, over the library modules (``reader``, ``convert``,
``synth``), which parse no argv.

``run_command`` is the one error handler of every command of both packages (``critic-pretrain``
routes through it too): a ``UserError`` prints one ``error: ...`` line and exits with its code
(2), Ctrl-C exits 130, a closed pipe exits 0; ``CRITIC_PRETRAIN_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .convert import convert_generic, convert_nemo_rl, convert_slime, convert_verl
from .errors import EXIT_INTERRUPTED, EXIT_USAGE, RolloutError, UserError, cause, environment_error
from .sources import SOURCES
from .writer import DEFAULT_SHARD_ROWS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="critic-pretrain rollouts",
                                description="Rollout archives: validate, convert other dumps into schema v1, "
                                            "generate synthetic rollouts.")
    rsub = p.add_subparsers(dest="rollouts_cmd", required=True, metavar="{check,convert,synth,schema}")
    _add_check(rsub)
    from . import synth
    add_convert_parser(rsub)
    synth.add_parser(rsub)
    s = rsub.add_parser("schema", help="print rollout schema v1")
    s.set_defaults(func=lambda args: print(__import__("rollouts.schema").schema.describe()) or 0)
    return p


def main(argv: list[str] | None = None) -> int:
    """``critic-pretrain rollouts ARGV``; raises ``UserError`` (``run_command`` prints it)."""
    args = build_parser().parse_args(argv)
    return args.func(args)


def _add_check(rsub) -> None:
    p = rsub.add_parser("check", help="validate rollouts and print a summary",
                        description="Validate rollout parquet files (files, folders, globs) and print a "
                                    "summary and a per-problem report. Exit code 1 when problems were found.")
    p.add_argument("paths", nargs="+", help="files, folders (searched recursively) or globs")
    p.add_argument("--on-bad", choices=["skip", "fail"], default="skip",
                   help="skip: report every bad row and continue (default); fail: stop at the first")
    p.add_argument("--quarantine", metavar="JSONL", help="write one line per bad row/file (file, row, reason)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--max-problems", type=int, default=20, help="problem lines to print (default 20)")
    vocab = p.add_mutually_exclusive_group()
    vocab.add_argument("--vocab-size", type=int, metavar="N", help="token ids must be below N (the model's vocabulary)")
    vocab.add_argument("--model", metavar="PATH",
                       help="take --vocab-size from this model folder's config.json, and check the rollouts' recorded "
                            "tokenizer (or synthetic origin) against the folder's tokenizer, as training does")
    p.set_defaults(func=run_check)


def vocab_size_of(model: str) -> int:
    """``vocab_size`` from a model folder's (or a config.json file's) config, without torch."""
    from pathlib import Path
    path = Path(model)
    path = path / "config.json" if path.is_dir() else path
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise RolloutError(f"--model {model}: cannot read {path} ({getattr(e, 'strerror', None) or e}); "
                           "pass a local model folder with a config.json, or --vocab-size N") from None
    size = config.get("vocab_size", (config.get("text_config") or {}).get("vocab_size"))
    if not isinstance(size, int) or size <= 0:
        raise RolloutError(f"--model {model}: {path} has no vocab_size; pass --vocab-size N")
    return size


def run_check(args: argparse.Namespace) -> int:
    from .reader import check

    vocab = args.vocab_size if args.vocab_size is not None else (vocab_size_of(args.model) if args.model else None)
    if vocab is not None and vocab <= 0:
        raise RolloutError(f"--vocab-size {vocab} must be > 0")
    reader = check(args.paths, on_bad=args.on_bad, quarantine=args.quarantine, vocab_size=vocab)
    summary = reader.summary
    mismatches = tokenizer_mismatches(args.paths, args.model) if args.model else []
    if args.json:
        print(json.dumps({"summary": summary.to_dict(), "tokenizer": mismatches,
                          "problems": [p.line() for p in reader.problems[: args.max_problems]]}, indent=2))
    else:
        print(summary.format())
        for warning in summary.warnings():
            print(f"\nwarning: {warning}")
        if reader.problems:
            print(f"\n{len(reader.problems)} problem(s):")
            for p in reader.problems[: args.max_problems]:
                print("  " + p.line())
            if len(reader.problems) > args.max_problems:
                print(f"  ... {len(reader.problems) - args.max_problems} more"
                      + (f" (all in {args.quarantine})" if args.quarantine else "; use --quarantine FILE for all"))
        for line in mismatches:
            print(f"\ntokenizer: {line}")
        if not reader.problems and not mismatches:
            print("\nno problems found")
    return 1 if reader.problems or mismatches else 0


def tokenizer_mismatches(paths: list[str], model: str) -> list[str]:
    """``PATH: why`` for each archive whose tokens cannot mean to ``model``'s tokenizer what they
    meant when written (``tokenizer.mismatch``: training refuses the same archives)."""
    from .paths import archive_folder
    from .tokenizer import fingerprint_of, mismatch

    folder = Path(model)
    fp = fingerprint_of(folder) if folder.is_dir() else None
    return [f"{p}: {why}" for p in paths if (why := mismatch(archive_folder(p), fp))]


# ---------------------------------------------------------------------------------------------
# rollouts convert


_EPILOG = """\
examples:
  critic-pretrain rollouts convert --from nemo-rl logs/exp_001 --out rollouts/run1
  critic-pretrain rollouts convert --from nemo-rl 'logs/exp_*/train_data_step*.jsonl' --out rollouts/run1 \\
      --on-bad skip --quarantine bad.jsonl
  critic-pretrain rollouts convert --from slime dump_details/rollout_data --out rollouts/run2 --model Qwen/Qwen3-4B
  critic-pretrain rollouts convert --from verl ~/.verl/rollout_dump/exp_proj --out rollouts/run3 \\
      --tokenizer /models/qwen2.5-7b
  critic-pretrain rollouts convert --from generic dump.jsonl --out rollouts/x \\
      --map input_ids=tokens --map loss_mask=mask --map reward=meta.score
  critic-pretrain rollouts convert --from generic padded.parquet --out rollouts/y \\
      --prompt-field prompt_ids --response-field response_ids --mask-field attention_mask --map reward=score
  critic-pretrain rollouts convert --from nemo-rl logs/exp_001 --out rollouts/run1 --ppo-config grpo.yaml

verl's trainer.rollout_data_dir dump is decoded text with the special tokens stripped
(batch_decode(..., skip_special_tokens=True)): token ids cannot be rebuilt from it, so it
cannot be converted; --from verl reads the token-level skip.rollout cache (gen_batch.dp) instead.
slime and verl dumps are pickles: they are read with an allow-list unpickler that runs no code
from the file (a file naming anything else is refused).
Row numbers in messages are 0-based; in a JSONL file row N is line N+1.
Field-by-field mapping of each format: docs/converters.md.
"""
GENERIC_OPTIONS = ("map", "prompt_field", "response_field", "mask_field", "pad_id")


def add_convert_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``rollouts convert``."""
    p = sub.add_parser(
        "convert", help="convert NeMo-RL, slime or verl dumps, or other JSONL/parquet, into schema-v1 shards",
        description="Convert rollout dumps into schema-v1 parquet shards (streamed, bounded memory). "
                    "The output folder receives the shards only when every input was converted.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="dump files, folders (searched recursively) or globs")
    p.add_argument("--from", dest="source", choices=list(SOURCES), required=True,
                   help="nemo-rl: train_data_step<N>.jsonl dumps; slime: --save-debug-rollout-data <id>.pt files; "
                        "verl: skip.rollout's gen_batch.dp cache; generic: JSONL/parquet with --map")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder (must be empty, or --overwrite)")
    p.add_argument("--shard-rows", type=_positive_int, default=DEFAULT_SHARD_ROWS, metavar="N",
                   help=f"rollouts per shard (default {DEFAULT_SHARD_ROWS})")
    p.add_argument("--on-bad", choices=["fail", "skip"], default="fail",
                   help="fail: stop at the first bad row (default); skip: leave bad rows out and count them")
    p.add_argument("--quarantine", metavar="JSONL", help="write one line per bad row/file (file, row, reason)")
    p.add_argument("--overwrite", action="store_true", help="replace the shards of a previous conversion in --out")
    p.add_argument("--keep-extra", action="store_true",
                   help="keep source fields that map to no schema column as extra columns")
    c = p.add_argument_group("the collecting run, recorded in OUT/_rollouts.json and printed when training starts")
    c.add_argument("--tokenizer", metavar="PATH",
                   help="the tokenizer (or model folder) that produced the token ids: its fingerprint and "
                        "chat-template hash are recorded, and training stops if the model's tokenizer differs "
                        "(slime: default <dump_details>/tokenizer when it is there)")
    c.add_argument("--model", metavar="NAME", help="the policy that generated the rollouts (hub id or folder)")
    c.add_argument("--framework-version", metavar="V", help="the collecting framework's version (dumps do not say)")
    r = p.add_argument_group("rewards: what the dump's rewards are (NeMo-RL logs them after its reward_scaling "
                             "and reward_shaping), recorded in OUT/_rollouts.json for training and seed check")
    how = r.add_mutually_exclusive_group()
    how.add_argument("--ppo-config", metavar="YAML",
                     help="the collecting run's NeMo-RL config (ppo: or grpo:): its reward_scaling and reward_shaping "
                          "were applied before logging (its model and max length are recorded too)")
    how.add_argument("--rewards-raw", action="store_true",
                     help="the rewards are as the reward function returned them (no scaling, no shaping)")
    how.add_argument("--rewards-scaled", metavar="SCALE,SHIFT",
                     help="the rewards were logged as SCALE * raw + SHIFT, e.g. 2,-1 for [0,1] mapped to [-1,1]")
    r.add_argument("--reward-field", metavar="FIELD",
                   help="nemo-rl: the reward field (default rewards; with dynamic sampling maybe filtered_rewards); "
                        "slime: the key of a dict reward (slime's --reward-key); verl: the batch tensor or "
                        "non_tensor_batch field (default token_level_scores, else rm_scores)")
    g = p.add_argument_group("generic")
    g.add_argument("--map", action="append", default=[], type=_mapping_arg, metavar="COLUMN=FIELD",
                   help="take schema COLUMN from source FIELD (a.b for nested objects); repeatable")
    g.add_argument("--prompt-field", metavar="FIELD", help="prompt token ids (loss_mask 0)")
    g.add_argument("--response-field", metavar="FIELD", help="response token ids (loss_mask 1)")
    g.add_argument("--mask-field", metavar="FIELD",
                   help="a 0/1 attention mask over the tokens (or a response mask): tokens where it is 0 are padding "
                        "and dropped")
    g.add_argument("--pad-id", type=int, metavar="ID",
                   help="strip runs of this id at the padded ends (a prompt's left, a response's right); default: "
                        "the --tokenizer's pad id")
    p.set_defaults(func=run_convert)


def run_convert(args: argparse.Namespace) -> int:
    """``rollouts convert``: convert, print a one-line summary; 1 when nothing was written."""
    settings = _ppo_settings(args)
    rewards = _rewards_logged(args, settings)
    tokenizer = _tokenizer_facts(args.tokenizer, "--tokenizer") if args.tokenizer else None
    result = _convert(args, tokenizer[0] if tokenizer else None)
    print(result.summary())
    if result.rows_written:  # replaces a previous conversion's (--overwrite)
        from .provenance import write_manifest
        collected, fingerprint = _collection(args, result.collected, settings, tokenizer)
        write_manifest(result.out_dir, generator="rollouts.convert", **{"from": args.source}, tokenizer=fingerprint,
                       collected=collected.to_dict() or None, rewards=rewards.to_dict() if rewards else None)
        if rewards is None and args.source == "nemo-rl":
            _warn_scaled(result.shards)
    if result.rows_skipped or result.bad_files:
        print(f"bad rows and files are listed in {result.quarantine}" if result.quarantine
              else "pass --quarantine FILE.jsonl to list every bad row")
    if not result.rows_written:
        print("no rollout was converted", file=sys.stderr)
        return 1
    print(f"next: critic-pretrain rollouts check {result.out_dir}")
    return 0


def _convert(args: argparse.Namespace, fingerprint: dict | None):
    """Run the converter ``--from`` names with the options that apply to it."""
    common = dict(keep_extra=args.keep_extra, shard_rows=args.shard_rows, on_bad=args.on_bad,
                  quarantine=args.quarantine, overwrite=args.overwrite, progress=_stderr)
    if args.source != "generic":
        given = [name for name in GENERIC_OPTIONS if getattr(args, name) not in (None, [])]
        if given:
            raise RolloutError(f"--{given[0].replace('_', '-')} is for --from generic; {args.source} dumps are mapped "
                               "already (docs/converters.md)")
    if args.source == "nemo-rl":
        return convert_nemo_rl(args.paths, args.out, reward_field=args.reward_field or "rewards", **common)
    if args.source == "slime":
        return convert_slime(args.paths, args.out, reward_key=args.reward_field, **common)
    if args.source == "verl":
        return convert_verl(args.paths, args.out, reward_field=args.reward_field, **common)
    if args.reward_field:
        raise RolloutError("--reward-field is for nemo-rl, slime and verl dumps; map the reward with "
                           "--map reward=<field>")
    mapping: dict[str, str] = {}
    for column, source_field in args.map:
        if column in mapping:
            raise RolloutError(f"--map {column}=...: given twice; map each column once")
        mapping[column] = source_field
    pad_id = args.pad_id
    if pad_id is None and fingerprint is not None and not args.mask_field:
        pad_id = fingerprint["special_ids"].get("pad_token_id")
        if pad_id is not None:
            _stderr(f"stripping runs of the tokenizer's pad id {pad_id} at the padded ends (--pad-id to change)")
    return convert_generic(args.paths, args.out, mapping, prompt_field=args.prompt_field,
                           response_field=args.response_field, pad_id=pad_id, mask_field=args.mask_field, **common)


def _tokenizer_facts(path: str, given_by: str) -> tuple[dict, str | None]:
    """(fingerprint, chat-template hash) of the tokenizer in ``path``; one line when there is none."""
    from .tokenizer import chat_template_sha256, fingerprint, load
    tokenizer = load(path)
    if tokenizer is None:
        raise RolloutError(f"{given_by} {path}: no loadable tokenizer there; pass the folder with "
                           "tokenizer.json / tokenizer_config.json of the policy that generated the rollouts")
    return fingerprint(tokenizer), chat_template_sha256(tokenizer)


def _collection(args: argparse.Namespace, found: dict, settings, tokenizer: tuple | None):
    """(``Collection``, tokenizer fingerprint): what the dump said, what the options add."""
    from .provenance import Collection
    collected = Collection.from_dict(found)
    if tokenizer is None and collected.tokenizer_path:  # slime saves its tokenizer beside the dump
        try:
            tokenizer = _tokenizer_facts(collected.tokenizer_path, "the dump's tokenizer")
            _stderr(f"tokenizer: {collected.tokenizer_path} (saved by the collecting run) is recorded; "
                    "--tokenizer to name another")
        except RolloutError as e:
            _stderr(f"warning: {e}")
            collected = collected.merged(tokenizer_path=None)
    return collected.merged(
        version=args.framework_version, model=args.model or (settings.model if settings else None),
        tokenizer_path=args.tokenizer, chat_template_sha256=tokenizer[1] if tokenizer else None,
        max_length=settings.max_length if settings and collected.max_length is None else None,
    ), (tokenizer[0] if tokenizer else None)


def _ppo_settings(args: argparse.Namespace):
    """The collecting run's NeMo-RL config (``--ppo-config``), or None."""
    if not args.ppo_config:
        return None
    from .ppo_config import read_ppo_config
    settings = read_ppo_config(args.ppo_config, grpo=True)
    if settings.framework != "nemo-rl":
        raise RolloutError(f"--ppo-config {args.ppo_config}: a {settings.framework} config; only NeMo-RL applies "
                           "its reward settings before logging: state what the dump holds with --rewards-raw or "
                           "--rewards-scaled SCALE,SHIFT")
    return settings


def _rewards_logged(args: argparse.Namespace, settings):
    """What ``--ppo-config`` / ``--rewards-raw`` / ``--rewards-scaled`` say of the dump's rewards, or None."""
    from .provenance import RewardsLogged
    if settings is not None:
        return RewardsLogged.from_ppo_settings(settings, f"--ppo-config {args.ppo_config}")
    if args.rewards_raw:
        return RewardsLogged(stated_by="--rewards-raw")
    if args.rewards_scaled:
        return RewardsLogged.parse(args.rewards_scaled, "--rewards-scaled")
    return None


def _warn_scaled(shards: list[Path]) -> None:
    """Once, when NeMo-RL rewards fall outside its default reward_scaling source range: they are
    probably scaled already, and nothing says so."""
    from .provenance import NEMO_RL_SOURCE_RANGE
    rewards = pa.concat_arrays([pq.read_table(s, columns=["reward"]).column("reward").combine_chunks()
                                for s in shards])
    lo, hi = pc.min(rewards).as_py(), pc.max(rewards).as_py()
    smin, smax = NEMO_RL_SOURCE_RANGE
    if lo is not None and (lo < smin or hi > smax):
        _stderr(f"warning: the rewards span [{lo:g}, {hi:g}], outside [{smin:g}, {smax:g}] (NeMo-RL's default "
                "reward_scaling source range); NeMo-RL logs rewards after reward_scaling and reward_shaping, so "
                "these may be scaled already: re-convert with --ppo-config <the collecting run's YAML> (or "
                "--rewards-raw / --rewards-scaled SCALE,SHIFT) so that training and seed check know the scale")


def _mapping_arg(text: str) -> tuple[str, str]:
    column, sep, source_field = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(f"'{text}': write COLUMN=FIELD, e.g. input_ids=tokens")
    return column.strip(), source_field.strip()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def run_command(fn: Callable[..., int], *args) -> int:
    """Run a command; the one place a user error becomes ``error: <message>`` and an exit code."""
    try:
        return fn(*args)
    except UserError as e:
        if os.environ.get("CRITIC_PRETRAIN_DEBUG"):
            raise
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `... | head`: the reader left, not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except BaseException as e:  # a library's wrapper (torch DCP's is a BaseException) of Ctrl-C or a full disk
        if isinstance(e, SystemExit) or os.environ.get("CRITIC_PRETRAIN_DEBUG"):
            raise
        if cause(e, KeyboardInterrupt) is not None:
            print("error: interrupted", file=sys.stderr)
            return EXIT_INTERRUPTED
        err = environment_error(e)
        if err is None:
            raise
        print(f"error: {err.strerror}{f' ({err.filename})' if err.filename else ''}: free space or fix the folder, "
              "then re-run the same command (files are replaced atomically: what was written before is intact)",
              file=sys.stderr)
        return EXIT_USAGE
