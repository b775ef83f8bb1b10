"""Numbers in the docs come from scripts: the demo block of docs/warm.md is what
docs/make_figures.py renders from the recorded demo numbers, and the script works on a real run."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from conftest import ROOT
from test_evaluate import tiny_run

spec = importlib.util.spec_from_file_location("make_figures", ROOT / "docs" / "make_figures.py")
make_figures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_figures)


def test_warm_md_demo_block_is_rendered_from_the_recorded_numbers():
    text = (ROOT / "docs" / "warm.md").read_text()
    block = text[text.index(make_figures.BEGIN):text.index(make_figures.END) + len(make_figures.END)]
    numbers = json.loads(make_figures.NUMBERS.read_text())
    assert block == make_figures.render(numbers), "docs/warm.md's demo block is stale: run `make docs-figures`"
    for figure in make_figures.FIGURES:
        assert (ROOT / "docs" / "img" / f"warm-{figure}.png").is_file()


def test_figures_script_on_a_real_run(tmp_path_factory, toy_data):
    run = tiny_run(tmp_path_factory, toy_data)
    numbers = make_figures.collect(Path(run), 12.0)
    final = numbers["rows"]["final"]
    records = [json.loads(line) for line in (Path(run) / "metrics.jsonl").read_text().splitlines()]
    last_val = [r for r in records if "val/loss" in r][-1]
    assert final["val/loss"] == last_val["val/loss"] and final["step"] == last_val["step"]
    block = make_figures.render(numbers)
    assert block.startswith(make_figures.BEGIN) and block.endswith(make_figures.END)
    assert f"{final['val/loss']:.3f}" in block and "took 0.2 min" in block
    doc = f"before\n{make_figures.BEGIN}\nold\n{make_figures.END}\nafter"
    assert make_figures.replace_block(doc, block) == f"before\n{block}\nafter"
    with pytest.raises(ValueError):
        make_figures.replace_block("no markers", block)


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["real_critic", "ppo_warm", "synth_envs", "recipe_envs", "step_rollouts",
                                  "verdict_proof"])
def test_generated_blocks_are_rendered_from_the_recorded_numbers(name):
    """The real-rollout numbers (bench/real_critic.py) and the PPO arms (bench/ppo_warm.py) in
    docs/warm.md, the environments' table (bench/synth_envs.py) in docs/synth.md: each is the
    rendering of its JSON, never typed."""
    script = _script(name)
    text = script.DOC.read_text()
    block = text[text.index(script.BEGIN):text.index(script.END) + len(script.END)]
    if not script.NUMBERS.is_file():
        pytest.fail(f"{script.NUMBERS.name} missing: run python bench/{name}.py")
    assert block == script.render(json.loads(script.NUMBERS.read_text())), \
        f"{script.DOC.name}'s {name} block is stale: run python bench/{name}.py"


def test_readme_paste_block_is_what_the_demo_prints():
    """The README's NeMo-RL lines are what `config_lines` prints for configs/demo.yaml's targets
    (a recipe change once left them at the old lambda, 0.8, while the demo printed 0.98)."""
    import dataclasses

    from critic_pretrain.config_io import load_config
    from critic_pretrain.interop.frameworks import config_lines
    from rollouts.paths import archive_folder
    from rollouts.provenance import rewards_logged

    text = (ROOT / "README.md").read_text()
    start = text.index("```yaml\nppo:\n  warm_start_value_checkpoint:") + len("```yaml\n")
    readme = text[start:text.index("```", start)].rstrip("\n").splitlines()
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    where = Path("/abs/path/runs/demo") / f"step_{cfg.train.max_steps}"
    logged = rewards_logged(archive_folder(cfg.data.train[0]))  # the sample is synthetic: it states raw rewards
    lines = config_lines("nemo-rl", where, {"targets": dataclasses.asdict(cfg.targets),
                                            "rewards": {"logged": logged.to_dict()}})
    printed = lines[1:lines.index("value:")]  # from `ppo:` to the reward scaling, as the README shows
    printed[1] = f"  warm_start_value_checkpoint: {where}"  # resolve() would prefix this machine's path
    assert readme == printed, "README.md's NeMo-RL block is stale: paste what `make demo` prints"
