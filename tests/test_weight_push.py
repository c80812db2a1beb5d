"""Pushes of only the changed weights (rlfactory_core.training.weight_push): which tensors are
sent, the shares reported, and a real backend holding exactly the trainer's weights in its
own dtype after partial pushes."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from rlfactory_core.config import load_config
from rlfactory_core.rollout.backends.hf import HFBackend
from rlfactory_core.rollout.backends.base import load_unit
from rlfactory_core.training.weight_push import ChangedWeights, pushes_changed_only


def test_the_first_push_sends_everything_and_later_ones_only_what_changed():
    a, b = torch.zeros(2, 3), torch.ones(4)  # 6 + 4 elements, 24 + 16 bytes
    weights = [("model.embed_tokens.weight", a), ("model.norm.weight", b)]
    pushed = ChangedWeights()
    sent, metrics = pushed.select(weights)
    assert [name for name, _ in sent] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert metrics == {"weight_sync/changed_share": 1.0, "weight_sync/sent_share": 1.0}

    a[0, 1] = 5.0  # the trainer updates in place: what was sent must not follow
    sent, metrics = pushed.select(weights)
    assert [name for name, _ in sent] == ["model.embed_tokens.weight"] and torch.equal(sent[0][1], a)
    assert metrics == {"weight_sync/changed_share": 1 / 10, "weight_sync/sent_share": 24 / 40}

    sent, metrics = pushed.select(weights)
    assert sent == [] and metrics == {"weight_sync/changed_share": 0.0, "weight_sync/sent_share": 0.0}
    a[1, 1] = 7.0  # the copy kept is not the trainer's tensor: this change is seen
    sent, _ = pushed.select(weights)
    assert [name for name, _ in sent] == ["model.embed_tokens.weight"]


def test_a_change_sends_its_whole_decoder_layer():
    """vLLM rebuilds a layer from the weights it is sent: q_proj alone would leave k and v
    of the fused qkv_proj uninitialised."""
    assert load_unit("model.layers.12.self_attn.q_proj.weight") == "model.layers.12"
    assert load_unit("model.layers.0.mlp.experts.7.down_proj.weight") == "model.layers.0"
    assert load_unit("lm_head.weight") == "lm_head" and load_unit("model.norm.weight") == "model.norm"
    names = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
             "model.layers.0.self_attn.k_proj.weight", "model.layers.0.mlp.up_proj.weight",
             "model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"]
    weights = {name: torch.zeros(4) for name in names}
    pushed = ChangedWeights()
    pushed.select(weights.items())
    weights["model.layers.0.self_attn.q_proj.weight"][2] = 1.0
    sent, metrics = pushed.select(weights.items())
    assert [name for name, _ in sent] == names[1:4]
    assert metrics == {"weight_sync/changed_share": 1 / 24, "weight_sync/sent_share": 3 / 6}


def test_changes_are_compared_in_the_samplers_dtype_bit_for_bit():
    one = torch.ones(8)
    pushed = ChangedWeights(torch.bfloat16)
    sent, _ = pushed.select([("w", one)])  # a name without a layer: a unit of its own
    assert sent[0][1].dtype == torch.bfloat16  # sent as the sampler holds it
    # 1 + 2**-10 rounds to 1.0 in bfloat16 (8 significant bits): no change to send
    sent, metrics = pushed.select([("w", one + 2**-10)])
    assert sent == [] and metrics["weight_sync/changed_share"] == 0.0
    # 1 + 2**-6 does not: one element crossed
    crossed = one.clone()
    crossed[3] += 2**-6
    sent, metrics = pushed.select([("w", crossed)])
    assert len(sent) == 1 and metrics["weight_sync/changed_share"] == 1 / 8
    # bits, not values: -0.0 == 0.0 and NaN != NaN would both be wrong here
    pushed = ChangedWeights()
    pushed.select([("z", torch.zeros(2))])
    assert len(pushed.select([("z", torch.tensor([0.0, -0.0]))])[0]) == 1
    pushed.select([("n", torch.tensor([float("nan")]))])
    assert pushed.select([("n", torch.tensor([float("nan")]))])[0] == []


def test_auto_tracks_changes_for_lora_only():
    assert not pushes_changed_only(load_config([], []))
    assert pushes_changed_only(load_config([], ["model.lora.enabled=true"]))
    assert not pushes_changed_only(load_config([], ["model.lora.enabled=true", "train.weight_push=all"]))
    assert pushes_changed_only(load_config([], ["train.weight_push=changed"]))


def test_a_backend_in_bfloat16_holds_the_trainers_weights_exactly_after_partial_pushes():
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    trainer = LlamaForCausalLM(config).float()
    backend = HFBackend(LlamaForCausalLM(config).to(torch.bfloat16))  # other random weights
    pushed = ChangedWeights(backend.weight_dtype)
    assert backend.weight_dtype == torch.bfloat16
    generator = torch.Generator().manual_seed(0)

    async def push(version: int) -> dict[str, float]:
        sent, metrics = pushed.select(trainer.state_dict().items())
        await backend.update_weights(sent, version=version)
        return metrics

    async def run() -> list[dict[str, float]]:
        try:
            shares = [await push(1)]
            for version in range(2, 5):
                with torch.no_grad():  # an update that moves some tensors a lot, most by less than bf16 resolves
                    for name, parameter in trainer.named_parameters():
                        step = 1e-2 if "layers.0.mlp" in name else 1e-6
                        parameter.add_(step * torch.randn(parameter.shape, generator=generator))
                shares.append(await push(version))
            return shares
        finally:
            await backend.close()

    shares = asyncio.run(run())
    assert shares[0]["weight_sync/sent_share"] == 1.0
    assert all(0 < s["weight_sync/sent_share"] < 1 for s in shares[1:]), shares
    served = backend._model.state_dict()
    for name, tensor in trainer.state_dict().items():
        assert torch.equal(served[name], tensor.to(torch.bfloat16)), name
    assert backend.weight_version == 4


@pytest.mark.parametrize("choice", ["changed", "all", "auto"])
def test_weight_push_is_a_validated_choice(choice):
    assert load_config([], [f"train.weight_push={choice}"]).train.weight_push == choice
    with pytest.raises(Exception, match="weight_push"):
        load_config([], ["train.weight_push=some"])


def test_changed_only_pushes_are_refused_on_the_ray_engine():
    with pytest.raises(Exception, match="train.weight_push: changed saves nothing on the ray engine"):
        load_config([], ["engine=ray", "train.weight_push=changed"])
    assert load_config([], ["engine=ray"]).train.weight_push == "auto"
