"""Trust no folder we did not write: token ids against the model, no code from a checkpoint,
integrity by content."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import ROOT, tiny_overrides, toy_rows, train_main

from critic_pretrain import checkpoint as ckpt
from rollouts import write_rows


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error:")]


# --- token ids against the model's vocabulary ----------------------------------------------

@pytest.fixture
def out_of_vocab(tmp_path) -> Path:
    rows = toy_rows(60, seed=3)
    rows[7]["input_ids"][2] = 64  # TINY_MODEL has vocab_size 64
    d = tmp_path / "data"
    write_rows(d, rows)
    return d


def test_token_id_beyond_vocab_fails_before_step_1(out_of_vocab, tmp_path, capsys):
    assert train_main(tiny_overrides(tmp_path / "run", out_of_vocab)) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "row 7" in err[0] and "input_ids" in err[0] and "vocab_size 64" in err[0], err
    assert not list((tmp_path / "run").glob("step_*"))


def test_token_id_beyond_vocab_is_quarantined_with_skip(out_of_vocab, tmp_path):
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, out_of_vocab, **{"data.on_bad": "skip", "train.max_steps": 2})) == 0
    bad = [json.loads(line) for line in (out / "data_cache" / "train" / "quarantine.jsonl").read_text().splitlines()]
    assert [(b["row"], b["kind"]) for b in bad] == [(7, "token_out_of_vocab")]


def test_rollouts_check_vocab_size_and_model(out_of_vocab, tmp_path):
    def check(*args):
        return subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "rollouts", "check", str(out_of_vocab),
                               *args], capture_output=True, text=True, cwd=ROOT)
    assert check().returncode == 0
    res = check("--vocab-size", "64")
    assert res.returncode == 1 and "row 7" in res.stdout and "vocab_size 64" in res.stdout
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"vocab_size": 64}))
    assert check("--model", str(tmp_path / "model")).returncode == 1
    assert check("--vocab-size", "65").returncode == 0
    res = check("--model", str(tmp_path / "nope"))
    assert res.returncode == 2 and len(error_lines(res.stderr)) == 1


def test_null_values_row_is_bad_when_lambda_bootstraps(tmp_path, capsys):
    rows = toy_rows(40, seed=4)
    for r in rows:
        r["values"] = [0.5] * len(r["input_ids"])
    rows[5]["values"] = None
    write_rows(tmp_path / "data", rows)
    over = tiny_overrides(tmp_path / "run", tmp_path / "data", **{"targets.lam": 0.9, "targets.values_from": "data"})
    assert train_main(over) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "row 5" in err[0] and "values" in err[0] and "lambda < 1" in err[0], err


# --- no code from a checkpoint ------------------------------------------------------------

class _Exec:
    """A pickle payload that writes ``marker`` when unpickled."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))


def refresh_manifest(step: Path) -> None:
    """What an attacker can do: make the manifest's sizes and checksums match the planted files."""
    manifest = json.loads((step / ckpt.MANIFEST).read_text())
    manifest["files"] = ckpt.files_manifest(step)
    (step / ckpt.MANIFEST).write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def trained(toy_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trust") / "run"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 4, "checkpoint.save_every": 2})) == 0
    return out


def planted(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    marker = tmp_path / "pwned"
    step = out / "step_4"
    (ckpt.StepPaths(step).optim_dir / ".metadata").write_bytes(pickle.dumps(_Exec(marker)))
    (step / "resume" / "rng_rank0.pt").write_bytes(pickle.dumps(_Exec(marker)))  # the old RNG file name
    config = json.loads(ckpt.StepPaths(step).hf_config.read_text())  # remote code the checkpoint asks for
    config["auto_map"] = {"AutoConfig": "evil.Config", "AutoModelForTokenClassification": "evil.Model"}
    ckpt.StepPaths(step).hf_config.write_text(json.dumps(config))
    (ckpt.StepPaths(step).weights_dir / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    cfg_yaml = (step / "config.yaml").read_text().replace("trust_remote_code: false", "trust_remote_code: true")
    (step / "config.yaml").write_text(cfg_yaml)
    refresh_manifest(step)
    return step, marker


def test_planted_pickles_never_run(trained, toy_data, tmp_path, capsys):
    from critic_pretrain.cli import main as cli_main
    step, marker = planted(trained, tmp_path)
    assert ckpt.verify(step, content=True) is None  # sizes and checksums match: only content can tell

    assert cli_main(["seed", "check", str(step)]) == 1                        # seed check
    assert cli_main(["export", str(step), "--format", "nemo-rl", "--out", str(tmp_path / "exp")]) != 0  # export
    assert cli_main(["eval", str(step), "--rollouts", str(toy_data), "--out", str(tmp_path / "e.json")]) == 0
    over = tiny_overrides(step.parent, toy_data, **{"train.max_steps": 6, "checkpoint.save_every": 2,
                                                   "train.allow_config_changes": "[train.max_steps]"})
    assert train_main(over) == 2                                              # resume
    err = capsys.readouterr().err
    assert "not part of a checkpoint" in err and "Traceback" not in err
    assert not marker.exists()


def test_rng_state_is_not_a_pickle(trained):
    rng = trained / "step_4" / "resume" / "rng_rank0.safetensors"
    assert rng.is_file() and not list((trained / "step_4" / "resume").glob("*.pt"))
    state = ckpt.load_rng_state(rng)
    assert set(state) >= {"python", "numpy", "torch"}


# --- integrity by content ------------------------------------------------------------------

def flip_byte(path: Path, offset: int) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime


def test_same_size_corruption_falls_back_and_is_refused(trained, toy_data, tmp_path, capsys, caplog):
    from critic_pretrain.cli import main as cli_main
    from critic_pretrain.interop.check import check_seed
    out = tmp_path / "run"
    shutil.copytree(trained, out)
    weights = ckpt.StepPaths(out / "step_4").weights
    flip_byte(weights, weights.stat().st_size // 2)
    assert ckpt.verify(out / "step_4") is None                                # sizes alone cannot tell
    assert "checksum" in ckpt.verify(out / "step_4", content=True)
    assert any("checksum" in str(p) for p in check_seed(out / "step_4").problems)
    assert cli_main(["export", str(out / "step_4"), "--format", "hf", "--out", str(tmp_path / "hf")]) != 0
    assert ckpt.resolve_resume(out, None) == out / "step_2"                    # auto-resume falls back
    with pytest.raises(Exception, match="checksum"):
        ckpt.resolve_resume(out, 4)                                           # an explicit step is an error


def test_in_place_data_edit_is_caught_on_resume(tmp_path, capsys):
    data = tmp_path / "data"
    write_rows(data, toy_rows(80, seed=5))
    out = tmp_path / "run"
    over = tiny_overrides(out, data, **{"train.max_steps": 2, "optim.schedule": "constant"})
    assert train_main(over) == 0
    shard = next(data.glob("*.parquet"))
    meta = pq.ParquetFile(shard).metadata
    first_page = meta.row_group(0).column(0).data_page_offset
    flip_byte(shard, first_page + 40)  # inside the first data page: footer and size unchanged
    over = tiny_overrides(out, data, **{"train.max_steps": 4, "optim.schedule": "constant"})
    assert train_main(over) == 2
    err = error_lines(capsys.readouterr().err)
    assert len(err) == 1 and "1 modified" in err[0], err


def test_a_model_folder_with_a_planted_pickle_runs_nothing(tmp_path):
    """model.name_or_path whose pytorch_model.bin carries a payload: transformers reads .bin weights
    with torch.load(weights_only=True), which refuses it; we say so in one line (before: a traceback
    ending in torch's advice to turn weights_only off) and nothing runs."""
    import torch
    from conftest import TINY_MODEL
    from transformers import AutoConfig

    from critic_pretrain.config import ModelConfig
    from critic_pretrain.errors import UserError
    from critic_pretrain.model import build_value_model
    folder, marker = tmp_path / "lm", tmp_path / "pwned"
    folder.mkdir()
    AutoConfig.for_model(**TINY_MODEL).save_pretrained(folder)
    torch.save({"model.embed_tokens.weight": _Exec(marker)}, folder / "pytorch_model.bin")
    with pytest.raises(UserError) as e:
        build_value_model(ModelConfig(name_or_path=str(folder)))
    assert "its pickle weights (*.bin) hold objects other than tensors" in str(e.value)
    assert "weights_only" not in str(e.value) and not marker.exists()
