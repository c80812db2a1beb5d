"""The cookiecutter template for new RLFactory plugins, shipped as ``rlfactory_cli.plugin_template``.

This directory is the template (``cookiecutter.json``, ``hooks/`` and the package template
under ``{{cookiecutter.__dist_name}}/``); the wheel ships it as package data of
``rlfactory_cli.plugin_template`` so ``rlf plugins new`` finds it wherever rlfactory is
installed. Cookiecutter ignores this file.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEMPLATE_DIR"]

#: The template directory, to pass to ``cookiecutter.main.cookiecutter``.
TEMPLATE_DIR = Path(__file__).resolve().parent
