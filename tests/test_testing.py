"""rlfactory_core.testing's helpers do what plugin tests rely on: the scripted backend speaks
the backend interface with a real tokenizer, scripted_backend() reaches the backend a run
builds, and assert_discovered() / installed_plugins() check a real installed plugin."""

from __future__ import annotations

import asyncio
import os

import pytest

from rlfactory_core import plugins, rollout
from rlfactory_core.rollout import ChatTemplate, Generation, SamplingParams
from rlfactory_core.testing import ScriptedBackend, assert_discovered, installed_plugins, scripted_backend

ARITHMETIC = "rlfactory-plugin-arithmetic"


@pytest.fixture(scope="module")
def tokenizer(default_model_dir):
    from rlfactory_core.models import load_tokenizer

    return load_tokenizer(default_model_dir)


def test_replies_per_call_as_text_or_exact_ids(tokenizer):
    backend = ScriptedBackend(tokenizer, ["Hello there.", [7, 8, 9]], logprob=-0.5)
    first = asyncio.run(backend.generate([1, 2], SamplingParams()))
    assert isinstance(first, Generation) and first.finish_reason == "stop"
    assert first.token_ids == tokenizer.encode("Hello there.", add_special_tokens=False) + [tokenizer.eos_token_id]
    assert first.logprobs == [-0.5] * len(first.token_ids)
    second = asyncio.run(backend.generate([3], SamplingParams(max_tokens=2)))
    assert (second.token_ids, second.finish_reason) == ([7, 8], "length")  # cut as a real backend cuts
    assert backend.prompts == [[1, 2], [3]]
    with pytest.raises(RuntimeError, match="generate call 3, but the script has 2 replies"):
        asyncio.run(backend.generate([4], SamplingParams()))
    asyncio.run(backend.update_weights([]))
    asyncio.run(backend.close())
    assert (backend.weight_updates, backend.closed) == (1, True)


def test_replies_per_prompt_from_an_async_function_of_the_text(tokenizer):
    seen = []

    async def reply(prompt):
        seen.append(prompt)
        return "4" if "2 + 2" in prompt else "no idea"

    backend = ScriptedBackend(tokenizer, reply, end_token_id=0)
    prompt = ChatTemplate(tokenizer).prompt_ids([{"role": "user", "content": "2 + 2?"}])
    generation = asyncio.run(backend.generate(prompt, SamplingParams()))
    assert generation.token_ids == tokenizer.encode("4", add_special_tokens=False) + [0]
    assert "<|im_start|>" not in seen[0] and "2 + 2?" in seen[0]  # the text, without markup tokens


def test_bad_scripts_and_replies_are_named(tokenizer):
    with pytest.raises(TypeError, match="script must be a sequence of replies or a function"):
        ScriptedBackend(tokenizer, "one reply")
    backend = ScriptedBackend(tokenizer, [{"text": "hi"}])
    with pytest.raises(TypeError, match="reply 1 is dict; give text or a list of token ids"):
        asyncio.run(backend.generate([1], SamplingParams()))


def test_scripted_backend_is_what_the_factory_builds_inside_the_block(tokenizer):
    original = rollout.make_backend
    backend = ScriptedBackend(tokenizer, ["x"])
    paths = []
    with scripted_backend(backend):
        assert rollout.make_backend("hf", "/some/model", max_batch_size=4) is backend
    with scripted_backend(lambda path: paths.append(path) or backend):
        assert rollout.make_backend("vllm", "/other/model") is backend
    assert paths == ["/other/model"]
    assert rollout.make_backend is original


def test_assert_discovered_passes_for_an_installed_plugin_and_names_what_differs():
    info = assert_discovered(ARITHMETIC, {"env": ["arithmetic"], "reward": ["arithmetic_verified"]})
    assert (info.name, info.status) == ("arithmetic", "ok")
    with pytest.raises(AssertionError, match=r"expected \('ok', 'rlfactory-plugin-arithmetic', False, "
                                             r"\['rlfactory_register_envs'\], \{'env': \['arithmetic'\]\}\)"):
        assert_discovered(ARITHMETIC, {"env": ["arithmetic"]})
    with pytest.raises(AssertionError, match="loads <module 'rlfactory_arithmetic'.*not 'another module'"):
        assert_discovered(ARITHMETIC, {"env": ["arithmetic"]}, plugin="another module")
    with pytest.raises(AssertionError, match="rlfactory-plugin-nowhere is not installed; pip install -e"):
        assert_discovered("rlfactory-plugin-nowhere", {"env": ["nowhere"]})


def test_installed_plugins_sets_and_restores_the_loading_variables(monkeypatch):
    monkeypatch.setenv(plugins.LOAD_ENV, "arithmetic")
    monkeypatch.delenv(plugins.STRICT_ENV, raising=False)
    with installed_plugins(load="", strict=True):
        assert (os.environ[plugins.LOAD_ENV], os.environ[plugins.STRICT_ENV]) == ("", "1")
        assert "arithmetic" not in plugins.components("env")
    assert os.environ[plugins.LOAD_ENV] == "arithmetic" and plugins.STRICT_ENV not in os.environ
