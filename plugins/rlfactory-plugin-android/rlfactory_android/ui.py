"""The screen as the model sees it: uiautomator XML -> a numbered list of elements.

``uiautomator dump`` writes the view hierarchy as XML: a ``<hierarchy rotation="0">`` root
and nested ``<node>`` elements with the attributes ``index``, ``text``, ``resource-id``,
``class``, ``package``, ``content-desc``, ``checkable``, ``checked``, ``clickable``,
``enabled``, ``focusable``, ``focused``, ``scrollable``, ``long-clickable``, ``password``,
``selected`` and ``bounds="[x1,y1][x2,y2]"`` (newer Android versions add ``drawing-order``,
``hint`` and ``display-id``, which are read when present and otherwise ignored). An empty
text field reports its hint as its text; such a field is read as empty.

:func:`parse_ui` keeps what a model can act on or read: visible elements (non-empty bounds
on the screen) that are interactive (clickable, long-clickable, checkable, editable,
scrollable) or carry text or a content description. An interactive element without text of
its own is labelled with the text of its non-interactive descendants (a settings row is a
clickable layout around a title), and those descendants are not listed again. Elements are
numbered from 1 in document order; the number is what the tools take as ``element``. A
row's switch that is not clickable itself (Settings draws them so) is folded into the row:
the row is listed as checked or unchecked.

:func:`render_screen` writes the list compactly, one element a line::

    Screen: com.android.settings (1080x2400)
    [1] TextView "Settings"
    [2] Switch "Wi-Fi" id=wifi_switch checked clickable at (540,420)
    [3] EditText "" hint="Name" id=name editable focused at (540,600)
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass

from .device import DeviceError

__all__ = ["UIElement", "Screen", "parse_ui", "render_screen", "parse_bounds"]

_BOUNDS = re.compile(r"^\[(-?\d+),(-?\d+)\]\[(-?\d+),(-?\d+)\]$")
_EDITABLE_CLASSES = ("EditText", "AutoCompleteTextView", "MultiAutoCompleteTextView", "SearchView$SearchAutoComplete")
_MAX_LABEL = 80


def parse_bounds(text: str) -> tuple[int, int, int, int]:
    """``"[0,63][1080,210]"`` -> ``(0, 63, 1080, 210)``; ``ValueError`` otherwise."""
    match = _BOUNDS.match(text.strip())
    if not match:
        raise ValueError(f"malformed bounds {text!r}: expected [x1,y1][x2,y2]")
    return tuple(int(v) for v in match.groups())  # type: ignore[return-value]


@dataclass(frozen=True)
class UIElement:
    """One listed element. ``number`` is its id in the observation (from 1)."""

    number: int
    cls: str
    text: str
    desc: str
    hint: str
    resource_id: str
    package: str
    bounds: tuple[int, int, int, int]
    clickable: bool
    long_clickable: bool
    checkable: bool
    checked: bool
    editable: bool
    scrollable: bool
    focused: bool
    enabled: bool
    selected: bool
    password: bool

    @property
    def center(self) -> tuple[int, int]:
        x1, y1, x2, y2 = self.bounds
        return (x1 + x2) // 2, (y1 + y2) // 2

    @property
    def short_class(self) -> str:
        return self.cls.rsplit(".", 1)[-1] or "View"

    @property
    def short_id(self) -> str:
        """The resource id without its ``package:id/`` prefix."""
        return self.resource_id.split(":id/", 1)[-1]

    @property
    def label(self) -> str:
        return self.text or self.desc

    @property
    def interactive(self) -> bool:
        return self.clickable or self.long_clickable or self.checkable or self.editable or self.scrollable


@dataclass(frozen=True)
class Screen:
    """A parsed screen: its foreground package, size and listed elements."""

    package: str
    size: tuple[int, int]
    elements: tuple[UIElement, ...]

    def element(self, number: int) -> UIElement | None:
        if 1 <= number <= len(self.elements):
            return self.elements[number - 1]
        return None

    def find(self, resource_id: str) -> UIElement | None:
        """The first element whose resource id is ``resource_id`` (full, or without ``pkg:id/``)."""
        for element in self.elements:
            if resource_id and resource_id in (element.resource_id, element.short_id):
                return element
        return None


def _flag(node: ET.Element, name: str) -> bool:
    return node.get(name, "false") == "true"


def _is_editable(cls: str) -> bool:
    return cls.rsplit(".", 1)[-1] in _EDITABLE_CLASSES


def parse_ui(xml: str, screen_size: tuple[int, int] | None = None) -> Screen:
    """Parse a uiautomator dump (see the module docstring). ``screen_size`` (width, height)
    bounds visibility; by default the root node's bounds. ``DeviceError`` for a dump that is
    not uiautomator XML."""
    text = xml.strip() if isinstance(xml, str) else ""
    # `uiautomator dump /dev/tty` appends "UI hierchary dumped to: /dev/tty" (sic) after the XML
    end = text.rfind("</hierarchy>")
    if end >= 0:
        text = text[: end + len("</hierarchy>")]
    try:
        root = ET.fromstring(text)
    except ET.ParseError as exc:
        raise DeviceError(f"the UI dump is not valid XML ({exc}); is uiautomator working on the device?") from None
    if root.tag != "hierarchy":
        raise DeviceError(f"the UI dump's root is <{root.tag}>, not <hierarchy>: not a uiautomator dump")
    nodes = list(root.iter("node"))
    if screen_size is None:
        screen_size = (0, 0)
        for node in nodes:
            try:
                x1, y1, x2, y2 = parse_bounds(node.get("bounds", ""))
            except ValueError:
                continue
            screen_size = (max(screen_size[0], x2), max(screen_size[1], y2))
    width, height = screen_size

    def visible(bounds: tuple[int, int, int, int]) -> bool:
        x1, y1, x2, y2 = bounds
        return x2 > x1 and y2 > y1 and x2 > 0 and y2 > 0 and x1 < width and y1 < height

    elements: list[UIElement] = []
    labelled: set[int] = set()  # ids of text nodes whose text labels an interactive ancestor

    def descendant_texts(node: ET.Element) -> list[ET.Element]:
        found = []
        for child in node.iter("node"):
            if child is node:
                continue
            cls = child.get("class", "")
            interactive = (_flag(child, "clickable") or _flag(child, "checkable") or _is_editable(cls)
                           or _flag(child, "long-clickable") or _flag(child, "scrollable"))
            if not interactive and (child.get("text") or child.get("content-desc")):
                found.append(child)
        return found

    package = next((n.get("package", "") for n in nodes if n.get("package")), "")
    for node in nodes:
        if id(node) in labelled:
            continue
        try:
            bounds = parse_bounds(node.get("bounds", ""))
        except ValueError:
            continue  # a node without usable bounds cannot be acted on; uiautomator always writes them
        if not visible(bounds):
            continue
        cls = node.get("class", "")
        element_kwargs = dict(
            cls=cls, text=node.get("text", ""), desc=node.get("content-desc", ""), hint=node.get("hint", ""),
            resource_id=node.get("resource-id", ""), package=node.get("package", ""), bounds=bounds,
            clickable=_flag(node, "clickable"), long_clickable=_flag(node, "long-clickable"),
            checkable=_flag(node, "checkable"), checked=_flag(node, "checked"), editable=_is_editable(cls),
            scrollable=_flag(node, "scrollable"), focused=_flag(node, "focused"),
            enabled=node.get("enabled", "true") == "true", selected=_flag(node, "selected"),
            password=_flag(node, "password"))
        if element_kwargs["editable"] and element_kwargs["hint"] and element_kwargs["text"] == element_kwargs["hint"]:
            element_kwargs["text"] = ""  # an empty field reports its hint as its text on a device
        interactive = any(element_kwargs[k] for k in ("clickable", "long_clickable", "checkable", "editable",
                                                      "scrollable"))
        if interactive and not element_kwargs["text"] and not element_kwargs["desc"] and not element_kwargs["editable"]:
            texts = descendant_texts(node)
            if texts and not element_kwargs["scrollable"]:
                element_kwargs["text"] = " / ".join(t.get("text") or t.get("content-desc", "") for t in texts[:2])
                labelled.update(id(t) for t in texts)
                # a row's switch that only shows the row's state (not clickable itself) is the row's state
                toggles = [c for c in node.iter("node") if c is not node and _flag(c, "checkable")
                           and not _flag(c, "clickable")]
                if len(toggles) == 1 and not element_kwargs["checkable"]:
                    element_kwargs["checkable"], element_kwargs["checked"] = True, _flag(toggles[0], "checked")
                    labelled.add(id(toggles[0]))
        if not interactive and not element_kwargs["text"] and not element_kwargs["desc"]:
            continue
        elements.append(UIElement(number=len(elements) + 1, **element_kwargs))  # type: ignore[arg-type]
    return Screen(package=package, size=(width, height), elements=tuple(elements))


def _quoted(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_LABEL:
        text = text[: _MAX_LABEL - 3] + "..."
    return '"' + text.replace('"', "'") + '"'


def render_screen(screen: Screen, coordinates: bool = True) -> str:
    """The compact text of ``screen`` (see the module docstring); without ``coordinates``,
    neither the screen's size nor the elements' centre points (a third fewer tokens; the
    elements are then acted on by number only)."""
    width, height = screen.size
    lines = [f"Screen: {screen.package or 'unknown'}" + (f" ({width}x{height})" if coordinates else "")]
    for e in screen.elements:
        parts = [f"[{e.number}]", e.short_class]
        if e.password:
            parts.append('"***"' if e.text else '""')
        elif e.text or e.editable:
            parts.append(_quoted(e.text))
        if e.desc and e.desc != e.text:
            parts.append(f"desc={_quoted(e.desc)}")
        if e.hint and e.editable:
            parts.append(f"hint={_quoted(e.hint)}")
        if e.resource_id:
            parts.append(f"id={e.short_id}")
        if e.checkable:
            parts.append("checked" if e.checked else "unchecked")
        parts += [flag for flag, on in (("clickable", e.clickable), ("long-clickable", e.long_clickable),
                                        ("editable", e.editable), ("scrollable", e.scrollable),
                                        ("focused", e.focused), ("selected", e.selected),
                                        ("disabled", not e.enabled)) if on]
        if e.interactive and coordinates:
            parts.append("at ({},{})".format(*e.center))
        lines.append(" ".join(parts))
    if not screen.elements:
        lines.append("(nothing on the screen to read or act on)")
    return "\n".join(lines)
