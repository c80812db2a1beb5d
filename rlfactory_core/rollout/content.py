"""Message content as data: where it lies in a rendered conversation, and its ids with the
template's special tokens recognised only in the template's own markup.

:class:`~rlfactory_core.rollout.render.ChatTemplate` uses this for everything the model did
not write (see "Text the model did not write is data" in :mod:`rlfactory_core.rollout.render`).
"""

from __future__ import annotations

import copy
import json
import re
import secrets
from typing import Any, Callable, Iterator, Sequence

from ..errors import ModelError

__all__ = ["SpecialTokens", "content_spans"]

Path = tuple[Any, ...]
Span = tuple[int, int]

# One marker per piece of content: ASCII letters and digits, which no template escapes or
# splits; "Slot" after the digits keeps "...1Slot" from matching inside "...11Slot". Each
# call draws a fresh nonce for them, so no text (a model turn the drift check leaves
# unmarked, a page quoting this code) can hold a marker by chance or on purpose.
_MARKER = "RlfData{nonce}n{index}Slot"


def _markers() -> tuple[str, re.Pattern[str]]:
    nonce = secrets.token_hex(6)
    return _MARKER.replace("{nonce}", nonce), re.compile(_MARKER.format(nonce=nonce, index=r"(\d+)"))


def _text_paths(message: dict[str, Any], at: Path) -> Iterator[Path]:
    """Paths of the strings in a message dict that are content: ``content`` (a string, or
    the ``text`` of its parts), ``name`` (a tool's name comes from whoever serves the tool,
    an MCP server say) and the string values of ``tool_calls`` arguments."""
    if isinstance(message.get("name"), str):
        yield (*at, "name")
    content = message.get("content")
    if isinstance(content, str):
        yield (*at, "content")
    elif isinstance(content, list):
        for j, part in enumerate(content):
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                yield (*at, "content", j, "text")
    for j, call in enumerate(message.get("tool_calls") or []):
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            yield from _leaves(function.get("arguments"), (*at, "tool_calls", j, "function", "arguments"))


def _leaves(value: Any, at: Path) -> Iterator[Path]:
    if isinstance(value, str):
        yield at
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*at, key))
    elif isinstance(value, list):
        for j, item in enumerate(value):
            yield from _leaves(item, (*at, j))


def _get(root: Any, path: Path) -> Any:
    for key in path:
        root = root[key]
    return root


def _replaced(dicts: list[dict[str, Any]], values: dict[Path, str]) -> list[dict[str, Any]]:
    out = copy.deepcopy(dicts)
    for path, value in values.items():
        _get(out, path[:-1])[path[-1]] = value
    return out


class SpecialTokens:
    """A tokenizer's special tokens (added tokens marked ``special``: ``<|im_start|>``,
    ``<|im_end|>``, ``<image>`` ...) and the encoding of text with them kept as plain text."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        decoder = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        by_id = {int(i): str(t.content) for i, t in decoder.items() if getattr(t, "special", False)}
        for i in getattr(tokenizer, "all_special_ids", []) or []:
            by_id.setdefault(int(i), tokenizer.convert_ids_to_tokens(int(i)))
        # The unknown token stands for characters the vocabulary lacks, so plain text may
        # tokenize to it; its string is a special token all the same (SmolLM2's is
        # <|endoftext|>), which content must not put into the ids.
        self._unknown = getattr(tokenizer, "unk_token_id", None)
        self.ids = frozenset(by_id)
        strings = sorted({s for s in by_id.values() if s}, key=len, reverse=True)
        self._pattern = re.compile("|".join(map(re.escape, strings))) if strings else None
        # A special token can also straddle content and markup ("...<|im_" + "end|>..."):
        # content that ends with the start of one or begins with the end of one is checked too.
        self._heads = {s[:k] for s in strings for k in range(1, len(s))}
        self._tails = {s[k:] for s in strings for k in range(1, len(s))}
        self._longest = max(map(len, strings), default=0)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        self._normalizer = getattr(backend, "normalizer", None)
        self._later_runs: Any = None  # built on first use, see _encode_plain

    def touched_by(self, text: str) -> bool:
        """Whether ``text`` as content could put a special token into the ids: it holds a
        special-token string (also after the tokenizer's normalizer) or part of one at an end."""
        if self._pattern is None or not text:
            return False
        if self._pattern.search(text):
            return True
        if self._normalizer is not None and self._pattern.search(self._normalizer.normalize_str(text)):
            return True
        reach = min(len(text), self._longest - 1)
        return any(text[-k:] in self._heads or text[:k] in self._tails for k in range(1, reach + 1))

    def encode(self, text: str, data: Sequence[Span]) -> list[int]:
        """Ids of ``text`` with special tokens recognised only outside the ``data`` spans.

        The tokenizer splits text at special tokens and tokenizes the runs between them
        independently, so a run between two markup special tokens that holds a forged one is
        tokenized again on its own with special tokens split; the other runs keep their ids.
        """
        try:
            encoded = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        except NotImplementedError:
            raise ModelError(
                f"the tokenizer of {getattr(self.tokenizer, 'name_or_path', '?')!r} gives no character offsets; "
                "text the model did not write cannot be kept apart from the template's special tokens",
                hint="use the model's fast tokenizer (tokenizer.json)") from None
        ids, offsets = list(encoded["input_ids"]), list(encoded["offset_mapping"])
        spans = sorted(data)
        out: list[int] = []
        run: list[int] = []
        run_start, forged = 0, False
        for token, (start, end) in zip(ids, offsets):
            if token not in self.ids:
                run.append(token)
            elif _overlaps(start, end, spans):
                run.append(token)
                forged = True
            else:  # the template's own special token
                out += self._encode_plain(text[run_start:start], run_start) if forged else run
                out.append(token)
                run, run_start, forged = [], end, False
        out += self._encode_plain(text[run_start:], run_start) if forged else run
        return out

    def _encode_plain(self, text: str, at: int) -> list[int]:
        if at and self._prepends_first():
            ids = list(self._later_runs.encode(text, add_special_tokens=False).ids)
        else:
            ids = list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])
        if self.ids.difference([self._unknown]).intersection(ids):  # merges that rebuild a special token
            raise ModelError(f"the tokenizer turns the plain text {text[:60]!r} into special tokens",
                             hint="use a tokenizer whose special tokens are not reachable by merges")
        return ids

    def _prepends_first(self) -> bool:
        """Whether the tokenizer marks only the start of the whole text as a word start
        (Metaspace ``prepend_scheme="first"``, Mistral's): a run after a special token then
        starts with no mark, which tokenizing the run alone would add. Builds the encoder
        for such runs (a copy of the tokenizer that never prepends) when it does."""
        if self._later_runs is None:
            self._later_runs = False
            backend = getattr(self.tokenizer, "backend_tokenizer", None)
            if backend is not None:
                spec = json.loads(backend.to_str())
                if _never_prepend(spec.get("pre_tokenizer")):
                    from tokenizers import Tokenizer

                    later = Tokenizer.from_str(json.dumps(spec))
                    later.encode_special_tokens = True
                    self._later_runs = later
        return self._later_runs is not False


def _never_prepend(spec: Any) -> bool:
    """Switch Metaspace pre-tokenizers in ``spec`` from ``first`` to ``never``; whether any was."""
    if not isinstance(spec, dict):
        return False
    changed = False
    if spec.get("type") == "Metaspace" and spec.get("prepend_scheme") == "first":
        spec["prepend_scheme"] = "never"
        changed = True
    for inner in spec.get("pretokenizers") or []:
        changed = _never_prepend(inner) or changed
    return changed


def _overlaps(start: int, end: int, spans: Sequence[Span]) -> bool:
    # Few spans per conversation: a linear scan is cheaper than anything cleverer.
    return any(start < e and s < end for s, e in spans if s != e)


def content_spans(render: Callable[[list[dict[str, Any]]], str], dicts: list[dict[str, Any]],
                  data: Sequence[int], text: str, special: SpecialTokens) -> list[Span] | None:
    """Where the content of the messages at indices ``data`` lies in ``text`` (=
    ``render(dicts)``), or None when none of it could put a special token into the ids.

    The conversation is rendered with each piece of content replaced by a marker; where the
    template writes content as given, putting the content back gives ``text`` and the
    spans. Where it changes content (``| trim``), each piece is rendered alone among the
    markers, which gives the piece as written. Raises :class:`ModelError` when neither
    gives ``text`` back: the template's markup then depends on the content."""
    paths = [path for i in data for path in _text_paths(dicts[i], (i,))]
    contents = [_get(dicts, path) for path in paths]
    if not any(special.touched_by(c) for c in contents):
        return None
    marker, marker_re = _markers()
    marked = render(_replaced(dicts, {p: marker.format(index=k) for k, p in enumerate(paths)}))
    found = [(m.start(), m.end(), int(m.group(1))) for m in marker_re.finditer(marked)]
    spans = _put_back(marked, found, contents, text)
    if spans is None and len({k for *_, k in found}) == len(found):
        written = list(contents)
        for start, end, k in found:
            alone = render(_replaced(dicts, {p: marker.format(index=j) for j, p in enumerate(paths) if j != k}))
            head, tail = marked[:start], marked[end:]
            if not (alone.startswith(head) and alone.endswith(tail) and len(alone) >= len(head) + len(tail)):
                break
            written[k] = alone[len(head):len(alone) - len(tail)]
        else:
            spans = _put_back(marked, found, written, text)
    if spans is None:
        raise ModelError(
            "the chat template writes different markup depending on message content, so text the model did "
            "not write cannot be kept apart from the template's special tokens",
            hint="use a template whose markup does not depend on the content (ChatML, Qwen, Llama 3 ...)")
    return spans


def _put_back(marked: str, found: list[tuple[int, int, int]], contents: list[str], text: str) -> list[Span] | None:
    pieces: list[str] = []
    spans: list[Span] = []
    at = length = 0
    for start, end, k in found:
        pieces.append(marked[at:start])
        length += start - at
        pieces.append(contents[k])
        spans.append((length, length + len(contents[k])))
        length += len(contents[k])
        at = end
    pieces.append(marked[at:])
    return spans if "".join(pieces) == text else None
