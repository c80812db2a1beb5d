"""Drop the modules of the component kinds that were not chosen.

Every module of the template is complete on its own; ``__init__.py`` and the tests import
only the chosen ones. The env module uses the word-count tool, so ``tools.py`` stays when
either a tool or an env was chosen (the tool is registered only when ``tool`` was chosen).
"""

from pathlib import Path

kinds = set({{ cookiecutter.__kinds | tojson }}.split(","))
package = Path("{{ cookiecutter.__module }}")

#: module -> the kinds that need it
NEEDED_BY = {
    "tools.py": {"tool", "env"},
    "rewards.py": {"reward"},
    "envs.py": {"env"},
    "parsers.py": {"parser"},
}

for module, needed_by in NEEDED_BY.items():
    if not kinds & needed_by:
        (package / module).unlink()
