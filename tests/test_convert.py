"""``rollouts convert``: NeMo-RL dumps and generic JSONL/parquet into schema-v1 shards.

The fake NeMo-RL dumps are written the way NeMo-RL's ``Logger.log_batched_dict_as_jsonl``
writes them (see docs/converters.md): the step's batch right-padded to one length, then one
line per rollout with every field sliced as a batch of one, plus ``idx``.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollouts import RolloutError, RolloutReader, check
from rollouts.cli import add_convert_parser
from rollouts.convert import convert_generic, convert_nemo_rl

PAD = 151643  # Qwen's pad id: padding must never reach the output


class Rollout:
    """One rollout of a fake run: tokens, mask and what the dump says about it."""

    _next_token = 1000

    def __init__(self, prompt: list[int], turns: list[tuple[int, bool]], reward: float, weight: float = 1.0):
        self.prompt = prompt
        self.ids = list(prompt)
        self.mask = [0] * len(prompt)
        for n, policy in turns:
            self.ids += list(range(Rollout._next_token, Rollout._next_token + n))
            Rollout._next_token += n
            self.mask += [int(policy)] * n
        self.reward, self.weight = reward, weight
        n = len(self.ids)
        self.values = [0.0] + [round(0.01 * t, 2) for t in range(1, n)]  # right-shifted: values[0] = 0
        self.advantages = [0.5 * m for m in self.mask]
        # Python's json.dumps writes NaN: NeMo-RL dumps can hold it in fields we do not use.
        self.logprobs = [-0.25] * (n - 1) + [float("nan")]


def nemo_rl_dump(path: Path, rollouts: list[Rollout], *, values: bool = False, divisible_by: int = 8) -> Path:
    """Write a step's batch like NeMo-RL: right-padded tensors, one batch-of-one line per rollout."""
    width = -(-max(len(r.ids) for r in rollouts) // divisible_by) * divisible_by

    def pad(seq: list, fill) -> list:
        return seq + [fill] * (width - len(seq))

    batch = {
        "content": [["<user> question", "<assistant> answer"] for _ in rollouts],
        "rewards": [r.reward for r in rollouts],
        "input_lengths": [len(r.ids) for r in rollouts],
        "token_ids": [pad(r.ids, PAD) for r in rollouts],
        "token_loss_mask": [pad(r.mask, 0) for r in rollouts],
        "sample_loss_mask": [r.weight for r in rollouts],
        "advantages": [pad(r.advantages, 0.0) for r in rollouts],
        "generation_logprobs": [pad(r.logprobs, 0.0) for r in rollouts],
        "prev_logprobs": [pad(r.logprobs, 0.0) for r in rollouts],
    }
    if values:
        batch["values"] = [pad(r.values, 0.0) for r in rollouts]
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(len(rollouts)):
            f.write(json.dumps({**{k: v[i:i + 1] for k, v in batch.items()}, "idx": i}) + "\n")
    return path


PROMPT_A, PROMPT_B = [1, 2, 3, 4], [1, 2, 9, 9, 9]


def fake_run(root: Path) -> dict[str, tuple[int, Rollout]]:
    """Three steps in three files (+ a validation dump to ignore); sample_id -> (step, rollout)."""
    steps = {
        1: [Rollout(PROMPT_A, [(5, True)], 1.0), Rollout(PROMPT_A, [(3, True)], 0.0),
            Rollout(PROMPT_B, [(4, True)], 1.0, weight=0.0)],  # sample_loss_mask 0
        # multi-turn agent rollout whose last real token is a tool token (mask 0)
        2: [Rollout(PROMPT_B, [(3, True), (4, False), (2, True), (5, False)], -1.0),
            Rollout(PROMPT_B, [(6, True)], 1.0)],
        3: [Rollout(PROMPT_A, [(2, True)], 0.5)],
    }
    for step, rollouts in steps.items():
        nemo_rl_dump(root / f"train_data_step{step}.jsonl", rollouts)
    (root / "val_data_step1.jsonl").write_text(json.dumps({"content": [["x"]], "rewards": [1.0], "idx": 0}) + "\n")
    return {f"step{s}-idx{i}": (s, r) for s, rs in steps.items() for i, r in enumerate(rs)}


def cli(argv: list[str]) -> int:
    """``critic-pretrain rollouts convert ...`` through the subcommand's own parser."""
    parser = argparse.ArgumentParser(prog="critic-pretrain rollouts")
    add_convert_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def read_rows(out: Path) -> dict[str, dict]:
    return {r["sample_id"]: r for r in RolloutReader(out).read_all().to_pylist()}


def assert_clean(out: Path) -> None:
    reader = check(out)
    assert reader.problems == [] and reader.summary.bad_files == 0


# --- NeMo-RL -----------------------------------------------------------------------------------

def test_nemo_rl_round_trip(tmp_path):
    expected = fake_run(tmp_path / "logs" / "exp_001")
    res = convert_nemo_rl(tmp_path / "logs", tmp_path / "out")

    assert (res.files, res.rows_written, res.rows_skipped) == (3, 6, 0)
    assert_clean(tmp_path / "out")
    rows = read_rows(tmp_path / "out")
    assert set(rows) == set(expected)
    for sid, (step, r) in expected.items():
        row = rows[sid]
        assert row["input_ids"] == r.ids and PAD not in row["input_ids"]
        assert row["loss_mask"] == r.mask
        assert row["reward"] == r.reward and row["sample_weight"] == r.weight
        assert row["policy_version"] == step - 1
        assert "values" not in row and "advantages" not in row  # absent from the dump / not kept
    # the agent rollout keeps its outcome reward although its last token is a tool token
    agent = rows["step2-idx0"]
    assert agent["loss_mask"][-1] == 0 and agent["reward"] == -1.0
    # group ids: one per prompt, stable across steps
    groups: dict[tuple, set] = {}
    for sid, (_, r) in expected.items():
        groups.setdefault(tuple(r.prompt), set()).add(rows[sid]["group_id"])
    assert [len(g) for g in groups.values()] == [1, 1]
    assert groups[tuple(PROMPT_A)] != groups[tuple(PROMPT_B)]


def test_nemo_rl_values_and_extras(tmp_path):
    rollouts = [Rollout(PROMPT_A, [(5, True), (2, False)], 1.0), Rollout(PROMPT_B, [(2, True)], 0.0)]
    dump = nemo_rl_dump(tmp_path / "train_data_step7.jsonl", rollouts, values=True)
    res = convert_nemo_rl(dump, tmp_path / "out", keep_extra=True)
    assert res.rows_written == 2
    assert_clean(tmp_path / "out")
    rows = read_rows(tmp_path / "out")
    for i, r in enumerate(rollouts):
        row = rows[f"step7-idx{i}"]
        assert row["values"] == pytest.approx(r.values) and row["values"][0] == 0.0
        assert row["advantages"] == r.advantages  # per-token extras are unpadded too
        assert len(row["generation_logprobs"]) == len(r.ids) and math.isnan(row["generation_logprobs"][-1])
        assert row["content"] == ["<user> question", "<assistant> answer"]
        assert row["policy_version"] == 6


def test_nemo_rl_same_step_in_two_runs_gets_folder_ids(tmp_path):
    for exp in ("exp_001", "exp_002"):  # a resumed run repeats the steps after its checkpoint
        nemo_rl_dump(tmp_path / exp / "train_data_step3.jsonl", [Rollout(PROMPT_A, [(2, True)], 1.0)])
    convert_nemo_rl(str(tmp_path / "exp_*"), tmp_path / "out")
    assert set(read_rows(tmp_path / "out")) == {"exp_001/step3-idx0", "exp_002/step3-idx0"}


def test_nemo_rl_file_name_must_carry_the_step(tmp_path):
    dump = nemo_rl_dump(tmp_path / "train_data_step1.jsonl", [Rollout(PROMPT_A, [(2, True)], 1.0)])
    dump = dump.rename(tmp_path / "dump.jsonl")
    with pytest.raises(RolloutError, match="dump.jsonl: the file name does not carry the training step"):
        convert_nemo_rl(dump, tmp_path / "out")
    res = convert_nemo_rl(dump, tmp_path / "out", on_bad="skip")
    assert (res.bad_files, res.rows_written, dict(res.problem_counts)) == (1, 0, {"bad_file_name": 1})


def test_nemo_rl_cli_summary(tmp_path, capsys):
    fake_run(tmp_path / "logs")
    out = tmp_path / "out"
    assert cli(["convert", "--from", "nemo-rl", str(tmp_path / "logs"), "--out", str(out), "--shard-rows", "4"]) == 0
    stdout = capsys.readouterr().out
    assert "converted 3 file(s): 6 rows written to 2 shard(s)" in stdout and "0 rows skipped" in stdout
    assert f"critic-pretrain rollouts check {out}" in stdout
    assert sorted(p.name for p in out.iterdir()) == ["_rollouts.json", "part-00000.parquet", "part-00001.parquet"]
    assert json.loads((out / "_rollouts.json").read_text()) == {"generator": "rollouts.convert", "from": "nemo-rl",
                                                                "collected": {"framework": "nemo-rl"}}


# --- generic -----------------------------------------------------------------------------------

GENERIC = [
    {"tokens": [5, 6, 7, 8], "mask": [0, 0, 1, 1], "meta": {"score": 1.0}, "uid": "a", "note": "x"},
    {"tokens": [5, 6, 9], "mask": [0, 0, 1], "meta": {"score": 0.0}, "uid": "b", "note": "y"},
    {"tokens": [4, 4, 1, 2], "mask": [0, 1, 0, 1], "meta": {"score": -1.0}, "uid": "c", "note": "z"},
]
MAPPING = {"input_ids": "tokens", "loss_mask": "mask", "reward": "meta.score", "sample_id": "uid"}


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_generic_mapping_round_trip(tmp_path, fmt):
    src = tmp_path / f"dump.{fmt}"
    if fmt == "jsonl":
        write_jsonl(src, GENERIC)
    else:
        pq.write_table(pa.Table.from_pylist(GENERIC), src)
    convert_generic(src, tmp_path / "out", MAPPING)
    convert_generic(src, tmp_path / "out_extra", MAPPING, keep_extra=True)

    for out in ("out", "out_extra"):
        assert_clean(tmp_path / out)
        rows = read_rows(tmp_path / out)
        for rec in GENERIC:
            row = rows[rec["uid"]]
            assert (row["input_ids"], row["loss_mask"], row["reward"]) == (rec["tokens"], rec["mask"],
                                                                            rec["meta"]["score"])
            assert ("note" in row) == (out == "out_extra")
        assert rows["a"]["group_id"] == rows["b"]["group_id"] != rows["c"]["group_id"]  # prompt [5, 6]
    assert read_rows(tmp_path / "out_extra")["b"]["note"] == "y"


def test_generic_prompt_response_and_schema_named_fields(tmp_path):
    src = write_jsonl(tmp_path / "verl.jsonl", [
        {"prompt_ids": [1, 2, 3], "response_ids": [7, 8], "reward": 0.5, "group_id": "q1"},
        {"prompt_ids": [1, 2, 3], "response_ids": [9], "reward": 1.0, "group_id": "q1"},
    ])
    convert_generic(src, tmp_path / "out", prompt_field="prompt_ids", response_field="response_ids")
    assert_clean(tmp_path / "out")
    rows = RolloutReader(tmp_path / "out").read_all().to_pylist()
    assert [(r["input_ids"], r["loss_mask"], r["reward"], r["group_id"]) for r in rows] == [
        ([1, 2, 3, 7, 8], [0, 0, 0, 1, 1], 0.5, "q1"),  # reward and group_id: same-name fields, no --map
        ([1, 2, 3, 9], [0, 0, 0, 1], 1.0, "q1"),
    ]


def test_generic_cli_map(tmp_path, capsys):
    src = write_jsonl(tmp_path / "dump.jsonl", GENERIC)
    argv = ["convert", "--from", "generic", str(src), "--out", str(tmp_path / "out")]
    for column, source_field in MAPPING.items():
        argv += ["--map", f"{column}={source_field}"]
    assert cli(argv) == 0
    assert "3 rows written" in capsys.readouterr().out
    with pytest.raises(RolloutError, match="'rewardz' is not a schema column"):
        cli(argv[:-2] + ["--map", "rewardz=x"] + ["--out", str(tmp_path / "o2")])


# --- bad input: one line in fail mode, one quarantine line in skip mode --------------------------

def _nemo_edited(tmp_path: Path, edit) -> tuple[Path, dict]:
    """A three-rollout NeMo-RL dump whose line 2 (row 1) is passed through ``edit``."""
    dump = nemo_rl_dump(tmp_path / "in" / "train_data_step1.jsonl",
                        [Rollout(PROMPT_A, [(3, True)], 1.0) for _ in range(3)])
    lines = dump.read_text().splitlines()
    lines[1] = edit(lines[1])
    dump.write_text("\n".join(lines) + "\n")
    return dump, {"converter": "nemo-rl"}


def _edit_json(change):
    def edit(line: str) -> str:
        rec = json.loads(line)
        change(rec)
        return json.dumps(rec)
    return edit


def _nemo_mask_too_short(tmp_path: Path) -> tuple[Path, dict]:
    # token_loss_mask shorter than input_lengths (7) once padding is cut
    return _nemo_edited(tmp_path, _edit_json(lambda r: r.update(token_loss_mask=[r["token_loss_mask"][0][:5]])))


def _nemo_missing_field(tmp_path: Path) -> tuple[Path, dict]:
    return _nemo_edited(tmp_path, _edit_json(lambda r: r.pop("token_ids")))


def _nemo_wrong_type(tmp_path: Path) -> tuple[Path, dict]:
    return _nemo_edited(tmp_path, _edit_json(lambda r: r.update(rewards=["high"])))


def _nemo_not_json(tmp_path: Path) -> tuple[Path, dict]:
    return _nemo_edited(tmp_path, lambda line: line[:40])  # a line cut off while being written


def _generic_missing_field(tmp_path: Path) -> tuple[Path, dict]:
    records = [dict(r) for r in GENERIC]
    del records[1]["meta"]
    return write_jsonl(tmp_path / "dump.jsonl", records), {"mapping": MAPPING}


def _generic_wrong_type(tmp_path: Path) -> tuple[Path, dict]:
    records = [dict(r) for r in GENERIC]
    records[1]["tokens"] = [5, "six", 7]
    return write_jsonl(tmp_path / "dump.jsonl", records), {"mapping": MAPPING}


def _generic_length_mismatch(tmp_path: Path) -> tuple[Path, dict]:
    records = [dict(r) for r in GENERIC]
    records[1]["mask"] = [0, 1]
    return write_jsonl(tmp_path / "dump.jsonl", records), {"mapping": MAPPING}


BAD_CASES = {
    # case: (builder, words the one-line error must hold, problem kind)
    "nemo_rl_length_mismatch": (_nemo_mask_too_short, ["row 1", "token_loss_mask", "input_lengths is 7"],
                                "length_mismatch"),
    "nemo_rl_missing_field": (_nemo_missing_field, ["row 1", "no field 'token_ids'", "other lines of the dump have "
                                                    "it, so this line is damaged; --on-bad skip"], "missing_field"),
    "nemo_rl_wrong_type": (_nemo_wrong_type, ["row 1", "'rewards' is \"high\"", "expected a number"], "wrong_type"),
    "nemo_rl_not_json": (_nemo_not_json, ["row 1", "not valid JSON"], "bad_json"),
    "generic_missing_field": (_generic_missing_field, ["row 1", "no field 'meta.score'", "--map reward=<field>"],
                              "missing_field"),
    "generic_wrong_type": (_generic_wrong_type, ["row 1", "'tokens'", "--map input_ids=<field>"], "wrong_type"),
    "generic_length_mismatch": (_generic_length_mismatch, ["row 1", "loss_mask", "source field 'mask'"],
                                "length_mismatch"),
}


def _convert(src: Path, out: Path, spec: dict, **kw):
    if spec.get("converter") == "nemo-rl":
        return convert_nemo_rl(src, out, **kw)
    return convert_generic(src, out, spec["mapping"], **kw)


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_fails_with_one_line(tmp_path, case):
    build, words, _ = BAD_CASES[case]
    src, spec = build(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(RolloutError) as err:
        _convert(src, out, spec, shard_rows=1)  # the first row's shard is complete before the failure
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(src))
    for word in words:
        assert word in msg, (word, msg)
    assert not out.exists()  # nothing half-written (or whole-but-partial) is left


@pytest.mark.parametrize("field, says", [
    ("token_ids", "NeMo-RL versions that log only text"),
    ("token_loss_mask", "this does not look like a NeMo-RL train_data_step dump; use --from generic with --map"),
])
def test_a_field_no_line_has_is_a_format_problem_not_a_damaged_line(tmp_path, field, says):
    """Only a field other lines carry makes a line "damaged" (fix: --on-bad skip); one that no line
    carries means another format (a new user was told --from generic for one bad line)."""
    dump = nemo_rl_dump(tmp_path / "in" / "train_data_step1.jsonl",
                        [Rollout(PROMPT_A, [(3, True)], 1.0) for _ in range(3)])
    dump.write_text("".join(_edit_json(lambda r: r.pop(field))(line) + "\n" for line in dump.read_text().splitlines()))
    with pytest.raises(RolloutError) as err:
        convert_nemo_rl(dump, tmp_path / "out")
    assert "row 0" in str(err.value) and says in str(err.value) and "damaged" not in str(err.value)


@pytest.mark.parametrize("case", BAD_CASES)
def test_bad_input_is_quarantined_in_skip_mode(tmp_path, case):
    build, _, kind = BAD_CASES[case]
    src, spec = build(tmp_path)
    quarantine = tmp_path / "bad.jsonl"
    res = _convert(src, tmp_path / "out", spec, on_bad="skip", quarantine=quarantine)
    assert (res.rows_written, res.rows_skipped, dict(res.problem_counts)) == (2, 1, {kind: 1})
    [line] = quarantine.read_text().splitlines()
    bad = json.loads(line)
    assert (bad["file"], bad["row"], bad["kind"]) == (str(src), 1, kind) and bad["reason"]
    assert_clean(tmp_path / "out")


def test_cli_skip_prints_counts(tmp_path, capsys):
    src, _ = _generic_missing_field(tmp_path)
    argv = ["convert", "--from", "generic", str(src), "--out", str(tmp_path / "out"), "--on-bad", "skip"]
    for column, source_field in MAPPING.items():
        argv += ["--map", f"{column}={source_field}"]
    assert cli(argv) == 0
    stdout = capsys.readouterr().out
    assert "2 rows written" in stdout and "1 rows skipped (missing_field: 1)" in stdout
    assert "--quarantine" in stdout


# --- output folder -----------------------------------------------------------------------------

def test_refuses_non_empty_out_and_overwrite_replaces_shards(tmp_path):
    fake_run(tmp_path / "logs")
    out = tmp_path / "out"
    convert_nemo_rl(tmp_path / "logs", out, shard_rows=1)
    assert len(list(out.glob("part-*.parquet"))) == 6

    argv = ["convert", "--from", "nemo-rl", str(tmp_path / "logs"), "--out", str(out)]
    with pytest.raises(RolloutError, match="not empty.*--overwrite") as err:
        cli(argv)
    assert "\n" not in str(err.value)

    assert cli(argv + ["--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_rollouts.json", "part-00000.parquet"]
    assert cli(argv + ["--overwrite", "--rewards-raw"]) == 0  # its own _rollouts.json is replaced, not foreign
    assert json.loads((out / "_rollouts.json").read_text())["rewards"]["stated_by"] == "--rewards-raw"
    assert RolloutReader(out).read_all().num_rows == 6

    (out / "notes.txt").write_text("mine")
    with pytest.raises(RolloutError, match="also holds 'notes.txt'"):
        convert_nemo_rl(tmp_path / "logs", out, overwrite=True)


def test_failed_overwrite_keeps_previous_conversion(tmp_path):
    fake_run(tmp_path / "logs")
    out = tmp_path / "out"
    convert_nemo_rl(tmp_path / "logs", out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with open(tmp_path / "logs" / "train_data_step3.jsonl", "a") as f:
        f.write("{broken\n")
    with pytest.raises(RolloutError, match="train_data_step3.jsonl: row 1"):
        convert_nemo_rl(tmp_path / "logs", out, overwrite=True, shard_rows=1)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no staging folder, old shards intact


def test_convert_records_the_tokenizer_and_training_checks_it(tmp_path, capsys, toy_data):
    """--tokenizer: its fingerprint goes to OUT/_rollouts.json; training on those rollouts with a
    model whose tokenizer has another vocabulary stops before step 1, the same one trains."""
    from conftest import tiny_overrides, train_main
    from test_interop_check import tiny_tokenizer

    from rollouts.provenance import ROLLOUTS_MANIFEST
    from rollouts.tokenizer import fingerprint_of

    tok, other = tiny_tokenizer(tmp_path / "tok"), tiny_tokenizer(tmp_path / "other", shuffle=True)
    src = write_jsonl(tmp_path / "dump.jsonl", GENERIC)
    argv = ["convert", "--from", "generic", str(src), "--out", str(tmp_path / "out")]
    for column, source_field in MAPPING.items():
        argv += ["--map", f"{column}={source_field}"]
    argv += ["--tokenizer", str(tok)]
    assert cli(argv) == 0
    recorded = json.loads((tmp_path / "out" / ROLLOUTS_MANIFEST).read_text())["tokenizer"]
    assert recorded == fingerprint_of(tok)
    with pytest.raises(RolloutError, match="no loadable tokenizer there"):
        cli(argv[:-1] + [str(tmp_path)])

    data = tmp_path / "data"  # training-sized rollouts converted with `tok`
    shutil.copytree(toy_data, data)
    shutil.copy(tmp_path / "out" / ROLLOUTS_MANIFEST, data / ROLLOUTS_MANIFEST)
    capsys.readouterr()
    assert train_main(tiny_overrides(tmp_path / "bad", data, **{"model.tokenizer": other, "train.max_steps": 1})) == 2
    err = capsys.readouterr().err
    assert "tokenized with another tokenizer than the model's" in err and "vs the rollouts' 64" in err
    assert not (tmp_path / "bad" / "step_1").exists()
    assert train_main(tiny_overrides(tmp_path / "good", data, **{"model.tokenizer": tok, "train.max_steps": 1,
                                                                   "checkpoint.save_every": 1})) == 0


def test_synthetic_or_other_tokenizer_rollouts_are_refused_for_a_real_tokenizer(tmp_path, capsys, toy_data):
    """A new user trained SmolLM2 on the bundled synthetic sample: its 512 toy ids are all in the
    real vocabulary, so it trained and ended "OK ... a valid critic seed". Synthetic archives
    (_synth.json) now meet only tokenizer-less (random-init) models, in training and in `rollouts
    check --model`, which also checks a recorded tokenizer as training does (it only read the
    vocabulary size)."""
    import json as _json

    from conftest import TINY_MODEL, tiny_overrides, train_main
    from test_interop_check import tiny_tokenizer

    from rollouts.cli import main as rollouts_cli
    from rollouts.provenance import ROLLOUTS_MANIFEST
    cli = rollouts_cli  # noqa: F811 (the whole `rollouts` command: synth and check)
    tok, other = tiny_tokenizer(tmp_path / "tok"), tiny_tokenizer(tmp_path / "other", shuffle=True)
    (tok / "config.json").write_text(_json.dumps({"vocab_size": 600}))
    assert cli(["synth", "--out", str(tmp_path / "synth"), "--rows", "40"]) == 0
    capsys.readouterr()
    assert train_main(tiny_overrides(tmp_path / "bad", tmp_path / "synth", **{"model.tokenizer": tok})) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "these are synthetic rollouts (rollouts synth, _synth.json: ids of a 512-token toy " \
        "vocabulary, no text), and the model has a real tokenizer" in err[0], err
    assert not (tmp_path / "bad").exists()
    assert err[0].endswith("set data.synthetic_on_pretrained=true")  # a backbone probe asks for it by name
    assert train_main(tiny_overrides(tmp_path / "probe", tmp_path / "synth", **{
        "model.tokenizer": tok, "data.synthetic_on_pretrained": True, "train.max_steps": 1,
        "model.config": _json.dumps({**TINY_MODEL, "vocab_size": 600}), "checkpoint.save_every": 1})) == 0
    capsys.readouterr()
    assert cli(["check", str(tmp_path / "synth"), "--model", str(tok)]) == 1
    assert f"tokenizer: {tmp_path / 'synth'}: these are synthetic rollouts" in capsys.readouterr().out

    data = tmp_path / "data"  # converted with `other`, recorded in _rollouts.json
    shutil.copytree(toy_data, data)
    (data / ROLLOUTS_MANIFEST).write_text(_json.dumps({"tokenizer": fingerprint_of_folder(other)}))
    assert cli(["check", str(data), "--model", str(tok)]) == 1
    assert "tokenized with another tokenizer than the model's" in capsys.readouterr().out
    (data / ROLLOUTS_MANIFEST).write_text(_json.dumps({"tokenizer": fingerprint_of_folder(tok)}))
    assert cli(["check", str(data), "--model", str(tok)]) == 0
    assert "no problems found" in capsys.readouterr().out
    assert cli(["check", str(tmp_path / "synth"), "--vocab-size", "600"]) == 0  # no tokenizer: nothing to compare


def fingerprint_of_folder(folder):
    from rollouts.tokenizer import fingerprint_of
    return fingerprint_of(folder)


# --- padded dumps ------------------------------------------------------------------------------

PADDED = [{"prompt": [511, 511, 1, 2, 3], "response": [10, 511, 511, 511], "mask": [0, 0, 1, 1, 1, 1, 0, 0, 0],
           "score": 1.0},
          {"prompt": [511, 4, 5, 6, 7], "response": [11, 12, 13, 511], "mask": [0, 1, 1, 1, 1, 1, 1, 1, 0],
           "score": 0.0}]


@pytest.mark.parametrize("flags", [["--pad-id", "511"], ["--mask-field", "mask"]])
def test_padded_prompt_response_dump_drops_the_pads(tmp_path, flags):
    """The issue's repro: [511,511,1,2,3] + [10,511,511,511] with pad 511 became loss_mask
    [0,0,0,0,0,1,1,1,1] with the reward on a pad; now the pads are gone."""
    src = write_jsonl(tmp_path / "padded.jsonl", PADDED)
    argv = ["convert", "--from", "generic", str(src), "--out", str(tmp_path / "out"), "--prompt-field", "prompt",
            "--response-field", "response", "--map", "reward=score", *flags]
    assert cli(argv) == 0
    rows = sorted(RolloutReader(tmp_path / "out").read_all().to_pylist(), key=lambda r: -r["reward"])
    assert rows[0]["input_ids"] == [1, 2, 3, 10] and rows[0]["loss_mask"] == [0, 0, 0, 1]
    assert rows[1]["input_ids"] == [4, 5, 6, 7, 11, 12, 13] and rows[1]["loss_mask"] == [0, 0, 0, 0, 1, 1, 1]
    assert_clean(tmp_path / "out")


def test_tokenizer_pad_is_the_default_and_check_warns_about_padding(tmp_path, capsys):
    from test_interop_check import tiny_tokenizer

    from rollouts.cli import main as rollouts_main

    records = [{"input_ids": [3, 7, 8, 9] + [0] * 5, "loss_mask": [0, 1, 1, 1] + [1] * 5, "reward": 1.0}
               for _ in range(4)]
    src = write_jsonl(tmp_path / "dump.jsonl", records)
    assert cli(["convert", "--from", "generic", str(src), "--out", str(tmp_path / "plain")]) == 0
    capsys.readouterr()
    assert rollouts_main(["check", str(tmp_path / "plain")]) == 0
    out = capsys.readouterr().out
    assert "4 of 4 rollouts end in 4+ copies of token id 0: padding left in the token ids?" in out
    assert "--pad-id 0" in out

    tok = tiny_tokenizer(tmp_path / "tok")  # pad id 0
    assert cli(["convert", "--from", "generic", str(src), "--out", str(tmp_path / "tok_out"),
                "--tokenizer", str(tok)]) == 0
    assert "stripping runs of the tokenizer's pad id 0" in capsys.readouterr().err
    assert {tuple(r["input_ids"]) for r in RolloutReader(tmp_path / "tok_out").read_all().to_pylist()} == {(3, 7, 8, 9)}
    assert rollouts_main(["check", str(tmp_path / "tok_out")]) == 0
    assert "padding left" not in capsys.readouterr().out


def test_mask_field_of_the_wrong_length_is_one_bad_row(tmp_path):
    src = write_jsonl(tmp_path / "d.jsonl", [{**PADDED[0], "mask": [1, 1]}])
    with pytest.raises(RolloutError, match="'mask' has 2 entries for 9 tokens \\(4 in the response\\)"):
        convert_generic(src, tmp_path / "out", {"reward": "score"}, prompt_field="prompt",
                        response_field="response", mask_field="mask")


def test_help_says_verl_text_dumps_cannot_be_converted(capsys):
    """verl's rollout_data_dir is decoded text without special tokens (the docs' old example named
    a verl parquet file verl never writes); and the schema text points at nothing above."""
    from rollouts.schema import describe
    with pytest.raises(SystemExit):
        cli(["convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "rollout_data_dir dump is decoded text with the special tokens stripped" in text
    assert "verl_dump" not in text and "as described above" not in describe()
