"""The android env's tools: each acts on the episode's device and answers with what it did and
the screen after it (the actions are described in :mod:`rlfactory_android.env`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlfactory_core import ToolArgumentsError, ToolResult, run_in_tool_thread

from .device import KEYS, Device, DeviceError
from .simulated import SimulatedPhone
from .ui import Screen

if TYPE_CHECKING:
    from .env import AndroidEnv

__all__ = ["TOOLS", "SWIPE_DIRECTIONS"]

SWIPE_DIRECTIONS = {"up": (0, -1), "down": (0, 1), "left": (-1, 0), "right": (1, 0)}


def _target_schema() -> dict[str, Any]:
    return {"element": {"type": "integer", "minimum": 1, "description": "the element's number on the screen"},
            "x": {"type": "integer", "description": "a point's x in screen pixels (instead of element)"},
            "y": {"type": "integer", "description": "a point's y in screen pixels (instead of element)"}}


class _PhoneTool:
    """A tool acting on the episode's device (``ctx["state"]``, set by ``reset``)."""

    name = ""
    description = ""
    properties: dict[str, Any] = {}
    required: list[str] = []

    def __init__(self, env: "AndroidEnv"):
        self._env = env
        self.parameters = {"type": "object", "properties": self.properties, "required": self.required,
                           "additionalProperties": False}

    @staticmethod
    def _state(ctx: dict[str, Any] | None) -> dict[str, Any]:
        state = (ctx or {}).get("state")
        if not isinstance(state, dict) or "device" not in state:
            raise RuntimeError("the android tools run inside an android episode: ctx['state']['device'] is missing")
        return state

    async def call(self, arguments: dict[str, Any], ctx: dict[str, Any] | None = None) -> ToolResult:
        state = self._state(ctx)
        async with state["lock"]:  # one action at a time on a device, in order
            screen: Screen = state["screen"]
            action = self._plan(arguments, screen, state)  # ToolArgumentsError for a bad action
            device: Device = state["device"]
            try:
                done = await run_in_tool_thread(self._act, device, action)
                state["actions"] += 1
                state["screen"] = screen = await run_in_tool_thread(self._env.read_screen, device)
            except DeviceError as exc:
                # the device failed, not the action: the infrastructure's (rlfactory_core.outcomes)
                return ToolResult(name=self.name, content=f"Error: {exc}", error="device_error", infrastructure=True)
        return ToolResult(name=self.name, content=f"{done}\n{self._env.render(screen)}")

    def _plan(self, arguments: dict[str, Any], screen: Screen, state: dict[str, Any]) -> Any:
        return arguments

    def _act(self, device: Device, action: Any) -> str:
        raise NotImplementedError  # every tool below defines it

    def _point(self, arguments: dict[str, Any], screen: Screen) -> tuple[int, int, str]:
        """The point ``arguments`` name: an element's center or (x, y); and how to say it."""
        element, x, y = arguments.get("element"), arguments.get("x"), arguments.get("y")
        if element is not None:
            if x is not None or y is not None:
                raise ToolArgumentsError(f"{self.name}: give an element number or x and y, not both")
            found = screen.element(element)
            if found is None:
                shown = f"1-{len(screen.elements)}" if screen.elements else "none"
                raise ToolArgumentsError(f"{self.name}: there is no element {element} on the screen "
                                         f"(the elements shown are {shown})")
            cx, cy = found.center
            label = f' "{found.label}"' if found.label else ""
            return cx, cy, f"element {element} ({found.short_class}{label})"
        if x is None or y is None:
            raise ToolArgumentsError(f"{self.name}: give the number of an element on the screen "
                                     '(e.g. {"element": 3}) or a point as x and y')
        width, height = screen.size
        if not (0 <= x < width and 0 <= y < height):
            raise ToolArgumentsError(f"{self.name}: ({x},{y}) is off the screen, which is {width}x{height} "
                                     "(x from 0 to {}, y from 0 to {})".format(width - 1, height - 1))
        return x, y, f"({x},{y})"


class _PointTool(_PhoneTool):
    """A one-point gesture (``gesture``, a :class:`Device` method) at an element's center or (x, y)."""

    properties = _target_schema()
    gesture = ""
    done = ""

    def _plan(self, arguments, screen, state):
        return self._point(arguments, screen)

    def _act(self, device, action):
        x, y, what = action
        getattr(device, self.gesture)(x, y)
        return f"{self.done} {what}."


class TapTool(_PointTool):
    name = "tap"
    description = "Tap an element of the screen (by its number) or a point (x, y)."
    gesture, done = "tap", "Tapped"


class LongPressTool(_PointTool):
    name = "long_press"
    description = "Press and hold an element of the screen (by its number) or a point (x, y)."
    gesture, done = "long_press", "Long-pressed"


class SwipeTool(_PhoneTool):
    name = "swipe"
    description = ("Swipe a finger across an element (by its number, e.g. a list) or the middle of the screen. "
                   "Swiping up shows what is further down a list.")
    properties = {"direction": {"type": "string", "enum": list(SWIPE_DIRECTIONS), "description": "where the finger moves"},
                  "element": {"type": "integer", "minimum": 1, "description": "the element to swipe across"}}
    required = ["direction"]

    def _plan(self, arguments, screen, state):
        if arguments.get("element") is not None:
            found = screen.element(arguments["element"])
            if found is None:
                raise ToolArgumentsError(f"swipe: there is no element {arguments['element']} on the screen")
            x1, y1, x2, y2 = found.bounds
        else:
            x1, y1, x2, y2 = 0, 0, *screen.size
        dx, dy = SWIPE_DIRECTIONS[arguments["direction"]]
        cx, cy = (x1 + x2) // 2, (y1 + y2) // 2
        # 3/4 of the element's extent, kept on the screen
        half_w, half_h = (x2 - x1) * 3 // 8, (y2 - y1) * 3 // 8
        return (cx - dx * half_w, cy - dy * half_h, cx + dx * half_w, cy + dy * half_h, arguments["direction"])

    def _act(self, device, action):
        x1, y1, x2, y2, direction = action
        device.swipe(x1, y1, x2, y2)
        return f"Swiped {direction}."


class TypeTextTool(_PhoneTool):
    name = "type_text"
    description = "Type text into a text field: the element given (by its number) or the focused field."
    properties = {"text": {"type": "string", "minLength": 1, "description": "the text to type"},
                  "element": {"type": "integer", "minimum": 1, "description": "the text field's number"}}
    required = ["text"]

    def _plan(self, arguments, screen, state):
        number = arguments.get("element")
        if number is None:
            focused = [e for e in screen.elements if e.editable and e.focused]
            if not focused:
                raise ToolArgumentsError("type_text: no text field is focused; give the field's number as element "
                                         "(a field is listed as editable)")
            return None, arguments["text"], f"element {focused[0].number}"
        found = screen.element(number)
        if found is None:
            raise ToolArgumentsError(f"type_text: there is no element {number} on the screen")
        if not found.editable:
            label = f' "{found.label}"' if found.label else ""
            raise ToolArgumentsError(f"type_text: element {number} ({found.short_class}{label}) is not a text field; "
                                     "type into an element listed as editable")
        return found.center, arguments["text"], f"element {number}"

    def _act(self, device, action):
        point, text, where = action
        if point is not None:
            device.tap(*point)  # focus the field first
        device.input_text(text)
        return f"Typed {text!r} into {where}."


class PressKeyTool(_PhoneTool):
    name = "press_key"
    description = "Press a key: back, home or enter."
    properties = {"key": {"type": "string", "enum": list(KEYS), "description": "the key"}}
    required = ["key"]

    def _act(self, device, action):
        device.press_key(action["key"])
        return f"Pressed {action['key']}."


class OpenAppTool(_PhoneTool):
    name = "open_app"
    description = "Open an app on its start screen."
    required = ["app"]

    def __init__(self, env: "AndroidEnv"):
        self.properties = {"app": {"type": "string", "enum": list(env.apps), "description": "the app's name"}}
        super().__init__(env)

    def _act(self, device, action):
        device.open_app(self._env.apps[action["app"]])
        return f"Opened {action['app']}."


class WaitTool(_PhoneTool):
    name = "wait"
    description = "Wait for the screen to settle (e.g. after opening an app), then show it."
    properties = {"seconds": {"type": "number", "minimum": 0, "maximum": 10, "description": "how long, at most 10"}}
    required = ["seconds"]

    def _act(self, device, action):
        if not isinstance(device, SimulatedPhone):  # the simulation has no time to wait for
            import time
            time.sleep(float(action["seconds"]))
        return f"Waited {action['seconds']} s."


TOOLS = (TapTool, LongPressTool, SwipeTool, TypeTextTool, PressKeyTool, OpenAppTool, WaitTool)
