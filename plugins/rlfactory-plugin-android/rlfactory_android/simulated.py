"""A simulated phone (named as such): a deterministic state machine with a few apps that
answers the :class:`~rlfactory_android.device.Device` protocol, so the env, the parser, the
reward and the training loop run and are tested without an Android device.

It is not an emulator. It draws its screens as uiautomator XML in the format a real device
dumps (same node attributes, nesting, system bars), and acts on taps, long presses, swipes,
typed text and keys by hit-testing those screens, the way input reaches a real app. Its apps:

* **Launcher** (``com.android.launcher3``): the home screen, an icon per app.
* **Settings** (``com.android.settings``): rows with switches for Wi-Fi
  (``global/wifi_on``), Bluetooth (``global/bluetooth_on``), Airplane mode
  (``global/airplane_mode_on``), Do not disturb (``global/zen_mode``) and Dark theme
  (``secure/ui_night_mode``: 2 on, 1 off); tapping a row toggles its setting.

The order of the Settings rows and of the launcher's icons is the start state's
:class:`~rlfactory_android.layout.Layout` (the usual order without one), so the same task can
start from screens whose element numbers differ.
* **Contacts** (``com.android.contacts``): a scrollable list sorted by name, a "Create
  contact" button opening a form (name, phone, Save), a contact's page with Delete, and a
  long press on a row asking "Delete contact?".
* **Notes** (``com.rlfactory.notes``, an app of the simulation only): a list, "New note"
  opening an editor (a text field and Save), a tap on a note opening it for editing, a long
  press asking "Delete note?".

The navigation bar has Back and Home; ``press_key`` does the same. Text goes into the focused
field (a tap on a field focuses it); with no field focused it goes nowhere, as on a phone.
"""

from __future__ import annotations

import io
import threading
from dataclasses import dataclass, field
from typing import Any, Callable
from xml.sax.saxutils import quoteattr

from .device import KEYS, DeviceError, StartState, split_setting
from .layout import APPS, TOGGLES, Layout

__all__ = ["SimulatedPhone", "APPS", "DEFAULT_SETTINGS", "TOGGLES"]

WIDTH, HEIGHT = 1080, 2400
_STATUS_BOTTOM, _APPBAR_BOTTOM, _NAV_TOP = 84, 252, 2274
_ROW = 168
_DIALOG = (96, 900, 984, 1400)

_LAUNCHER = "com.android.launcher3"
_SYSTEMUI = "com.android.systemui"
_TOGGLE_OF = {title: (title, name, on, off) for title, name, on, off in TOGGLES}
DEFAULT_SETTINGS: dict[str, str] = {"global/wifi_on": "1", "global/bluetooth_on": "0",
                                    "global/airplane_mode_on": "0", "global/zen_mode": "0",
                                    "secure/ui_night_mode": "1"}


@dataclass
class _Node:
    """A view: its uiautomator attributes, children, and what a tap / long press on it does."""

    cls: str
    bounds: tuple[int, int, int, int]
    package: str
    text: str = ""
    resource_id: str = ""
    desc: str = ""
    hint: str | None = None
    clickable: bool = False
    long_clickable: bool = False
    checkable: bool = False
    checked: bool = False
    scrollable: bool = False
    focused: bool = False
    children: list["_Node"] = field(default_factory=list)
    on_tap: Callable[[], None] | None = None
    on_long_press: Callable[[], None] | None = None
    on_scroll: Callable[[int], None] | None = None  # rows to scroll (positive: further down the list)

    def contains(self, x: int, y: int) -> bool:
        x1, y1, x2, y2 = self.bounds
        return x1 <= x < x2 and y1 <= y < y2

    def walk(self):
        yield self
        for child in self.children:
            yield from child.walk()

    def xml(self, index: int, order: list[int]) -> str:
        order[0] += 1
        editable = self.cls.endswith("EditText")
        attrs = [("index", str(index)), ("text", self.text), ("resource-id", self.resource_id),
                 ("class", self.cls), ("package", self.package), ("content-desc", self.desc),
                 ("checkable", self.checkable), ("checked", self.checked), ("clickable", self.clickable),
                 ("enabled", True), ("focusable", self.clickable or editable), ("focused", self.focused),
                 ("scrollable", self.scrollable), ("long-clickable", self.long_clickable), ("password", False),
                 ("selected", False), ("bounds", "[{},{}][{},{}]".format(*self.bounds)),
                 ("drawing-order", str(order[0]))]
        if self.hint is not None:
            attrs.append(("hint", self.hint))
        text = " ".join(f"{name}={quoteattr(str(value).lower() if isinstance(value, bool) else value)}"
                        for name, value in attrs)
        inner = "".join(child.xml(i, order) for i, child in enumerate(self.children))
        return f"<node {text}>{inner}</node>" if inner else f"<node {text} />"


@dataclass
class _Form:
    """A screen with text fields: field id -> text, and which field has the focus."""

    fields: dict[str, str]
    focused: str | None = None
    error: str = ""
    editing: int | None = None  # the note being edited (None: a new one)


class SimulatedPhone:
    """A simulated phone (see the module docstring). Thread-safe: one lock around every call."""

    screen_size = (WIDTH, HEIGHT)

    def __init__(self, serial: str = "simulated-0"):
        self.serial = serial
        self._lock = threading.RLock()
        self.settings: dict[str, str] = dict(DEFAULT_SETTINGS)
        self.contacts: list[tuple[str, str]] = []
        self.notes: list[str] = []
        self.layout = Layout()
        self._stack: list[tuple[str, Any]] = [("home", None)]  # (screen, its state)
        self._dialog: tuple[str, Callable[[], None]] | None = None  # (question, what Delete does)
        self._scroll = 0
        self.actions = 0  # input events received, for tests

    # ------------------------------------------------------------------ Device protocol

    def dump_ui(self) -> str:
        with self._lock:
            root = self._render()
            return ("<?xml version='1.0' encoding='UTF-8' standalone='yes' ?>"
                    f'<hierarchy rotation="0">{root.xml(0, [0])}</hierarchy>')

    def screenshot(self) -> bytes:
        """A PNG drawing of the screen: each view's box and text (for vision-language runs)."""
        try:
            from PIL import Image, ImageDraw
        except ImportError:
            raise DeviceError("screenshots of the simulated phone need Pillow: pip install pillow") from None
        with self._lock:
            root = self._render()
        image = Image.new("RGB", (WIDTH // 3, HEIGHT // 3), "white")
        draw = ImageDraw.Draw(image)
        for node in root.walk():
            x1, y1, x2, y2 = (v // 3 for v in node.bounds)
            if node.clickable or node.cls.endswith("EditText"):
                draw.rectangle((x1, y1, x2 - 1, y2 - 1), outline="gray")
            if node.checkable:
                draw.ellipse((x2 - 40, y1 + 14, x2 - 12, y1 + 42), fill="green" if node.checked else "lightgray")
            label = node.text or node.desc or (node.hint or "")
            if label and not node.children:
                draw.text((x1 + 6, y1 + 6), label, fill="black" if node.text else "gray")
        out = io.BytesIO()
        image.save(out, format="PNG")
        return out.getvalue()

    def tap(self, x: int, y: int) -> None:
        with self._lock:
            self._input(x, y, long=False)

    def long_press(self, x: int, y: int, duration_ms: int = 800) -> None:
        with self._lock:
            self._input(x, y, long=True)

    def swipe(self, x1: int, y1: int, x2: int, y2: int, duration_ms: int = 300) -> None:
        with self._lock:
            self._check_point(x1, y1)
            self._check_point(x2, y2)
            self.actions += 1
            rows = round((y1 - y2) / _ROW)  # a swipe up moves the content up: further down the list
            for node in reversed(list(self._render().walk())):
                if node.on_scroll and node.contains(x1, y1):
                    node.on_scroll(rows)
                    return

    def input_text(self, text: str) -> None:
        with self._lock:
            self.actions += 1
            form = self._form()
            if form is not None and form.focused is not None:
                form.fields[form.focused] += text
                form.error = ""

    def press_key(self, key: str) -> None:
        if key not in KEYS:
            raise DeviceError(f"unknown key {key!r}; keys: {', '.join(KEYS)}")
        with self._lock:
            self.actions += 1
            if key == "back":
                self._back()
            elif key == "home":
                self._go_home()
            # enter: every field of these apps is one line; the key does nothing

    def open_app(self, package: str) -> None:
        with self._lock:
            if package not in APPS.values():
                raise DeviceError(f"the simulated phone has no app {package!r}; its apps: "
                                  + ", ".join(f"{name} ({pkg})" for name, pkg in APPS.items()))
            self.actions += 1
            self._dialog, self._scroll = None, 0
            self._stack = [("home", None), (package, None)]

    def get_setting(self, name: str) -> str | None:
        split_setting(name)
        with self._lock:
            return self.settings.get(name)

    def list_contacts(self) -> list[tuple[str, str]]:
        with self._lock:
            return list(self.contacts)

    def list_notes(self) -> list[str]:
        with self._lock:
            return list(self.notes)

    def reset(self, start: StartState, apps: dict[str, str]) -> None:
        with self._lock:
            self.settings = {**DEFAULT_SETTINGS, **start.settings}
            self.contacts = list(start.contacts)
            self.notes = list(start.notes)
            self.layout = start.layout
            self._go_home()
            if start.app is not None:
                if start.app not in apps:
                    raise DeviceError(f"unknown app {start.app!r}; apps: {', '.join(apps)}")
                self.open_app(apps[start.app])
            self.actions = 0

    def healthy(self) -> bool:
        return True

    # ------------------------------------------------------------------ input

    def _check_point(self, x: int, y: int) -> None:
        if not (0 <= x < WIDTH and 0 <= y < HEIGHT):
            raise DeviceError(f"({x},{y}) is off the screen, which is {WIDTH}x{HEIGHT}")

    def _input(self, x: int, y: int, long: bool) -> None:
        self._check_point(x, y)
        self.actions += 1
        if self._dialog is not None and not _Node("", _DIALOG, "").contains(x, y):
            self._dialog = None  # a touch outside a dialog dismisses it and reaches nothing else
            return
        # the topmost view under the finger that handles the event (later in the tree = drawn on top)
        for node in reversed(list(self._render().walk())):
            handler = node.on_long_press if long else node.on_tap
            if handler is not None and node.contains(x, y):
                handler()
                return

    def _go_home(self) -> None:
        self._stack, self._dialog, self._scroll = [("home", None)], None, 0

    def _back(self) -> None:
        if self._dialog is not None:
            self._dialog = None
        elif len(self._stack) > 1:
            self._stack.pop()
            self._scroll = 0

    def _push(self, screen: str, state: Any = None) -> None:
        self._stack.append((screen, state))
        self._scroll = 0

    def _form(self) -> _Form | None:
        state = self._stack[-1][1]
        return state if isinstance(state, _Form) and self._dialog is None else None

    # ------------------------------------------------------------------ drawing

    def _render(self) -> _Node:
        screen, state = self._stack[-1]
        package = _LAUNCHER if screen == "home" else screen.split("#")[0]
        content = _Node("android.widget.FrameLayout", (0, _STATUS_BOTTOM, WIDTH, _NAV_TOP), package,
                        resource_id="android:id/content")
        draw = {"home": self._home, "com.android.settings": self._settings, "com.android.contacts": self._contacts,
                "com.android.contacts#new": self._contact_form, "com.android.contacts#view": self._contact_page,
                "com.rlfactory.notes": self._notes, "com.rlfactory.notes#edit": self._note_editor}[screen]
        content.children = draw(package, state)
        if self._dialog is not None:
            content.children.append(self._dialog_node(package))
        root = _Node("android.widget.FrameLayout", (0, 0, WIDTH, HEIGHT), package, children=[content])
        root.children.insert(0, _Node("android.widget.FrameLayout", (0, 0, WIDTH, _STATUS_BOTTOM), _SYSTEMUI,
                                      resource_id="com.android.systemui:id/status_bar", children=[
                                          _Node("android.widget.TextView", (36, 18, 180, 66), _SYSTEMUI, text="12:00",
                                                resource_id="com.android.systemui:id/clock")]))
        root.children.append(_Node("android.widget.FrameLayout", (0, _NAV_TOP, WIDTH, HEIGHT), _SYSTEMUI,
                                   resource_id="com.android.systemui:id/navigation_bar_frame", children=[
                                       _Node("android.widget.ImageView", (200, _NAV_TOP, 400, HEIGHT), _SYSTEMUI,
                                             desc="Back", resource_id="com.android.systemui:id/back", clickable=True,
                                             on_tap=self._back),
                                       _Node("android.widget.ImageView", (440, _NAV_TOP, 640, HEIGHT), _SYSTEMUI,
                                             desc="Home", resource_id="com.android.systemui:id/home", clickable=True,
                                             on_tap=self._go_home)]))
        return root

    @staticmethod
    def _title(package: str, text: str) -> _Node:
        return _Node("android.widget.TextView", (48, _STATUS_BOTTOM + 42, 1032, _APPBAR_BOTTOM - 42), package,
                     text=text, resource_id=f"{package}:id/title")

    @staticmethod
    def _row(index: int) -> tuple[int, int, int, int]:
        top = _APPBAR_BOTTOM + index * _ROW
        return (0, top, WIDTH, top + _ROW)

    @staticmethod
    def _button(package: str, text: str, rid: str, bounds: tuple[int, int, int, int],
                on_tap: Callable[[], None]) -> _Node:
        return _Node("android.widget.Button", bounds, package, text=text, resource_id=f"{package}:id/{rid}",
                     clickable=True, on_tap=on_tap)

    def _home(self, package: str, state: Any) -> list[_Node]:
        icons = []
        for i, name in enumerate(self.layout.home):
            app, x = APPS[name], 60 + i * 330
            icons.append(_Node("android.widget.TextView", (x, 1900, x + 300, 2150), package, text=name, desc=name,
                               resource_id=f"{package}:id/icon", clickable=True, long_clickable=True,
                               on_tap=lambda app=app: self.open_app(app)))
        return [_Node("android.view.ViewGroup", (0, _STATUS_BOTTOM, WIDTH, _NAV_TOP), package,
                      resource_id=f"{package}:id/workspace", children=icons)]

    def _settings(self, package: str, state: Any) -> list[_Node]:
        rows = [self._title(package, "Settings")]
        for i, (title, name, on, off) in enumerate(_TOGGLE_OF[title] for title in self.layout.settings):
            checked = self.settings.get(name) == on

            def toggle(name=name, on=on, off=off):
                self.settings[name] = off if self.settings.get(name) == on else on
            x1, y1, x2, y2 = self._row(i)
            rows.append(_Node("android.widget.LinearLayout", (x1, y1, x2, y2), package, clickable=True, on_tap=toggle,
                              children=[
                                  _Node("android.widget.TextView", (48, y1 + 48, 800, y2 - 48), package, text=title,
                                        resource_id="android:id/title"),
                                  _Node("android.widget.Switch", (880, y1 + 40, 1032, y2 - 40), package,
                                        resource_id="android:id/switch_widget", checkable=True, checked=checked)]))
        return [_Node("androidx.recyclerview.widget.RecyclerView", (0, _STATUS_BOTTOM, WIDTH, _NAV_TOP), package,
                      resource_id=f"{package}:id/recycler_view", children=rows)]

    def _scrolled_rows(self, package: str, items: list[Any], row: Callable[[int, Any, tuple], _Node]) -> _Node:
        """A scrollable list of ``items`` under the app bar; only the rows that fit are drawn."""
        fits = (_NAV_TOP - _APPBAR_BOTTOM) // _ROW
        self._scroll = max(0, min(self._scroll, max(0, len(items) - fits)))

        def scroll(rows: int) -> None:
            self._scroll = max(0, min(self._scroll + rows, max(0, len(items) - fits)))
        shown = items[self._scroll: self._scroll + fits]
        return _Node("androidx.recyclerview.widget.RecyclerView", (0, _APPBAR_BOTTOM, WIDTH, _NAV_TOP), package,
                     resource_id=f"{package}:id/list", scrollable=len(items) > fits, on_scroll=scroll,
                     children=[row(i, item, self._row(i)) for i, item in enumerate(shown)])

    def _contacts(self, package: str, state: Any) -> list[_Node]:
        people = sorted(self.contacts, key=lambda c: c[0].lower())

        def row(i: int, contact: tuple[str, str], bounds: tuple) -> _Node:
            def delete(contact=contact):
                self.contacts.remove(contact)
            return _Node("android.widget.LinearLayout", bounds, package, clickable=True, long_clickable=True,
                         on_tap=lambda: self._push("com.android.contacts#view", contact),
                         on_long_press=lambda: self._ask("Delete contact?", delete),
                         children=[_Node("android.widget.TextView", (48, bounds[1] + 48, 1000, bounds[3] - 48),
                                         package, text=contact[0], resource_id=f"{package}:id/contact_name")])
        nodes = [self._title(package, "Contacts"), self._scrolled_rows(package, people, row)]
        if not people:
            nodes.append(_Node("android.widget.TextView", (48, 600, 1032, 700), package, text="No contacts",
                               resource_id=f"{package}:id/empty"))
        nodes.append(_Node("android.widget.ImageButton", (840, 2050, 1032, 2242), package, desc="Create contact",
                           resource_id=f"{package}:id/floating_action_button", clickable=True,
                           on_tap=lambda: self._push("com.android.contacts#new",
                                                     _Form({"name_field": "", "phone_field": ""}))))
        return nodes

    def _field(self, package: str, form: _Form, rid: str, hint: str, bounds: tuple) -> _Node:
        def focus():
            form.focused = rid
        return _Node("android.widget.EditText", bounds, package, text=form.fields[rid], hint=hint,
                     resource_id=f"{package}:id/{rid}", clickable=True, focused=form.focused == rid, on_tap=focus)

    def _contact_form(self, package: str, form: _Form) -> list[_Node]:
        def save():
            name, phone = form.fields["name_field"].strip(), form.fields["phone_field"].strip()
            if not name:
                form.error = "Name is required"
                return
            self.contacts.append((name, phone))
            self._stack.pop()
            self._push("com.android.contacts#view", (name, phone))
        nodes = [self._title(package, "Create contact"),
                 self._field(package, form, "name_field", "Name", (48, 300, 1032, 440)),
                 self._field(package, form, "phone_field", "Phone", (48, 480, 1032, 620)),
                 self._button(package, "Cancel", "cancel_button", (48, 680, 520, 820), self._back),
                 self._button(package, "Save", "save_button", (560, 680, 1032, 820), save)]
        if form.error:
            nodes.append(_Node("android.widget.TextView", (48, 860, 1032, 940), package, text=form.error,
                               resource_id=f"{package}:id/error"))
        return nodes

    def _contact_page(self, package: str, contact: tuple[str, str]) -> list[_Node]:
        def delete():
            if contact in self.contacts:
                self.contacts.remove(contact)
            self._back()
        return [self._title(package, contact[0]),
                _Node("android.widget.TextView", (48, 300, 1032, 400), package, text=contact[1] or "No phone number",
                      resource_id=f"{package}:id/phone"),
                self._button(package, "Delete", "delete_button", (48, 480, 520, 620),
                             lambda: self._ask("Delete contact?", delete))]

    def _notes(self, package: str, state: Any) -> list[_Node]:
        def row(i: int, note: tuple[int, str], bounds: tuple) -> _Node:
            index, text = note

            def delete(index=index):
                del self.notes[index]
            return _Node("android.widget.LinearLayout", bounds, package, clickable=True, long_clickable=True,
                         on_tap=lambda: self._push("com.rlfactory.notes#edit",
                                                   _Form({"note_text": text}, focused="note_text", editing=index)),
                         on_long_press=lambda: self._ask("Delete note?", delete),
                         children=[_Node("android.widget.TextView", (48, bounds[1] + 48, 1000, bounds[3] - 48),
                                         package, text=text.splitlines()[0] if text.strip() else "(empty note)",
                                         resource_id=f"{package}:id/note_title")])
        nodes = [self._title(package, "Notes"), self._scrolled_rows(package, list(enumerate(self.notes)), row)]
        if not self.notes:
            nodes.append(_Node("android.widget.TextView", (48, 600, 1032, 700), package, text="No notes",
                               resource_id=f"{package}:id/empty"))
        nodes.append(self._button(package, "New note", "new_note", (720, 2080, 1032, 2220),
                                  lambda: self._push("com.rlfactory.notes#edit",
                                                     _Form({"note_text": ""}, focused="note_text"))))
        return nodes

    def _note_editor(self, package: str, form: _Form) -> list[_Node]:
        def save():
            text = form.fields["note_text"]
            if form.editing is not None:
                self.notes[form.editing] = text
            elif text.strip():
                self.notes.append(text)
            self._back()
        return [self._title(package, "Edit note" if form.editing is not None else "New note"),
                self._field(package, form, "note_text", "Note", (48, 300, 1032, 1200)),
                self._button(package, "Save", "save_button", (560, 1260, 1032, 1400), save)]

    def _ask(self, question: str, on_delete: Callable[[], None]) -> None:
        self._dialog = (question, on_delete)

    def _dialog_node(self, package: str) -> _Node:
        question, on_delete = self._dialog  # type: ignore[misc]

        def confirm():
            self._dialog = None
            on_delete()
        return _Node("android.widget.FrameLayout", _DIALOG, package, resource_id="android:id/parentPanel",
                     children=[_Node("android.widget.TextView", (144, 950, 936, 1050), package, text=question,
                                     resource_id="android:id/alertTitle"),
                               self._button(package, "Cancel", "button2", (144, 1240, 520, 1360), self._back),
                               self._button(package, "Delete", "button1", (560, 1240, 936, 1360), confirm)])
