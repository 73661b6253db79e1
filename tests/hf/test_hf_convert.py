"""tspbench/hf/convert.py: config mapping (both transformers key styles), refusals in one line naming the field,
state-dict round trips, the shipped conf/model/hf configs against our presets, and `model=hf:PATH` in the commands
that compose `model=` (verify, estimate) and in cli.model_from_name (what plan and other parse_options commands
would call)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_cases import LLAMA3_SCALING, tiny

from tspbench import cli
from tspbench.config import ConfigError, ModelConfig, RopeScaling, model_preset
from tspbench.hf.convert import (
    hf_config_from_model,
    model_config_from_hf,
    rope_from_hf,
    rope_to_hf,
    state_dict_from_hf,
    state_dict_to_hf,
)
from tspbench.model import Transformer

ROOT = Path(__file__).resolve().parents[2]
HF_DIR = ROOT / "conf" / "model" / "hf"
SHAPE = ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden", "norm_eps", "rope_theta")


def test_maps_fields_and_both_rope_styles():
    cfg = model_config_from_hf(tiny(rope_theta=5e5, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True))
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden, cfg.vocab_size) == (32, 2, 4, 2, 48, 64)
    assert cfg.rope_theta == 5e5 and cfg.tie_embeddings and cfg.norm_eps == 1e-5
    assert cfg.rope_scaling == RopeScaling(8.0, 1.0, 4.0, 16)
    v5 = tiny(rope_parameters={**LLAMA3_SCALING, "rope_theta": 5e5})  # transformers 5.x key
    assert model_config_from_hf(v5).rope == cfg.rope
    no_kv = {k: v for k, v in tiny().items() if k != "num_key_value_heads"}
    assert model_config_from_hf(no_kv).n_kv_heads == 4  # default: MHA


def test_reads_a_pretrained_config():
    transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
    hf = transformers.LlamaConfig(**tiny(rope_theta=5e5, rope_scaling=LLAMA3_SCALING))
    assert model_config_from_hf(hf).rope == model_config_from_hf(tiny(rope_theta=5e5, rope_scaling=LLAMA3_SCALING)).rope
    for family, cls in (("llama", transformers.LlamaConfig), ("mistral", transformers.MistralConfig)):
        cfg = ModelConfig(name="m", rope_theta=5e5, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16), tie_embeddings=True)
        assert model_config_from_hf(cls(**hf_config_from_model(cfg, family)), name="m") == cfg  # transformers reads it


@pytest.mark.parametrize(
    "over,field",
    [
        ({"attention_bias": True}, "attention_bias"),
        ({"mlp_bias": True}, "mlp_bias"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"head_dim": 16}, "head_dim"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_type"),
        ({"model_type": "qwen2"}, "model_type"),
        ({"attention_dropout": 0.1}, "attention_dropout"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"hidden_size": None}, "hidden_size"),
    ],
)
def test_refuses_in_one_line_naming_the_field(over, field):
    with pytest.raises(ConfigError) as e:
        model_config_from_hf(tiny(**over))
    msg = str(e.value)
    assert ("\n" not in msg and msg.startswith(field)) or f"{field}=" in msg, msg
    assert "allowed" in msg or "must" in msg


@pytest.mark.parametrize("family", ["llama", "mistral"])
def test_config_round_trip(family):
    cfg = ModelConfig(name=family, rope_theta=5e5, rope_scaling=RopeScaling(8.0, 1.0, 4.0, 16), tie_embeddings=True)
    assert model_config_from_hf(hf_config_from_model(cfg, family), name=family) == cfg


def test_state_dict_round_trip_and_permutation():
    cfg = model_config_from_hf(tiny())
    sd = {k: torch.randn_like(v) for k, v in Transformer(cfg).state_dict().items()}
    back = state_dict_from_hf(state_dict_to_hf(sd, cfg), cfg)
    assert sd.keys() == back.keys() and all(torch.equal(sd[k], back[k]) for k in sd)
    w = torch.arange(16.0).reshape(8, 2)  # one head, d = 8: interleaved rows 0,1,…,7 → 0,2,4,6,1,3,5,7
    assert rope_to_hf(w, 1)[:, 0].tolist() == [0, 4, 8, 12, 2, 6, 10, 14]
    assert torch.equal(rope_from_hf(rope_to_hf(w, 1), 1), w)


def test_shipped_configs_equal_our_presets():
    """llama3_8b.yaml is Llama 3 8B's shape; llama7b.yaml is the paper's model: Llama 2 7B's shape except the MLP
    (the paper's F = 4: 16384, Llama 2: 11008)."""
    hf8 = model_config_from_hf(json.loads((HF_DIR / "llama3_8b.json").read_text()))
    ours8 = model_preset("llama3_8b")
    assert {f: getattr(hf8, f) for f in SHAPE} == {f: getattr(ours8, f) for f in SHAPE}
    hf7 = model_config_from_hf(json.loads((HF_DIR / "llama2_7b.json").read_text()))
    ours7 = model_preset("llama7b")
    differ = {f for f in SHAPE if getattr(hf7, f) != getattr(ours7, f)}
    assert differ == {"ffn_hidden"} and (hf7.ffn_hidden, ours7.ffn_hidden) == (11008, 16384)
    for path in HF_DIR.glob("*.json"):  # every shipped file converts, and names its source
        data = json.loads(path.read_text())
        assert data["_source"].startswith("https://huggingface.co/") and data["_source"].endswith("/config.json")
        model_config_from_hf(data)
    assert model_config_from_hf(json.loads((HF_DIR / "llama3_1_8b.json").read_text())).rope_scaling.factor == 8.0


def test_model_from_name_takes_presets_and_hf_paths(tmp_path):
    assert cli.model_from_name("tiny") == model_preset("tiny")
    cfg = cli.model_from_name("hf:conf/model/hf/llama3_70b.json")  # relative to the repository root
    assert (cfg.name, cfg.dim, cfg.n_layers, cfg.n_kv_heads) == ("llama3_70b", 8192, 80, 8)
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(tiny()))
    assert cli.model_from_name(f"hf:{tmp_path / 'm'}").name == "m"  # a directory holding config.json
    with pytest.raises(ConfigError, match="no such file"):
        cli.model_from_name("hf:/nonexistent/config.json")


def test_verify_composes_model_hf(tmp_path):
    from tspbench.verify.__main__ import compose

    path = tmp_path / "tiny.json"
    path.write_text(json.dumps(tiny(rope_theta=5e5, rope_scaling=LLAMA3_SCALING, tie_word_embeddings=True)))
    vc = compose([f"model=hf:{path}", "model.n_layers=1"])  # what `python -m tspbench.verify ...` composes
    assert vc.model == ModelConfig(
        **{**vars(model_config_from_hf(json.loads(path.read_text()), name="tiny")), "n_layers": 1}
    )


def test_estimate_command_takes_model_hf(capsys, monkeypatch):
    from tspbench.estimate import main

    monkeypatch.chdir(ROOT)
    argv = ["model=hf:conf/model/hf/llama3_1_8b.json", "scheme=tsp", "degree=4", "seq_len=256", "model.n_layers=1"]
    assert main(argv) == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
