"""``critic-pretrain seed check``: every failure is one line that says what to do, exit code 1.

One tiny trained run per module (steps 2 and 4); each failure case breaks a copy of step_4.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from conftest import ROOT, tiny_overrides
from safetensors.torch import load_file, save_file

from critic_pretrain import checkpoint as ckpt
from critic_pretrain.cli import main as cli_main
from critic_pretrain.interop.check import check_seed
from critic_pretrain.interop.frameworks import config_lines, nemo_rl_reward_scaling


@pytest.fixture(scope="module")
def run(toy_data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("seedrun")
    from conftest import train_main
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 4, "checkpoint.save_every": 2})) == 0
    return out


@pytest.fixture
def seed(run, tmp_path) -> Path:
    """A private copy of step_4 (inside a run folder with a step_2 beside it) to break."""
    shutil.copytree(run / "step_2", tmp_path / "run" / "step_2")
    return Path(shutil.copytree(run / "step_4", tmp_path / "run" / "step_4"))


def check(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["seed", "check", *map(str, args)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("error: ")]


def rewrite_weights(step: Path, edit) -> None:
    """Edit the weights as if training had saved them so (the manifest's checksums follow)."""
    path = ckpt.StepPaths(step).weights
    state = load_file(path)
    edit(state)
    save_file(state, path, metadata={"format": "pt"})
    manifest = json.loads((step / ckpt.MANIFEST).read_text())
    manifest["files"] = ckpt.files_manifest(step)
    (step / ckpt.MANIFEST).write_text(json.dumps(manifest))


# ---------------------------------------------------------------------------------------------
# A good seed

def test_good_seed_passes_with_facts_and_paste_lines(run, capsys):
    report = check_seed(run / "step_4")
    assert report.ok, report.problems
    f = report.facts
    assert f["step"] == 4 and f["parameters"] > 0 and f["dtypes"] == ["float32"]
    assert f["head"]["weight_shape"] == [1, 32] and isinstance(f["head"]["bias"], float)
    assert f["arch"] == {"model_type": "qwen2", "hidden_size": 32, "num_layers": 2, "vocab_size": 64}
    assert f["targets"]["gamma"] == 1.0 and f["targets"]["lam"] == 1.0
    opt = f["optimizer"]
    assert opt["param_groups"] == 1 and opt["initial_lr"] and opt["scheduler"] == "LambdaLR" and opt["last_epoch"] == 4
    rc, out, err = check(capsys, run / "step_4", "--model-config", ckpt.StepPaths(run / "step_4").hf_config)
    assert rc == 0, err
    assert out.startswith(f"OK  {run / 'step_4'} is a valid critic seed for nemo-rl")
    assert f"warm_start_value_checkpoint: {(run / 'step_4').resolve()}" in out
    assert "policy_training_start_step: 0" in out and "gae_lambda_value: 1" in out
    # The current NeMo-RL warm-starts from the weights only: no warnings about the optimizer state.
    assert err == "" and "ignores it on a warm start; --legacy-nemo-rl checks it" in out
    rc, out, err = check(capsys, run / "step_4", "--legacy-nemo-rl")
    assert rc == 0 and "LambdaLR" in err and "carries lr" in err  # the notes for NeMo-RL before PR #4213
    # The state's AdamW hyperparameters replace the PPO config's too: the run's own, read from the state.
    cfg = yaml.safe_load((run / "config.yaml").read_text())["optim"]
    assert opt["betas"] == cfg["betas"] and opt["weight_decay"] == cfg["weight_decay"] and opt["eps"] == cfg["eps"]
    assert f"AdamW betas {tuple(cfg['betas'])}, weight decay {cfg['weight_decay']}:" in err


def test_json_output(run, capsys):
    rc = cli_main(["seed", "check", str(run / "step_4"), "--json"])
    report = json.loads(capsys.readouterr().out)
    assert rc == 0 and report["ok"] and report["facts"]["step"] == 4


def test_step_folder_for_other_targets_points_at_export(run, capsys):
    for target, fmt in (("verl", "hf"), ("openrlhf", "openrlhf"), ("trl", "trl")):
        rc, out, _ = check(capsys, run / "step_4", "--for", target)
        assert rc == 0 and f"critic-pretrain export {run / 'step_4'} --format {fmt}" in out


def test_reward_transform_becomes_nemo_rl_reward_scaling():
    lines = "\n".join(nemo_rl_reward_scaling({"reward_scale": 2.0, "reward_shift": -1.0, "reward_clip": None}))
    assert "enabled: true" in lines and "target_min: -1" in lines and "target_max: 1" in lines
    clipped = "\n".join(nemo_rl_reward_scaling({"reward_scale": 2.0, "reward_shift": -1.0, "reward_clip": [-1, 0.5]}))
    assert "source_min: 0" in clipped and "source_max: 0.75" in clipped and "target_max: 0.5" in clipped
    assert "enabled: false" in "\n".join(nemo_rl_reward_scaling({"reward_scale": 1.0, "reward_shift": 0.0}))
    text = "\n".join(config_lines("nemo-rl", Path("/s/step_3"), {"targets": {"gamma": 0.99, "lam": 0.95}}))
    assert "gae_gamma: 0.99" in text and "gae_lambda_value: 0.95" in text


@pytest.mark.parametrize("target,key", [("verl", "algorithm.lam: "), ("openrlhf", "--lambd "), ("trl", "lam=")])
def test_shared_lambda_frameworks_keep_the_actors_lambda_after_td_pretraining(target, key):
    """verl, OpenRLHF and TRL use one lambda for actor and critic: Monte-Carlo pretraining is
    printed as trained (1), TD(0.8) pretraining does not push 0.8 onto the actor."""
    mc = "\n".join(config_lines(target, Path("/s"), {"targets": {"gamma": 1.0, "lam": 1.0}}))
    td = "\n".join(config_lines(target, Path("/s"), {"targets": {"gamma": 1.0, "lam": 0.8, "values_from": "critic"}}))
    assert f"{key}1" in mc and f"{key}<actor's lambda>" in td and "TD(0.8)" in td and f"{key}0.8" not in td



def test_a_lambda_schedule_hands_ppo_the_lambda_of_the_step():
    """targets.lam_end: a seed's lambda, as the check and the paste lines report it, is the one
    that step was last trained with (the schedule's value there), not the starting `lam`."""
    targets = {"gamma": 1.0, "lam": 0.98, "lam_end": 0.8, "values_from": "critic"}
    at = {step: ckpt.Manifest({"step": step, "max_steps": 1200, "targets": targets}).effective_targets["lam"]
          for step in (0, 600, 1200)}
    assert at == pytest.approx({0: 0.98, 600: 0.89, 1200: 0.8})
    fixed = ckpt.Manifest({"step": 600, "max_steps": 1200, "targets": {**targets, "lam_end": None}})
    assert fixed.effective_targets["lam"] == 0.98
    end = ckpt.Manifest({"step": 1200, "max_steps": 1200, "targets": targets}).effective_targets
    text = "\n".join(config_lines("nemo-rl", Path("/s/step_1200"), {"targets": end}))
    assert "gae_lambda_value: 0.8" in text and end["lam_start"] == 0.98

# ---------------------------------------------------------------------------------------------
# The path

def test_empty_path(capsys):
    rc, _, err = check(capsys, "")
    assert rc == 1
    assert errors(err) == ["error: the seed path is empty: pass the step_<n> folder of a critic-pretrain run, e.g. "
                           "runs/critic/step_370 (NeMo-RL rejects an empty ppo.warm_start_value_checkpoint too)"]


def saved_steps(run: Path) -> str:
    return ", ".join(sorted((d.name for d in run.glob("step_*")), key=lambda n: int(n.removeprefix("step_"))))


def test_typo_path_suggests_the_close_name(seed, capsys):
    rc, _, err = check(capsys, seed.parent / "step_44")
    assert rc == 1
    assert errors(err) == [f"error: {seed.parent / 'step_44'} does not exist ({seed.parent} has no 'step_44'; its "
                           f"checkpoints: {saved_steps(seed.parent)}); pass an existing step_<n> folder"]
    rc, _, err = check(capsys, seed.parent.parent / (seed.parent.name + "x") / seed.name)
    assert errors(err)[0].endswith(f"does not exist (did you mean {seed}?); pass an existing step_<n> folder")


def test_run_folder_names_the_newest_step(seed, capsys):
    rc, _, err = check(capsys, seed.parent)
    assert rc == 1
    assert errors(err) == [f"error: {seed.parent} is a run folder, not a checkpoint; pass one of its step_<n> "
                           f"folders, e.g. the newest complete one: {seed}"]


def test_tmp_step_folder(seed, capsys):
    tmp = shutil.copytree(seed, seed.parent / "tmp_step_6")
    rc, _, err = check(capsys, tmp)
    assert rc == 1
    assert errors(err) == [f"error: {tmp} is an unfinished save (tmp_step_6: the run crashed or is still writing "
                           f"it); use the newest complete checkpoint {seed}, or wait for the save to finish"]


def test_not_a_seed_and_file(tmp_path, capsys):
    (tmp_path / "x.txt").write_text("x")
    assert check(capsys, tmp_path / "x.txt")[0] == 1
    rc, _, err = check(capsys, tmp_path)
    assert rc == 1 and "has no value/weights: it is not a critic seed" in err


# ---------------------------------------------------------------------------------------------
# Weights

def test_missing_weights(seed, capsys):
    ckpt.StepPaths(seed).weights.unlink()
    rc, _, err = check(capsys, seed)
    assert rc == 1
    assert any("no weights: " in e and "has no *.safetensors file" in e for e in errors(err)), err


def test_unreadable_weights(seed, capsys):
    with open(ckpt.StepPaths(seed).weights, "r+b") as f:
        f.truncate(50)
    rc, _, err = check(capsys, seed)
    assert rc == 1 and any("the file is truncated or not safetensors" in e for e in errors(err)), err


def test_head_of_the_wrong_shape(seed, capsys):
    def two_labels(state):
        state["score.weight"] = torch.zeros(2, 32)
        state["score.bias"] = torch.zeros(2)
    rewrite_weights(seed, two_labels)
    rc, _, err = check(capsys, seed)
    assert rc == 1
    assert "error: value head score.weight has shape [2, 32], expected [1, hidden]: a value head has one output " \
           "(this looks like a classifier with several labels); train a critic with critic-pretrain train" in err


def test_nan_weights(seed, capsys):
    rewrite_weights(seed, lambda s: s["model.layers.1.mlp.up_proj.weight"].view(-1)[:3].fill_(float("nan")))
    rc, _, err = check(capsys, seed)
    assert rc == 1
    assert errors(err) == ["error: 1 tensor(s) hold NaN/Inf (e.g. model.layers.1.mlp.up_proj.weight: 3 of 2048 "
                           "values): NeMo-RL loads them silently and the first PPO step produces NaN; use an earlier "
                           f"checkpoint, e.g. {seed.parent / 'step_2'} and lower the learning rate"]


def test_hidden_size_differs_from_the_ppo_model(seed, tmp_path, capsys):
    config = json.loads(ckpt.StepPaths(seed).hf_config.read_text())
    config.update(hidden_size=64, intermediate_size=128)
    (tmp_path / "ppo_model").mkdir()
    (tmp_path / "ppo_model" / "config.json").write_text(json.dumps(config))
    rc, _, err = check(capsys, seed, "--model-config", tmp_path / "ppo_model")
    assert rc == 1
    assert errors(err) == [f"error: hidden size 32 in the seed (value head [1, 32]) but --model-config "
                           f"{tmp_path / 'ppo_model'} has hidden_size=64: the critic was trained on another backbone; "
                           "point the PPO value model (value.model_name) at the seed's backbone or retrain the critic "
                           "on the PPO model"]


def test_vocab_and_layers_differ_from_the_ppo_model(seed, tmp_path, capsys):
    config = json.loads(ckpt.StepPaths(seed).hf_config.read_text())
    config.update(vocab_size=128, num_hidden_layers=3, layer_types=["full_attention"] * 3)
    (tmp_path / "config.json").write_text(json.dumps(config))
    rc, _, err = check(capsys, seed, "--model-config", tmp_path / "config.json")
    assert rc == 1
    lines = errors(err)
    assert len(lines) == 2
    assert lines[0].startswith("error: vocabulary of 64 tokens in the seed (model.embed_tokens.weight) but")
    assert lines[1].startswith("error: 2 layers in the seed but")


def test_extra_keys_that_nemo_rl_would_ignore(seed, capsys):
    rewrite_weights(seed, lambda s: s.update({"lm_head.weight": torch.zeros(64, 32)}))
    rc, _, err = check(capsys, seed)
    assert rc == 1 and any(e.startswith("error: 1 unexpected tensor(s) (e.g. lm_head.weight): NeMo-RL and "
                                        "transformers ignore extra keys silently") for e in errors(err)), err


def test_missing_backbone_tensor(seed, capsys):
    rewrite_weights(seed, lambda s: s.pop("model.norm.weight"))
    rc, _, err = check(capsys, seed)
    assert rc == 1 and any(e.startswith("error: 1 tensor(s) missing (e.g. model.norm.weight): the strict load fails")
                           for e in errors(err)), err


@pytest.mark.parametrize("name", ["__0_0.distcp", "adapter_model.safetensors"])
def test_stray_files_that_switch_nemo_rls_loader(seed, capsys, name):
    shutil.copy(ckpt.StepPaths(seed).weights, ckpt.StepPaths(seed).weights_dir / name)
    rc, _, err = check(capsys, seed)
    assert rc == 1
    expected = "stray DCP file" if name.endswith(".distcp") else "makes NeMo-RL load the seed as a PEFT adapter"
    assert any(expected in e for e in errors(err)), err


def test_head_without_bias_for_nemo_rl(run, toy_data, tmp_path, capsys):
    from conftest import train_main
    out = tmp_path / "nobias"
    assert train_main(tiny_overrides(out, toy_data, **{"train.max_steps": 1, "model.head_bias": False})) == 0
    rc, _, err = check(capsys, out / "step_1")
    assert rc == 1
    assert errors(err) == ["error: the value head has no bias (trained with model.head_bias=false) but nemo-rl builds "
                           "AutoModelForTokenClassification(num_labels=1) with score.bias [1] and loads strictly; "
                           "export it with critic-pretrain export --format nemo-rl (adds a zero bias, "
                           "values unchanged)"]
    assert check(capsys, out / "step_1", "--for", "trl")[0] == 0  # bias-free is what TRL wants


# ---------------------------------------------------------------------------------------------
# training_info.json and the manifest

def test_training_info_step_mismatch_and_missing(seed, capsys):
    info = json.loads(ckpt.StepPaths(seed).training_info.read_text())
    moved = shutil.copytree(seed, seed.parent / "step_3")
    rc, _, err = check(capsys, moved)
    assert rc == 1 and (f"error: training_info.json says total_steps={info['total_steps']} "
                        "but the folder is step_3" in err)
    ckpt.StepPaths(seed).training_info.unlink()
    rc, _, err = check(capsys, seed)
    assert rc == 1 and f"error: no training_info.json in {seed}" in err


def test_changed_file_is_caught_by_the_manifest(seed, capsys):
    with open(ckpt.StepPaths(seed).root / "config.yaml", "a") as f:
        f.write("# edited\n")
    rc, _, err = check(capsys, seed)
    assert rc == 1 and "config.yaml has" in err and "copy it again from the run" in err


# ---------------------------------------------------------------------------------------------
# Optimizer

def _rewrite_optimizer(step: Path, make) -> None:
    """Replace value/optimizer/optim with the state of the optimizer/scheduler ``make`` builds."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    from transformers import AutoConfig, AutoModelForTokenClassification

    p = ckpt.StepPaths(step)
    model = AutoModelForTokenClassification.from_config(AutoConfig.from_pretrained(p.hf_config.parent))
    opt, sched = make(model)
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    if sched is not None:
        sched.step()
    shutil.rmtree(p.optim_dir)
    state = {"optim": get_optimizer_state_dict(model, opt, options=ckpt.OPTIM_OPTIONS),
             "sched": sched.state_dict() if sched is not None else {"last_epoch": 1}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "torch.distributed is disabled": one process is the intent
        dcp.save(state, checkpoint_id=str(p.optim_dir), no_dist=True)
    manifest = json.loads(p.manifest.read_text())
    manifest["files"] = ckpt.files_manifest(step)
    p.manifest.write_text(json.dumps(manifest))


def test_optimizer_with_two_param_groups(seed, capsys):
    from torch.optim.lr_scheduler import LambdaLR

    def two_groups(model):
        head = [p for n, p in model.named_parameters() if n.startswith("score.")]
        body = [p for n, p in model.named_parameters() if not n.startswith("score.")]
        opt = torch.optim.AdamW([{"params": body}, {"params": head, "weight_decay": 0.1}], lr=1e-3)
        return opt, LambdaLR(opt, lambda s: 1)
    _rewrite_optimizer(seed, two_groups)
    rc, _, err = check(capsys, seed)
    assert rc == 1
    assert errors(err) == ["error: the optimizer state has 2 parameter groups (they differ in weight_decay): NeMo-RL "
                           "builds one AdamW group, loads this with the wrong hyperparameters and its scheduler "
                           "crashes on the first step; drop it (critic-pretrain export STEP --format nemo-rl "
                           "--drop-optimizer: NeMo-RL since PR #4213 rebuilds it on a warm start anyway)"]


def test_optimizer_without_scheduler_or_all_parameters(seed, capsys):
    _rewrite_optimizer(seed, lambda model: (torch.optim.AdamW(model.parameters(), lr=1e-3), None))
    rc, _, err = check(capsys, seed)
    assert rc == 1 and any(e.startswith("error: no initial_lr in the optimizer state") for e in errors(err)), err

    def frozen_head(model):
        opt = torch.optim.AdamW([p for n, p in model.named_parameters() if not n.startswith("score.")], lr=1e-3)
        from torch.optim.lr_scheduler import LambdaLR
        return opt, LambdaLR(opt, lambda s: 1)
    _rewrite_optimizer(seed, frozen_head)
    rc, _, err = check(capsys, seed)
    assert rc == 1 and any(e.startswith("error: the optimizer state lacks 2 trainable parameter(s) (e.g. score.")
                           for e in errors(err)), err


def test_unreadable_optimizer(seed, capsys):
    (ckpt.StepPaths(seed).optim_dir / ".metadata").write_bytes(b"garbage")
    rc, _, err = check(capsys, seed)
    assert rc == 1 and "value/optimizer/optim is not a readable torch.distributed.checkpoint" in err


def test_cli_subprocess_exit_code_and_one_line(run, tmp_path):
    res = subprocess.run([sys.executable, "-m", "critic_pretrain.cli", "seed", "check", str(run / "step_9")],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 1
    assert errors(res.stderr) == [f"error: {run / 'step_9'} does not exist ({run} has no 'step_9'; its checkpoints: "
                                  f"{saved_steps(run)}); pass an existing step_<n> folder"]
    assert "Traceback" not in res.stderr


# ---------------------------------------------------------------------------------------------
# --rollouts: is the critic still better than the group statistics on the current policy?

def verdict_of(call: str, regime: str, est: float = 0.2) -> dict:
    return {"call": call, "regime": regime, "ev_vs_group_mean": {"est": est, "lo": est - 0.1, "hi": est + 0.1},
            "line": f"{regime}: **{call}** (EV over the group mean {est:.3f}): fix"}


@pytest.mark.parametrize("metrics,regimes,ok,words", [
    ({"eval/adv_corr_first_lam0.95": 0.70, "eval/adv_corr_first_lam0.95_group_mean": 0.55,
      "eval/adv_corr_first_grpo": 0.4}, [], True, None),
    ({"eval/adv_corr_first_lam0.95": 0.38, "eval/adv_corr_first_lam0.95_group_mean": 0.55,
      "eval/adv_corr_first_grpo": 0.47}, [], False,
     "correlate 0.380 with the true ones at turn-first tokens, no better than the group mean return as a constant "
     "value (0.550, by more than two standard errors over"),
    # without an oracle PPO's regime (fresh responses to trained prompts) decides, wherever it is listed
    ({}, [verdict_of("no better than the group mean", "prompt", -0.1), verdict_of("helps", "response")], True, None),
    ({}, [verdict_of("helps", "prompt"), verdict_of("no better than the group mean", "response", -0.1)], False,
     "response: no better than the group mean (EV over the group mean -0.100)"),
    ({}, [verdict_of("harmful", "prompt", -0.5), verdict_of("unknown", "response")], False, "prompt: harmful"),
])
def test_quality_rule(seed, capsys, monkeypatch, metrics, regimes, ok, words):
    import critic_pretrain.eval.from_checkpoint as evaluate

    calls = []
    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda step, rollouts, **kw: calls.append(
        (step, rollouts, kw)) or {"metrics": {"eval/explained_variance": 0.3, **metrics},
                                  "data": {"rows": 64, "trained_on_left_out": 1600},
                                  "regimes": [{"rows": 32, "regime": v["regime"], "verdict": v} for v in regimes]})
    rc, out, err = check(capsys, seed, "--rollouts", "newer/")
    assert calls == [(seed.resolve(), ["newer/"], {"cold_every": 0, "leave_out_trained": True})]
    assert rc == (0 if ok else 1)
    if ok:
        assert "quality on the current policy (64 rollouts; 1,600 more left out: the critic trained on them)" in out
    else:
        (line,) = errors(err)
        assert words in line and "on 64 rollouts of newer/, 1,600 more left out: the critic trained on them" in line
    for v in regimes:  # every regime's verdict is printed, pass or fail
        assert f"verdict on {v['line'].replace('**', '')}" in (out if ok else err)


def test_quality_without_a_baseline_warns(seed, capsys, monkeypatch):
    import critic_pretrain.eval.from_checkpoint as evaluate

    monkeypatch.setattr(evaluate, "evaluate_checkpoint", lambda *a, **kw: {
        "metrics": {"eval/explained_variance": 0.3}, "data": {"rows": 9, "trained_on_left_out": 0},
        "regimes": [{"rows": 9, "regime": "response", "verdict": verdict_of("unknown", "response")}]})
    rc, _, err = check(capsys, seed, "--rollouts", "x/")
    assert rc == 0 and "too few prompts with two or more responses to judge the critic" in err
    assert "(its explained variance: 0.300)" in err


def test_quality_on_fresh_rollouts_of_a_shifted_policy(tmp_path, capsys):
    """A real check: a tiny critic trained on the synthetic environment, checked on rollouts of
    a policy with the good-action probabilities reversed; the verdict and the numbers are the
    `eval` numbers on those rollouts."""
    import pyarrow.parquet as pq
    from conftest import TINY_MODEL, train_main

    from critic_pretrain.eval import evaluate_checkpoint
    from rollouts import synth

    env = dict(group_size=4, max_length=256, median_length=48)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    pq.write_table(synth.generate(96, seed=1, **env), tmp_path / "a" / "part-0.parquet")
    pq.write_table(synth.generate(48, seed=2, p_good_easy=0.2, p_good_hard=0.9, **env), tmp_path / "b" / "p.parquet")
    out = tmp_path / "run"
    assert train_main(tiny_overrides(out, tmp_path / "a", **{
        "model.config": json.dumps({**TINY_MODEL, "vocab_size": synth.VOCAB_SIZE}), "train.max_steps": 4,
        "data.max_tokens": 1024})) == 0
    rc, out_text, err = check(capsys, out / "step_4", "--rollouts", tmp_path / "b")
    ev = evaluate_checkpoint(out / "step_4", [str(tmp_path / "b")], cold_every=0)
    m = ev["metrics"]
    critic, control = m["eval/adv_corr_first_lam0.95"], m["eval/adv_corr_first_lam0.95_group_mean"]
    n = next(r["n"] for r in ev["advantages"] if (r["estimator"], r["lam"], r["tokens"]) == ("critic", 0.95, "first"))
    assert rc == (0 if critic - control > 2 / n ** 0.5 else 1)
    assert f"{critic:.3f}" in (out_text if rc == 0 else err) and f"{control:.3f}" in (out_text if rc == 0 else err)
    assert "more left out" not in out_text + err  # b is all fresh
    # with the training archive passed too, its trained rows are left out and the line says how many
    trained = len(ckpt.StepPaths(out / "step_4").read_trained()["rollouts"])
    facts = check_seed(out / "step_4", rollouts=[str(tmp_path / "b"), str(tmp_path / "a")]).facts["quality"]
    assert 0 < trained < 96 and facts["rows"] == 48 + 96 - trained and facts["trained_on_left_out"] == trained


# ---------------------------------------------------------------------------------------------
# --ppo-config: the PPO run's conventions against the seed's

NEMO_BASE = """
ppo:
  adv_estimator: {name: gae, gae_lambda: 0.95, gae_gamma: 1, gae_lambda_value: null}
  reward_shaping: {enabled: true, overlong_buffer_length: 2048}
  reward_scaling: {enabled: true, source_min: 0.0, source_max: 1.0, target_min: -1.0, target_max: 1.0}
policy:
  model_name: Qwen/Qwen2.5-1.5B
  max_total_sequence_length: 16384
value:
  model_name: ${policy.model_name}
  max_total_sequence_length: ${policy.max_total_sequence_length}
"""


def test_ppo_config_nemo_rl_mismatches_one_line_each(run, tmp_path, capsys):
    """NeMo-RL's example-style config against a seed trained on raw rewards, gamma 1, lambda 1,
    256-token rollouts: the reward map is an error; shaping, lambda, length and an unreachable
    model are warnings, each with both values."""
    (tmp_path / "ppo.yaml").write_text(NEMO_BASE)
    rc, out, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "ppo.yaml")
    (line,) = errors(err)
    assert rc == 1 and "the PPO run's rewards are 2*r - 1 of the raw ones, the critic's were r (as given)" in line
    assert "targets.reward_scale=2 targets.reward_shift=-1" in line
    assert "reward_shaping is enabled" in err and "lambda 0.95, it was pretrained with 1" in err
    assert "sequences up to 16384 tokens, the critic was trained on at most 256" in err
    assert "Qwen/Qwen2.5-1.5B is not a local folder here" in err


def test_ppo_config_nemo_rl_recipe_inheriting_defaults_that_matches(run, tmp_path, capsys):
    """A recipe with `defaults:` (merged, child wins) that matches the seed, whose critic model is
    a local folder of the same architecture: exit 0, no warnings."""
    (tmp_path / "base.yaml").write_text(NEMO_BASE)
    model = ckpt.StepPaths(run / "step_4").hf_config.parent
    (tmp_path / "recipe.yaml").write_text(f"""defaults: base.yaml
ppo:
  reward_shaping: {{enabled: false}}
  adv_estimator: {{gae_lambda_value: 1.0}}
  reward_scaling: {{enabled: false}}
policy: {{max_total_sequence_length: 256}}
value: {{model_name: {model}}}
""")
    rc, out, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "recipe.yaml")
    assert rc == 0 and err == "", err
    report = check_seed(run / "step_4", ppo_config=tmp_path / "recipe.yaml")
    assert report.facts["ppo_config"] == {"framework": "nemo-rl", "gamma": 1.0, "lam": 1.0, "reward_scale": 1.0,
                                          "reward_shift": 0.0, "model": str(model), "max_length": 256}


def test_ppo_config_model_of_another_architecture(run, tmp_path, capsys):
    other = tmp_path / "other-model"
    other.mkdir()
    config = json.loads(ckpt.StepPaths(run / "step_4").hf_config.read_text())
    (other / "config.json").write_text(json.dumps({**config, "hidden_size": 48}))
    (tmp_path / "verl.yaml").write_text(f"algorithm: {{gamma: 1.0, lam: 1.0}}\ncritic: {{model: {{path: {other}}}}}\n"
                                        "data: {max_prompt_length: 100, max_response_length: 100}\n")
    rc, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "verl.yaml")
    assert rc == 1 and "hidden" in err and "48" in err


@pytest.mark.parametrize("text,rc,words", [
    ("algorithm.gamma=0.99 algorithm.lam=1.0 data.max_prompt_length=100 data.max_response_length=100",
     1, "gamma 0.99, but the critic was trained with gamma 1"),
    ("python3 -m openrlhf.cli.train_ppo_ray --pretrain /nope --gamma 1 --normalize_reward \\\n"
     "  --prompt_max_len 100 --generate_max_len 100", 0, "reward normalisation is on"),
    ("python3 -m openrlhf.cli.train_ppo_ray --actor.model_name_or_path /nope --algo.advantage.gamma=0.9 "
     "--data.max_len 200", 1, "gamma 0.9, but the critic was trained with gamma 1"),
])
def test_ppo_config_verl_overrides_and_openrlhf_command_lines(run, tmp_path, capsys, text, rc, words):
    (tmp_path / "args.txt").write_text(text)
    got, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "args.txt")
    assert got == rc and words in err


def test_ppo_config_flat_openrlhf_defaults_to_its_lambda(run, tmp_path, capsys):
    """Flat OpenRLHF (<= 0.8) defaults --lambd to 0.95: worth a warning for a lambda-1 critic."""
    (tmp_path / "a.sh").write_text("--pretrain /nope --prompt_max_len 100 --generate_max_len 100")
    rc, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "a.sh")
    assert rc == 0 and "lambda 0.95, it was pretrained with 1" in err


@pytest.mark.parametrize("name, text, says", [
    ("ppo.yaml", NEMO_BASE.replace("gae_gamma: 1", "gae_gama: 0.9"),
     "ppo.adv_estimator has 'gae_gama'; did you mean 'gae_gamma'?"),
    ("ppo.yaml", NEMO_BASE.replace("target_min: -1.0", "target_mn: -1.0"),
     "ppo.reward_scaling has 'target_mn'; did you mean 'target_min'?"),
    ("args.txt", "algorithm.gama=0.9 algorithm.lam=1.0", "algorithm has 'gama'; did you mean 'gamma'?"),
])
def test_ppo_config_misspelt_key_is_one_line_not_a_default(run, tmp_path, capsys, name, text, says):
    """A misspelt key we read was ignored and its default passed the check (a new user's
    `gae_gama: 0.9` printed OK): it is one line with the did-you-mean, exit 2."""
    (tmp_path / name).write_text(text)
    rc, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / name)
    assert rc == 2 and err.count("\n") == 1 and says in err and "takes the framework's default" in err, err


def test_ppo_config_broken_yaml_names_its_line(run, tmp_path, capsys):
    """A parse error says where (line and column, counted from 1 as editors do), not only what."""
    (tmp_path / "ppo.yaml").write_text(NEMO_BASE + "  oops: [1, 2\nloss_fn: {}\n")
    rc, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / "ppo.yaml")
    line = NEMO_BASE.count("\n") + 2  # the line after the unclosed bracket
    assert rc == 2 and err.count("\n") == 1 and f"not valid YAML (line {line}, column" in err, err


def test_ppo_config_that_is_none_of_them(run, tmp_path, capsys):
    (tmp_path / "x.yaml").write_text("trainer: {epochs: 3}\n")
    (tmp_path / "x.txt").write_text("hello world\n")
    for f in ("x.yaml", "x.txt", "missing.yaml"):
        rc, _, err = check(capsys, run / "step_4", "--ppo-config", tmp_path / f)
        assert rc == 2 and err.startswith("error: --ppo-config") and "Traceback" not in err


# ---------------------------------------------------------------------------------------------
# Tokenizer fingerprint

def tiny_tokenizer(folder: Path, *, shuffle: bool = False, eos: str = "[EOS]") -> Path:
    """A 64-token word-level tokenizer saved like a model's (tokenizer.json + config)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    words = ["[PAD]", "[UNK]", "[EOS]", "[BOS]"] + [f"w{i}" for i in range(60)]
    if shuffle:
        words = words[:4] + words[4:][::-1]
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel({w: i for i, w in enumerate(words)},
                                                                       unk_token="[UNK]")),
                                  unk_token="[UNK]", pad_token="[PAD]", eos_token=eos, bos_token="[BOS]")
    tok.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module")
def tok_run(toy_data, tmp_path_factory) -> tuple[Path, Path]:
    from conftest import train_main

    tmp = tmp_path_factory.mktemp("tokrun")
    tok = tiny_tokenizer(tmp / "tok")
    assert train_main(tiny_overrides(tmp / "run", toy_data, **{"train.max_steps": 2, "checkpoint.save_every": 2,
                                                                 "model.tokenizer": tok})) == 0
    return tmp / "run" / "step_2", tok


def test_seed_records_its_tokenizer_fingerprint(tok_run, capsys):
    from rollouts.tokenizer import fingerprint_of

    step, tok = tok_run
    manifest = json.loads((step / ckpt.MANIFEST).read_text())
    assert manifest["tokenizer"] == fingerprint_of(tok) and manifest["tokenizer"]["vocab_size"] == 64
    assert manifest["tokenizer"]["special_ids"]["eos_token_id"] == 2
    rc, out, _ = check(capsys, step)
    assert rc == 0 and (f"64 tokens, vocab hash {manifest['tokenizer']['vocab_sha256']} "
                        "(bos 3, eos 2, pad 0, unk 1)" in out)


@pytest.mark.parametrize("shuffle,eos,rc,words", [
    (False, "[EOS]", 0, None),
    (True, "[EOS]", 1, "differs from the one the critic was trained under: vocabulary 64 tokens"),
    (False, "[BOS]", 0, "eos_token id 3 vs the seed's 2"),
])
def test_ppo_model_tokenizer_against_the_seed(tok_run, tmp_path, capsys, shuffle, eos, rc, words):
    """--model-config (or --ppo-config's local model) with its tokenizer: another vocabulary is
    an error, another special id a warning."""
    step, _ = tok_run
    model = tiny_tokenizer(tmp_path / "ppo-model", shuffle=shuffle, eos=eos)
    shutil.copy(ckpt.StepPaths(step).hf_config, model / "config.json")
    got, _, err = check(capsys, step, "--model-config", model)
    assert got == rc, err
    if words:
        assert words in err
    else:
        assert err == ""


def test_rollouts_of_another_tokenizer_fail_eval_and_seed_check(tok_run, toy_data, tmp_path, capsys):
    """The training check everywhere rollouts meet a model: `eval --rollouts` refuses in one line and
    `seed check --rollouts` fails (before: PASSED, and eval ran without a word)."""
    from critic_pretrain.cli import main
    from rollouts.provenance import ROLLOUTS_MANIFEST
    from rollouts.tokenizer import fingerprint_of

    step, tok = tok_run
    other = fingerprint_of(tiny_tokenizer(tmp_path / "other-tok", shuffle=True))
    for name, fp in (("same", fingerprint_of(tok)), ("other", other)):
        shutil.copytree(toy_data, tmp_path / name)
        (tmp_path / name / ROLLOUTS_MANIFEST).write_text(json.dumps({"tokenizer": fp}))
    capsys.readouterr()
    assert main(["eval", str(step), "--rollouts", str(tmp_path / "other"), "--out", str(tmp_path / "e.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "tokenized with another tokenizer than the model's" in err
    assert not (tmp_path / "e.json").exists()
    rc, out, err = check(capsys, step, "--rollouts", tmp_path / "other")
    assert rc == 1 and "tokenized with another tokenizer" in err and "PASSED" not in out
    assert main(["eval", str(step), "--rollouts", str(tmp_path / "same"), "--out", str(tmp_path / "e.json")]) == 0


def test_optimizer_line_rounds_the_learning_rate():
    """A cosine schedule's lr printed as 0.0024917112325092907 (a trial): four digits say it."""
    from critic_pretrain.interop.frameworks import describe_optimizer
    opt = {"kind": "AdamW", "parameters": 28, "param_groups": 1, "lr": 0.0024917112325092907,
           "scheduler": "LambdaLR", "last_epoch": 150}
    assert describe_optimizer(opt) == ("AdamW state over 28 tensors, 1 group(s), lr 0.002492, scheduler LambdaLR "
                                       "at step 150")


def test_a_step_without_its_manifest(run, tmp_path, capsys):
    """Our step with critic_pretrain.json removed (its config.yaml says we wrote it) fails seed check
    and export: its integrity and training settings cannot be verified; before, it passed both, even
    with another run's weights swapped in, and pasted `gae_lambda_value: 1` for a TD(0.98) critic.
    A step that is not ours (no config.yaml either) is warned about and gets placeholders, not 1."""
    from critic_pretrain.errors import UserError
    from critic_pretrain.interop.export import export
    step = tmp_path / "step_4"
    shutil.copytree(run / "step_4", step)
    (step / ckpt.MANIFEST).unlink()
    rc, _, err = check(capsys, step)
    assert rc == 1 and "no critic_pretrain.json in" in err and "though its config.yaml says critic-pretrain" in err
    with pytest.raises(UserError, match="copy the whole step_<n> folder again"):
        export(step, "hf", tmp_path / "hf")
    (step / "config.yaml").unlink()
    rc, out, err = check(capsys, step)
    assert rc == 0 and "not a critic-pretrain step, so its integrity is not verified" in err
    assert "gae_gamma: <the gamma the critic was trained with>" in out
    assert "gae_lambda_value: <the lambda the critic was trained with>" in out
    assert "--lambd <actor's lambda>" in "\n".join(config_lines("openrlhf", step, {}))
    result = export(step, "hf", tmp_path / "hf2")  # the export says what the seed check warned
    assert any("source: no critic_pretrain.json: not a critic-pretrain step" in n for n in result.notes)
    assert "source: no critic_pretrain.json" in result.summary()
