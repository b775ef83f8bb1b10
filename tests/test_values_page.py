"""``values.html`` (``critic-pretrain report``): held-out rollouts of the picked checkpoint token by token.

A tiny run trained with a word-level tokenizer (``model.tokenizer``, so its checkpoints carry
``value/tokenizer/``); an audit file written by the audit's own ``to_json`` for every rollout. The
page's values must be a plain forward's head outputs shifted by one, its advantages a hand loop's
one-step deltas over the policy tokens, its text the tokenizer's words; the slow test opens the
page in Debian's chromium (``make test`` installs it: ``make browser``), takes screenshots of both
views and counts the token spans of the rendered DOM.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_overrides, train_main
from test_audit import REWARD_PY, rows, word_tokenizer

from critic_pretrain import cli, report
from critic_pretrain.eval import audit
from critic_pretrain.report.values_html import render_page
from critic_pretrain.report.values_page import PageRollout, ValuesPage, pick_rows, shares, values_page

pytest.importorskip("matplotlib")
MC_RETURNS = [1.0, 0.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """(run folder, its step_4, the tokenizer, the rollout rows): val_split both, so both regimes show."""
    from rollouts import write_rows
    from rollouts.provenance import write_manifest
    from rollouts.tokenizer import fingerprint

    tmp = tmp_path_factory.mktemp("values-page")
    ns: dict = {}
    exec(REWARD_PY, ns)
    tok = word_tokenizer(tmp / "tokenizer")
    data = tmp / "rollouts"
    table = rows(tok, ns["reward"], n_groups=16, per_group=6, seed=2)
    write_rows(data, table, shard_rows=200)
    write_manifest(data, tokenizer=fingerprint(tok))
    run = tmp / "run"
    assert train_main(tiny_overrides(run, data, **{"data.val_fraction": 0.25, "data.val_split": "both",
                                                    "model.tokenizer": str(tmp / "tokenizer"),
                                                    "train.max_steps": 4, "checkpoint.save_every": 4})) == 0
    assert (run / "step_4" / "value" / "tokenizer").is_dir()
    write_audit(run / "step_4", table)
    return run, run / "step_4", tok, table


def write_audit(step: Path, table: list[dict]) -> None:
    """What ``critic-pretrain audit`` writes (its own ``to_json``), one cut at the last turn's first
    token of every rollout, MC value 0.75 from four continuations."""
    import xxhash

    audited = []
    for i, r in enumerate(table):
        mask = np.array(r["loss_mask"])
        a, e = audit.last_turn(mask)
        ro = audit.Rollout(i, "prompt", r["input_ids"], int(np.flatnonzero(mask)[0]), (a, e), r["reward"], 0.5,
                           f"{xxhash.xxh3_64_intdigest(np.asarray(r['input_ids'], np.int32).tobytes()):016x}")
        ro.cuts.append(audit.Cut(0, a, 8, critic=0.25, returns=list(MC_RETURNS)))
        audited.append(ro)
    path = audit.default_out(step)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"step": 4, "rows": audit.to_json(audited)}))


def test_page_values_advantages_and_text_are_the_checkpoints(world):
    from critic_pretrain import checkpoint as ckpt
    from critic_pretrain.config_io import load_config
    from critic_pretrain.eval import load_checkpoint_model

    run, step, tok, table = world
    page = values_page(step, "run", 6, device="cpu")
    assert len(page.rollouts) == 6 and page.decoded.startswith("decoded with the checkpoint's tokenizer")
    regimes = [r.regime for r in page.rollouts]                            # 3 of each, val/ first
    assert regimes == ["prompts it never trained on"] * 3 + ["fresh responses to prompts it trained on"] * 3
    by_ids = {tuple(r["input_ids"]): r for r in table}
    model = load_checkpoint_model(step, load_config(ckpt.StepPaths(step).config_yaml), torch.device("cpu"))
    for r in page.rollouts:
        src = by_ids[tuple(r.ids)]                                         # a rollout of the data, whole
        assert r.policy == [bool(m) for m in src["loss_mask"]] and r.length == len(r.ids)
        assert r.text == tok.convert_ids_to_tokens(r.ids)                  # words like "w17", "[EOS]"
        with torch.no_grad():
            head = model(input_ids=torch.tensor([r.ids])).logits[0, :, 0].double()
        want = torch.cat([torch.zeros(1, dtype=torch.float64), head[:-1]])   # value of t: head at t - 1
        assert np.allclose(r.values, want.numpy(), atol=1e-5)
        policy = [t for t, p in enumerate(r.policy) if p]
        assert r.rewards[policy[-1]] == src["reward"] and r.outcome == src["reward"]   # gamma 1, no transform
        for k, t in enumerate(policy):                                     # delta_t, next policy token
            nxt = r.values[policy[k + 1]] if k + 1 < len(policy) else 0.0
            assert r.advantages[t] == pytest.approx(r.rewards[t] + nxt - r.values[t], abs=1e-5)
        assert all(math.isnan(r.advantages[t]) for t in range(len(r.ids)) if not r.policy[t])
        (cut_at, cut), = r.cuts.items()                                    # every rollout is audited
        assert cut_at == audit.last_turn(np.array(src["loss_mask"]))[0] and cut["mc"] == np.mean(MC_RETURNS)
    for part in (page.rollouts[:3], page.rollouts[3:]):                  # highest return first, both ends
        outcomes = [r.outcome for r in part]
        assert outcomes == sorted(outcomes, reverse=True) and outcomes[0] == 1.0 and outcomes[-1] == 0.0


def test_pick_rows_spreads_over_returns_and_prefers_audited():
    outcome = np.array([0.0] * 8 + [1.0] * 2 + [0.5] * 5)
    picked = pick_rows(outcome, 4)
    assert len(picked) == 4 and outcome[picked[0]] == 1.0 and outcome[picked[-1]] == 0.0   # both ends
    assert pick_rows(outcome, 4) == picked                                 # seeded
    prefer = np.zeros(15, bool)
    prefer[[1, 12]] = True
    assert set(pick_rows(outcome, 3, prefer=prefer)) >= {1, 12}
    assert sorted(pick_rows(outcome, 40)) == list(range(15))
    assert shares(6, [10, 10]) == [3, 3] and shares(6, [1, 10]) == [1, 5] and shares(6, [2, 1]) == [2, 1]


def test_html_escapes_text_and_shows_every_token():
    nasty = ['<script>alert("x")</script>', 'a & b', '"q"', "\n"]
    r = PageRollout("prompts it never trained on", "<g>", 3, "", [5, 6, 7, 8], nasty, ["p<", "", "", ""],
                    [False, True, True, True], [0.0, 0.1, 0.5, 0.9], [math.nan, 0.4, 0.4, 0.1],
                    [0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 1.0, 1.0], 1.0, math.nan, 4,
                    cuts={2: {"mc": 0.5, "mc_se": None, "critic": 0.5, "samples": 2}})
    page = ValuesPage("run <1>", Path("/x/step_1"), 1, 1.0, 1.0, {"scale": 1.0, "shift": 0.0, "clip_min": None,
                      "clip_max": None}, "decoded with a tokenizer", None, [r])
    html = render_page([page])
    assert "<script>alert" not in html and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in html
    assert "a &amp; b" in html and "run &lt;1&gt;" in html and "&lt;g&gt;" in html and "&#x27;p&lt;&#x27;" in html
    assert len(re.findall(r'<span class="tok (?:p|np)', html)) == 4 and html.count('class="mc"') == 1
    assert "MC 0.5 ± nan" in html and "no other rollout of this prompt" in html


def test_report_writes_and_links_the_page(world, tmp_path, capsys):
    run, step, _, _ = world
    assert cli.main(["report", str(run), "--out", str(tmp_path / "a"), "--page-rollouts", "3"]) == 0
    html = (tmp_path / "a" / "values.html").read_text()
    assert html.count('<div class="rollout">') == 3 and html.count('class="mc"') == 3
    assert "[Values per token of held-out rollouts](values.html)" in (tmp_path / "a" / "report.md").read_text()
    written, _ = report.write_report([run], tmp_path / "b", evaluate=False)          # --no-eval: no model, no page
    assert not (tmp_path / "b" / "values.html").exists() and "values.html" not in (tmp_path / "b" / "report.md"
                                                                                       ).read_text()
    assert cli.main(["report", str(run), "--out", str(tmp_path / "c"), "--page-rollouts", "0"]) == 0
    assert not (tmp_path / "c" / "values.html").exists()
    capsys.readouterr()
    assert cli.main(["report", str(run), "--out", str(tmp_path / "d"), "--page-rollouts", "-1"]) == 2
    assert "--page-rollouts -1" in capsys.readouterr().err


def test_a_run_whose_rollouts_are_gone_gets_a_note_not_a_failed_report(world, tmp_path, monkeypatch):
    import critic_pretrain.eval as ev
    from critic_pretrain.errors import UserError

    def gone(*args, **kwargs):
        raise UserError("/data/rollouts: no such file; <pass> the rollouts")
    monkeypatch.setattr(ev, "held_out_sets", gone)
    run = world[0]
    [page] = report.write_values_page(report.load_runs([run]), tmp_path)
    html = page.read_text()
    assert "No rollouts to show: /data/rollouts: no such file; &lt;pass&gt; the rollouts" in html
    assert 'class="tok' not in html


# ---------------------------------------------------------------------------------------------
# In a real browser (slow: chromium starts three times)

def browser() -> str:
    """Debian's chromium (``make browser`` installs it), else skip, or fail where CI requires it."""
    found = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
    if found:
        return found
    if os.environ.get("CRITIC_PRETRAIN_REQUIRE_BROWSER") == "1":
        pytest.fail("chromium is not installed but CRITIC_PRETRAIN_REQUIRE_BROWSER=1: run `make browser` (apt-get "
                    "install chromium), or `make REQUIRE_BROWSER=0 test` to skip the browser test")
    pytest.skip("chromium not installed (`make browser` installs Debian's); the browser test is skipped")


def headless(exe: str, tmp: Path, *args: str) -> str:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
           "--no-first-run", f"--user-data-dir={tmp / 'profile'}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.slow
def test_page_renders_in_a_headless_browser(world, tmp_path):
    from PIL import Image

    exe = browser()
    run, step, _, _ = world
    [page_file] = report.write_values_page(report.load_runs([run]), tmp_path, rollouts=6, device="cpu")
    page = values_page(step, run.name, 6, device="cpu")                   # what the file shows
    url = page_file.resolve().as_uri()
    dom = headless(exe, tmp_path, "--dump-dom", url)
    assert 'data-view="value"' in dom
    spans = re.findall(r'<span class="tok (p|np)[^"]*"[^>]*>([^<]*)</span>', dom)
    assert len(spans) == sum(len(r.ids) for r in page.rollouts)
    assert [s[1] for s in spans] == [t for r in page.rollouts for t in r.text]   # the decoded words
    assert sum(1 for kind, _ in spans if kind == "p") == sum(sum(r.policy) for r in page.rollouts)
    assert dom.count('class="mc"') == 6
    assert 'data-view="advantage"' in headless(exe, tmp_path, "--dump-dom", url + "#advantage")   # the toggle's JS
    shot = tmp_path / "values.png"
    headless(exe, tmp_path, f"--screenshot={shot}", "--window-size=1200,1400", url)
    img = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    assert img.shape[:2] == (1400, 1200) and shot.stat().st_size > 20_000
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    colours = len(np.unique(img.reshape(-1, 3), axis=0))
    reddish, bluish = ((r > b + 40) & (r > g + 20)).sum(), ((b > r + 40) & (b > g)).sum()
    assert colours > 200 and reddish > 200 and bluish > 200, (colours, reddish, bluish)   # both ends of the scale
