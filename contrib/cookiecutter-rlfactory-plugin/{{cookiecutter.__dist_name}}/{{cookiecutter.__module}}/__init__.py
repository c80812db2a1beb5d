{% set kinds = cookiecutter.__kinds.split(",") %}
{% set slug = cookiecutter.__slug %}
"""RLFactory plugin ``{{ cookiecutter.plugin_name }}``: the hooks that register its components.

RLFactory finds this module through the ``rlfactory`` entry point in pyproject.toml and calls
each ``rlfactory_register_*`` hook below once per process with a ``register`` callback, which
checks the component and records that this plugin provided it. Run configs then refer to the
components by name; ``rlf plugins list`` shows them.
"""

from __future__ import annotations

from rlfactory_core import hookimpl

{% if "env" in kinds %}
from .envs import WordCountEnv
{% endif %}
{% if "parser" in kinds %}
from .parsers import JsonLinesParser
{% endif %}
{% if "reward" in kinds %}
from .rewards import LengthReward
{% endif %}
{% if "tool" in kinds %}
from .tools import {{ slug }}_word_count
{% endif %}

#: the plugin API versions this plugin works with (checked when rlfactory loads it)
rlfactory_api = ">=1.0,<2"

__all__ = [
{% if "env" in kinds %}
    "WordCountEnv",
{% endif %}
{% if "parser" in kinds %}
    "JsonLinesParser",
{% endif %}
{% if "reward" in kinds %}
    "LengthReward",
{% endif %}
{% if "tool" in kinds %}
    "{{ slug }}_word_count",
{% endif %}
]
{% if "tool" in kinds %}


@hookimpl
def rlfactory_register_tools(register):
    """Tools: a plain function is registered as is (its schema comes from its type hints)."""
    register({{ slug }}_word_count)
{% endif %}
{% if "reward" in kinds %}


@hookimpl
def rlfactory_register_rewards(register):
    """Rewards: registered as classes, built per run with the reward's config options."""
    register(LengthReward)
{% endif %}
{% if "env" in kinds %}


@hookimpl
def rlfactory_register_envs(register):
    """Envs: registered as classes, built per run with the env's config options."""
    register(WordCountEnv)
{% endif %}
{% if "parser" in kinds %}


@hookimpl
def rlfactory_register_parsers(register):
    """Parsers: registered as a ready instance (they hold no state)."""
    register(JsonLinesParser())
{% endif %}
