"""Readers over files/folders/globs and every validation case, in both fail and skip mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollouts import RolloutError, RolloutReader, check, resolve, write_rows


def rows(n: int, start: int = 0, length: int = 6) -> list[dict]:
    return [dict(input_ids=list(range(1, length + 1)), loss_mask=[0, 0, 1, 1, 0, 1][:length],
                 reward=float(i % 2), sample_id=f"s{start + i}", group_id=f"g{(start + i) // 2}")
            for i in range(n)]


def write_table(path: Path, data: dict, schema: pa.Schema | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(data, schema=schema), path)
    return path


def good(path: Path, n: int = 4, **over) -> Path:
    data = {"input_ids": [[1, 2, 3, 4]] * n, "loss_mask": [[0, 1, 1, 0]] * n,
            "reward": [1.0] * n, "sample_id": [f"{path.stem}-{i}" for i in range(n)]}
    data.update(over)
    return write_table(path, data)


# --- path resolution -------------------------------------------------------------------------

def test_reads_file_folder_glob_and_lists(tmp_path):
    write_rows(tmp_path / "a", rows(5), shard_rows=2)          # 3 shards
    write_rows(tmp_path / "b" / "nested", rows(4, start=100))  # recursive folder
    (tmp_path / "a" / "part-00009.parquet.tmp").write_bytes(b"half-written")  # never picked up
    (tmp_path / "a" / "notes.txt").write_text("not data")

    assert len(resolve(tmp_path / "a")) == 3
    assert len(resolve(str(tmp_path / "**" / "*.parquet"))) == 4
    files = resolve([tmp_path / "a", str(tmp_path / "b" / "*"), tmp_path / "a" / "part-00000.parquet"])
    assert len(files) == 4  # duplicates removed, order kept
    assert files[:3] == sorted(files[:3])

    reader = check([tmp_path / "a", tmp_path / "b"], on_bad="fail")
    assert reader.summary.rows == 9 and reader.summary.files == 4
    assert reader.summary.tokens == 9 * 6 and reader.summary.policy_tokens == 9 * 3


def test_many_shards_stream_in_order(tmp_path):
    write_rows(tmp_path, rows(300), shard_rows=1)  # 300 single-row shards
    seen = [sid for _, _, b in RolloutReader(tmp_path) for sid in b.column("sample_id").to_pylist()]
    assert seen == [f"s{i}" for i in range(300)]


@pytest.mark.parametrize("spec, message", [
    ("", "empty path"),
    ("does/not/exist", "no such file or folder \\(relative to the current folder, /"),  # which folder it read from
    ("nothing-*.parquet", "matches no file"),
])
def test_bad_path_specs(tmp_path, monkeypatch, spec, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RolloutError, match=message):
        resolve(spec)


def test_folder_without_parquet(tmp_path):
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(RolloutError, match="holds no .parquet"):
        resolve(tmp_path)


# --- summary ---------------------------------------------------------------------------------

def test_summary_statistics(tmp_path):
    data = {"input_ids": [[5] * 4, [5] * 8, [5] * 10],
            "loss_mask": [[0, 1, 1, 1], [0, 1, 0, 1, 1, 0, 1, 0], [0] * 9 + [1]],
            "reward": [1.0, 0.0, 0.5], "token_rewards": [[0.0] * 4, [0.0] * 7 + [0.25], [0.0] * 10]}
    write_table(tmp_path / "s.parquet", data)
    s = check(tmp_path, on_bad="fail").summary
    d = s.to_dict()
    assert d["rows"] == 3 and d["tokens"] == 22 and d["policy_tokens"] == 3 + 4 + 1
    assert list(s.turns) == [1, 3, 1]
    np.testing.assert_allclose(s.rewards, [1.0, 0.25, 0.5])
    assert d["length"]["max"] == 10 and d["length"]["min"] == 4
    text = s.format()
    assert "policy turns" in text and "p99" in text


def test_extra_columns_are_kept(tmp_path):
    good(tmp_path / "x.parquet", prompt_text=["hi"] * 4, score_details=[[1.0, 2.0]] * 4)
    reader = RolloutReader(tmp_path)
    batches = [b for _, _, b in reader]
    assert "prompt_text" in batches[0].schema.names and "score_details" in batches[0].schema.names
    assert reader.summary.extra_columns == {"prompt_text", "score_details"}
    assert reader.summary.bad_rows == 0


def test_loose_types_are_cast_to_canonical(tmp_path):
    write_table(tmp_path / "x.parquet", {
        "input_ids": pa.array([[1, 2, 3]], pa.large_list(pa.int64())),
        "loss_mask": pa.array([[False, True, True]]),
        "reward": pa.array([1], pa.int64()),
        "sample_id": pa.array([7], pa.int64()),
    })
    table = RolloutReader(tmp_path, on_bad="fail").read_all()
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.column("loss_mask").to_pylist() == [[0, 1, 1]]
    assert table.column("reward").type == pa.float64()
    assert table.column("sample_id").to_pylist() == ["7"]


# --- every validation case: fail mode gives one line naming file, row, column -----------------

def _case_files(tmp: Path) -> dict[str, tuple[Path, str, int | None, str | None]]:
    """case -> (file, expected message fragment, row, column)."""
    cases = {}

    def add(name, path, fragment, row, column):
        cases[name] = (path, fragment, row, column)

    add("missing_column", write_table(tmp / "missing.parquet", {"input_ids": [[1, 2]], "reward": [1.0]}),
        "missing required column", None, "loss_mask")
    add("no_reward_column", write_table(tmp / "noreward.parquet", {"input_ids": [[1, 2]], "loss_mask": [[0, 1]]}),
        "no reward column", None, "reward")
    add("wrong_type", write_table(tmp / "wrongtype.parquet", {"input_ids": [["a", "b"]], "loss_mask": [[0, 1]],
                                                              "reward": [1.0]}), "wrong type", None, "input_ids")
    add("wrong_type_reward", write_table(tmp / "wrongreward.parquet", {"input_ids": [[1, 2]], "loss_mask": [[0, 1]],
                                                                       "reward": ["high"]}),
        "wrong type", None, "reward")
    add("length_mask", good(tmp / "len_mask.parquet", loss_mask=[[0, 1, 1, 0]] * 3 + [[0, 1]]),
        "length differs from input_ids", 3, "loss_mask")
    add("length_token_rewards", good(tmp / "len_tr.parquet", token_rewards=[[0.0] * 4] * 2 + [[0.0] * 5] + [[0.0] * 4]),
        "length differs from input_ids", 2, "token_rewards")
    add("length_values", good(tmp / "len_values.parquet", values=[[0.0] * 4, [0.0] * 3, [0.0] * 4, [0.0] * 4]),
        "length differs from input_ids", 1, "values")
    add("no_policy_token", good(tmp / "nopolicy.parquet",
                                loss_mask=[[0, 1, 1, 0]] * 2 + [[0, 0, 0, 0]] + [[0, 1, 1, 0]]),
        "no policy token", 2, "loss_mask")
    add("nan_reward", good(tmp / "nanreward.parquet", reward=[1.0, float("nan"), 1.0, 1.0]),
        "NaN or infinite", 1, "reward")
    add("inf_reward", good(tmp / "infreward.parquet", reward=[1.0, 1.0, 1.0, float("inf")]),
        "NaN or infinite", 3, "reward")
    add("huge_reward", good(tmp / "hugereward.parquet", reward=[1.0, 1.0, 1e20, 1.0]),  # crashed train and eval
        "reward beyond +-1e+09", 2, "reward")
    add("huge_token_reward", good(tmp / "hugetr.parquet", token_rewards=[[0.0] * 4] * 3 + [[0.0, -3e38, 0.0, 0.0]]),
        "a token reward beyond +-1e+09", 3, "token_rewards")
    add("huge_weight", good(tmp / "hugeweight.parquet", sample_weight=[1.0, 1e12, 1.0, 1.0]),  # val loss 3.5e10
        "sample_weight beyond +-1e+09", 1, "sample_weight")
    add("huge_value", good(tmp / "hugevalue.parquet", values=[[0.0] * 4, [0.0, 0.0, 0.0, 1e30], [0.0] * 4, [0.0] * 4]),
        "a value in values beyond", 1, "values")
    add("nan_value", good(tmp / "nanvalue.parquet", values=[[0.0] * 4, [0.0, float("nan"), 0.0, 0.0],
                                                           [0.0] * 4, [0.0] * 4]), "NaN or infinite", 1, "values")
    add("nan_token_reward", good(tmp / "nantr.parquet",
                                 token_rewards=[[0.0, 0.0, float("-inf"), 0.0]] + [[0.0] * 4] * 3),
        "NaN or infinite", 0, "token_rewards")
    add("negative_token", good(tmp / "negtok.parquet", input_ids=[[1, 2, 3, 4]] * 2 + [[1, -5, 3, 4]] + [[1, 2, 3, 4]]),
        "negative token id", 2, "input_ids")
    add("bad_mask_value", good(tmp / "badmask.parquet", loss_mask=[[0, 1, 2, 0]] + [[0, 1, 1, 0]] * 3),
        "values other than 0 and 1", 0, "loss_mask")
    add("empty_file", _touch(tmp / "empty.parquet"), "empty file (0 bytes)", None, None)
    add("empty_rows", write_table(tmp / "norows.parquet", {"input_ids": pa.array([], pa.list_(pa.int32())),
                                                            "loss_mask": pa.array([], pa.list_(pa.int8())),
                                                            "reward": pa.array([], pa.float64())}),
        "empty file (no rows)", None, None)
    src = good(tmp / "src.parquet", n=200)
    data = src.read_bytes()
    trunc = tmp / "truncated.parquet"
    trunc.write_bytes(data[: len(data) // 2])
    add("truncated", trunc, "not a readable parquet file", None, None)
    junk = tmp / "corrupt.parquet"
    junk.write_bytes(b"PAR1" + bytes(np.random.default_rng(0).integers(0, 256, 500, dtype=np.uint8)) + b"PAR1")
    add("corrupt", junk, "not a readable parquet file", None, None)
    src.unlink()
    return cases


def _touch(p: Path) -> Path:
    p.write_bytes(b"")
    return p


CASES = ["missing_column", "no_reward_column", "wrong_type", "wrong_type_reward", "length_mask",
         "length_token_rewards", "length_values", "no_policy_token", "nan_reward", "inf_reward", "huge_reward",
         "huge_token_reward", "huge_weight", "huge_value", "nan_value",
         "nan_token_reward", "negative_token", "bad_mask_value", "empty_file", "empty_rows", "truncated", "corrupt"]


@pytest.mark.parametrize("case", CASES)
def test_fail_mode_one_line_error(tmp_path, case):
    path, fragment, row, column = _case_files(tmp_path)[case]
    with pytest.raises(RolloutError) as info:
        check(path, on_bad="fail")
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith(str(path)), msg
    assert fragment in msg, msg
    if row is not None:
        assert f"row {row}" in msg
    if column is not None:
        assert f"column '{column}'" in msg
    assert ";" in msg  # followed by what to do


def test_duplicate_sample_id_across_files(tmp_path):
    good(tmp_path / "a.parquet")
    good(tmp_path / "b.parquet", sample_id=["b-0", "a-2", "b-2", "b-2"])
    with pytest.raises(RolloutError, match=r"b.parquet: row 1 \(sample_id 'a-2'\), column 'sample_id': duplicate"):
        check(tmp_path, on_bad="fail")
    reader = check(tmp_path, on_bad="skip")
    assert [(Path(p.file).name, p.row) for p in reader.problems] == [("b.parquet", 1), ("b.parquet", 3)]
    assert reader.summary.rows == 6


def test_skip_mode_quarantines_everything_and_counts(tmp_path):
    cases = _case_files(tmp_path / "data")
    good(tmp_path / "data" / "fine.parquet")
    qfile = tmp_path / "q" / "quarantine.jsonl"
    reader = check(tmp_path / "data", on_bad="skip", quarantine=qfile)
    lines = [json.loads(l) for l in qfile.read_text().splitlines()]
    assert len(lines) == len(reader.problems)
    quarantined = {Path(l["file"]).name for l in lines}
    assert {p.name for p, *_ in cases.values()} == quarantined  # every bad file/row is reported
    for l in lines:
        assert {"file", "row", "column", "reason", "sample_id"} <= l.keys()
    s = reader.summary
    # Row-level cases drop exactly one bad row each from otherwise good 4-row files.
    row_cases = [c for c, (_, _, row, _) in cases.items() if row is not None]
    assert s.bad_rows == len(row_cases)
    assert s.rows == 4 + 3 * len(row_cases)
    assert s.bad_files == len(cases) - len(row_cases)
    assert sum(s.problems.values()) == len(lines)


def test_corrupt_page_mid_file_is_reported(tmp_path):
    """A file whose footer is fine but whose data pages are damaged."""
    path = good(tmp_path / "x.parquet", n=50_000)
    raw = bytearray(path.read_bytes())
    mid = len(raw) // 3
    raw[mid:mid + 2000] = b"\xff" * 2000
    path.write_bytes(bytes(raw))
    reader = check(path, on_bad="skip", batch_rows=1000)
    assert reader.summary.bad_files == 1
    assert reader.problems and reader.problems[-1].kind == "corrupt_file"
    assert "truncated or corrupt" in reader.problems[-1].line()


# --- CLI --------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", *args], capture_output=True, text=True)


def test_cli_check_summary_and_problems(tmp_path):
    good(tmp_path / "ok.parquet")
    good(tmp_path / "bad.parquet", reward=[1.0, float("nan"), 1.0, 1.0])
    res = _cli("rollouts", "check", str(tmp_path), "--quarantine", str(tmp_path / "q.jsonl"))
    assert res.returncode == 1, res.stderr
    assert "rows           7  (1 bad rows left out)" in res.stdout
    assert "bad.parquet: row 1" in res.stdout
    assert "Traceback" not in res.stderr
    res = _cli("rollouts", "check", str(tmp_path / "ok.parquet"), "--json")
    assert res.returncode == 0
    assert json.loads(res.stdout)["summary"]["rows"] == 4


def test_cli_errors_are_one_line(tmp_path):
    res = _cli("rollouts", "check", str(tmp_path / "missing"))
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and res.stderr.startswith("error: ")
    good(tmp_path / "bad.parquet", reward=[1.0, float("nan"), 1.0, 1.0])
    res = _cli("rollouts", "check", str(tmp_path), "--on-bad", "fail")
    assert res.returncode == 2 and "row 1" in res.stderr and "Traceback" not in res.stderr


def test_rollouts_package_does_not_import_torch():
    code = "import rollouts, rollouts.cli, rollouts.convert, rollouts.synth, sys; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"


def test_hugging_face_datasets_are_rollout_archives(tmp_path):
    """A Dataset.save_to_disk folder, a datasets.Dataset and an hf:NAME spec (local cache) read
    like parquet shards: the same rows, memory-mapped Arrow files; a Dataset with an indices
    mapping or in memory only, and a DatasetDict folder, are one-line errors."""
    import datasets
    from conftest import toy_rows

    from rollouts import RolloutError, RolloutReader, resolve, write_rows

    rows = toy_rows(30)
    write_rows(tmp_path / "pq", rows)
    want = RolloutReader(tmp_path / "pq").read_all()
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(tmp_path / "saved"))
    loaded = datasets.load_from_disk(str(tmp_path / "saved"))
    for spec in (tmp_path / "saved", loaded):
        files = resolve(spec)
        assert [f.suffix for f in files] == [".arrow"]
        got = RolloutReader(spec).read_all()
        assert got.column("input_ids").to_pylist() == want.column("input_ids").to_pylist()
        assert got.column("reward").to_pylist() == want.column("reward").to_pylist()
    with pytest.raises(RolloutError, match="flatten_indices"):
        resolve(loaded.select([2, 1]))
    with pytest.raises(RolloutError, match="in memory only"):
        resolve(ds)
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dict"))
    with pytest.raises(RolloutError, match="pass one split's folder, e.g. .*dict/train"):
        resolve(tmp_path / "dict")


def test_hf_spec_reads_the_local_datasets_cache(tmp_path, monkeypatch):
    """hf:NAME[:SPLIT] goes through datasets.load_dataset (offline here: a local parquet dataset
    folder stands in for a cached Hub dataset)."""
    import datasets
    from conftest import toy_rows

    from rollouts import RolloutError, RolloutReader, write_rows

    write_rows(tmp_path / "hub" / "data", toy_rows(12))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "cache"))
    got = RolloutReader(f"hf:{tmp_path / 'hub'}:train").read_all()
    assert got.num_rows == 12
    with pytest.raises(RolloutError, match="cannot load it from the datasets cache"):
        RolloutReader(f"hf:{tmp_path / 'nope'}")
    assert datasets.__version__
