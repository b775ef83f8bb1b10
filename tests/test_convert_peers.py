"""``rollouts convert --from slime|verl``: the dumps peers already write, read safely, row by row.

The fixtures are written the way the peers write them (docs/converters.md cites the code):

- slime: ``torch.save({"rollout_id": N, "samples": [Sample.to_dict(), ...]}, <N>.pt)``, with every
  field ``Sample.to_dict`` gives (``status`` as its value, ``spec_info``/``prefix_cache_info`` as
  dicts) and the ``--dump-details`` layout (``rollout_data/``, ``train_data/``, ``tokenizer/``);
- verl: ``pickle.dump(DataProto)`` (``DataProto.save_to_disk``) whose ``__getstate__`` gives the
  ``torch.save`` bytes of a consolidated TensorDict (or, with
  ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``, its ``serialize_tensordict`` tuple), the
  ``non_tensor_batch`` numpy arrays and ``meta_info``; the tensors as the agent loop's
  ``_postprocess`` builds them; the ``skip.rollout`` layout (``<step>/gen_batch.dp`` + ``meta.json``).
  verl's and tensordict's classes are stand-ins registered under their real module names, so the
  pickles name exactly the globals the real ones do; neither package is needed.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides, toy_rows, train_main
from test_convert import cli as convert_cli
from test_interop_check import tiny_tokenizer

from rollouts import RolloutError, RolloutReader, check
from rollouts.convert import convert_slime, convert_verl
from rollouts.provenance import ROLLOUTS_MANIFEST
from rollouts.tokenizer import chat_template_sha256, fingerprint_of, load

PAD = 0  # toy ids start at 1


def read_rows(out: Path) -> dict[str, dict]:
    return {r["sample_id"]: r for r in RolloutReader(out).read_all().to_pylist()}


def assert_clean(out: Path) -> None:
    reader = check(out)
    assert reader.problems == [] and reader.summary.bad_files == 0


def split(row: dict) -> tuple[list[int], list[int], list[int]]:
    """(prompt, response, response loss mask): the response starts at the first policy token."""
    first = row["loss_mask"].index(1)
    return row["input_ids"][:first], row["input_ids"][first:], row["loss_mask"][first:]


# ---------------------------------------------------------------------------------------------
# slime

def slime_sample(prompt: list[int], response: list[int], mask: list[int] | None, reward, *, group: int, index: int,
                 status: str = "completed", remove: bool = False, **more) -> dict:
    """``Sample(...).to_dict()``: ``self.__dict__`` with ``status`` as its value and the two info
    dataclasses as dicts (slime/utils/types.py)."""
    sample = {
        "group_index": group, "index": index, "rollout_id": None, "prompt": "<user> question",
        "tokens": prompt + response,
        "multimodal_inputs": None, "multimodal_train_inputs": None, "multimodal_train_input_id": None,
        "apply_chat_template_kwargs": {}, "response": "answer", "response_length": len(response), "label": "42",
        "reward": reward, "loss_mask": mask, "weight_versions": ["1"], "rollout_log_probs": [-0.5] * len(response),
        "rollout_top_p_token_ids": None, "rollout_top_p_token_offsets": None, "rollout_routed_experts": None,
        "remove_sample": remove, "teacher_log_probs": None, "status": status, "metadata": {"source": "toy"},
        "generate_function_path": None, "custom_rm_path": None, "train_metadata": None, "session_id": None,
        "non_generation_time": 0.0,
        "spec_info": {"spec_accept_token_num": 0, "spec_draft_token_num": 0, "spec_verify_ct": 0,
                      "completion_token_num": len(response)},
        "prefix_cache_info": {"cached_tokens": 0, "total_prompt_tokens": len(prompt)},
    }
    sample.update(more)
    return sample


def slime_dump(path: Path, rollout_id: int, samples: list[dict]) -> Path:
    """``save_debug_rollout_data``: ``torch.save({"rollout_id": ..., "samples": [...]}, path)``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"rollout_id": rollout_id, "samples": samples}, path)
    return path


def slime_run(root: Path, rows_by_rollout: dict[int, list[dict]]) -> Path:
    """``--dump-details root``: rollout_data/<id>.pt, an eval dump, train_data/ and the tokenizer."""
    for rollout_id, rows in rows_by_rollout.items():
        samples = []
        for i, row in enumerate(rows):
            prompt, response, mask = split(row)
            samples.append(slime_sample(prompt, response, None if all(mask) else mask, row["reward"],
                                        group=rollout_id * 100 + i // 2, index=rollout_id * 100 + i))
        slime_dump(root / "rollout_data" / f"{rollout_id}.pt", rollout_id, samples)
    slime_dump(root / "rollout_data" / "eval_0.pt", 0, [])  # evaluation rollouts: not training data
    (root / "train_data").mkdir(parents=True, exist_ok=True)
    torch.save({"tokens": [[1, 2]], "loss_masks": [[1]]}, root / "train_data" / "0.pt")  # another format
    tok = tiny_tokenizer(root / "tokenizer")
    t = load(tok)
    t.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    t.save_pretrained(str(tok))
    return root


def test_slime_round_trip_and_provenance(tmp_path, capsys):
    multi = {"input_ids": [3, 9, 9, 20, 21, 30, 31, 22, 40], "loss_mask": [0, 0, 0, 1, 1, 0, 0, 1, 0],
             "reward": -1.0}  # a tool reply between turns, and one at the end
    rows = {0: toy_rows(4, seed=1), 1: toy_rows(3, seed=2) + [multi]}
    root = slime_run(tmp_path / "dump", rows)
    out = tmp_path / "out"
    assert convert_cli(["convert", "--from", "slime", str(root), "--out", str(out), "--model", "Qwen/Qwen3-4B"]) == 0
    captured = capsys.readouterr()
    assert "converted 2 file(s): 8 rows written" in captured.out
    assert "ignored 2 other .pt file(s)" in captured.err and "tokenizer: " in captured.err
    assert_clean(out)
    got = read_rows(out)
    for rollout_id, rs in rows.items():
        for i, row in enumerate(rs):
            r = got[f"rollout{rollout_id}-idx{rollout_id * 100 + i}"]
            assert (r["input_ids"], r["loss_mask"], r["reward"]) == (row["input_ids"], row["loss_mask"], row["reward"])
            assert r["group_id"] == f"group{rollout_id * 100 + i // 2}" and r["policy_version"] == rollout_id
            assert r["sample_weight"] == 1.0 and r["truncated"] is False
    assert got["rollout1-idx103"]["loss_mask"][-1] == 0  # ends on a tool token; the reward stays with the row
    manifest = json.loads((out / ROLLOUTS_MANIFEST).read_text())
    tok = root / "tokenizer"
    assert manifest["tokenizer"] == fingerprint_of(tok)
    assert manifest["collected"] == {"framework": "slime", "model": "Qwen/Qwen3-4B", "tokenizer_path": str(tok),
                                     "chat_template_sha256": chat_template_sha256(load(tok))}


def test_slime_fields_reward_key_status_remove_and_compact(tmp_path):
    p, resp = [5, 6, 7], [10, 11, 12]
    samples = [
        slime_sample(p, resp, [1, 0, 1], {"acc": 1.0, "fmt": 0.5}, group=0, index=0, status="truncated",
                     rollout_routed_experts=torch.zeros(5, 2, 2, dtype=torch.int16)),  # tensors load too
        slime_sample(p, resp, None, {"acc": 0.0, "fmt": 1.0}, group=0, index=1, remove=True),
        slime_sample(p, [13, 14], [1, 1], {"acc": 1.0, "fmt": 1.0}, group=1, index=2, rollout_id=7),
        slime_sample(p, [15], [1], {"acc": 0.0, "fmt": 1.0}, group=1, index=2, rollout_id=7),  # same compact rollout
    ]
    dump = slime_dump(tmp_path / "3.pt", 3, samples)
    with pytest.raises(RolloutError, match=r"3.pt: row 0, column 'reward': reward is a dict \(keys acc, fmt\); "
                                           r"pass --reward-field KEY"):
        convert_slime(dump, tmp_path / "o1")
    convert_slime(dump, tmp_path / "out", reward_key="acc", keep_extra=True)
    assert_clean(tmp_path / "out")
    got = read_rows(tmp_path / "out")
    assert list(got) == ["rollout3-idx0", "rollout3-idx1", "rollout3-idx2-row2", "rollout3-idx2-row3"]
    a, b = got["rollout3-idx0"], got["rollout3-idx1"]
    assert (a["loss_mask"], a["reward"], a["truncated"]) == ([0, 0, 0, 1, 0, 1], 1.0, True)
    assert (b["loss_mask"], b["sample_weight"]) == ([0, 0, 0, 1, 1, 1], 0.0)  # remove_sample: kept, no weight
    assert a["status"] == "truncated" and a["metadata"] == '{"source": "toy"}' and a["index"] == 0
    assert a["rollout_id"] is None and got["rollout3-idx2-row3"]["rollout_id"] == "7"


# ---------------------------------------------------------------------------------------------
# verl: DataProto and TensorDict as their pickles name them

def _fake_module(name: str, monkeypatch) -> types.ModuleType:
    """``name`` (and its parent packages) in sys.modules, for this test only."""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            mod = types.ModuleType(sub)
            mod.__path__ = []
            monkeypatch.setitem(sys.modules, sub, mod)
    return sys.modules[name]


def _fake_class(module: str, name: str, monkeypatch, **body) -> type:
    mod = _fake_module(module, monkeypatch)
    cls = type(name, (), body)
    cls.__module__, cls.__qualname__ = module, name
    setattr(mod, name, cls)
    return cls


@pytest.fixture
def verl_classes(monkeypatch):
    """``verl.protocol.DataProto`` and tensordict's consolidated rebuild, as stand-ins whose pickles
    name the real globals (pickle checks ``sys.modules[module].name is obj``)."""
    def getstate(self):  # DataProto.__getstate__
        if os.environ.get("VERL_DATAPROTO_SERIALIZATION_METHOD") == "numpy":
            return serialize_tensordict(self.batch, self.batch_size), self.non_tensor_batch, self.meta_info
        return consolidated_td_bytes(self.batch, self.batch_size, monkeypatch), self.non_tensor_batch, self.meta_info

    return _fake_class("verl.protocol", "DataProto", monkeypatch, __getstate__=getstate)


def consolidated_td_bytes(tensors: dict[str, torch.Tensor], batch_size: int, monkeypatch) -> bytes:
    """``torch.save(td.contiguous().consolidate())``: tensordict's ``_reduce_td`` gives
    ``(_rebuild_tensordict_files_consolidated, (metadata, flat uint8 storage))`` with every leaf
    ``(dtype, shape, start, stop, pad)`` padded to 8 bytes (tensordict/_base/serialization.py)."""
    leaves, chunks, start = {}, [], 0
    for key, t in tensors.items():
        raw = t.contiguous().view(-1).view(torch.uint8)
        pad = (8 - raw.numel() % 8) % 8
        chunks += [raw, torch.zeros(pad, dtype=torch.uint8)]
        leaves[key] = (str(t.dtype), list(t.shape), start, start + raw.numel() + pad, pad)
        start += raw.numel() + pad
    metadata = {"cls": "TensorDict", "non_tensors": {}, "leaves": leaves,
                "cls_metadata": {"device": None, "names": [None], "batch_size": [batch_size], "is_locked": False}}
    mod = _fake_module("tensordict._reductions", monkeypatch)

    def _rebuild_tensordict_files_consolidated(metadata, storage):
        raise AssertionError("never called: the reader has its own")
    _rebuild_tensordict_files_consolidated.__module__ = "tensordict._reductions"
    _rebuild_tensordict_files_consolidated.__qualname__ = "_rebuild_tensordict_files_consolidated"
    mod._rebuild_tensordict_files_consolidated = _rebuild_tensordict_files_consolidated

    class Consolidated:
        def __reduce__(self):
            return _rebuild_tensordict_files_consolidated, (metadata, torch.cat(chunks))
    buf = io.BytesIO()
    torch.save(Consolidated(), buf)
    return buf.getvalue()


def serialize_tensordict(tensors: dict[str, torch.Tensor], batch_size: int):
    """verl's ``serialize_tensordict`` (VERL_DATAPROTO_SERIALIZATION_METHOD=numpy)."""
    items = {k: (str(v.dtype).removeprefix("torch."), v.shape, v.flatten().contiguous().view(torch.uint8).numpy())
             for k, v in tensors.items()}
    return (batch_size,), None, items


def verl_batch(rows: list[dict], P: int, R: int, *, reward_key: str = "rm_scores") -> dict[str, torch.Tensor]:
    """The agent loop's ``_postprocess``: prompts left-padded to P, responses right-padded to R,
    response_mask 1 on policy tokens (0 on tool tokens and padding), the score on the last real
    response token (``attention_mask[:, P:].sum(1) - 1``)."""
    B = len(rows)
    prompts, responses = torch.full((B, P), PAD), torch.full((B, R), PAD)
    pmask, rmask, resp_mask = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long), \
        torch.zeros(B, R, dtype=torch.long)
    for b, row in enumerate(rows):
        p, r, m = split(row)
        prompts[b, P - len(p):], pmask[b, P - len(p):] = torch.tensor(p), 1
        responses[b, :len(r)], rmask[b, :len(r)], resp_mask[b, :len(r)] = torch.tensor(r), 1, torch.tensor(m)
    attention = torch.cat([pmask, rmask], dim=1)
    scores = torch.zeros(B, R)
    scores[torch.arange(B), attention[:, P:].sum(1) - 1] = torch.tensor([row["reward"] for row in rows])
    return {"prompts": prompts, "responses": responses, "response_mask": resp_mask,
            "input_ids": torch.cat([prompts, responses], dim=1), "attention_mask": attention,
            "position_ids": torch.clamp(attention.cumsum(-1) - 1, min=0), reward_key: scores}


def verl_dump(folder: Path, step: int, rows: list[dict], DataProto, P: int = 16, R: int = 48, **kw) -> Path:
    """``RolloutSkip.prepare_data``: ``<step>/gen_batch.dp`` (``DataProto.save_to_disk``) + meta.json."""
    dp = DataProto()
    dp.batch, dp.batch_size = verl_batch(rows, P, R, **kw), len(rows)
    dp.non_tensor_batch = {"__num_turns__": np.array([2] * len(rows), dtype=np.int32),
                           "turn_scores": np.array([None] * len(rows), dtype=object),
                           "data_source": np.array(["toy"] * len(rows), dtype=object)}
    dp.meta_info = {"timing": {"agent_loop/generate_sequences/mean": np.float64(0.25)}, "reward_extra_keys": []}
    step_dir = folder / str(step)
    step_dir.mkdir(parents=True, exist_ok=True)
    with open(step_dir / "gen_batch.dp", "wb") as f:
        pickle.dump(dp, f)
    (step_dir / "meta.json").write_text(json.dumps({"global_steps": step}))
    return step_dir / "gen_batch.dp"


@pytest.mark.parametrize("method", ["torch", "numpy"])
def test_verl_round_trip(tmp_path, verl_classes, monkeypatch, method, capsys):
    if method == "numpy":
        monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", "numpy")
    multi = {"input_ids": [3, 9, 9, 20, 21, 30, 31, 22, 40], "loss_mask": [0, 0, 0, 1, 1, 0, 0, 1, 0],
             "reward": 1.0}
    steps = {1: toy_rows(4, seed=3), 2: toy_rows(3, seed=4) + [multi]}
    cache = tmp_path / "rollout_dump" / "exp_proj" / "GBS2_N2_in16_out48"
    for step, rows in steps.items():
        verl_dump(cache, step, rows, verl_classes)
    out = tmp_path / "out"
    assert convert_cli(["convert", "--from", "verl", str(tmp_path / "rollout_dump"), "--out", str(out),
                        "--keep-extra"]) == 0
    assert "converted 2 file(s): 8 rows written" in capsys.readouterr().out
    assert_clean(out)
    got = read_rows(out)
    for step, rows in steps.items():
        for i, row in enumerate(rows):
            r = got[f"step{step}-{i}"]
            assert (r["input_ids"], r["loss_mask"], r["reward"]) == (row["input_ids"], row["loss_mask"], row["reward"])
            assert r["token_rewards"] is None and r["policy_version"] == step - 1 and PAD not in r["input_ids"]
            assert r["__num_turns__"] == 2 and r["data_source"] == "toy"
    assert got["step2-3"]["loss_mask"][-1] == 0  # verl's score sat on that tool token: the row keeps it
    manifest = json.loads((out / ROLLOUTS_MANIFEST).read_text())
    assert manifest["collected"] == {"framework": "verl", "max_length": 64}


def test_verl_per_token_scores_and_reward_field(tmp_path, verl_classes):
    rows = toy_rows(3, seed=5)
    dump = verl_dump(tmp_path / "c", 1, rows, verl_classes, reward_key="token_level_scores")
    convert_verl(dump, tmp_path / "out")
    assert [r["reward"] for r in read_rows(tmp_path / "out").values()] == [r["reward"] for r in rows]
    # scores on several tokens (a process reward): kept per token, padding dropped alike
    batch = verl_batch(rows, 16, 48, reward_key="token_level_scores")
    batch["token_level_scores"][:, 0] = 0.5
    obj = verl_classes()
    obj.batch, obj.batch_size = batch, 3
    obj.non_tensor_batch, obj.meta_info = {"acc": np.array([1.0, 0.0, 1.0])}, {}
    (tmp_path / "d" / "2").mkdir(parents=True)
    (tmp_path / "d" / "2" / "gen_batch.dp").write_bytes(pickle.dumps(obj))
    convert_verl(tmp_path / "d", tmp_path / "out2")
    for i, (row, r) in enumerate(zip(rows, read_rows(tmp_path / "out2").values())):
        first = row["loss_mask"].index(1)
        assert r["reward"] is None and len(r["token_rewards"]) == len(row["input_ids"])
        assert r["token_rewards"][first] == 0.5 + (row["reward"] if len(row["input_ids"]) == first + 1 else 0.0)
    convert_verl(tmp_path / "d", tmp_path / "out3", reward_field="acc")  # a non_tensor_batch field
    assert [r["reward"] for r in read_rows(tmp_path / "out3").values()] == [1.0, 0.0, 1.0]


def test_verl_text_dump_is_refused_with_what_to_dump(tmp_path):
    """trainer.rollout_data_dir: ``_log_rollout_data`` decodes with skip_special_tokens=True."""
    text = tmp_path / "rollout_data_dir"
    text.mkdir()
    (text / "1.jsonl").write_text(json.dumps({"input": "question", "output": "answer", "gts": "4", "score": 1.0,
                                              "step": 1}) + "\n")
    for spec in (text, text / "1.jsonl"):
        with pytest.raises(RolloutError) as err:
            convert_verl(spec, tmp_path / "out")
        msg = str(err.value)
        assert "\n" not in msg and "decoded text with the special tokens stripped" in msg
        assert "skip.rollout.enable=True skip.rollout.action=cache" in msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["slime", "verl"])
def test_converted_dump_trains_and_the_run_prints_its_provenance(source, tmp_path, toy_data, verl_classes, capsys):
    rows = RolloutReader(toy_data).read_all().to_pylist()
    if source == "slime":
        src = slime_run(tmp_path / "dump", {0: rows[:120], 1: rows[120:]})
    else:
        src = tmp_path / "dump"
        for step, part in ((1, rows[:120]), (2, rows[120:])):
            verl_dump(src, step, part, verl_classes, P=16, R=80)
    out = tmp_path / "rollouts"
    assert convert_cli(["convert", "--from", source, str(src), "--out", str(out), "--framework-version", "0.9"]) == 0
    capsys.readouterr()
    assert train_main(tiny_overrides(tmp_path / "run", out, **{"train.max_steps": 2, "checkpoint.save_every": 2})) == 0
    line = next(line for line in capsys.readouterr().err.splitlines() if "collected by" in line)
    assert f"collected by {source} 0.9" in line and str(out) in line
    assert ("Tokenizer" in line) == (source == "slime")  # slime saved its tokenizer beside the dump


# ---------------------------------------------------------------------------------------------
# Bad input: one line each, never a pickle's code

class Planted:
    """A pickle that would run a shell command on a plain ``pickle.load`` / ``torch.load``."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _slime_planted(tmp_path, verl_classes=None):
    samples = [slime_sample([1, 2], [3], [1], 1.0, group=0, index=0, metadata={"x": Planted(tmp_path / "pwned")})]
    return slime_dump(tmp_path / "in" / "0.pt", 0, samples), "slime"


def _verl_planted(tmp_path, verl_classes=None):
    path = tmp_path / "in" / "1" / "gen_batch.dp"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"batch": Planted(tmp_path / "pwned")}))
    return path, "verl"


def _slime_mask_length(tmp_path, verl_classes=None):
    return slime_dump(tmp_path / "in" / "0.pt", 0, [slime_sample([1, 2], [3, 4], [1], 1.0, group=0, index=0)]), "slime"


def _slime_not_torch(tmp_path, verl_classes=None):
    path = tmp_path / "in" / "0.pt"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"rollout_id": 0, "samples": []}))  # a plain pickle, not torch.save's zip
    return path, "slime"


def _verl_no_reward(tmp_path, verl_classes):
    return verl_dump(tmp_path / "in", 1, toy_rows(2), verl_classes, reward_key="acc_tensor"), "verl"


def _verl_not_dataproto(tmp_path, verl_classes):
    path = tmp_path / "in" / "1" / "gen_batch.dp"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"prompts": np.zeros((2, 3))}))
    return path, "verl"


BAD = {
    # case: (builder, words the one line must hold, kind)
    "slime_planted_reduce": (_slime_planted, ["the pickle calls posix.system", "refused before anything ran"],
                             "unsafe_pickle"),
    "verl_planted_reduce": (_verl_planted, ["the pickle calls posix.system"], "unsafe_pickle"),
    "slime_mask_length": (_slime_mask_length, ["row 0", "loss_mask has 1 entries but response_length is 2"],
                          "length_mismatch"),
    "slime_not_torch": (_slime_not_torch, ["not a torch.save archive"], "not_slime_dump"),
    "verl_no_reward": (_verl_no_reward, ["holds no reward (neither token_level_scores nor rm_scores)",
                                         "--reward-field"], "missing_field"),
    "verl_not_dataproto": (_verl_not_dataproto, ["holds a pickled dict, not a verl DataProto"], "not_verl_batch"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_input_is_one_line_and_runs_nothing(case, tmp_path, verl_classes):
    build, words, kind = BAD[case]
    src, source = build(tmp_path, verl_classes)
    convert = convert_slime if source == "slime" else convert_verl
    with pytest.raises(RolloutError) as err:
        convert(src, tmp_path / "out")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(str(src)), msg
    for word in words:
        assert word in msg, (word, msg)
    assert not (tmp_path / "out").exists() and not (tmp_path / "pwned").exists()
    res = convert(src, tmp_path / "out", on_bad="skip", quarantine=tmp_path / "q.jsonl")
    assert dict(res.problem_counts) == {kind: 1} and res.rows_written == 0
    assert not (tmp_path / "pwned").exists()


def test_planted_reduce_would_run_under_a_plain_load(tmp_path):
    """The fixture is real: torch.load(weights_only=False), as slime loads its dumps, runs it."""
    src, _ = _slime_planted(tmp_path)
    torch.load(src, weights_only=False)
    assert (tmp_path / "pwned").exists()


def test_every_converter_records_what_it_knows_of_the_run(tmp_path):
    """NeMo-RL with the collecting run's GRPO config (model, max length), generic with options only."""
    from test_convert import PROMPT_A, Rollout, nemo_rl_dump, write_jsonl

    dump = nemo_rl_dump(tmp_path / "n" / "train_data_step1.jsonl", [Rollout(PROMPT_A, [(3, True)], 1.0)])
    grpo = tmp_path / "grpo.yaml"
    grpo.write_text("grpo: {reward_scaling: {enabled: false}}\n"
                    "policy: {model_name: Qwen/Qwen2.5-1.5B, max_total_sequence_length: 4096}\n")
    tok = tiny_tokenizer(tmp_path / "tok")
    assert convert_cli(["convert", "--from", "nemo-rl", str(dump), "--out", str(tmp_path / "a"), "--ppo-config",
                        str(grpo), "--tokenizer", str(tok), "--framework-version", "0.4.0"]) == 0
    manifest = json.loads((tmp_path / "a" / ROLLOUTS_MANIFEST).read_text())
    assert manifest["collected"] == {"framework": "nemo-rl", "version": "0.4.0", "model": "Qwen/Qwen2.5-1.5B",
                                     "tokenizer_path": str(tok), "max_length": 4096}  # no chat template: no hash
    assert manifest["tokenizer"] == fingerprint_of(tok)
    src = write_jsonl(tmp_path / "g.jsonl", [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "reward": 1.0}])
    assert convert_cli(["convert", "--from", "generic", str(src), "--out", str(tmp_path / "b"), "--model", "m"]) == 0
    assert json.loads((tmp_path / "b" / ROLLOUTS_MANIFEST).read_text())["collected"] == {"model": "m"}
    with pytest.raises(RolloutError, match="--map is for --from generic; slime dumps are mapped already"):
        convert_cli(["convert", "--from", "slime", str(src), "--out", str(tmp_path / "c"), "--map", "reward=x"])
