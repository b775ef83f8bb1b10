"""rollouts/provenance.py: what an archive says of its rewards, from convert to seed check.

NeMo-RL logs ``rewards`` after ``scale_rewards`` and reward shaping (grpo.py and the PPO loop).
The issue's repro: a dump of a run mapping {0,1} to {-1,1}, trained with defaults, checked
against NeMo-RL's example PPO config, used to advise ``targets.reward_scale=2
targets.reward_shift=-1``, and following that advice trained on {-3, 1} and printed OK.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import tiny_overrides, toy_rows, train_main
from test_convert import cli as convert_cli
from test_convert import nemo_rl_dump

from critic_pretrain.interop.check import check_seed
from rollouts.provenance import ROLLOUTS_MANIFEST, RewardsLogged, rewards_logged

SCALING = "reward_scaling: {enabled: true, source_min: 0.0, source_max: 1.0, target_min: -1.0, target_max: 1.0}"
PPO = f"""
ppo:
  adv_estimator: {{name: gae, gae_lambda: 1.0, gae_gamma: 1, gae_lambda_value: 1.0}}
  {SCALING}
  reward_shaping: {{enabled: {{shaping}}}}
policy: {{max_total_sequence_length: 256}}
"""
GRPO = f"""
grpo:
  {SCALING}
  reward_shaping: {{enabled: true, overlong_buffer_length: 64}}
policy: {{model_name: Qwen/Qwen2.5-1.5B}}
"""


class Row:
    """A rollout as nemo_rl_dump writes it, from conftest's toy rows (ids below the tiny vocab)."""

    def __init__(self, r: dict, reward: float):
        self.ids, self.mask, self.reward, self.weight = r["input_ids"], r["loss_mask"], reward, 1.0
        self.advantages = [0.0] * len(self.ids)
        self.logprobs = [-0.5] * len(self.ids)


def dump(folder: Path, scaled: bool) -> Path:
    """train_data_step1.jsonl with the toy rollouts' 0/1 rewards, or as NeMo-RL logs them scaled."""
    rows = toy_rows(160, seed=21)
    nemo_rl_dump(folder / "train_data_step1.jsonl", [Row(r, 2 * r["reward"] - 1 if scaled else r["reward"])
                                                      for r in rows])
    return folder


def convert(src: Path, out: Path, *flags: str) -> None:
    assert convert_cli(["convert", "--from", "nemo-rl", str(src), "--out", str(out), *flags]) == 0


def train(data: Path, out: Path, **extra) -> Path:
    assert train_main(tiny_overrides(out, data, **{"train.max_steps": 2, "checkpoint.save_every": 2,
                                                   "eval.every": 2, **extra})) == 0
    return out / "step_2"


def ppo_config(tmp_path: Path, shaping: bool = True) -> Path:
    path = tmp_path / f"ppo-{shaping}.yaml"
    path.write_text(PPO.replace("{shaping}", str(shaping).lower()))
    return path


def problems(report) -> list[str]:
    return [p.message for p in report.problems]


def test_nemo_rl_dump_at_both_scales_from_convert_to_seed_check(tmp_path, capsys):
    scaled = dump(tmp_path / "scaled_dump", scaled=True)
    ppo = ppo_config(tmp_path)

    # 1. nothing says how the dump logged its rewards: one warning at convert time
    convert(scaled, tmp_path / "unknown")
    assert "outside [0, 1] (NeMo-RL's default reward_scaling source range)" in capsys.readouterr().err
    assert rewards_logged(tmp_path / "unknown") is None
    step = train(tmp_path / "unknown", tmp_path / "run_unknown")
    report = check_seed(step, ppo_config=ppo)
    (line,) = problems(report)
    assert "almost certainly scaled already" in line and "rollouts convert --ppo-config" in line
    assert "targets.reward_scale=2" not in line  # the old advice, which scaled them twice
    # the paste-in does not call them raw: it once said "trained on the raw rewards" here
    from critic_pretrain.commands.seed import print_report
    from critic_pretrain.interop.frameworks import RAW_UNSTATED
    capsys.readouterr()
    print_report(check_seed(step))
    out = capsys.readouterr().out
    assert f"enabled: false        # the critic was trained on {RAW_UNSTATED}" in out and "raw rewards" not in out

    # 2. the old advice followed: the critic trains on {-3, 1}; before, this printed OK
    step = train(tmp_path / "unknown", tmp_path / "run_twice", **{"targets.reward_scale": 2,
                                                                   "targets.reward_shift": -1})
    assert not check_seed(step, ppo_config=ppo).ok

    # 3. converted with the collecting run's (GRPO) config: recorded, trained with defaults, OK
    (tmp_path / "grpo.yaml").write_text(GRPO)
    convert(scaled, tmp_path / "known", "--ppo-config", str(tmp_path / "grpo.yaml"))
    assert "outside [0, 1]" not in capsys.readouterr().err
    logged = rewards_logged(tmp_path / "known")
    assert (logged.scale, logged.shift, logged.clip, logged.source_range, logged.shaped) == (2.0, -1.0, (-1.0, 1.0),
                                                                                             (0.0, 1.0), True)
    step = train(tmp_path / "known", tmp_path / "run_known")
    manifest = json.loads((step / "critic_pretrain.json").read_text())
    assert manifest["data"]["rewards"]["logged"]["scale"] == 2.0
    assert (manifest["data"]["rewards"]["min"], manifest["data"]["rewards"]["max"]) == (-1.0, 1.0)
    report = check_seed(step, ppo_config=ppo)
    assert report.ok and report.warnings == [], (problems(report), report.warnings)
    assert report.facts["targets"]["reward_scale"] == 2.0 and report.facts["targets"]["reward_shift"] == -1.0

    # the paste-in block: NeMo-RL's reward_scaling as the critic saw it, not "raw rewards"
    capsys.readouterr()
    print_report(check_seed(step))
    out = capsys.readouterr().out
    assert "enabled: true" in out and "source_min: 0" in out and "target_min: -1" in out
    assert "the rollouts logged them as 2*r - 1, shaped" in out

    # 4. the recorded archive plus a second scaling: the advice undoes it
    step = train(tmp_path / "known", tmp_path / "run_known_twice", **{"targets.reward_scale": 2,
                                                                       "targets.reward_shift": -1})
    (line,) = problems(check_seed(step, ppo_config=ppo))
    assert "the critic's were 4*r - 3" in line and "targets.reward_scale=1 targets.reward_shift=0" in line

    # 5. a raw dump, stated raw: the advice to scale is right, and following it passes
    raw = dump(tmp_path / "raw_dump", scaled=False)
    convert(raw, tmp_path / "raw", "--rewards-raw")
    assert "outside" not in capsys.readouterr().err
    step = train(tmp_path / "raw", tmp_path / "run_raw")
    (line,) = problems(check_seed(step, ppo_config=ppo))
    assert "targets.reward_scale=2 targets.reward_shift=-1" in line
    capsys.readouterr()
    print_report(check_seed(step))  # stated raw: the paste-in says so plainly
    assert "enabled: false        # the critic was trained on the raw rewards\n" in capsys.readouterr().out
    step = train(tmp_path / "raw", tmp_path / "run_raw_scaled", **{"targets.reward_scale": 2,
                                                                    "targets.reward_shift": -1})
    report = check_seed(step, ppo_config=ppo)
    assert report.ok, problems(report)
    assert any("the critic's rollouts were logged without it" in w for w in report.warnings)  # PPO shapes


def test_shaping_on_either_side(tmp_path):
    """Recorded shaped rollouts against a PPO run that does not shape, and unrecorded ones
    against one that does: a warning that says which side shapes."""
    convert(dump(tmp_path / "d", scaled=True), tmp_path / "scaled", "--rewards-scaled", "2,-1")
    step = train(tmp_path / "scaled", tmp_path / "run")
    report = check_seed(step, ppo_config=ppo_config(tmp_path, shaping=False))
    assert report.ok and report.warnings == []  # not shaped, and the PPO run does not shape
    (tmp_path / "grpo.yaml").write_text(GRPO)
    convert(tmp_path / "d", tmp_path / "shaped", "--ppo-config", str(tmp_path / "grpo.yaml"))
    report = check_seed(train(tmp_path / "shaped", tmp_path / "run2"), ppo_config=ppo_config(tmp_path, shaping=False))
    assert any("logged with reward shaping, this PPO run does not shape" in w for w in report.warnings)


def test_archives_on_different_scales_are_not_mixed(tmp_path, capsys):
    convert(dump(tmp_path / "a", scaled=True), tmp_path / "scaled", "--rewards-scaled", "2,-1")
    convert(dump(tmp_path / "b", scaled=False), tmp_path / "raw", "--rewards-raw")
    over = tiny_overrides(tmp_path / "run", tmp_path / "raw",
                          **{"data.train": f"[{tmp_path / 'scaled'},{tmp_path / 'raw'}]", "train.max_steps": 1})
    capsys.readouterr()
    assert train_main(over) == 2
    err = capsys.readouterr().err
    assert "hold rewards on different scales" in err and "2*r - 1 (--rewards-scaled 2,-1)" in err


@pytest.mark.parametrize("flags, says", [
    (["--rewards-scaled", "two"], "--rewards-scaled 'two': write SCALE,SHIFT"),
    (["--rewards-scaled", "0,1"], "SCALE must not be 0"),
    (["--rewards-raw", "--rewards-scaled", "2,-1"], None),  # argparse: not allowed together
])
def test_bad_reward_flags(tmp_path, flags, says):
    from rollouts.errors import UserError
    src = dump(tmp_path / "d", scaled=False)
    if says is None:
        with pytest.raises(SystemExit):
            convert(src, tmp_path / "out", *flags)
        return
    with pytest.raises(UserError, match=says):
        convert(src, tmp_path / "out", *flags)
    assert not (tmp_path / "out" / ROLLOUTS_MANIFEST).exists()


def test_compose_and_raw():
    logged = RewardsLogged(2.0, -1.0, clip=(-1.0, 1.0))
    assert logged.compose({"reward_scale": 1.0, "reward_shift": 0.0, "reward_clip": None}) == {
        "reward_scale": 2.0, "reward_shift": -1.0, "reward_clip": [-1.0, 1.0]}
    assert logged.compose({"reward_scale": 0.5, "reward_shift": 0.5})["reward_shift"] == 0.0  # back to [0, 1]
    assert logged.to_raw(1.0) == 1.0 and logged.to_raw(-1.0) == 0.0
    assert RewardsLogged.from_dict(json.loads(json.dumps(logged.to_dict()))) == logged


def test_two_synthetic_archives_of_one_seed_are_refused_together(tmp_path, capsys):
    """`rollouts synth` ids are s<seed>-...: two environments of one seed share every id, so the
    second source was dropped as repeats (the fifth trial's `data.sources`). One line names both
    folders and the fix; another seed, or the same archive twice, trains."""
    from rollouts import SAMPLE_DIR, synth
    small = {"max_length": 256, "median_length": 60}
    synth.write(tmp_path / "fatal0", 48, seed=0, env="fatal", **small)
    synth.write(tmp_path / "fatal1", 48, seed=1, env="fatal", **small)
    from rollouts.provenance import synthetic_id_clash
    assert synthetic_id_clash([SAMPLE_DIR, tmp_path / "fatal1", SAMPLE_DIR]) is None
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, SAMPLE_DIR, **{"data.train": f"[builtin:sample,{tmp_path / 'fatal0'}]",
                                                         "model.config.vocab_size": 512})) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == (f"error: {SAMPLE_DIR} and {tmp_path / 'fatal0'} were both written by rollouts synth with --seed 0 "
                   "but different environments or settings: their sample_ids and group_ids coincide, so one archive's "
                   "rollouts would be dropped as repeats of the other's and their prompts merged; write one again with "
                   "another --seed")
    assert not out.exists()


def test_a_model_folder_without_tokenizer_files_has_no_tokenizer(tmp_path):
    """transformers 5 builds a one-token "tokenizer" from a config.json alone; training took that for
    a real tokenizer and refused synthetic rollouts while `rollouts check --model` accepted them.
    Both now read a folder without tokenizer files as having none; given as model.tokenizer, it is
    an error."""
    from conftest import TINY_MODEL
    from transformers import AutoConfig

    from critic_pretrain.errors import UserError
    from rollouts.tokenizer import fingerprint_of, load_for_model
    AutoConfig.for_model(**TINY_MODEL).save_pretrained(tmp_path / "lm")
    assert load_for_model(str(tmp_path / "lm"), explicit=False, trust_remote_code=False) is None
    assert fingerprint_of(tmp_path / "lm") is None
    with pytest.raises(UserError, match="holds no tokenizer files"):
        load_for_model(str(tmp_path / "lm"), explicit=True, trust_remote_code=False)
