"""Reading answers out of model text, in time linear in its length.

Envs and rewards take the final answer from the model's last turn: the content of its
``<answer>...</answer>`` pairs, with ``<think>`` reasoning set aside. The obvious regular
expression, ``re.findall(r"<answer>(.*?)</answer>", text, re.S)``, scans to the end of the
text from every ``<answer>`` that is never closed: ``"<answer>" * 20000`` (160 kB, a turn a
degenerate policy can write) took 40 s, on the event loop every trajectory shares. These
helpers give the same results with each character looked at a bounded number of times.
"""

from __future__ import annotations

__all__ = ["tag_contents", "last_tag_content", "without_reasoning"]


def tag_contents(text: str, tag: str = "answer") -> list[str]:
    """The contents of the ``<tag>...</tag>`` pairs of ``text``, left to right: what
    ``re.findall(rf"<{tag}>(.*?)</{tag}>", text, re.S)`` gives, in linear time.

    A pair opens at the first ``<tag>`` after the previous pair and closes at the first
    ``</tag>`` after that; once an opening tag has no closing tag after it, no later one
    has either, so the search stops there instead of trying each of them.
    """
    opened, closed = f"<{tag}>", f"</{tag}>"
    found, pos = [], 0
    while (start := text.find(opened, pos)) != -1:
        end = text.find(closed, start + len(opened))
        if end == -1:
            break
        found.append(text[start + len(opened):end])
        pos = end + len(closed)
    return found


def last_tag_content(text: str, tag: str = "answer") -> str:
    """The stripped content of the last ``<tag>...</tag>`` pair outside reasoning; "" when
    there is none."""
    found = tag_contents(without_reasoning(text), tag)
    return found[-1].strip() if found else ""


def without_reasoning(text: str, tag: str = "think") -> str:
    """``text`` without its ``<think>...</think>`` blocks; an unclosed block runs to the end
    (a turn cut off while thinking). What ``re.sub(r"<think>.*?(</think>|$)", "", text,
    flags=re.S)`` gives, except that a newline ending the text inside an unclosed block is
    removed too."""
    opened, closed = f"<{tag}>", f"</{tag}>"
    kept, pos = [], 0
    while (start := text.find(opened, pos)) != -1:
        kept.append(text[pos:start])
        end = text.find(closed, start + len(opened))
        if end == -1:
            return "".join(kept)
        pos = end + len(closed)
    kept.append(text[pos:])
    return "".join(kept)
