"""Refuse a plugin name or a component kind the generated package could not use.

Runs before any file is written (cookiecutter renders this script first). ``rlf plugins new``
checks the same rules with friendlier messages; this covers direct ``cookiecutter`` use.
"""

import re
import sys

NAME_PATTERN = r"[a-z0-9]+(?:[-_][a-z0-9]+)*"
VALID_KINDS = ("tool", "reward", "env", "parser")

name = {{ cookiecutter.plugin_name | tojson }}
raw_kinds = {{ cookiecutter.kinds | tojson }}
kinds = [kind for kind in {{ cookiecutter.__kinds | tojson }}.split(",") if kind]

problems = []
if not re.fullmatch(NAME_PATTERN, name):
    problems.append(
        f"invalid plugin name {name!r}: use lowercase letters and digits, separated by single '-' or '_'"
    )
unknown = [kind for kind in kinds if kind not in VALID_KINDS]
if unknown or not kinds:
    problems.append(
        f"invalid kinds {raw_kinds!r}: choose one or more of {', '.join(VALID_KINDS)}"
    )
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(1)
