"""The ``{{ cookiecutter.__slug }}_word_count`` tool: a plain function that ``register`` turns into a tool.

``register`` wraps a plain function with ``rlfactory_core.function_tool``: the tool's name is
the function's name, its JSON schema comes from the type hints (and validates the model's
arguments before the call), its description from the docstring's first paragraph and each
parameter's description from the ``Args:`` section. A sync function runs in a worker
thread; an ``async def`` one is awaited.
"""

from __future__ import annotations

__all__ = ["{{ cookiecutter.__slug }}_word_count"]


def {{ cookiecutter.__slug }}_word_count(text: str) -> int:
    """Count the words in a text (the runs of characters between whitespace).

    Args:
        text: the text whose words to count.
    """
    return len(text.split())
