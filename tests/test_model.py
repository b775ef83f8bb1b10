"""Value model: alignment, packed == padded for every attention path, head options, init sources."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_MODEL, tiny_overrides
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification

from critic_pretrain import attention
from critic_pretrain.config import ModelConfig
from critic_pretrain.errors import UserError
from critic_pretrain.model import build_config, build_value_model, position_limit, shift_values, token_values

LENS = [5, 17, 1, 9, 30]


def model_cfg(**over) -> ModelConfig:
    return ModelConfig(config=dict(TINY_MODEL), **over)


def packed_and_padded(lens=LENS, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = [torch.randint(0, vocab, (n,), generator=g) for n in lens]
    ids = torch.cat(seqs)[None]
    pos = torch.cat([torch.arange(n) for n in lens])[None]
    T = max(lens)
    pad = torch.zeros(len(lens), T, dtype=torch.long)
    am = torch.zeros(len(lens), T, dtype=torch.long)
    for i, s in enumerate(seqs):
        pad[i, : len(s)], am[i, : len(s)] = s, 1
    return ids, pos, torch.tensor(lens, dtype=torch.int32), pad, am


def unpad(v: torch.Tensor, lens) -> torch.Tensor:
    return torch.cat([v[i, :n] for i, n in enumerate(lens)])


def test_shift_values_alignment():
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    pos = torch.tensor([[0, 1, 2, 0, 1]])  # two packed sequences
    assert shift_values(logits, pos).tolist() == [[0.0, 1.0, 2.0, 0.0, 4.0]]


@pytest.mark.parametrize("attn", ["auto", "sdpa", "eager"])
def test_packed_equals_padded(attn):
    torch.manual_seed(0)
    model = build_value_model(model_cfg(attn_implementation=attn)).eval()
    ref_model = build_value_model(model_cfg(attn_implementation="eager")).eval()
    ref_model.load_state_dict(model.state_dict())
    ids, pos, seq_lens, pad, am = packed_and_padded()
    with torch.no_grad():
        packed = token_values(model, ids, pos, seq_lens=seq_lens)[0]
        padded = token_values(ref_model, pad, torch.arange(pad.shape[1]).expand_as(pad), am)
    torch.testing.assert_close(packed, unpad(padded, LENS), rtol=1e-5, atol=1e-6)
    starts = torch.cumsum(torch.tensor([0] + LENS[:-1]), 0)
    assert torch.all(packed[starts] == 0)  # value of the first token of every rollout


def test_packed_attention_is_selected_and_not_saved():
    model = build_value_model(model_cfg())
    assert model.config._attn_implementation == attention.NAME
    assert attention.NAME not in model.config.to_json_string()


def test_head_options():
    m = build_value_model(model_cfg(head_bias=False, head_init="zero"))
    assert m.score.bias is None and torch.all(m.score.weight == 0)
    assert m.config.classifier_dropout == 0.0 and m.config.num_labels == 1
    assert "score.bias" not in m.state_dict()
    m = build_value_model(model_cfg(head_std=0.5))
    assert 0.3 < m.score.weight.std().item() < 0.7 and m.score.bias.item() == 0.0
    assert isinstance(m.dropout, torch.nn.Dropout) and m.dropout.p == 0.0


def test_init_from_pretrained_backbone(tmp_path, capfd, caplog):
    """Weights equal the LM's; the expected key differences are one log line, not transformers'
    LOAD REPORT table (score.* MISSING, lm_head.weight UNEXPECTED)."""
    config = AutoConfig.for_model(**TINY_MODEL)
    lm = AutoModelForCausalLM.from_config(config)
    lm.save_pretrained(tmp_path / "lm")
    capfd.readouterr()
    with caplog.at_level("INFO", logger="critic_pretrain.model"):
        vm = build_value_model(ModelConfig(name_or_path=str(tmp_path / "lm")))
    for k, v in lm.model.state_dict().items():
        assert torch.equal(vm.model.state_dict()[k], v), k
    assert vm.score.weight.abs().sum() > 0
    printed = capfd.readouterr()
    assert "LOAD REPORT" not in printed.err + printed.out and "not sharded" not in printed.err
    assert any("new value head (score.bias, score.weight); the LM head (lm_head.weight) is left out" in r.getMessage()
               for r in caplog.records)


def test_init_from_reward_model(tmp_path):
    config = AutoConfig.for_model(**TINY_MODEL, num_labels=1)
    rm = AutoModelForSequenceClassification.from_config(config)
    torch.nn.init.normal_(rm.score.weight, std=1.0)
    rm.save_pretrained(tmp_path / "rm")
    vm = build_value_model(ModelConfig(name_or_path=str(tmp_path / "rm"), init_from="reward_model"))
    assert torch.equal(vm.score.weight, rm.score.weight)
    assert vm.score.bias.item() == 0.0  # the RM head has no bias: it starts at 0
    fresh = build_value_model(ModelConfig(name_or_path=str(tmp_path / "rm"), init_from="backbone"))
    assert not torch.equal(fresh.score.weight, rm.score.weight)  # a new head


def test_init_from_reward_model_without_score(tmp_path):
    from critic_pretrain.errors import UserError
    lm = AutoModelForCausalLM.from_config(AutoConfig.for_model(**TINY_MODEL))
    lm.save_pretrained(tmp_path / "lm")
    with pytest.raises(UserError, match="has no 'score' head"):
        build_value_model(ModelConfig(name_or_path=str(tmp_path / "lm"), init_from="reward_model"))


def test_missing_model_is_one_line_error(tmp_path):
    from critic_pretrain.errors import UserError
    with pytest.raises(UserError, match="cannot read its config"):
        build_value_model(ModelConfig(name_or_path=str(tmp_path / "nope")))
    (tmp_path / "m.Q4_1.gguf").write_bytes(b"GGUF")  # a GGUF file where a folder goes: say how to make one
    with pytest.raises(UserError, match=r"is a GGUF file; pass a model folder: .*examples/smollm2/model.py"):
        build_value_model(ModelConfig(name_or_path=str(tmp_path / "m.Q4_1.gguf")))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_varlen_matches_per_sequence_on_gpu():
    if attention._varlen() is None:
        pytest.skip("torch without torch.nn.attention.varlen")
    torch.manual_seed(0)
    model = build_value_model(model_cfg()).cuda().eval()
    ids, pos, seq_lens, pad, am = packed_and_padded(lens=[64, 300, 17, 900])
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        assert attention.backend_for(torch.device("cuda"), torch.bfloat16) == "varlen"
        varlen = token_values(model, ids.cuda(), pos.cuda(), seq_lens=seq_lens)[0]
        per_seq = token_values(model, pad.cuda(), torch.arange(pad.shape[1], device="cuda").expand_as(pad),
                               am.cuda())
    torch.testing.assert_close(varlen, unpad(per_seq, [64, 300, 17, 900]), rtol=2e-2, atol=2e-2)


# --- models we cannot train, and what a model supports -------------------------------------

SMALL = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
         "pad_token_id": 0, "tie_word_embeddings": False}


@pytest.mark.parametrize("config, match", [
    ({"model_type": "gemma3_text"}, "no token-classification class"),
    ({"model_type": "olmo2"}, "no token-classification class"),
    ({**SMALL, "model_type": "qwen2", "pad_token_id": 64}, "pad_token_id=64 is not a token of the vocabulary"),
    ({**SMALL, "model_type": "phi3", "pad_token_id": 32000}, "pad_token_id=32000"),
    ({"model_type": "gpt2", "vocab_size": 64, "n_embd": 32, "n_layer": 2, "n_head": 4},
     "names its head differently from 'score'"),
    ({**SMALL, "model_type": "qwen2", "hiden_size": 48}, "did you mean 'hidden_size'"),
    ({**SMALL, "model_type": "qwen2", "head_dimm": 16}, "Qwen2Config has no such field; did you mean 'head_dim'"),
    ({**SMALL, "model_type": "llama", "sliding_windw": 16}, "LlamaConfig has no such field"),
    ({**SMALL, "model_type": "openai_privacy_filter"}, "attends in both directions"),
    ({"model_type": "funnel", "num_hidden_layers": 3}, "transformers refuses this 'funnel' config"),
])
def test_models_we_cannot_train_fail_in_one_line(config, match):
    with pytest.raises(UserError, match=match) as e:
        build_config(ModelConfig(config=config))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("model_type", ["qwen2", "phi3", "starcoder2"])
def test_keys_the_modeling_code_reads_are_accepted(model_type):
    """Qwen2Config declares no head_dim, but Qwen2Attention reads ``getattr(config, "head_dim", ...)``:
    the key check takes what the family's modeling source reads, and the model is built with it."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING
    assert "head_dim" not in AutoConfig.for_model(model_type).to_dict()  # undeclared: the case at hand
    config = build_config(ModelConfig(config={**SMALL, "model_type": model_type, "head_dim": 16}))
    with torch.device("meta"):
        model = MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING[type(config)](config)
    o_proj = next(m for name, m in model.named_modules() if name.endswith("self_attn.o_proj"))
    assert o_proj.in_features == 4 * 16  # heads x head_dim, not hidden_size (32)


def test_modeling_keys_come_from_code_not_comments():
    from transformers import AutoConfig

    from critic_pretrain.model import modeling_keys
    keys = modeling_keys(type(AutoConfig.for_model("qwen2")))
    assert {"head_dim", "hidden_size", "num_key_value_heads", "rms_norm_eps"} <= keys
    assert "json" not in keys  # "config.json" in a docstring is not a read


def test_train_cli_refuses_in_one_line(toy_data, tmp_path, capsys):
    from critic_pretrain.cli import main as cli_main
    over = [o for o in tiny_overrides(tmp_path, toy_data) if not o.startswith("model.config=")]
    assert cli_main(["train", *over, 'model.config={"model_type": "gemma3_text"}']) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "gemma3_text" in errors[0] and "Traceback" not in err
    assert not (tmp_path / "data_cache").exists()  # refused before any data work


@pytest.mark.parametrize("extra, limit", [
    ({}, 512),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}}, 2048),
    ({"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "original_max_position_embeddings": 256, "low_freq_factor": 1.0, "high_freq_factor": 4.0}}, 4096),
])
def test_position_limit(extra, limit):
    assert position_limit(build_config(ModelConfig(config={**TINY_MODEL, **extra}))) == limit


def test_metadata_keys_of_a_converted_config_build_the_same_model():
    """A GGUF-converted folder's config.json carries `_model_name_or_path` (the GGUF's name) and
    `unk_token_id` (no LlamaConfig field); a checkpoint of it must load in eval and audit.
    Underscore keys are metadata; a saved config.json is not checked for typos."""
    plain = build_config(ModelConfig(config={**SMALL, "model_type": "llama"}))
    with_meta = build_config(ModelConfig(config={**SMALL, "model_type": "llama",
                                                 "_model_name_or_path": "Smollm2 135M 8k"}))
    drop = ("_model_name_or_path", "_name_or_path")
    assert ({k: v for k, v in with_meta.to_dict().items() if k not in drop}
            == {k: v for k, v in plain.to_dict().items() if k not in drop})
    saved = build_config(ModelConfig(config={**SMALL, "model_type": "llama", "unk_token_id": 0}), saved=True)
    assert saved.hidden_size == plain.hidden_size
    with pytest.raises(UserError, match="unk_token_id"):  # typed by a user: still a typo until proven otherwise
        build_config(ModelConfig(config={**SMALL, "model_type": "llama", "unk_token_id": 0}))


def test_a_shape_override_on_a_pretrained_backbone_is_one_line(tmp_path):
    """`--config demo model.name_or_path=FOLDER` kept the demo's random-init model.config (hidden 64,
    vocab 512) over the folder's own: transformers failed with a traceback about mismatched sizes."""
    from transformers import AutoConfig, AutoModelForCausalLM
    AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**SMALL, "model_type": "llama"})).save_pretrained(tmp_path)
    with pytest.raises(UserError, match=r"model.config.hidden_size=64 differs from .*'s hidden_size=32.*config=null"):
        build_config(ModelConfig(name_or_path=str(tmp_path), config={"hidden_size": 64}))
    assert build_config(ModelConfig(name_or_path=str(tmp_path), config={"hidden_size": 32})).hidden_size == 32
