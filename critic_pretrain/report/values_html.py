"""``values.html``: the rollouts of ``values_page`` as one self-contained HTML file.

Inline CSS and a few lines of inline JavaScript (the view toggle; ``values.html#advantage`` opens
the advantage view); nothing is fetched. Every policy token's background is its value on a
diverging scale (blue high, red low, white the middle of the section's range) or, in the second
view, its one-step advantage (white 0); prompt and tool tokens are grey. Hovering a token gives its
exact numbers; each audit cut shows the policy's Monte-Carlo value next to the critic's. All text
from the rollouts and the tokenizer is escaped.
"""

from __future__ import annotations

import dataclasses
import math
from html import escape

import numpy as np

from .values_page import PageRollout, ValuesPage

STOPS = ((-1.0, (214, 96, 77)), (-0.5, (244, 165, 130)), (0.0, (247, 247, 247)), (0.5, (146, 197, 222)),
         (1.0, (67, 147, 195)))
"""A light red-white-blue diverging scale (position in [-1, 1] -> RGB): dark text stays readable."""


def colour(s: float) -> str:
    """``#rrggbb`` at position ``s`` of ``STOPS`` (clipped to [-1, 1])."""
    s = min(max(s, -1.0), 1.0)
    for (a, ca), (b, cb) in zip(STOPS, STOPS[1:]):
        if s <= b:
            f = (s - a) / (b - a)
            return "#" + "".join(f"{round(x + f * (y - x)):02x}" for x, y in zip(ca, cb))
    return "#" + "".join(f"{x:02x}" for x in STOPS[-1][1])


@dataclasses.dataclass(frozen=True)
class Scale:
    """Values from ``lo`` to ``hi`` on the diverging scale, ``mid`` white."""

    lo: float
    mid: float
    hi: float

    def colour(self, x: float) -> str:
        half = max(self.hi - self.mid, self.mid - self.lo, 1e-12)
        return colour((x - self.mid) / half)

    @classmethod
    def of_values(cls, page: ValuesPage) -> Scale:
        """The section's policy-token values and returns, 1st to 99th percentile; middle white."""
        x = np.array([v for r in page.rollouts for v, p in zip(r.values, r.policy) if p]
                     + [r.outcome for r in page.rollouts], np.float64)
        x = x[np.isfinite(x)]
        lo, hi = (float(np.percentile(x, 1)), float(np.percentile(x, 99))) if len(x) else (0.0, 1.0)
        return cls(lo, (lo + hi) / 2, hi)

    @classmethod
    def of_advantages(cls, page: ValuesPage) -> Scale:
        """Symmetric around 0 up to the 98th percentile of |delta| over the section."""
        a = np.abs(np.array([d for r in page.rollouts for d in r.advantages], np.float64))
        a = a[np.isfinite(a)]
        m = float(np.percentile(a, 98)) if len(a) else 1.0
        return cls(-m, 0.0, m) if m > 0 else cls(-1.0, 0.0, 1.0)


def num(x: float, digits: int = 6) -> str:
    return "nan" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}g}"


CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; max-width: 75em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 2em; } h3 { font-size: 1em; margin: 1.2em 0 .3em; }
.note, .info { color: #555; font-size: .9em; margin: .2em 0; }
.controls { position: sticky; top: 0; background: #fff; padding: .4em 0; border-bottom: 1px solid #ddd; z-index: 1; }
.legend { display: inline-flex; align-items: center; gap: .4em; font-size: .85em; margin-right: 1.5em; }
.legend .bar { width: 12em; height: .9em; border: 1px solid #aaa; }
.tokens { font-family: ui-monospace, monospace; font-size: .9em; line-height: 1.9; border: 1px solid #ddd;
          padding: .5em; word-break: break-word; }
.tok { white-space: pre-wrap; border-radius: 2px; padding: 0 1px; }
.ids .tok { margin-right: .35em; white-space: nowrap; }  /* one id never breaks across lines */
.tok.np { color: #8a8a8a; background: #ececec; }
body[data-view=value] .tok.p { background: var(--v); }
body[data-view=advantage] .tok.p { background: var(--a); }
body[data-view=value] .legend.advantage, body[data-view=advantage] .legend.value { display: none; }
.tok.cut { outline: 2px solid #333; }
.mc { font-family: system-ui, sans-serif; font-size: .75em; border: 1px solid #333; border-radius: 3px;
      padding: 0 .3em; margin: 0 .2em; background: #fffbe6; white-space: nowrap; }
"""

SCRIPT = """
const boxes = document.querySelectorAll('input[name=view]');
function show(view) { document.body.dataset.view = view; boxes.forEach(b => { b.checked = b.value === view; }); }
boxes.forEach(b => b.addEventListener('change', () => show(b.value)));
show(location.hash === '#advantage' ? 'advantage' : 'value');
"""


def render_page(pages: list[ValuesPage]) -> str:
    """The whole page: one section per run."""
    controls = ('<div class="controls">colour the policy tokens by '
                '<label><input type="radio" name="view" value="value" checked> the value V(s<sub>t</sub>)</label> '
                '<label><input type="radio" name="view" value="advantage"> the one-step advantage '
                'δ<sub>t</sub></label></div>')
    intro = ("<p class=\"note\">A few held-out rollouts of each run (the checkpoint its report picks), spread over "
             "their returns. V(s<sub>t</sub>) is the critic's value at token t (the head on the hidden state of "
             "token t−1: the value PPO reads for the action at t); δ<sub>t</sub> = r<sub>t</sub> + γ "
             "V(s<sub>t'</sub>) − V(s<sub>t</sub>), t' the next policy token (0 after the last): the advantage "
             "PPO's GAE gives with λ = 0. Grey tokens were not generated by the policy (prompt, tool output). "
             "Hover a token for its numbers.</p>")
    body = "\n".join(section(p) for p in pages)
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>Values per token: {escape(', '.join(p.run for p in pages))}</title>"
            f"<style>{CSS}</style></head>\n<body data-view=\"value\">\n<h1>Values per token of held-out rollouts</h1>\n"
            f"{intro}\n{controls}\n{body}\n<script>{SCRIPT}</script>\n</body></html>\n")


def section(page: ValuesPage) -> str:
    if page.problem:
        return (f"<section class=\"run\"><h2>{escape(page.run)}: {escape(page.step_dir.name)}</h2>\n"
                f"<p class=\"note\">No rollouts to show: {escape(page.problem)}</p></section>")
    vs, adv = Scale.of_values(page), Scale.of_advantages(page)
    t = page.transform
    how = (f"γ = {num(page.gamma)}, λ = {num(page.lam)}, rewards × {num(t['scale'])} + {num(t['shift'])}"
           + (f", clipped to [{num(t['clip_min'])}, {num(t['clip_max'])}]"
              if t.get("clip_min") is not None or t.get("clip_max") is not None else "")
           + " (values, rewards and returns in these target units)")
    lines = [f"<section class=\"run\"><h2>{escape(page.run)}: {escape(page.step_dir.name)}</h2>",
             f"<p class=\"note\">{escape(str(page.step_dir))}; {escape(how)}; {escape(page.decoded)}.</p>"]
    if page.audit:
        lines.append(f"<p class=\"note\">Audit: {escape(page.audit)}.</p>")
    lines.append(f"<div>{legend(vs, 'value', 'value V(s_t)')}{legend(adv, 'advantage', 'advantage δ_t')}</div>")
    lines += [rollout(k, r, vs, adv) for k, r in enumerate(page.rollouts, 1)]
    lines.append("</section>")
    return "\n".join(lines)


def legend(scale: Scale, kind: str, label: str) -> str:
    stops = ", ".join(colour(s) for s, _ in STOPS)
    return (f"<span class=\"legend {kind}\">{escape(label)}: {num(scale.lo, 3)}"
            f"<span class=\"bar\" style=\"background: linear-gradient(to right, {stops})\"></span>"
            f"{num(scale.hi, 3)} <span class=\"note\">(white {num(scale.mid, 3)})</span></span>")


def rollout(k: int, r: PageRollout, vs: Scale, adv: Scale) -> str:
    policy = [t for t, p in enumerate(r.policy) if p]
    ids_only = not any(r.piece)                                   # no tokenizer: ids, spaced apart
    turns = sum(1 for t in policy if t == 0 or not r.policy[t - 1])
    last = policy[-1] if policy else None
    early = sum(1 for t in policy if t != last and r.rewards[t] != 0)
    facts = [f"reward on the last policy token {num(r.rewards[last], 4)}" if last is not None else "no policy token",
             f"critic's value at the first policy token {num(r.values[policy[0]], 4)}" if policy else "",
             (f"prompt-only value (leave-one-out mean return of the prompt's other rollouts) {num(r.prompt_only, 4)}"
              if not math.isnan(r.prompt_only) else "no other rollout of this prompt"),
             f"{len(r.ids)} tokens: a prompt of {policy[0] if policy else len(r.ids)}, {len(policy)} of the policy "
             f"in {turns} turn{'s' * (turns != 1)}",
             f"per-token rewards on {early} earlier tokens" if early else "",
             f"cut at max_length: the first {len(r.ids)} of {r.length} tokens" if r.length > len(r.ids) else ""]
    head = (f"<h3>#{k}: return {num(r.outcome, 4)} <span class=\"note\">({escape(r.regime)}; prompt "
            f"{escape(r.group)}, store row {r.row})</span></h3>")
    info = f"<p class=\"info\">{escape('; '.join(f for f in facts if f))}.</p>"
    spans = []
    for t, tok_id in enumerate(r.ids):
        if t in r.cuts:
            spans.append(mc_marker(t, r.cuts[t], r.values[t]))
        spans.append(token(t, tok_id, r, vs, adv))
    tokens = f"<div class=\"tokens{' ids' * ids_only}\">{''.join(spans)}</div>"
    return f"<div class=\"rollout\">{head}\n{info}\n{tokens}</div>"


def token(t: int, tok_id: int, r: PageRollout, vs: Scale, adv: Scale) -> str:
    piece = f" {r.piece[t]!r}" if r.piece[t] else ""
    lines = [f"t={t}  id {tok_id}{piece}", f"V(s_t) = {num(r.values[t])}"]
    cut = " cut" if t in r.cuts else ""
    if r.policy[t]:
        d = r.advantages[t]
        lines += [f"δ_t = {num(d)}", f"r_t = {num(r.rewards[t])}", f"value target = {num(r.targets[t])}"]
        if r.oracle is not None and not math.isnan(r.oracle[t]):
            lines.append(f"true value (oracle) = {num(r.oracle[t])}")
        style = f" style=\"--v:{vs.colour(r.values[t])};--a:{adv.colour(d) if not math.isnan(d) else '#fff'}\""
        cls = "tok p"
    else:
        lines.append("not generated by the policy (loss mask 0)")
        style, cls = "", "tok np"
    return (f"<span class=\"{cls}{cut}\"{style} title=\"{escape(chr(10).join(lines))}\">"
            f"{escape(r.text[t])}</span>")


def mc_marker(t: int, cut: dict, value: float) -> str:
    """The audit's Monte-Carlo value of state ``s_t`` (continuations sampled from ``tokens[:t]``)
    next to the critic's value there."""
    mc, se = cut.get("mc"), cut.get("mc_se")
    lines = [f"audit cut at t={t}: continuations sampled from tokens[:{t}]",
             f"Monte-Carlo value {num(mc)} ± {num(se)} (standard error, {cut.get('samples', '?')} samples)",
             f"critic V(s_t) {num(value)} (audit: {num(cut.get('critic'))})"]
    if cut.get("prompt_only") is not None:
        lines.append(f"prompt-only value {num(cut.get('prompt_only'))}")
    return (f"<span class=\"mc\" title=\"{escape(chr(10).join(lines))}\">MC {num(mc, 3)} ± {num(se, 2)} · "
            f"V {num(value, 3)}</span>")
